"""The lab's STAND-IN for the QEMU guest agent of a Proxmox lab node's VM guest (NOT qemu-ga), answered the
way Proxmox's /nodes/{node}/qemu/{vmid}/agent/* endpoints return it (qemu-server's PVE::API2::Qemu::Agent).

- `network-get-interfaces`: written once by the hypervisor when the guest boots with an agent
  (`write_interfaces`, `<node root>/var/lib/pvegpu-lab/agent/<vmid>.json` = the endpoint's whole answer
  `{"result": [...]}`: lo, then the guest's NIC, named as a Debian guest names virtio net0 on that machine
  type) and removed when it stops (`remove`); the pvesh stand-in reads that file.
- every other command goes through `handle` (a hypervisor request), answering `{"ok": true, "result": R}` with
  R what the endpoint returns as data, except for get-fsinfo (R: the qemu-ga result, which Proxmox wraps in
  `{"result": R}`), or `{"ok": false, "error": E}` with E qemu-ga's error text (Proxmox, and the pvesh
  stand-in, prefix it with `Agent error: `):
  `get-fsinfo` -> `[...]` synthesized from the booted image (root ext4 on sda1; an image with an
  EFI system partition also has vfat /boot/efi on sda15; no sizes);
  `file-read` {"file"} -> `{"content", "bytes-read"}` (16 MiB at most, then `"truncated": 1`);
  `file-write` {"file", "content", "encode"} -> None;
  `exec` {"command": [...], "input-data"} -> `{"pid"}` (started, not waited for);
  `exec-status` {"pid"} -> `{"exited": 0}` while it runs, then once `{"exited": 1, "exitcode"|"signal",
  "out-data", "err-data"}` (each output only when not empty), as Proxmox decodes them.
  Files and commands are the guest's: they run inside its namespaces (nsenter into its init), as qemu-ga
  runs inside the guest; a command's PID is the lab machine's. Errors read like qemu-ga's
  (`failed to open file '/x' (mode: 'r'): No such file or directory`).
"""

from __future__ import annotations

import base64
import json
import subprocess
import tempfile
from pathlib import Path
from typing import IO, Any

from lab import hosts
from lab.pve.node import AGENT_DIR, GUEST_RECORD

NOT_RUNNING = "QEMU guest agent is not running"
MAX_READ = 16 * 1024 * 1024  # Proxmox's $MAX_READ_SIZE
GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Debian's name for virtio net0 (Proxmox: bus pci.0, addr 0x12): i440FX puts pci.0 on the root bus; Q35
# behind a bridge (bus 6), which is why a guest's NIC name changes when the machine type does.
NIC_NAME = {"pc": "ens18", "q35": "enp6s18"}
# Reads or writes one file inside the guest: argv[1] path, argv[2] "r" or "w"; prints a JSON answer.
_FILE_SCRIPT = f"MAX_READ = {MAX_READ}\n" + (
    """
import base64, json, sys
path, mode = sys.argv[1], sys.argv[2]
try:
    if mode == "r":
        with open(path, "rb") as f:
            data = f.read(MAX_READ + 1)
        print(json.dumps({"data": base64.b64encode(data).decode()}))
    else:
        with open(path, "wb") as f:
            f.write(sys.stdin.buffer.read())
        print(json.dumps({}))
except OSError as e:
    print(json.dumps({"error": e.strerror}))
"""
)
_EXECS: dict[int, tuple[subprocess.Popen[bytes], IO[bytes], IO[bytes]]] = {}


def agent_path(node: hosts.LabHost, vmid: int) -> Path:
    return node.root / AGENT_DIR / f"{vmid}.json"


def _link_local(mac: str) -> str:
    """The IPv6 link-local address (EUI-64) the kernel gives an interface with `mac`."""
    octets = [int(part, 16) for part in mac.split(":")]
    eui = [octets[0] ^ 0x02, *octets[1:3], 0xFF, 0xFE, *octets[3:]]
    groups = [f"{eui[i] << 8 | eui[i + 1]:x}" for i in range(0, 8, 2)]
    return "fe80::" + ":".join(groups)


def interfaces(machine: str, mac: str | None, address: str) -> dict[str, Any]:
    """`GET .../agent/network-get-interfaces` of a guest with NIC `mac` at `address`/24 on `machine` (no
    MAC known: the NIC has no hardware address and no link-local address in the answer)."""
    nic: dict[str, Any] = {
        "name": NIC_NAME["q35" if "q35" in machine else "pc"],
        "ip-addresses": [{"ip-address": address, "ip-address-type": "ipv4", "prefix": 24}],
    }
    if mac is not None:
        nic["hardware-address"] = mac.lower()
        nic["ip-addresses"].append({"ip-address": _link_local(mac), "ip-address-type": "ipv6", "prefix": 64})
    return {
        "result": [
            {
                "name": "lo",
                "hardware-address": "00:00:00:00:00:00",
                "ip-addresses": [
                    {"ip-address": "127.0.0.1", "ip-address-type": "ipv4", "prefix": 8},
                    {"ip-address": "::1", "ip-address-type": "ipv6", "prefix": 128},
                ],
            },
            nic,
        ]
    }


def write_interfaces(
    node: hosts.LabHost, vmid: int, guest: hosts.LabHost, machine: str, mac: str | None
) -> None:
    """The agent of `guest` runs: write its network-get-interfaces answer where the stand-in reads it."""
    path = agent_path(node, vmid)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(interfaces(machine, mac, guest.address), sort_keys=True) + "\n")
    partial.rename(path)


def remove(node: hosts.LabHost, vmid: int) -> None:
    agent_path(node, vmid).unlink(missing_ok=True)


