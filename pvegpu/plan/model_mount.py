"""The VM guest's mount of its node's model store: the virtiofs tag of the directory mapping `SHARE_ID`,
mounted read-only at `sglang.model_path` by a systemd mount unit, named after the path as systemd requires
(whether the node gives a VM virtiofs at all: plan/model_share.py `virtiofs_available`)."""

from __future__ import annotations

import posixpath

SYSTEMD_UNITS = "/etc/systemd/system"  # where the mount unit is written
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:_.")


def mount_unit_name(path: str) -> str:
    """systemd's unit name for a mount at absolute `path` (`systemd-escape --path --suffix=mount`:
    systemd's unit_name_from_path): `/srv/models/GLM-5` -> `srv-models-GLM\\x2d5.mount`."""
    trimmed = posixpath.normpath(path).strip("/")
    if not trimmed:
        return "-.mount"
    escaped = []
    for index, char in enumerate(trimmed):
        if char == "/":
            escaped.append("-")
        elif char in _PLAIN and not (char == "." and index == 0):
            escaped.append(char)
        else:
            escaped.extend(f"\\x{byte:02x}" for byte in char.encode())
    return "".join(escaped) + ".mount"
