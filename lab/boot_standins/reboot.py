#!/usr/bin/python3
"""LAB STAND-IN for `reboot` on a pvegpu lab node (installed as /usr/local/sbin/reboot by lab/boot.py).

A lab node cannot boot a kernel, so "rebooting" applies what the next boot would pick up to the node's
fake running state, from the files the bootloader, modprobe and systemd would really read:

- kernel command line: GRUB layout: the `linux` line of /boot/grub/grub.cfg (written by update-grub);
  systemd-boot layout: the `options` of the first ESP's loader entry for the lab's kernel (written by
  proxmox-boot-tool's `refresh`). Without those, the command line stays as it was.
- drivers: when vfio-pci loads at boot (vfio_pci in /etc/modules-load.d/*.conf) and the IOMMU is on
  (`amd_iommu=on` / `intel_iommu=on` on the new command line), every function matching
  `options vfio-pci ids=` or an address in an `install vfio-pci` driver_override line is bound to vfio-pci
  (the fake sysfs `driver` links are rewritten). A function bound to vfio-pci that the configuration no
  longer selects (the `lxc` / `baremetal` profiles removed it) gets its own driver back, as a boot without
  vfio-pci gives it: an NVIDIA display function `nvidia` when the host driver loads (dpkg knows
  `nvidia-kernel-open-dkms` or `nvidia-kernel-dkms`, or an nvidia.ko is under /lib/modules, and no
  modprobe.d file blacklists `nvidia`), else no driver; an HD audio function `snd_hda_intel`; anything
  else no driver. An NVIDIA display function that vfio-pci does not take and that has no driver, or has
  `nvidia`, gets `nvidia` when the host driver loads and no driver when it does not. Other functions keep
  their driver.
- IOMMU groups: each `kernel/iommu_groups/N/type` gets the default DMA domain the new command line gives
  (drivers/iommu/iommu.c): `identity` with `iommu=pt` or `iommu.passthrough=1`, `DMA` with
  `iommu.strict=1`, else `DMA-FQ` (x86's lazy default).
- the NVIDIA module: when the host driver loads and at least one NVIDIA display function ends up bound to
  `nvidia`, VERSION_FILE (from /etc/pvegpu-lab/nvidia.env, else the lab's default path) gets what
  /proc/driver/nvidia/version shows, for the version dpkg-query gives for the installed
  nvidia-kernel-open-dkms (else nvidia-kernel-dkms) without its Debian revision, in the text of the
  stand-in kernel package (lab/standins/nvidia_module.py); otherwise (or with no dpkg version)
  VERSION_FILE is removed.
- device nodes: /dev/nvidia* are removed (a boot starts with a fresh devtmpfs); then, when systemd runs
  (/run/systemd/system exists) and `pvegpu-nvidia-devices.service` is enabled, it is restarted, as the
  boot would start it (it creates the nodes again with nvidia-modprobe).
- a Proxmox lab node's VMs (when /etc/pvegpu-lab/pve.json is there): the running ones are stopped before the
  "boot" and, after it, the ones with `onboot: 1` are started as pve-guests.service starts them, through the
  API's start (`pvesh create /nodes/<node>/qemu/<vmid>/status/start`): the VM's pre-start hookscript, then
  Proxmox's mapping check. A start that fails leaves its VM down, its task log saying why.
- SSH: the node going down ends every SSH connection to it, as a real reboot does. First of all (before any
  new state is visible), every sshd process below the node's sshd listener (the per-connection ones) is
  killed (SIGKILL), so every client holding a connection (pyinfra's, pvegpu's API session, any other) sees
  it dropped. The listener stays, as if it were back at once. Before that the stand-in leaves its caller's
  session and process group and ignores SIGHUP, so that the end of the connection that started it (pvegpu
  starts it detached, `( sleep 1 && reboot ) &`) does not end it too. A connection that waits for the
  stand-in itself (`ssh node reboot`, the lab's own callers) is spared, so that its caller gets the exit
  status. The closed connections' client addresses go into the log line (`ssh-closed=`).

Settings come from /etc/pvegpu-lab/boot.json (layout, sysfs_root, cmdline_path, kernel image names). Each
reboot appends one line to /var/log/pvegpu-lab/reboot.log.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path

CONFIG = Path("/etc/pvegpu-lab/boot.json")
ESP_ROOT = Path("/var/lib/pvegpu-lab/esp")
ESP_LIST = Path("/etc/kernel/proxmox-boot-uuids")
KERNEL_FILE = Path("/etc/pvegpu-lab/kernel")
GRUB_CFG = Path("/boot/grub/grub.cfg")
LOG = Path("/var/log/pvegpu-lab/reboot.log")
PVE_CONFIG = Path("/etc/pvegpu-lab/pve.json")  # a Proxmox lab node's (lab/pve/node.py)
QEMU_CONFS = Path("/etc/pve/qemu-server")
NVIDIA_ENV = Path("/etc/pvegpu-lab/nvidia.env")
DEFAULT_VERSION_FILE = "/opt/fakeproc/driver/nvidia/version"  # lab.guest_payload.VERSION_FILE
DEV = Path("/dev")
DEVICE_UNIT = "pvegpu-nvidia-devices.service"
VERSION_TEXT = (  # lab/standins/nvidia_module.py's VERSION_TEXT
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {version}  Release Build  "
    "(pvegpu lab STAND-IN)\nGCC version:  none (pvegpu lab STAND-IN)\n"
)
_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def next_cmdline(config: dict[str, str], running: str) -> str:
    if config["layout"] == "grub":
        if not GRUB_CFG.is_file():
            return running
        for line in GRUB_CFG.read_text().splitlines():
            words = line.split()
            if words[:1] == ["linux"]:
                return " ".join([f"BOOT_IMAGE={words[1]}", *words[2:]])
        return running
    uuids = ESP_LIST.read_text().split() if ESP_LIST.is_file() else []
    kernel = KERNEL_FILE.read_text().strip()
    entry = ESP_ROOT / uuids[0] / f"loader/entries/proxmox-{kernel}.conf" if uuids else None
    if entry is None or not entry.is_file():
        return running
    for line in entry.read_text().splitlines():
        words = line.split(maxsplit=1)
        if words[:1] == ["options"]:
            return f"initrd={config['esp_initrd']} {words[1].strip() if len(words) > 1 else ''}".strip()
    return running


def vfio_selection() -> tuple[set[str], set[str], bool]:
    """(ids, addresses, vfio-pci loads at boot) from modules-load.d and modprobe.d."""
    loads = any(
        line.strip() in ("vfio_pci", "vfio-pci")
        for conf in Path("/etc/modules-load.d").glob("*.conf")
        for line in conf.read_text().splitlines()
    )
    ids: set[str] = set()
    addresses: set[str] = set()
    for conf in sorted(Path("/etc/modprobe.d").glob("*.conf")):
        for line in conf.read_text().splitlines():
            words = line.split()
            if words[:2] == ["options", "vfio-pci"]:
                for word in words[2:]:
                    if word.startswith("ids="):
                        ids.update(word[len("ids=") :].split(","))
            elif words[:2] == ["install", "vfio-pci"] and "driver_override" in line:
                addresses.update(_ADDRESS.findall(line))
    return ids, addresses, loads


NVIDIA = "0x10de"
DISPLAY_CLASS = "0x03"
AUDIO_CLASS = "0x0403"
DKMS_PACKAGES = ("nvidia-kernel-open-dkms", "nvidia-kernel-dkms")


def host_driver_loads() -> bool:
    """Whether `nvidia` would load at boot: its module installed and no modprobe.d blacklist for it."""
    installed = any(Path(f"/var/lib/dpkg/info/{name}.list").is_file() for name in DKMS_PACKAGES) or any(
        Path("/lib/modules").glob("*/**/nvidia.ko*")
    )
    blacklisted = any(
        line.split() == ["blacklist", "nvidia"]
        for conf in Path("/etc/modprobe.d").glob("*.conf")
        for line in conf.read_text().splitlines()
    )
    return installed and not blacklisted


def is_nvidia_display(device: Path) -> bool:
    vendor = (device / "vendor").read_text().strip()
    return vendor == NVIDIA and (device / "class").read_text().strip().startswith(DISPLAY_CLASS)


def own_driver(device: Path, nvidia: bool) -> str | None:
    """The driver a function gets at a boot without vfio-pci (module docstring)."""
    if is_nvidia_display(device):
        return "nvidia" if nvidia else None
    if (device / "class").read_text().strip().startswith(AUDIO_CLASS):
        return "snd_hda_intel"
    return None


def current_driver(device: Path) -> str | None:
    link = device / "driver"
    return Path(os.readlink(link)).name if link.is_symlink() else None


def unbind(sysfs: Path, address: str) -> None:
    device = (sysfs / "bus/pci/devices" / address).resolve()
    link = device / "driver"
    if link.is_symlink():
        old = Path(os.readlink(link)).name
        (sysfs / "bus/pci/drivers" / old / address).unlink(missing_ok=True)
        link.unlink()


def bind(sysfs: Path, address: str, driver: str) -> None:
    device = (sysfs / "bus/pci/devices" / address).resolve()
    link = device / "driver"
    unbind(sysfs, address)
    drivers = sysfs / "bus/pci/drivers" / driver
    if not drivers.is_dir():
        drivers.mkdir(parents=True)
        for name in ("bind", "unbind", "new_id", "remove_id"):
            (drivers / name).write_text("")
    link.symlink_to(os.path.relpath(drivers, device))
    (drivers / address).symlink_to(os.path.relpath(device, drivers))


def installed_version() -> str | None:
    """The upstream version of the installed NVIDIA kernel module package (dpkg-query), None without one."""
    for name in DKMS_PACKAGES:
        query = subprocess.run(
            ["dpkg-query", "-W", "-f", "${db:Status-Status} ${Version}", name],
            check=False,
            capture_output=True,
            text=True,
        )
        status, _, version = query.stdout.partition(" ")
        if query.returncode == 0 and status == "installed" and version:
            return version.rsplit("-", 1)[0]
    return None


def version_file(env: Path = NVIDIA_ENV) -> Path:
    """VERSION_FILE of the NVIDIA stand-ins' settings (lab.guest_payload), or the lab's default."""
    lines = env.read_text().splitlines() if env.is_file() else []
    values = dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    return Path(values.get("VERSION_FILE", DEFAULT_VERSION_FILE).strip())


def module_at_boot(sysfs: Path, loads: bool, version: str | None, path: Path) -> str | None:
    """Write or remove the module's version file (module docstring); the version loaded, or None."""
    devices = (sysfs / "bus/pci/devices").iterdir()
    bound = any(is_nvidia_display(d) and current_driver(d) == "nvidia" for d in devices)
    if loads and bound and version is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(VERSION_TEXT.format(version=version))
        return version
    path.unlink(missing_ok=True)
    return None


