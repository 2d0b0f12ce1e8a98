"""The SGLang systemd service: its command lines and the values its templates are rendered from. Pure.

No key appears in a file pvegpu writes or on a command line. With `api_key_file` (or `admin_api_key_file`)
the unit loads each key file as a systemd credential (`LoadCredential=api-key:<file>`: copied at start into
a directory only the service reads), and `ExecStartPre=` runs pvegpu's small script, as the service user,
that writes the keys as `api-key: "<key>"` into `SECRETS_CONFIG` (mode 0600, in the service's 0700 runtime
directory, removed when it stops); `sglang serve` reads that file with `--config`. SGLang 0.5.23's parser
(`sglang.srt.utils.server_args_config_parser.ConfigArgumentMerger`) needs exactly this: a `.yaml` path as the
word after `--config`, a mapping at the root, each key an option name without `--`, the value a string.
The same script then runs `sglang serve` (`exec_start`), so that `/server_info` does not show the keys.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pvegpu.models.secret_file import SecretFile, secret_file_problems
from pvegpu.models.sglang import WILDCARDS, ProbeTarget, SglangSpec
from pvegpu.plan.sglang import secret_options

ENV_FILE = "/etc/pvegpu/sglang.env"
UNIT_FILE = "/etc/systemd/system/sglang.service"
SECRETS_SCRIPT = "/usr/local/lib/pvegpu/sglang-secrets.py"
SERVICE = "sglang.service"
_PLAIN = re.compile(r"[A-Za-z0-9_./:=,+@-]+")


def systemd_word(word: str) -> str:
    """`word` as one ExecStart argument: plain words as they are, others double-quoted with C escapes;
    `%` and `$` doubled so systemd neither expands specifiers nor variables in them."""
    if not _PLAIN.fullmatch(word):
        word = '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return word.replace("%", "%%").replace("$", "$$")


def exec_start(spec: SglangSpec, argv: Sequence[str]) -> str:
    """The unit's ExecStart: `sglang serve` with the planned options `argv` (from `plan_sglang_argv`).

    With a key, through SECRETS_SCRIPT (`python SECRETS_SCRIPT serve ...`): SGLang 0.5.23's `/server_info`
    answers both keys and the launch command holding them to every holder of the API key, and SGLang offers
    no setting against it, so the script runs SGLang's own `sglang serve` with that answer's keys blanked
    (the template says how)."""
    command = (
        [f"{spec.venv}/bin/python", SECRETS_SCRIPT] if credentials(spec) else [f"{spec.venv}/bin/sglang"]
    )
    return " ".join(systemd_word(word) for word in [*command, "serve", *argv])


def credentials(spec: SglangSpec) -> tuple[tuple[str, str], ...]:
    """`(credential name, key file)` per `LoadCredential=` line; the name is SGLang's option (`api-key`)."""
    return secret_options(spec)


def exec_start_pre(spec: SglangSpec) -> str | None:
    """The `ExecStartPre=` that writes SECRETS_CONFIG from the credentials; None when there is no key."""
    if not credentials(spec):
        return None
    return " ".join(systemd_word(word) for word in (f"{spec.venv}/bin/python", SECRETS_SCRIPT))


def key_files(spec: SglangSpec, *, fetches: bool | None = None) -> tuple[tuple[str, str, bool], ...]:
    """`(field, path, for_sglang)` of every secret file the serving host must hold for `spec`: the hub's token
    when the host fetches `model_repo` itself (`fetches`; None: when it may, as the state read asks: a host
    that sees its node's store through a bind mount or in place never does, a VM guest may fall back)."""
    may_fetch = spec.model_repo is not None and spec.model_share in (None, "virtiofs")
    files = [
        ("sglang.api_key_file", spec.api_key_file, True),
        ("sglang.admin_api_key_file", spec.admin_api_key_file, True),
        (
            "sglang.hf_token_file",
            spec.hf_token_file if (may_fetch if fetches is None else fetches) else None,
            False,
        ),
    ]
    return tuple((field, path, for_sglang) for field, path, for_sglang in files if path is not None)


def key_file_problems(spec: SglangSpec, observed: dict[str, SecretFile], *, fetches: bool) -> tuple[str, ...]:
    """Every problem of the key files of `spec` as the host shows them (`SecretFiles` fact), one line each;
    `fetches`: whether the host fetches the model itself (then its hub token's too)."""
    return tuple(
        problem
        for field, path, for_sglang in key_files(spec, fetches=fetches)
        for problem in secret_file_problems(field, observed[path], for_sglang=for_sglang)
    )


def probe_host(listen: str) -> str:
    """Where the readiness probe connects: loopback for a wildcard address, else the address itself."""
    return WILDCARDS.get(listen, f"[{listen}]" if ":" in listen else listen)


def probe_target(spec: SglangSpec) -> ProbeTarget:
    """The readiness probe's target for `spec`: its venv's python, `probe_host` and port, its API key file.

    A rank other than 0 of several nodes serves no API: SGLang 0.5.23 starts a health-only server on its
    host and port once its schedulers are up (`engine.py` `_launch_subprocesses`,
    `launch_dummy_health_check_server`), so it is ready when that answers /health and rank 0 answers
    /health at dist_init_addr's host, on the port the ranks share (`sglang.port`)."""
    base_url = f"http://{probe_host(spec.host)}:{spec.port}"
    if spec.nnodes == 1 or spec.node_rank == 0 or spec.dist_init_addr is None:
        return ProbeTarget(f"{spec.venv}/bin/python", base_url, spec.api_key_file)
    return ProbeTarget(f"{spec.venv}/bin/python", base_url, None, f"http://{spec.dist_init_host}:{spec.port}")
