"""Field types shared by every spec: PCI ids, absolute paths, one-line text, and how a bad value is shown in a
message."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

_PCI_ID = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{4}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def normalize_pci_id(value: str) -> str:
    """`10DE:2BB1` -> `10de:2bb1`; ValueError for anything but two groups of 4 hex digits."""
    if not _PCI_ID.fullmatch(value):
        raise ValueError(f"{shown(value)} is not a vendor:device id like 10de:2bb1")
    # sysfs and Proxmox's live mapping check use lowercase; accept either case, store lowercase.
    return value.lower()


def check_absolute(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"must be an absolute path (got {shown(value)})")
    return value


def check_one_line(value: str) -> str:
    """ValueError for a value holding a control character: a newline would end the unit-file line or the
    comment it is written on and start one of its own (`ExecStartPre=...`), a NUL cuts it."""
    found = _CONTROL.search(value)
    if found is not None:
        raise ValueError(
            f"{shown(value)} holds a control character ({found.group()!r}), which pvegpu will not write "
            "into a unit file or a command"
        )
    return value


def has_control_character(value: str) -> bool:
    """Whether `value` holds a control character (U+0000-U+001F, U+007F)."""
    return _CONTROL.search(value) is not None


def shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def matching(pattern: re.Pattern[str], what: str) -> AfterValidator:
    """A validator that accepts a string only when `pattern` matches all of it: `<value> is not <what>`."""

    def check(value: str) -> str:
        if not pattern.fullmatch(value):
            raise ValueError(f"{shown(value)} is not {what}")
        return value

    return AfterValidator(check)


PciId = Annotated[str, AfterValidator(normalize_pci_id)]
# Every value a spec hands to a unit file or a command: one line, no control character.
OneLine = Annotated[str, AfterValidator(check_one_line)]
AbsolutePath = Annotated[str, AfterValidator(check_absolute), AfterValidator(check_one_line)]