def fresh_device_nodes(dev: Path = DEV) -> None:
    """A fresh devtmpfs: no /dev/nvidia* node (or /dev/nvidia-caps directory) survives the boot."""
    for node in dev.glob("nvidia*"):
        if node.is_dir() and not node.is_symlink():
            shutil.rmtree(node)
        else:
            node.unlink()


def start_device_unit() -> str:
    """Restart the device node unit as the boot would start it; what happened, for the log."""
    if not Path("/run/systemd/system").is_dir():
        return "no-systemd"
    enabled = subprocess.run(["systemctl", "is-enabled", "--quiet", DEVICE_UNIT], check=False)
    if enabled.returncode != 0:
        return "not-enabled"
    restart = subprocess.run(["systemctl", "restart", DEVICE_UNIT], check=False)
    return "started" if restart.returncode == 0 else "failed"


def domain_type(cmdline: str) -> str:
    """The default DMA domain type of every IOMMU group after a boot with `cmdline` (module docstring)."""
    tokens = cmdline.split()
    if "iommu=pt" in tokens or "iommu.passthrough=1" in tokens:
        return "identity"
    return "DMA" if "iommu.strict=1" in tokens else "DMA-FQ"


def boot_domain_types(sysfs: Path, cmdline: str) -> None:
    for group_type in sysfs.glob("kernel/iommu_groups/*/type"):
        group_type.write_text(domain_type(cmdline) + "\n")


