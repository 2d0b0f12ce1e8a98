"""`SecretFiles(paths)`: kind, owner, mode and shape of secret files on the host, never their content.

One shell command for every path: `stat` and `grep -c` counts only, so no key byte reaches pyinfra's output
or log. A path that is missing, a symbolic link or not a regular file is not read at all (a FIFO would
block). Parsing is pure (`parse_secret_files`). `read_local_secret` observes a file on the operator's
machine the same way, and returns its content too: that file's secret is for pvegpu itself.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
from collections.abc import Sequence

from pyinfra.api.facts import FactBase
from typing_extensions import override

from pvegpu.facts.errors import FactParseError
from pvegpu.models.secret_file import SecretFile, SecretFileKind

_ONE_PATH = (
    'if [ -L "$f" ]; then printf "symlink\\t%s\\n" "$f"; '
    'elif [ ! -e "$f" ]; then printf "missing\\t%s\\n" "$f"; '
    'elif [ ! -f "$f" ]; then printf "special\\t%s\\n" "$f"; '
    'else printf "file %s %s %s %s %s\\t%s\\n" "$(stat -c "%u %a %s" -- "$f")" "$(grep -c "" -- "$f")" '
    '"$(grep -c "^\\$" -- "$f")" "$(LC_ALL=C grep -c "[^!-~]" -- "$f")" "$(grep -c "^-" -- "$f")" "$f"; fi'
)

# `file uid mode size lines empty odd dash`: stat's %u and %a (octal), then counts; ASCII digits, bounded.
_FILE_COUNTS = re.compile(r"file ([0-9]{1,10}) ([0-7]{1,4})" + r" ([0-9]{1,19})" * 5)


class SecretFiles(FactBase[dict[str, SecretFile]]):
    """`paths` -> `{path: SecretFile}` (module docstring)."""

    @override
    def command(self, paths: Sequence[str] = ()) -> str:
        words = " ".join(shlex.quote(path) for path in paths)
        return f"for f in {words}; do {_ONE_PATH}; done" if paths else "true"

    @override
    def process(self, output: list[str]) -> dict[str, SecretFile]:
        return parse_secret_files(output)


def parse_secret_files(lines: Sequence[str]) -> dict[str, SecretFile]:
    """`kind<TAB>path` or `file uid mode size lines empty odd dash<TAB>path` per path -> SecretFile by path.

    Raises FactParseError naming the line when one has another shape.
    """
    files: dict[str, SecretFile] = {}
    for line in lines:
        head, tab, path = line.partition("\t")
        words = head.split()
        try:
            kind = SecretFileKind(words[0]) if tab and words else None
        except ValueError:
            kind = None
        counts = _FILE_COUNTS.fullmatch(head) if kind is SecretFileKind.FILE else None
        if counts is not None:
            uid, size, count, empty, odd, dash = (int(counts[i]) for i in (1, 3, 4, 5, 6, 7))
            files[path] = SecretFile(
                path, SecretFileKind.FILE, uid, int(counts[2], 8), size, count, empty, odd, dash
            )
        elif kind is not None and kind is not SecretFileKind.FILE and len(words) == 1:
            files[path] = SecretFile(path, kind)
        else:
            raise FactParseError(f"secret file state: unexpected line {line!r}")
    return files


def read_local_secret(path: str) -> tuple[SecretFile, bytes]:
    """The SecretFile of `path` on this machine, counted as the `SecretFiles` fact counts, and its content
    (b"" unless a regular file). A link or special file is never opened. Raises OSError when the file cannot
    be read (permission) or turns into something else while it is opened."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return SecretFile(path, SecretFileKind.MISSING), b""
    if stat.S_ISLNK(mode):
        return SecretFile(path, SecretFileKind.SYMLINK), b""
    if not stat.S_ISREG(mode):
        return SecretFile(path, SecretFileKind.SPECIAL), b""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as file:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise OSError("it changed while it was opened")
        content = file.read()
    lines = content.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # a final newline ends the last line; it does not start another
    return SecretFile(
        path,
        SecretFileKind.FILE,
        uid=status.st_uid,
        mode=stat.S_IMODE(status.st_mode),
        size=len(content),
        lines=len(lines),
        empty_lines=sum(line == b"" for line in lines),
        odd_lines=sum(any(byte < 0x21 or byte > 0x7E for byte in line) for line in lines),
        dash_lines=sum(line.startswith(b"-") for line in lines),
    ), content
