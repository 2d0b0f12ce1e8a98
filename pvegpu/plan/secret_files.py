"""The rules a secret file (API key, token) must meet on the host that uses it. Pure.

A regular file (not a link: whoever owns its directory could point it elsewhere), owned by root, without
group or other permission bits, holding one non-empty line of visible ASCII (what an HTTP `Authorization`
header carries). A key for SGLang may not start with `-`: its `--config` parser hands the value to argparse,
which would take it for an option. Messages name the file, never a byte of its content.
"""

from __future__ import annotations

from pvegpu.models.secret_file import SecretFile, SecretFileKind


def secret_file_problems(field: str, observed: SecretFile, *, for_sglang: bool) -> tuple[str, ...]:
    """`<field>: <path> ...` per broken rule (module docstring); () when `observed` meets every rule."""
    path = observed.path
    if observed.kind is SecretFileKind.MISSING:
        return (f"{field}: {path} does not exist on the host",)
    if observed.kind is SecretFileKind.SYMLINK:
        return (f"{field}: {path} is a symbolic link; it must be a regular file",)
    if observed.kind is SecretFileKind.SPECIAL:
        return (f"{field}: {path} is not a regular file",)
    problems = []
    if observed.uid != 0:
        problems.append(f"{path} is owned by uid {observed.uid}; it must be owned by root (chown root:root)")
    if observed.mode & 0o077:
        problems.append(
            f"{path} has mode {observed.mode:o}: group or others may read it; it must be 0600 or stricter "
            f"(chmod 600)"
        )
    if observed.size == 0 or observed.lines == observed.empty_lines:
        problems.append(f"{path} is empty: it must hold the secret (an empty API key lets every client in)")
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