def boot_drivers(sysfs: Path, cmdline: str, nvidia: bool) -> tuple[list[str], list[str]]:
    """Rebind the functions as the boot would (module docstring); (bound to vfio-pci, released from it)."""
    tokens = cmdline.split()
    iommu = "amd_iommu=on" in tokens or "intel_iommu=on" in tokens
    ids, addresses, loads = vfio_selection()
    bound = []
    released = []
    for device in sorted((sysfs / "bus/pci/devices").iterdir()):
        pci_id = (
            f"{(device / 'vendor').read_text().strip()[2:]}:{(device / 'device').read_text().strip()[2:]}"
        )
        current = current_driver(device)
        if loads and iommu and (pci_id in ids or device.name in addresses):
            bind(sysfs, device.name, "vfio-pci")
            bound.append(device.name)
        elif current == "vfio-pci" or (is_nvidia_display(device) and current in (None, "nvidia")):
            driver = own_driver(device, nvidia)
            if driver == current:
                continue
            if driver is None:
                unbind(sysfs, device.name)
            else:
                bind(sysfs, device.name, driver)
            if current == "vfio-pci":
                released.append(f"{device.name}:{driver or '-'}")
    return bound, released


def _get(path: str) -> object:
    done = subprocess.run(
        ["pvesh", "get", path, "--output-format", "json"], check=True, capture_output=True, text=True
    )
    return json.loads(done.stdout)


