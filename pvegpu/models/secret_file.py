"""A secret file (an API key, a token) as a host shows it: its kind, owner, mode and shape, never its
content (the counts are all pvegpu reads on a remote host, `pvegpu.facts.secret_files`), and the rules it
must meet (`secret_file_problems`). Pure.

A regular file (not a link: whoever owns its directory could point it elsewhere), owned by root (or, for a
file read on the operator's machine, by the user running pyinfra), without group or other permission bits,
holding one non-empty line of visible ASCII (what an HTTP `Authorization` header carries). A key for
SGLang may not start with `-`: its `--config` parser hands the value to argparse, which would take it for
an option. Messages name the file, never a byte of its content.
"""

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


def secret_file_problems(
    field: str, observed: SecretFile, *, for_sglang: bool, operator_uid: int | None = None
) -> tuple[str, ...]:
    """`<field>: <path> ...` per broken rule (module docstring); () when `observed` meets every rule.

    `operator_uid`: the uid running pyinfra, also allowed to own the file (a file read on that machine).
    """
    path = observed.path
    if observed.kind is SecretFileKind.MISSING:
        where = "on the host" if operator_uid is None else "on this machine"
        return (f"{field}: {path} does not exist {where}",)
    if observed.kind is SecretFileKind.SYMLINK:
        return (f"{field}: {path} is a symbolic link; it must be a regular file",)
    if observed.kind is SecretFileKind.SPECIAL:
        return (f"{field}: {path} is not a regular file",)
    problems = []
    if observed.uid not in (0, operator_uid):
        owners = "root (chown root:root)"
        if operator_uid not in (None, 0):
            owners = f"root or by uid {operator_uid}, the user running pyinfra"
        problems.append(f"{path} is owned by uid {observed.uid}; it must be owned by {owners}")
    if observed.mode & 0o077:
        problems.append(
            f"{path} has mode {observed.mode:o}: group or others may read it; it must be 0600 or stricter "
            f"(chmod 600)"
        )
    if observed.size == 0 or observed.lines == observed.empty_lines:
        why = " (an empty API key lets every client in)" if for_sglang else ""
        problems.append(f"{path} is empty: it must hold the secret{why}")
    elif observed.lines > 1:
        problems.append(f"{path} holds {observed.lines} lines; it must hold one line: the secret")
    elif observed.odd_lines:
        problems.append(
            f"{path} holds characters other than visible ASCII (a space, tab, carriage return, control or "
            "non-ASCII character)"
        )
    elif for_sglang and observed.dash_lines:
        problems.append(f"{path} starts with '-', which SGLang's option parser would read as an option")
    return tuple(f"{field}: {problem}" for problem in problems)
