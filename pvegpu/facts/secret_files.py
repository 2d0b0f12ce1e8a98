"""`SecretFiles(paths)`: kind, owner, mode and shape of secret files on the host, never their content.

One shell command for every path: `stat` and `grep -c` counts only, so no key byte reaches pyinfra's output
or log. A path that is missing, a symbolic link or not a regular file is not read at all (a FIFO would
block). Parsing is pure (`parse_secret_files`).
"""

from __future__ import annotations

import shlex
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
        if kind is SecretFileKind.FILE and len(words) == 8 and all(w.isdigit() for w in words[1:]):
            uid, size, count, empty, odd, dash = (int(words[i]) for i in (1, 3, 4, 5, 6, 7))
            files[path] = SecretFile(path, kind, uid, int(words[2], 8), size, count, empty, odd, dash)
        elif kind is not None and kind is not SecretFileKind.FILE and len(words) == 1:
            files[path] = SecretFile(path, kind)
        else:
            raise FactParseError(f"secret file state: unexpected line {line!r}")
    return files