def _create(path: str) -> None:
    """A task (stop, start): pvesh prints its output and UPID, and exits 0 even when the task failed."""
    subprocess.run(["pvesh", "create", path], check=True, capture_output=True, text=True)


def _vmids() -> list[str]:
    return sorted(conf.stem for conf in QEMU_CONFS.glob("*.conf")) if PVE_CONFIG.is_file() else []


def stop_vms(node: str) -> list[str]:
    """Stop the node's running VMs (a reboot shuts its guests down); the vmids stopped."""
    stopped = []
    for vmid in _vmids():
        status = _get(f"/nodes/{node}/qemu/{vmid}/status/current")
        if isinstance(status, dict) and status.get("status") == "running":
            _create(f"/nodes/{node}/qemu/{vmid}/status/stop")
            stopped.append(vmid)
    return stopped


def start_onboot_vms(node: str) -> list[str]:
    """Start the VMs with `onboot: 1` through the API (pve-guests.service at boot); the vmids started."""
    started = []
    for vmid in _vmids():
        config = _get(f"/nodes/{node}/qemu/{vmid}/config")
        if isinstance(config, dict) and str(config.get("onboot", "0")) == "1" and "lock" not in config:
            _create(f"/nodes/{node}/qemu/{vmid}/status/start")
            started.append(vmid)
    return started


SSHD_NAMES = ("sshd", "sshd-session", "sshd-auth")  # OpenSSH 9.8+ runs a connection as sshd-session
PROC = Path("/proc")
_CLOSE_TIMEOUT_S = 5.0


def _stat(pid: int, proc: Path) -> list[str]:
    # /proc/<pid>/stat: `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
    return (proc / str(pid) / "stat").read_text().rpartition(")")[2].split()


def _parent(pid: int, proc: Path) -> int:
    return int(_stat(pid, proc)[1])


def _processes(proc: Path) -> dict[int, tuple[str, int]]:
    """{pid: (comm, parent pid)} of every process still there while it is read."""
    found = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            pid = int(entry.name)
            try:
                found[pid] = ((entry / "comm").read_text().strip(), _parent(pid, proc))
            except (OSError, IndexError, ValueError):
                continue  # it ended meanwhile
    return found


