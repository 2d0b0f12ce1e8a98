"""What a host shows about a secret file (an API key, a token): its kind, owner, mode and shape. Never its
content: the counts are all pvegpu reads (`pvegpu.facts.secret_files`), and the rules are in
`pvegpu.plan.secret_files`."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class SecretFileKind(enum.Enum):
    MISSING = "missing"
    SYMLINK = "symlink"
    SPECIAL = "special"  # a directory, device, FIFO or socket
    FILE = "file"


@dataclass(frozen=True)
class SecretFile:
    """One path on a host. For a FILE: owner `uid`, permission bits `mode`, `size` in bytes, `lines`
    (a last line without newline counts), `empty_lines`, `odd_lines` (holding anything but visible ASCII:
    space, tab, CR, control or non-ASCII) and `dash_lines` (starting with `-`); all 0 otherwise."""

    path: str
    kind: SecretFileKind
    uid: int = 0
    mode: int = 0
    size: int = 0
    lines: int = 0
    empty_lines: int = 0
    odd_lines: int = 0
    dash_lines: int = 0
