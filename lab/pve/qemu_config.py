"""What every part of a lab VM start's QEMU command line reads from the VM's config (lab/pve/qemu_cmdline.py):
property strings, booleans, the Windows version and the machine. LAB STAND-IN for qemu-server's helpers;
this is NOT Proxmox."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

NODE_QEMU = (10, 1)  # Proxmox VE 9.1's pve-qemu-kvm: the machine version of an unpinned VM


class QemuCmdlineError(Exception):
    """A config this module cannot build (qemu-server's `die` texts where it has one)."""


def parse_property_string(text: str, default_key: str | None = None) -> dict[str, str]:
    """`key=value,...` (PVE::JSONSchema parse_property_string, without the schema): a part without `=` is the
    default key's value."""
    values: dict[str, str] = {}
    for part in text.split(",") if text else []:
        key, sep, value = part.partition("=")
        if not sep:
            if default_key is None:
                raise QemuCmdlineError(f"value without key, but schema does not define a default key: {part}")
            key, value = default_key, part
        values[key] = value
    return values


def _version(text: str) -> tuple[int, int] | None:
    match = re.search(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def windows_version(ostype: str | None) -> int:
    """QemuServer::Helpers::windows_version."""
    if ostype in ("wxp", "w2k3", "w2k"):
        return 5
    if ostype in ("w2k8", "wvista"):
        return 6
    match = re.fullmatch(r"win(\d+)", ostype or "")
    return int(match.group(1)) if match else 0


def as_bool(value: str | None, default: bool) -> bool:
    if value is None:
        return default
    return value.lower() in ("1", "on", "yes", "true")


@dataclass(frozen=True)
class Machine:
    """Machine.pm get_vm_machine: the `type=` printed (without its +pve revision) and the machine version."""

    type: str
    version: tuple[int, int]
    q35: bool

    def at_least(self, major: int, minor: int) -> bool:
        """The `$version_guard` / min_version of config_to_command (the +pve revision is not modelled)."""
        return self.version >= (major, minor)


def vm_machine(conf: Mapping[str, str], kvm_version: tuple[int, int] = NODE_QEMU) -> Machine:
    """The machine a start uses: an unpinned `pc`/`q35` is the node's QEMU version, a Windows one is pinned to
    5.1 (or its `meta` creation-qemu from 9.1 on), a pinned `pc-q35-X.Y[+pveN]` is X.Y."""
    machine_type = parse_property_string(conf.get("machine", ""), "type").get("type") or "pc"
    q35 = "q35" in machine_type
    if machine_type in ("pc", "q35"):
        if windows_version(conf.get("ostype")):
            created = _version(parse_property_string(conf.get("meta", "")).get("creation-qemu", ""))
            base = created if created is not None and created >= (9, 1) else (5, 1)
            flavour = "pc-q35" if q35 else "pc-i440fx"
            return Machine(f"{flavour}-{base[0]}.{base[1]}", base, q35)
        return Machine(machine_type, kvm_version, q35)
    pinned = _version(machine_type)
    if pinned is None:
        raise QemuCmdlineError(f"unable to parse machine version '{machine_type}'")
    return Machine(re.sub(r"\+pve\d+$", "", machine_type), pinned, q35)
