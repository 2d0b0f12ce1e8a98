"""An NCCL conf file (`/etc/nccl.conf`, `~/.nccl.conf`) read as NCCL reads it: src/misc/param.cc `setEnvFile`.

Pure. Each line that does not start with `#` and holds a `=` sets the variable named by everything before
the first `=` to everything after it, nothing trimmed (`NCCL_P2P_LEVEL = SYS` names `NCCL_P2P_LEVEL `, which
NCCL never reads), name and value cut to 1,023 characters; only the line's final newline is dropped.
"""

from __future__ import annotations

from pvegpu.models.nccl import ConfSetting

_LIMIT = 1023  # the name and value buffers are 1,024 bytes with their terminating NUL


def parse_nccl_conf(text: str) -> tuple[ConfSetting, ...]:
    """Every setting of the file's `text`, in order (a name set twice appears twice; NCCL keeps the first)."""
    settings = []
    for number, line in enumerate(text.split("\n"), start=1):
        name, equals, value = line.partition("=")
        if line.startswith("#") or not equals:
            continue
        settings.append(ConfSetting(number, name[:_LIMIT], value[:_LIMIT]))
    return tuple(settings)
