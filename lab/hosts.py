"""Lab hosts: a Debian root (overlay over the shared base), a fake sysfs, and a real sshd, in its own network.

A host is reachable at root@10.200.<index>.2:22 over a veth pair (`pvl-<name>`; the lab side is
10.200.<index>.1) from a network namespace `pvl-<name>`. Two modes:

- `netns`: a PID/mount/UTS namespace whose init (lab/host_init.sh) pivots into the root and runs sshd. The
  fake sysfs is the root's /sys and a fake kernel command line is bind-mounted on /proc/cmdline, so the
  host's `sysfs_root` / `cmdline_path` are the defaults. No systemd: `systemctl` is inert there.
- `nspawn`: systemd-nspawn --boot, a real systemd as PID 1 that starts sshd itself. nspawn mounts the real
  sysfs on /sys and refuses a bind over /proc/cmdline, so the fake tree is at /opt/fakesys and the command
  line at /opt/fakeproc/cmdline (both are node settings).

Each host has its own identity: hostname, machine-id, SSH host key (recorded in the lab's known_hosts file,
which the inventory checks strictly) and root login key. State lives in `$PVEGPU_LAB_RUN/<name>/`
(default /run/pvegpu-lab): `host.json` (the `LabHost` record), `sysfs.json` (the fake sysfs manifest),
`id_ed25519` (root's login key), `merged/` (the host's "/": tests may read or tamper with it), `upper/`,
`work/`, `pid`, `console.log`.

`route_between` lets hosts reach each other (off by default: each host sees only the lab machine). `up`
refuses a name or address that is in use; `down` removes everything `up` made (processes, network
namespace, veth, mounts, state) and also cleans up after a half-finished `up`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal, cast

from lab import fakesys, root
from lab.errors import LabError
from lab.topology import Topology

Mode = Literal["netns", "nspawn"]
MODES: tuple[Mode, ...] = ("netns", "nspawn")

# veth names are limited to 15 characters: "pvl-" + 11.
_NAME = re.compile(r"[a-z][a-z0-9]{0,10}")
_PREFIX = "pvl-"
_MAX_INDEX = 250
_HOST_INIT = Path(__file__).with_name("host_init.sh")
_MACHINE_LOCK = Path("/run/lock/pvegpu-lab.lock")
_SSH_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 15.0
# Hosts started by this process, so that stopping them reaps them (no zombies, no ResourceWarning).
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}

# Synthesized, not captured: the shape of a fresh Proxmox VE 8 install (GRUB, LVM root, installer's `quiet`).
FRESH_PVE_CMDLINE = "BOOT_IMAGE=/boot/vmlinuz-6.8.12-4-pve root=/dev/mapper/pve-root ro quiet\n"
# Where the fake sysfs tree and the fake kernel command line are, per mode (node settings).
SYSFS_ROOT: dict[Mode, str] = {"netns": "/sys", "nspawn": "/opt/fakesys"}
CMDLINE_PATH: dict[Mode, str] = {"netns": "/proc/cmdline", "nspawn": "/opt/fakeproc/cmdline"}


@dataclass(frozen=True)
class LabHost:
    """A running lab host, as recorded in `<run>/<name>/host.json`."""

    name: str
    mode: Mode
    topology: str
    index: int
    pid: int
    netns_inode: int
    host_key: str
    sysfs_root: str
    cmdline_path: str
    # False for a cloud-init guest: its deployer records its key (the lab's known_hosts keeps that line).
    host_key_recorded: bool = True

    @property
    def address(self) -> str:
        return f"10.200.{self.index}.2"

    @property
    def state_dir(self) -> Path:
        return run_dir() / self.name

    @property
    def root(self) -> Path:
        """The host's "/" as seen from the lab machine."""
        return self.state_dir / "merged"

    @property
    def key(self) -> Path:
        """root's SSH login key for this host."""
        return self.state_dir / "id_ed25519"

    def manifest(self) -> dict[str, Any]:
        """The fake sysfs manifest `lab.fakesys.write_tree` returned for this host."""
        return cast(dict[str, Any], json.loads((self.state_dir / "sysfs.json").read_text()))

    def gpu_drivers(self) -> dict[str, str | None]:
        """Every function of the host's GPU cards -> the driver its fake sysfs `driver` link names."""
        devices = self.root / self.sysfs_root.lstrip("/") / "bus/pci/devices"
        bound: dict[str, str | None] = {}
        for gpu in self.manifest()["gpus"]:
            for address in gpu["functions"]:
                link = devices / address / "driver"
                bound[address] = link.readlink().name if link.is_symlink() else None
        return bound

    def is_alive(self) -> bool:
        return _alive(self.pid)


