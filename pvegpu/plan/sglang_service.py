"""The SGLang systemd service: its ExecStart line and the values its templates are rendered from. Pure.

The API key never appears in a file pvegpu writes or a command it runs: with `api_key_file` the unit loads
the file as a systemd credential (`LoadCredential=api-key:<file>`, readable by the service only) and a
`/bin/sh -c` wrapper passes it to `--api-key` at start. Without it, ExecStart runs `sglang serve` directly.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from pvegpu.models.sglang import SglangSpec
from pvegpu.plan.sglang import API_KEY_ARG

ENV_FILE = "/etc/pvegpu/sglang.env"
UNIT_FILE = "/etc/systemd/system/sglang.service"
SERVICE = "sglang.service"
CREDENTIAL = "api-key"
_PLAIN = re.compile(r"[A-Za-z0-9_./:=,+@-]+")
_READ_KEY = '"$(cat "$CREDENTIALS_DIRECTORY/' + CREDENTIAL + '")"'


def systemd_word(word: str) -> str:
    """`word` as one ExecStart argument: plain words as they are, others double-quoted with C escapes;
    `%` and `$` doubled so systemd neither expands specifiers nor variables in them."""
    if not _PLAIN.fullmatch(word):
        word = '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return word.replace("%", "%%").replace("$", "$$")


def exec_start(spec: SglangSpec, argv: Sequence[str]) -> str:
    """The unit's ExecStart value for the planned options `argv` (from `plan_sglang_argv`)."""
    command = [f"{spec.venv}/bin/sglang", "serve"]
    words = list(argv)
    if API_KEY_ARG not in words:
        return " ".join(systemd_word(word) for word in [*command, *words])
    at = words.index(API_KEY_ARG)
    del words[at - 1 : at + 1]  # `--api-key ${SGLANG_API_KEY}`: the wrapper passes the credential instead
    script = " ".join(["exec", *map(shlex.quote, [*command, *words]), "--api-key", _READ_KEY])
    return f"/bin/sh -c {systemd_word(script)}"


def probe_host(listen: str) -> str:
    """Where the readiness probe connects: loopback for a wildcard address, else the address itself."""
    wildcard = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}
    return wildcard.get(listen, f"[{listen}]" if ":" in listen else listen)