def fsinfo(esp: bool) -> dict[str, Any]:
    """`GET .../agent/get-fsinfo` of a guest whose disk (scsi0) has a root partition and maybe an ESP."""

    def disk(partition: int) -> list[dict[str, Any]]:
        controller = {"domain": 0, "bus": 0, "slot": 5, "function": 0}  # virtio-scsi-pci, pci.0 addr 0x5
        return [
            {
                "bus-type": "scsi",
                "bus": 0,
                "target": 0,
                "unit": 0,
                "pci-controller": controller,
                "dev": f"/dev/sda{partition}",
                "serial": "0QEMU_QEMU_HARDDISK_drive-scsi0",
            }
        ]

    filesystems = [{"name": "sda1", "mountpoint": "/", "type": "ext4", "disk": disk(1)}]
    if esp:
        filesystems.insert(0, {"name": "sda15", "mountpoint": "/boot/efi", "type": "vfat", "disk": disk(15)})
    return {"result": filesystems}


def _init_pid(guest: hosts.LabHost) -> int:
    """The PID (on the lab machine) of the guest's init: the process in its network namespace that is PID 1
    of its own PID namespace."""
    for pid in hosts.netns_processes(guest.netns_inode):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("NSpid:") and len(line.split()) > 2 and line.split()[-1] == "1":
                return pid
    raise RuntimeError(f"lab guest {guest.name}: no init process found")


def _in_guest(guest: hosts.LabHost, argv: list[str]) -> list[str]:
    return ["nsenter", f"--target={_init_pid(guest)}", "--all", "--root", "--wd", "--", *argv]


def _file(guest: hosts.LabHost, path: str, mode: str, data: bytes = b"") -> dict[str, Any]:
    done = subprocess.run(
        _in_guest(guest, ["python3", "-c", _FILE_SCRIPT, path, mode]),
        input=data,
        capture_output=True,
        check=False,
        timeout=60,
        env={"PATH": GUEST_PATH},
    )
    if done.returncode != 0:
        raise RuntimeError(f"agent file {mode}: {done.stderr.decode(errors='replace').strip()}")
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def _agent_error(message: str) -> dict[str, Any]:
    return {"ok": False, "error": message}


def handle(name: str, request: dict[str, Any]) -> dict[str, Any]:
    """Answer agent request `request` for guest lab host `name` (module docstring)."""
    record_path = hosts.run_dir() / name / GUEST_RECORD
    if not record_path.is_file() or not json.loads(record_path.read_text()).get("agent"):
        return {"ok": False, "error": NOT_RUNNING}
    record = json.loads(record_path.read_text())
    guest = hosts.get_host(name)
    command, params = request["command"], dict(request.get("params") or {})
    if command == "get-fsinfo":
        return {"ok": True, "result": fsinfo(bool(record.get("esp")))["result"]}
    if command in ("file-read", "file-write"):
        return _file_command(guest, command, params)
    if command == "exec":
        argv = params.get("command") or []
        return _exec(
            guest, [argv] if isinstance(argv, str) else [str(a) for a in argv], params.get("input-data")
        )
    if command == "exec-status":
        return _exec_status(int(params["pid"]))
    return {"ok": False, "error": f"lab: guest agent command {command!r} is not modelled"}


def _file_command(guest: hosts.LabHost, command: str, params: dict[str, Any]) -> dict[str, Any]:
    if command == "file-read":
        path = str(params["file"])
        read = _file(guest, path, "r")
        if "error" in read:
            return _agent_error(f"failed to open file '{path}' (mode: 'r'): {read['error']}")
        data = base64.b64decode(read["data"])
        result: dict[str, Any] = {
            "content": data[:MAX_READ].decode(errors="replace"),
            "bytes-read": min(len(data), MAX_READ),
        }
        if len(data) > MAX_READ:
            result["truncated"] = 1
        return {"ok": True, "result": result}
    path, content = str(params["file"]), str(params["content"])
    encode = params.get("encode", 1) not in (0, False, "0")
    written = _file(guest, path, "w", content.encode() if encode else base64.b64decode(content))
    if "error" in written:
        return _agent_error(f"failed to open file '{path}' (mode: 'wb'): {written['error']}")
    return {"ok": True, "result": None}


def _exec(guest: hosts.LabHost, argv: list[str], input_data: str | None) -> dict[str, Any]:
    if not argv:
        return {"ok": False, "error": "command or input-data (or both) required"}
    # Kept open until exec-status reads them (a pipe would fill up while nobody polls).
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115
    process = subprocess.Popen(
        _in_guest(guest, argv),
        stdin=subprocess.PIPE if input_data is not None else subprocess.DEVNULL,
        stdout=out,
        stderr=err,
        env={"PATH": GUEST_PATH},
    )
    if process.stdin is not None:
        process.stdin.write(str(input_data).encode())
        process.stdin.close()
    _EXECS[process.pid] = (process, out, err)
    return {"ok": True, "result": {"pid": process.pid}}


def _exec_status(pid: int) -> dict[str, Any]:
    if pid not in _EXECS:
        return _agent_error("Invalid parameter 'pid'")
    process, out, err = _EXECS[pid]
    status = process.poll()
    if status is None:
        return {"ok": True, "result": {"exited": 0}}
    del _EXECS[pid]
    result: dict[str, Any] = {"exited": 1}
    result.update({"signal": -status} if status < 0 else {"exitcode": status})
    for key, stream in (("out-data", out), ("err-data", err)):
        stream.seek(0)
        data = stream.read()
        stream.close()
        if data:
            result[key] = data.decode(errors="replace")
    return {"ok": True, "result": result}