def run_dir() -> Path:
    return Path(os.environ.get("PVEGPU_LAB_RUN", "/run/pvegpu-lab"))


def known_hosts_path() -> Path:
    """The lab's known_hosts file: one line per running host whose key the lab records, rewritten by every
    up/down; lines the lab does not own (e.g. a cloud-init guest's, written by pvegpu) are kept."""
    return run_dir() / "known_hosts"


def netns_name(name: str) -> str:
    return _PREFIX + name


def list_hosts() -> list[LabHost]:
    """Every host with a complete record, sorted by name. A host whose processes died is included: it shows
    up as a connection error rather than silently vanishing from the inventory."""
    hosts = []
    for record in sorted(run_dir().glob("*/host.json")):
        data = json.loads(record.read_text())
        hosts.append(LabHost(**data))
    return hosts


def get_host(name: str) -> LabHost:
    record = run_dir() / name / "host.json"
    if not record.is_file():
        raise LabError(f"no lab host named {name!r} is up (python -m lab status lists them)")
    return LabHost(**json.loads(record.read_text()))


def login_key(host: LabHost) -> Path:
    """The key that logs in to `host` as root: the lab's for a host it made; for a guest cloud-init set up,
    the login key pvegpu generated for it (the lab inventory names the VM as the lab names its guest)."""
    if host.host_key_recorded:
        return host.key
    node, vmid = _guest_of(host.name)
    folder = known_hosts_path().parent / GUEST_KEYS_DIR
    found = sorted(folder.glob(f"*/{node}-{vmid}_login_ed25519")) if node else []
    return found[0] if len(found) == 1 else folder / node / f"{node}-{vmid}_login_ed25519"


def _guest_of(name: str) -> tuple[str, str]:
    """(node, vmid) of the guest the lab names `<node>v<vmid>`; ("", "") for another name."""
    matched = re.fullmatch(r"(.+)v(\d+)", name)
    return (matched[1], matched[2]) if matched else ("", "")


def ssh_argv(host: LabHost, *command: str) -> list[str]:
    """An OpenSSH command line into `host` as root (`login_key`) that checks its host key against the lab's
    known_hosts (where pvegpu records a cloud-init guest's)."""
    # -F /dev/null: the user's ~/.ssh/config has no say (no StrictHostKeyChecking=no from a `Host *`).
    options = [
        "IdentitiesOnly=yes",
        "BatchMode=yes",
        f"UserKnownHostsFile={known_hosts_path()}",
        "StrictHostKeyChecking=yes",
        "LogLevel=ERROR",
    ]
    login = ["-i", str(login_key(host)), f"root@{host.address}"]
    return [
        "ssh",
        "-F",
        "/dev/null",
        *(arg for option in options for arg in ("-o", option)),
        *login,
        *command,
    ]


