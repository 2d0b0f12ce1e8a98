"""`python -m lab`: start, stop, list and enter lab hosts (run as root; see lab/hosts.py).

python -m lab up NAME --topology reference [--mode netns|nspawn] [--replace] [--pve]
python -m lab retopo NAME TOPOLOGY
python -m lab down NAME | --all
python -m lab status
python -m lab ssh NAME [CMD...]
python -m lab seed-vm NODE VMID --esp|--no-esp
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import cast

from lab import boot, fakesys, guest_payload, hosts
from lab.errors import LabError
from lab.pve import node as pve_node
from lab.pve import seed


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lab", description="pvegpu lab hosts")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start a host (overlay root, fake sysfs, sshd) and wait for its sshd")
    up.add_argument("name")
    up.add_argument("--topology", required=True, choices=sorted(fakesys.TOPOLOGIES))
    up.add_argument(
        "--mode",
        default="netns",
        choices=hosts.MODES,
        help="netns: sshd only, fake sysfs at /sys; nspawn: real systemd, fake sysfs at /opt/fakesys",
    )
    up.add_argument("--replace", action="store_true", help="stop a host of the same name first")
    up.add_argument(
        "--pve",
        action="store_true",
        help="a Proxmox node: the pvesh stand-in and a lab hypervisor that starts its VMs' guests (lab/pve)",
    )
    up.add_argument(
        "--boot",
        choices=boot.LAYOUTS,
        help="a bootloader layout (GRUB or systemd-boot) and the lab's reboot stand-in (lab/boot.py)",
    )
    retopo = commands.add_parser(
        "retopo",
        help="the BIOS changed: a Proxmox node's VMs stop, the fake sysfs is rewritten, the node boots again",
    )
    retopo.add_argument("name")
    retopo.add_argument("topology", choices=sorted(fakesys.TOPOLOGIES))
    down = commands.add_parser("down", help="stop hosts and remove everything they left")
    which = down.add_mutually_exclusive_group(required=True)
    which.add_argument("name", nargs="?")
    which.add_argument("--all", action="store_true")
    seeding = commands.add_parser(
        "seed-vm", help="an installed i440FX/SeaBIOS VM (stopped) on a Proxmox lab node (lab/pve/seed.py)"
    )
    seeding.add_argument("name")
    seeding.add_argument("vmid", type=int)
    seeding.add_argument(
        "--esp",
        action=argparse.BooleanOptionalAction,
        required=True,
        help="whether its disk has an EFI system partition with a boot loader",
    )
    commands.add_parser("status", help="list the lab's hosts")
    ssh = commands.add_parser("ssh", help="run a command on a host (or a shell), host key checked")
    ssh.add_argument("name")
    ssh.add_argument("cmd", nargs=argparse.REMAINDER)
    return parser


def _describe(host: hosts.LabHost) -> str:
    state = "up" if host.is_alive() else "DEAD (python -m lab down " + host.name + ")"
    return (
        f"{host.name}\t{state}\t{host.mode}\troot@{host.address}\ttopology={host.topology}\t"
        f"sysfs_root={host.sysfs_root}\tcmdline_path={host.cmdline_path}\troot={host.root}"
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "up":
            mode = cast(hosts.Mode, args.mode)
            if args.pve:
                if args.replace:
                    hosts.down(args.name)
                host = pve_node.up(args.name, args.topology, mode)
                # The stand-in NVIDIA repository, for the host driver of the `lxc` / `baremetal` profiles.
                guest_payload.install(host)
            else:
                host = hosts.up(args.name, args.topology, mode, replace=args.replace)
            if args.boot:
                boot.install(host, args.boot)
            print(_describe(host))
        elif args.command == "retopo":
            print(_describe(pve_node.bios_change(args.name, args.topology)))
        elif args.command == "down":
            names = hosts.down_all() if args.all else [args.name] if hosts.down(args.name) else []
            print("stopped: " + (" ".join(names) or "nothing"))
        elif args.command == "seed-vm":
            print(seed.seed_vm(args.name, args.vmid, args.esp))
        elif args.command == "status":
            for host in hosts.list_hosts():
                print(_describe(host))
        else:
            argv_ssh = hosts.ssh_argv(hosts.get_host(args.name), *args.cmd)
            os.execvp(argv_ssh[0], argv_ssh)
    except LabError as error:
        print(f"lab: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
