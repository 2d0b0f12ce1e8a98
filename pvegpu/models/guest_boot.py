"""What the QEMU guest agent shows of a running guest's boot setup (read through the Proxmox API): its
filesystems, whether given boot loader files exist, its network interfaces. Plain observed data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pvegpu.models.pve import GuestInterface


@dataclass(frozen=True)
class GuestFilesystem:
    """One mounted filesystem (`agent/get-fsinfo`): device name (`sda15`), mount point, type (`vfat`)."""

    name: str
    mountpoint: str
    type: str


@dataclass(frozen=True)
class GuestBoot:
    """A guest as its agent showed it. `agent_error` is Proxmox's message when the agent did not answer
    (`QEMU guest agent is not running`); then nothing else was read. `files`: each loader path asked for
    (`agent/file-read`) -> whether it exists with content. `os_id`: `ID` of its /etc/os-release; `nics`: its
    interfaces (`agent/network-get-interfaces`)."""

    agent_error: str | None = None
    filesystems: tuple[GuestFilesystem, ...] = ()
    files: Mapping[str, bool] = field(default_factory=dict)
    nics: tuple[GuestInterface, ...] = ()
    os_id: str | None = None