def up(
    name: str,
    topology: str | Topology,
    mode: Mode = "netns",
    replace: bool = False,
    driver: str = "nvidia",
    *,
    index: int | None = None,
    record_host_key: bool = True,
    customize: Callable[[Path], None] | None = None,
) -> LabHost:
    """Start host `name` with the fake sysfs of `topology` (a name in `fakesys.TOPOLOGIES`, or a description,
    e.g. a VM guest's from lab.pve.guest), NVIDIA cards bound to `driver`; return once its sshd answers.

    `index`: the address 10.200.<index>.2 it must get (default: the first free one). `customize(root)` runs
    on the host's root after the lab wrote its identity and before anything starts (a cloud-init guest's first
    boot: lab.cloud_init); the host key is read back afterwards. `record_host_key=False`: the lab's
    known_hosts file does not get the host's key (a cloud-init guest, whose deployer records it).

    Raises `LabError` when the name is invalid or taken (unless `replace`: the old host is stopped first),
    the index is taken or out of range, the topology is unknown, or the host does not come up (its log is in
    the message); a failed start is cleaned up before raising.
    """
    if not _NAME.fullmatch(name):
        raise LabError(f"host name {name!r}: use 1-11 lowercase letters and digits, starting with a letter")
    if isinstance(topology, str) and topology not in fakesys.TOPOLOGIES:
        raise LabError(f"unknown topology {topology!r}; known: {', '.join(sorted(fakesys.TOPOLOGIES))}")
    if mode not in MODES:
        raise LabError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    if replace:
        down(name)
    base = root.ensure_base()
    with _locked():
        state = run_dir() / name
        if state.exists():
            raise LabError(f"lab host {name!r} is already up; stop it with: python -m lab down {name}")
        if Path("/run/netns", netns_name(name)).exists():
            raise LabError(f"network namespace {netns_name(name)} exists, but not as a lab host: remove it")
        index = _free_index() if index is None else _requested_index(index)
        state.mkdir(parents=True)
        try:
            host = _start(
                name,
                topology,
                mode,
                index=index,
                base=base,
                state=state,
                driver=driver,
                record_host_key=record_host_key,
                customize=customize,
            )
        except BaseException:
            _stop(name)
            raise
        _write_known_hosts()
    return host


def down(name: str) -> bool:
    """Stop host `name` and remove everything it left; return False when there was nothing to remove.
    Its companion process (a Proxmox node's lab hypervisor) is stopped first, then the hosts recorded as its
    dependents (that node's VM guests; see lab.pve)."""
    _stop_companion(name)  # outside the lock: a companion may be waiting for it to start a dependent
    for dependent in dependents(name):
        down(dependent)
    with _locked():
        record = run_dir() / name / "host.json"
        stopped = LabHost(**json.loads(record.read_text())) if record.is_file() else None
        found = _stop(name)
        released = {stopped.address} if stopped and stopped.host_key_recorded else set()
        _write_known_hosts(released=released, forgotten=_forget_guest_keys(name))
    return found


# pvegpu's key files for the guest of VM <vmid> on node <name> (pvegpu/local/guest_keys.py):
# guest-keys/<cluster>/<name>-<vmid>_ed25519 and the like, the cluster folder being the node's name for the
# lab's standalone nodes (any folder counts: a test may give its inventory a cluster).
GUEST_KEYS_DIR = "guest-keys"


def _forget_guest_keys(name: str) -> set[str]:
    """A node going down takes its VMs with it: remove the key files pvegpu made for their guests (a node of
    the same name later gets new VMs, which must not be trusted with the old keys); the public host keys
    removed, whose known_hosts lines go too."""
    folder = known_hosts_path().parent / GUEST_KEYS_DIR
    pattern = re.compile(rf"{re.escape(name)}-\d+(_login)?_ed25519(\.pub)?|{re.escape(name)}-\d+\.address")
    forgotten: set[str] = set()
    for path in sorted(folder.glob(f"*/{name}-*")) if folder.is_dir() else []:
        if not pattern.fullmatch(path.name):
            continue
        if path.name.endswith("_ed25519.pub") and "_login" not in path.name:
            forgotten.add(" ".join(path.read_text().split()[:2]))
        path.unlink()
    return forgotten