def ssh_connection_processes(proc: Path = PROC) -> list[int]:
    """The pids of every sshd process below an sshd listener (the per-connection processes), except the
    connection this process runs under (its ancestors)."""
    processes = _processes(proc)
    ancestors, pid = set(), os.getpid()
    while pid in processes and pid not in ancestors:
        ancestors.add(pid)
        pid = processes[pid][1]
    sshd = {pid for pid, (comm, _) in processes.items() if comm in SSHD_NAMES}
    below = [pid for pid in sshd if processes[pid][1] in sshd]
    return sorted(pid for pid in below if pid not in ancestors)


def _tcp_peers(proc: Path) -> dict[str, str]:
    """{socket inode: `address:port` of the remote end} of this network namespace's TCP sockets."""
    peers = {}
    for table in ("tcp", "tcp6"):
        path = proc / "net" / table
        for line in path.read_text().splitlines()[1:] if path.is_file() else []:
            fields = line.split()
            address, port = fields[2].split(":")
            # The kernel prints each 32-bit word of the address in host (little-endian) order.
            raw = b"".join(bytes.fromhex(address[i : i + 8])[::-1] for i in range(0, len(address), 8))
            ip = ipaddress.ip_address(raw)
            shown = ip.ipv4_mapped or ip if isinstance(ip, ipaddress.IPv6Address) else ip
            peers[fields[9]] = f"{shown}:{int(port, 16)}"
    return peers


def _peers_of(pids: list[int], proc: Path) -> list[str]:
    peers = _tcp_peers(proc)
    found = set()
    for pid in pids:
        with suppress(OSError):
            for fd in (proc / str(pid) / "fd").iterdir():
                with suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:[") and target[8:-1] in peers:
                        found.add(peers[target[8:-1]])
    return sorted(found)


def close_ssh_connections(proc: Path = PROC) -> list[str]:
    """End every SSH connection to the node but the caller's (module docstring); the clients' addresses."""
    pids = ssh_connection_processes(proc)
    peers = _peers_of(pids, proc)
    for pid in pids:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + _CLOSE_TIMEOUT_S
    while any(_running(pid, proc) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # a process that exited (a zombie, until reaped) has closed its sockets
    return peers


def _running(pid: int, proc: Path) -> bool:
    try:
        return _stat(pid, proc)[0] != "Z"
    except OSError:
        return False


def detach() -> None:
    """Leave the caller's session and process group: the connection that started the stand-in ending
    (its own or the one it closes) must not end the stand-in with it."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    with suppress(OSError):
        os.setsid()  # refused when already a group leader: the parent's hangup is ignored then


def main() -> int:
    detach()
    closed = close_ssh_connections()
    node = str(json.loads(PVE_CONFIG.read_text())["node"]) if PVE_CONFIG.is_file() else ""
    stopped = stop_vms(node) if node else []
    config = json.loads(CONFIG.read_text())
    cmdline_path = Path(config["cmdline_path"])
    sysfs = Path(config["sysfs_root"])
    cmdline = next_cmdline(config, cmdline_path.read_text().strip())
    cmdline_path.write_text(cmdline + "\n")
    nvidia = host_driver_loads()
    bound, released = boot_drivers(sysfs, cmdline, nvidia)
    boot_domain_types(sysfs, cmdline)
    module = module_at_boot(sysfs, nvidia, installed_version(), version_file())
    fresh_device_nodes()
    unit = start_device_unit()
    started = start_onboot_vms(node) if node else []
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("a") as log:
        log.write(
            f"reboot: cmdline={cmdline!r} vfio-pci={','.join(bound) or '-'}"
            + (f" released={','.join(released)}" if released else "")
            + f" nvidia={module or '-'} {DEVICE_UNIT}={unit}"
            + (f" vms-stopped={','.join(stopped)}" if stopped else "")
            + (f" vms-started={','.join(started)}" if started else "")
            + (f" ssh-closed={','.join(closed)}" if closed else "")
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