def down_all() -> list[str]:
    """Stop every host in the run directory; return their names."""
    folders = run_dir().iterdir() if run_dir().is_dir() else iter(())
    names = sorted(p.name for p in folders if p.is_dir() and p.name != GUEST_KEYS_DIR)
    for name in names:
        down(name)
    return names


# --- starting --------------------------------------------------------------------------------


def _start(
    name: str,
    topology: str | Topology,
    mode: Mode,
    *,
    index: int,
    base: Path,
    state: Path,
    driver: str,
    record_host_key: bool,
    customize: Callable[[Path], None] | None,
) -> LabHost:
    merged = state / "merged"
    for layer in ("upper", "work", "merged"):
        (state / layer).mkdir()
    layers = f"lowerdir={base},upperdir={state / 'upper'},workdir={state / 'work'}"
    _run("mount", "-t", "overlay", "overlay", "-o", layers, merged)
    host_key = _write_identity(name, merged, state)
    if customize is not None:
        customize(merged)
        host_key = _host_key_line(merged)

    sysfs_root, cmdline_path = SYSFS_ROOT[mode], CMDLINE_PATH[mode]
    tree = merged / sysfs_root.lstrip("/")
    tree.mkdir(parents=True, exist_ok=True)
    manifest = fakesys.write_tree(tree, topology, driver)
    (state / "sysfs.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    # netns: bind-mounted over /proc/cmdline by host_init.sh; nspawn: a plain file in the root.
    cmdline = state / "cmdline" if mode == "netns" else merged / cmdline_path.lstrip("/")
    cmdline.parent.mkdir(parents=True, exist_ok=True)
    cmdline.write_text(FRESH_PVE_CMDLINE)

    netns_inode = _make_network(name, index)
    argv = _netns_argv(name, merged, cmdline) if mode == "netns" else _nspawn_argv(name, merged)
    with (state / "console.log").open("wb") as log:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    _CHILDREN[process.pid] = process
    (state / "pid").write_text(f"{process.pid}\n")
    host = LabHost(
        name=name,
        mode=mode,
        topology=topology if isinstance(topology, str) else topology.name,
        index=index,
        pid=process.pid,
        netns_inode=netns_inode,
        host_key=host_key,
        sysfs_root=sysfs_root,
        cmdline_path=cmdline_path,
        host_key_recorded=record_host_key,
    )
    _wait_for_sshd(host, process, state / "console.log")
    (state / "host.json").write_text(json.dumps(asdict(host), indent=1) + "\n")
    return host


def _write_identity(name: str, merged: Path, state: Path) -> str:
    """Hostname, machine-id, SSH host key and root's login key; return the host key line for known_hosts."""
    (merged / "etc/hostname").write_text(f"{name}\n")
    (merged / "etc/hosts").write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{name}\n")
    (merged / "etc/machine-id").write_text(hashlib.md5(f"pvegpu-lab:{name}".encode()).hexdigest() + "\n")
    host_key = merged / "etc/ssh/ssh_host_ed25519_key"
    for key, comment in ((host_key, f"root@{name}"), (state / "id_ed25519", f"pvegpu-lab@{name}")):
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", key)
    ssh_dir = merged / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    shutil.copyfile(state / "id_ed25519.pub", ssh_dir / "authorized_keys")
    return _host_key_line(merged)


def _host_key_line(merged: Path) -> str:
    """`<type> <base64>` of the host's ed25519 host key (the one the lab's sshd serves); "" when it has none
    (its sshd will not start)."""
    public = merged / "etc/ssh/ssh_host_ed25519_key.pub"
    if not public.is_file():
        return ""
    key_type, key_data = public.read_text().split()[:2]
    return f"{key_type} {key_data}"


def _make_network(name: str, index: int) -> int:
    ns = netns_name(name)
    _run("ip", "netns", "add", ns)
    _run("ip", "link", "add", ns, "type", "veth", "peer", "name", "eth0", "netns", ns)
    _run("ip", "addr", "add", f"10.200.{index}.1/24", "dev", ns)
    _run("ip", "link", "set", ns, "up")
    _run("ip", "-n", ns, "addr", "add", f"10.200.{index}.2/24", "dev", "eth0")
    _run("ip", "-n", ns, "link", "set", "eth0", "up")
    _run("ip", "-n", ns, "link", "set", "lo", "up")
    return Path("/run/netns", ns).stat().st_ino


def _netns_argv(name: str, merged: Path, cmdline: Path) -> list[str]:
    # nsenter execs (`ip netns exec` forks: killing its PID would orphan the host); util-linux unshare
    # ignores SIGTERM while it waits, so `_stop` SIGKILLs it and --kill-child takes the PID namespace down.
    netns = f"--net=/run/netns/{netns_name(name)}"
    namespaces = ["unshare", "--mount", "--pid", "--uts", "--fork", "--kill-child"]
    return ["nsenter", netns, *namespaces, "bash", str(_HOST_INIT), str(merged), str(cmdline), name]


def _nspawn_argv(name: str, merged: Path) -> list[str]:
    # Without systemd as the lab machine's PID 1 (CI containers), nspawn needs --register=no --keep-unit (no
    # machined, no D-Bus) and /run/systemd/nspawn on a tmpfs (it refuses to clean a propagation directory that
    # sits on a disk file system): where /run is not a tmpfs, one is mounted there (and left for later hosts).
    nspawn_dir = Path("/run/systemd/nspawn")
    nspawn_dir.mkdir(parents=True, exist_ok=True)
    fs_type = subprocess.run(
        ["stat", "-f", "-c", "%T", str(nspawn_dir)], check=True, capture_output=True, text=True
    )
    if fs_type.stdout.strip() != "tmpfs":
        _run("mount", "-t", "tmpfs", "-o", "mode=755,size=1m", "tmpfs", nspawn_dir)
    flags = ["--quiet", "--boot", "--register=no", "--keep-unit", "--console=read-only"]
    netns = f"--network-namespace-path=/run/netns/{netns_name(name)}"
    return ["systemd-nspawn", *flags, f"--directory={merged}", f"--machine={name}", netns]


def _wait_for_sshd(host: LabHost, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + _SSH_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        try:
            with socket.create_connection((host.address, 22), timeout=1.0) as conn:
                if conn.recv(4) == b"SSH-":
                    return
        except OSError:
            pass
        time.sleep(0.05)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
    status = "exited" if process.poll() is not None else f"no SSH banner within {_SSH_TIMEOUT_S:.0f} s"
    raise LabError(f"lab host {host.name} did not come up ({status}); last lines of {log}:\n{tail}")


def retopo(name: str, topology: str) -> LabHost:
    """Rewrite running host `name`'s fake sysfs in place with `topology` ("the BIOS changed": same box,
    new bus and group numbers); the host keeps running. Returns the updated record."""
    if topology not in fakesys.TOPOLOGIES:
        raise LabError(f"unknown topology {topology!r}; known: {', '.join(sorted(fakesys.TOPOLOGIES))}")
    with _locked():
        host = get_host(name)
        tree = host.root / host.sysfs_root.lstrip("/")
        for child in tree.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
        manifest = fakesys.write_tree(tree, topology)
        (host.state_dir / "sysfs.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        host = replace(host, topology=topology)
        (host.state_dir / "host.json").write_text(json.dumps(asdict(host), indent=1) + "\n")
    return host


def route_between(*names: str) -> None:
    """Let running hosts `names` reach each other (as a cluster's nodes do): each gets a route to the others'
    addresses through its lab side, and the lab machine forwards between their veths only (per-interface
    `forwarding`, the rest of the machine's routing untouched). Gone with the hosts' veths at `down`."""
    with _locked():
        hosts = [get_host(name) for name in names]
        for host in hosts:
            Path(f"/proc/sys/net/ipv4/conf/{netns_name(host.name)}/forwarding").write_text("1\n")
        for host in hosts:
            gateway = host.address.rpartition(".")[0] + ".1"
            for other in hosts:
                if other.name != host.name:
                    _run(
                        "ip",
                        "-n",
                        netns_name(host.name),
                        "route",
                        "replace",
                        f"{other.address}/32",
                        "via",
                        gateway,
                    )


# --- companions and dependents -----------------------------------------------------------------


def start_companion(name: str, argv: list[str]) -> int:
    """Start a lab-machine process that belongs to host `name` (its log: `<state>/companion.log`); `down`
    stops it before the host. `argv` must contain the host's state directory (how `down` recognises it).
    Returns its PID."""
    state = run_dir() / name
    if str(state) not in argv:
        raise LabError(f"companion of {name}: its command line must name {state}")
    with (state / "companion.log").open("ab") as log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=Path(__file__).resolve().parents[1],
        )
    _CHILDREN[process.pid] = process
    (state / "companion.pid").write_text(f"{process.pid}\n")
    return process.pid


def add_dependent(name: str, dependent: str) -> None:
    """Record that host `dependent` (e.g. a VM guest) goes down with host `name`."""
    folder = run_dir() / name / "dependents"
    folder.mkdir(exist_ok=True)
    (folder / dependent).touch()


def remove_dependent(name: str, dependent: str) -> None:
    (run_dir() / name / "dependents" / dependent).unlink(missing_ok=True)


def dependents(name: str) -> list[str]:
    folder = run_dir() / name / "dependents"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def _stop_companion(name: str) -> None:
    state = run_dir() / name
    pid_file = state / "companion.pid"
    if pid_file.is_file():
        pid = int(pid_file.read_text())
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except FileNotFoundError:
            argv = b""
        if str(state).encode() in argv:
            _signal_until_gone(pid, signal.SIGTERM)
        pid_file.unlink()


# --- stopping --------------------------------------------------------------------------------


def _stop(name: str) -> bool:
    state = run_dir() / name
    ns = netns_name(name)
    found = state.exists() or Path("/run/netns", ns).exists()
    pid_file = state / "pid"
    if pid_file.is_file():
        _kill(int(pid_file.read_text()), state)
    if Path("/run/netns", ns).exists():
        # The top process is gone; the rest of the host (a netns host's init and sshd die a moment after it)
        # are exactly the processes in its network namespace.
        _kill_netns_processes(Path("/run/netns", ns).stat().st_ino)
        _run("ip", "netns", "delete", ns)  # the kernel then removes the veth pair, asynchronously
    if _link_exists(ns):
        try:
            _run("ip", "link", "delete", ns)
        except LabError:
            if _link_exists(ns):
                raise
    for mountpoint in reversed(_mounts_under(state)):
        _run("umount", mountpoint)
    if state.exists():
        shutil.rmtree(state)
    return found


def _kill(pid: int, state: Path) -> None:
    """Stop the host's top process (only if it is really this host's) and wait until it is gone."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return
    if str(state / "merged").encode() not in argv:
        return  # the PID was reused by an unrelated process
    # nspawn: SIGTERM is a clean container shutdown. netns: unshare ignores SIGTERM (see _netns_argv).
    is_nspawn = argv.startswith(b"systemd-nspawn")
    _signal_until_gone(pid, signal.SIGTERM if is_nspawn else signal.SIGKILL)


def _signal_until_gone(pid: int, first: signal.Signals) -> None:
    """Send `first`, then SIGKILL every `_STOP_TIMEOUT_S` seconds, until `pid` is gone."""
    os.kill(pid, first)
    deadline = time.monotonic() + _STOP_TIMEOUT_S
    while _alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + _STOP_TIMEOUT_S
        time.sleep(0.05)


def netns_processes(netns_inode: int) -> list[int]:
    """PIDs of the live processes in the network namespace with this inode."""
    wanted, pids = f"net:[{netns_inode}]", []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.readlink(proc / "ns/net") == wanted:
                pids.append(int(proc.name))
        except OSError:
            continue  # exited meanwhile, or a zombie (no namespaces left)
    return pids


def _kill_netns_processes(netns_inode: int) -> None:
    deadline = time.monotonic() + _STOP_TIMEOUT_S
    while pids := netns_processes(netns_inode):
        if time.monotonic() > deadline:
            raise LabError(f"processes {pids} in network namespace {netns_inode} survived SIGKILL")
        for pid in pids:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """True while `pid` runs. A host started by this process is reaped; a zombie of another parent (a host
    started by an earlier `python -m lab up`, now a child of PID 1) counts as gone."""
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        del _CHILDREN[pid]
        return False
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below `path` in this mount namespace, in mount order."""
    prefix = str(path)
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    return points


def _link_exists(link: str) -> bool:
    return Path("/sys/class/net", link).exists()


# --- shared state ----------------------------------------------------------------------------


@contextmanager
def _locked() -> Iterator[None]:
    """Serialise up/down: addresses and network namespaces are the machine's, shared by every run directory
    (a test session and the demo may run at once), and the known_hosts file by every host of a run."""
    _MACHINE_LOCK.parent.mkdir(parents=True, exist_ok=True)
    run_dir().mkdir(parents=True, exist_ok=True)
    with _MACHINE_LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _free_index() -> int:
    used = {host.index for host in list_hosts()}
    addresses = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], check=True, capture_output=True, text=True
    ).stdout
    for index in range(1, _MAX_INDEX + 1):
        if index not in used and f" 10.200.{index}.1/" not in addresses:
            return index
    raise LabError(f"all {_MAX_INDEX} lab addresses are in use; stop hosts with: python -m lab down --all")


def _requested_index(index: int) -> int:
    """`index` when its address is free (LabError naming what holds it otherwise)."""
    if not 1 <= index <= _MAX_INDEX:
        raise LabError(f"lab address index {index} is out of range (1-{_MAX_INDEX})")
    holders = [host.name for host in list_hosts() if host.index == index]
    addresses = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], check=True, capture_output=True, text=True
    ).stdout
    if holders or f" 10.200.{index}.1/" in addresses:
        holder = f"lab host {holders[0]}" if holders else "another network interface"
        raise LabError(f"lab address 10.200.{index}.2 is taken by {holder}")
    return index


def _line_names(line: str, addresses: set[str]) -> bool:
    """Whether known_hosts `line` is about one of `addresses` (plain host patterns; hashed ones never)."""
    fields = line.split()
    if fields and fields[0].startswith("@"):
        fields = fields[1:]
    return bool(fields) and any(name in addresses for name in fields[0].split(","))


def _write_known_hosts(released: set[str] | None = None, forgotten: set[str] | None = None) -> None:
    """One line per host whose key the lab records. The lab owns every line about those hosts' addresses and
    about `released` (addresses of recorded hosts just stopped): a line there is stale or planted; and every
    line of a key in `forgotten` (`<type> <base64>` of a gone node's guests). Other lines (a cloud-init
    guest's, written by pvegpu; comments) are kept as they are, before the lab's."""
    recorded = [host for host in list_hosts() if host.host_key_recorded]
    owned = {host.address for host in recorded} | (released or set())
    path = known_hosts_path()
    previous = path.read_text().splitlines() if path.is_file() else []
    gone = forgotten or set()
    kept = [
        f"{line}\n"
        for line in previous
        if not _line_names(line, owned) and " ".join(line.split()[1:3]) not in gone
    ]
    lines = kept + [f"{host.address} {host.host_key}\n" for host in recorded]
    partial = path.with_name(path.name + ".partial")
    partial.write_text("".join(lines))
    partial.rename(path)


def _run(*argv: str | Path) -> None:
    command = [str(a) for a in argv]
    result = subprocess.run(command, check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise LabError(f"`{' '.join(command)}` failed ({result.returncode}): {result.stderr.strip()}")
