"""The SGLang service an operator declares: host data key `sglang`.

    ("pve1", {"node": {...}, "sglang": {"model_path": "/models/GLM-5-NVFP4", "tp_size": 4, "pp_size": 2}})

Values that SGLang restricts to a set (quantization, KV-cache dtype, parsers) are checked against the pinned
SGLang's own option table (`sglang_options`), so a typo fails at inventory validation, naming the field.
Whether `tp_size * pp_size` fits the node's GPUs is checked by `pvegpu.plan.sglang.check_layout`, which
needs the GPU count.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pvegpu.models.fields import AbsolutePath, OneLine, has_control_character, shown
from pvegpu.models.recipe import load_recipes
from pvegpu.models.sglang_options import SGLANG_VERSION, load_option_table

SGLANG_KEY = "sglang"

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# systemd EnvironmentFile values without quoting: no whitespace, control character, quotes, backslash or `$`.
_ENV_VALUE = re.compile(r"[^\s\x00-\x1f\x7f\"'\\$]*")
_HOST_PORT = re.compile(r"(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):(?P<port>\d{1,5})")
_HOST = re.compile(r"[A-Za-z0-9.:-]+")
# Each wildcard listen address, and the loopback a probe on the same host connects to instead.
WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}


def _choice_of(flag: str) -> Callable[[str | None], str | None]:
    """A validator accepting None or one of `flag`'s choices in the pinned SGLang."""

    def check(value: str | None) -> str | None:
        choices = load_option_table().option(flag).choices or ()
        if value is not None and value not in choices:
            raise ValueError(
                f"{shown(value)} is not a choice of {flag} in sglang {load_option_table().version} "
                f"(choose from {', '.join(choices)})"
            )
        return value

    return check


def _recipe_name(name: str) -> str:
    names = ("auto", "none", *load_recipes().names())
    if name not in names:
        raise ValueError(f"{shown(name)} is not a recipe (choose from {', '.join(names)})")
    return name


def _check_env(env: dict[str, str]) -> dict[str, str]:
    for name, value in env.items():
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"{shown(name)} is not an environment variable name")
        if name == "SGLANG_LOGGING_CONFIG_PATH":  # pvegpu's logging config keeps the keys out of the journal
            raise ValueError(f"{name} is set by pvegpu (pvegpu.plan.sglang_service); it may not be set here")
        if not _ENV_VALUE.fullmatch(value):
            raise ValueError(
                f"{name}: {shown(value)} may not hold whitespace, control characters, quotes, backslashes "
                "or $"
            )
    return env


# Options whose value is a secret, and the field that keeps it off the command line and out of the unit file
# (None: pvegpu has no such field). An abbreviation of one is refused the same way.
SECRET_OPTIONS = {
    "--api-key": "sglang.api_key_file",
    "--admin-api-key": "sglang.admin_api_key_file",
    "--ssl-keyfile-password": None,
}
_NO_FIELD = "pvegpu has no field for it; use a TLS key without a password"
# pvegpu passes `--config` itself (the keys, see pvegpu.plan.sglang_service); SGLang reads only one.
CONFIG_OPTION = "--config"


def _check_extra(args: tuple[str, ...]) -> tuple[str, ...]:
    for arg in args:
        if not arg or has_control_character(arg):
            raise ValueError(f"{shown(arg)} is not a command-line argument")
    return args


def _check_extra_arg(arg: str) -> str:
    """Refuse an argument that would put a secret in the unit file and on SGLang's command line (`ps`).

    Only the option's name is ever shown, never a value (`--api-key=...` is one argument).
    """
    name = arg.partition("=")[0]
    if len(name) <= 2 or not name.startswith("--"):
        return arg
    if name == CONFIG_OPTION:
        raise ValueError(
            f"{name} is refused: pvegpu passes SGLang's one config file itself (the API keys from systemd "
            "credentials); give options here as arguments"
        )
    for option, field in SECRET_OPTIONS.items():
        if option.startswith(name):
            named = name if name == option else f"{name} (an abbreviation of {option})"
            instead = f"use {field}" if field else _NO_FIELD
            raise ValueError(
                f"{named} is refused: its value is a secret, which would be readable in the unit file "
                f"and on SGLang's command line; {instead}"
            )
    if name == "--watermark-config" and arg.partition("=")[2].lstrip().startswith("{"):
        raise ValueError(
            f"{name} is refused as inline JSON: it holds the watermark keys; give the path of a file "
            "readable only by the service user"
        )
    return arg


def is_loopback(host: str) -> bool:
    """`127.0.0.1`, `::1`, `localhost` and the rest of 127/8 are loopback; anything else is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class SglangSpec(BaseModel):
    """How SGLang serves the model on the node (VM guest, container or host): host data key `sglang`."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    model_path: AbsolutePath = Field(
        default="/models/GLM-5-NVFP4",
        description="Absolute path of the model directory on the serving host (`--model-path`).",
    )
    served_model_name: OneLine = Field(
        default="glm-5",
        min_length=1,
        description="Model name clients use and `/v1/models` returns (`--served-model-name`).",
    )
    tp_size: StrictInt = Field(
        default=8,
        ge=1,
        description=(
            "Tensor-parallel width (`--tp-size`); `tp_size * pp_size` must equal the GPUs of all nodes."
        ),
    )
    pp_size: StrictInt = Field(
        default=1,
        ge=1,
        description=(
            "Pipeline-parallel stages (`--pp-size`): TP8 is `tp_size 8, pp_size 1`; TP4+PP2 is `4, 2`."
        ),
    )
    quantization: Annotated[str | None, AfterValidator(_choice_of("--quantization"))] = Field(
        default="modelopt_fp4",
        description=(
            "Weight quantization (`--quantization`): `modelopt_fp4` for NVFP4 checkpoints; None: auto."
        ),
    )
    kv_cache_dtype: Annotated[str, AfterValidator(_choice_of("--kv-cache-dtype"))] = Field(
        default="bf16",
        description=(
            "KV-cache dtype (`--kv-cache-dtype`); `bf16` is the one reported to work on SM120 (RTX PRO 6000)."
        ),
    )
    mem_fraction_static: float = Field(
        default=0.88,
        gt=0,
        lt=1,
        description="Share of each GPU's memory for weights and KV cache (`--mem-fraction-static`).",
    )
    context_length: StrictInt | None = Field(
        default=131072,
        ge=1,
        description="Maximum context in tokens (`--context-length`); None: the model's own.",
    )
    chunked_prefill_size: StrictInt | None = Field(
        default=8192,
        ge=-1,
        description=(
            "Prefill chunk in tokens (`--chunked-prefill-size`); -1 disables chunking; None: SGLang's."
        ),
    )
    cuda_graph_max_bs: StrictInt | None = Field(
        default=None,
        ge=1,
        description=(
            "Largest decode batch captured as a CUDA graph (`--cuda-graph-max-bs-decode`); None: "
            "`concurrency`."
        ),
    )
    concurrency: StrictInt = Field(
        default=64,
        ge=1,
        description=(
            "The concurrency target: requests served at once (`--max-running-requests`; SGLang 0.5.23 "
            "would cap it at 48 under speculative decoding), and the decode CUDA graphs' largest batch "
            "unless `cuda_graph_max_bs` is set."
        ),
    )
    recipe: Annotated[str, AfterValidator(_recipe_name)] = Field(
        default="auto",
        description=(
            "Serving recipe (`pvegpu/data/sglang/recipes.json`, each value with its source): `auto` picks "
            "the one made for the checkpoint's `config.json` (architecture, quantization) and the GPUs' "
            "compute capability, or none; a recipe's name applies it; `none`: only the fields and "
            "`extra_args`."
        ),
    )
    workload: Literal["latency", "throughput"] = Field(
        default="throughput",
        description=(
            "What the recipe's MoE runner is chosen for (`--moe-runner-backend`): `throughput` (many "
            "requests at once) or `latency` (one or two)."
        ),
    )
    mtp: bool = Field(
        default=True,
        description=(
            "MTP speculative decoding (`--speculative-algorithm NEXTN`) when the recipe has it and the "
            "checkpoint holds the MTP layer; with `pp_size` > 1 it also needs `env` "
            "`SGLANG_ENABLE_PP_SPEC: '1'` (SGLang 0.5.23's opt-in)."
        ),
    )
    reasoning_parser: Annotated[str | None, AfterValidator(_choice_of("--reasoning-parser"))] = Field(
        default="glm45",
        description=(
            "Reasoning-output parser (`--reasoning-parser`): `glm45` serves GLM-4.5 to GLM-5; None: off."
        ),
    )
    tool_call_parser: Annotated[str | None, AfterValidator(_choice_of("--tool-call-parser"))] = Field(
        default="glm47",
        description="Tool-call parser (`--tool-call-parser`): `glm47` serves GLM-4.7 and GLM-5; None: off.",
    )
    trust_remote_code: bool = Field(
        default=False,
        description=(
            "Let the checkpoint run its own Python code (`--trust-remote-code`); only for trusted models."
        ),
    )
    api_key_file: AbsolutePath | None = Field(
        default=None,
        description=(
            "Absolute path, on the serving host, of the API key clients must send (`--api-key`): a regular "
            "file owned by root, mode 0600 or stricter, one line of visible ASCII. Required to listen beyond "
            "loopback. The key reaches SGLang through systemd credentials and a `--config` YAML file in the "
            "service's private runtime directory: never on a command line, never printed."
        ),
    )
    admin_api_key_file: AbsolutePath | None = Field(
        default=None,
        description=(
            "Absolute path, on the serving host, of the key for SGLang's admin endpoints "
            "(`--admin-api-key`), with the same file rules and path to SGLang as `api_key_file`, which it "
            "needs (SGLang's `/server_info` shows both keys to every holder of the API key; pvegpu's service "
            "blanks them there); "
            "None: admin endpoints are off."
        ),
    )
    host: str = Field(
        default="127.0.0.1",
        description=(
            "Address the HTTP server listens on (`--host`); anything but loopback needs `api_key_file`."
        ),
    )
    port: StrictInt = Field(default=30000, ge=1, le=65535, description="HTTP port (`--port`).")
    enable_metrics: bool = Field(
        default=True,
        description=(
            "Serve Prometheus metrics at `/metrics` (`--enable-metrics`). SGLang answers `/metrics` without "
            "the API key, so beyond loopback (`host`) it is off by default and refused when set."
        ),
    )
    nnodes: StrictInt = Field(
        default=1,
        ge=1,
        description="Nodes serving the model together (`--nnodes`); more than 1 needs `dist_init_addr`.",
    )
    node_rank: StrictInt = Field(
        default=0,
        ge=0,
        description=(
            "This node's rank among `nnodes` (`--node-rank`), from 0. Rank 0 hosts `dist_init_addr` and "
            "serves the API, listening (`host`) on that address or all of them: the other ranks serve only "
            "SGLang's `/health` and are ready when theirs and rank 0's answer (rank 0's at "
            "`dist_init_addr`'s host, on `port`)."
        ),
    )
    dist_init_addr: str | None = Field(
        default=None,
        description=(
            "`host:port` of rank 0 where the nodes meet (`--dist-init-addr`); only with `nnodes` > 1."
        ),
    )
    extra_args: tuple[Annotated[str, AfterValidator(_check_extra_arg)], ...] = Field(
        default=(),
        description=(
            "More `sglang serve` arguments, full option names only (e.g. `--watchdog-timeout`, `1200`); "
            "checked against the pinned option table (choices, types, a JSON value parsed as SGLang parses "
            "it, `--cuda-graph-config`'s phases and keys, `--speculative-algorithm` among the algorithms "
            "SGLang knows). Refused: options set by the fields above, options "
            "whose value is a secret (`--api-key`, `--admin-api-key`, `--ssl-keyfile-password`: use the "
            "`*_file` fields), `--config`, and in the `vm` profile the options that need GPU P2P."
        ),
    )
    env: dict[str, str] = Field(
        default={},
        description=(
            "Environment for the service (`NCCL_*`, `SGLANG_*`, ...); overrides pvegpu's NCCL plan and is "
            "shown in the env file. P2P-forcing variables and `NCCL_CONF_FILE` are refused in the `vm` "
            "profile."
        ),
    )

    user: str = Field(
        default="sglang",
        pattern=r"^[a-z_][a-z0-9_-]{0,31}$",
        description="System user the service runs as (created without a login shell).",
    )
    venv: AbsolutePath = Field(
        default="/opt/sglang/venv",
        description=f"Python virtual environment holding the pinned SGLang ({SGLANG_VERSION}).",
    )
    pip_args: tuple[str, ...] = Field(
        default=(),
        description=(
            "Extra `pip install` arguments for SGLang, e.g. `--index-url`, URL or `--no-index`, "
            "`--find-links`, DIR for an offline mirror (the lab's stand-in wheel)."
        ),
    )
    model_repo: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$",
        description=(
            "Hugging Face repository fetched into `model_path` (e.g. `nvidia/GLM-5-NVFP4`) by "
            "`pvegpu-model-fetch.service` on the host: resumed after a cut, every file checked against the "
            "hub's size and sha256, free space checked first; with `model_share`, the node's store's "
            "repository (fetched by the node); None: the model is put there by other means."
        ),
    )
    model_revision: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9]+([._/-][A-Za-z0-9]+)*$",  # git's ref rules: no `..`, no `//`, no end `.`
        description=(
            "Revision of `model_repo` (a commit, tag or branch); None: `main` as it is at the first fetch, "
            "recorded with its commit and kept (a later run does not follow the branch)."
        ),
    )
    hf_endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://[A-Za-z0-9.:\[\]-]+(/[A-Za-z0-9._~/-]*)?$",
        description=(
            "The hub's address for `model_repo` (a mirror, the lab's stand-in); None: huggingface_hub's "
            "default, https://huggingface.co."
        ),
    )
    hf_token_file: AbsolutePath | None = Field(
        default=None,
        description=(
            "Absolute path, on the serving host, of the Hugging Face token for `model_repo` (same file "
            "rules as `api_key_file`); read on the host through `HF_TOKEN_PATH`, never printed."
        ),
    )
    model_share: Literal["virtiofs", "bind", "local"] | None = Field(
        default=None,
        description=(
            "How this host sees its node's model store (the node's `model`; set by `guests_of` and "
            "inventory/baremetal.py / lxc.py from it): `virtiofs`, a VM guest mounting the directory mapping "
            "`pvegpu-models` read-only at `model_path` (a node without virtiofs: fetched here instead); "
            "`bind`, the container's read-only `mpN` at `model_path`; `local`, bare metal, `model_path` is "
            "the store. The model is then the node's, `model_repo` and `model_revision` name it, and nothing "
            "is fetched here. None: `model_repo`, when set, is fetched on this host."
        ),
    )
    start_timeout_s: StrictInt = Field(
        default=1200,
        ge=1,
        description=(
            "Seconds to wait for `/health` and `/v1/models` after a (re)start (GLM-5 takes ~8 min to load); "
            "on a rank > 0, for its `/health` and rank 0's."
        ),
    )

    _extra = field_validator("extra_args")(_check_extra)
    _pip = field_validator("pip_args")(_check_extra)
    _env = field_validator("env")(_check_env)

    @field_validator("chunked_prefill_size")
    @classmethod
    def _chunk_not_zero(cls, size: int | None) -> int | None:
        if size == 0:
            raise ValueError("must be -1 (no chunking) or at least 1 (got 0)")
        return size

    @field_validator("model_revision", "hf_endpoint")
    @classmethod
    def _needs_repo(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("model_repo") is None:
            raise ValueError("applies to `model_repo`, which is not set")
        return value

    @field_validator("admin_api_key_file")
    @classmethod
    def _admin_needs_key(cls, path: str | None, info: ValidationInfo) -> str | None:
        # SGLang 0.5.23 srt/utils/auth.py decide_request_auth: without --api-key the normal endpoints are
        # open, and `/server_info` (srt/entrypoints/http_server.py, build_server_info) shows admin_api_key.
        if path is not None and info.data.get("api_key_file") is None:
            raise ValueError(
                "needs api_key_file: without an API key SGLang answers /server_info, which shows the admin "
                "key, to anyone"
            )
        return path

    @field_validator("host")
    @classmethod
    def _host_needs_key(cls, host: str, info: ValidationInfo) -> str:
        if not _HOST.fullmatch(host):
            raise ValueError(f"{shown(host)} is not a host name or IP address")
        if not is_loopback(host) and info.data.get("api_key_file") is None:
            raise ValueError(
                f"{shown(host)} is not a loopback address: listening beyond this host needs api_key_file"
            )
        return host

    @model_validator(mode="before")
    @classmethod
    def _metrics_off_beyond_loopback(cls, data: Any) -> Any:
        """`enable_metrics` unset on a host listening beyond loopback: off (`_metrics_as_the_api`)."""
        if isinstance(data, dict) and "enable_metrics" not in data:
            host = data.get("host", "127.0.0.1")
            if isinstance(host, str) and _HOST.fullmatch(host) and not is_loopback(host):
                return {**data, "enable_metrics": False}
        return data

    @field_validator("enable_metrics")
    @classmethod
    def _metrics_as_the_api(cls, enabled: bool, info: ValidationInfo) -> bool:
        # SGLang 0.5.23 (srt/utils/auth.py decide_request_auth) lets /health*, /ready* and /metrics* through
        # without a key: beyond loopback they would be open while the API asks for the key.
        host = info.data.get("host")
        if enabled and isinstance(host, str) and not is_loopback(host):
            raise ValueError(
                f"SGLang answers /metrics without the API key, so with host {shown(host)} anyone who reaches "
                "the port reads it: set enable_metrics: false (the default there), or keep host on loopback "
                "and scrape on the host"
            )
        return enabled

    @field_validator("node_rank")
    @classmethod
    def _rank_in_range(cls, rank: int, info: ValidationInfo) -> int:
        nnodes = info.data.get("nnodes")
        if nnodes is not None and rank >= nnodes:
            raise ValueError(f"must be below nnodes ({nnodes}) (got {rank})")
        return rank

    @field_validator("dist_init_addr")
    @classmethod
    def _addr_with_nodes(cls, addr: str | None, info: ValidationInfo) -> str | None:
        nnodes = info.data.get("nnodes")
        if addr is None:
            if nnodes is not None and nnodes > 1:
                raise ValueError(f"is required when nnodes is {nnodes} (host:port of rank 0)")
            return addr
        match = _HOST_PORT.fullmatch(addr)
        if match is None or not 1 <= int(match["port"]) <= 65535:
            raise ValueError(f"{shown(addr)} is not host:port")
        if nnodes == 1:
            raise ValueError("is only used when nnodes is more than 1")
        return addr

    @property
    def dist_init_host(self) -> str:
        """dist_init_addr's host (as written: an IPv6 address keeps its brackets); '' without one."""
        return (self.dist_init_addr or "").rpartition(":")[0]

    @model_validator(mode="after")
    def _leader_reachable(self) -> SglangSpec:
        # The other ranks' readiness asks rank 0's /health at dist_init_addr's host (plan/sglang_service.py).
        if self.nnodes == 1 or self.node_rank != 0 or self.dist_init_addr is None:
            return self
        leader = self.dist_init_host
        if self.host not in WILDCARDS and self.host.strip("[]") != leader.strip("[]"):
            raise ValueError(
                f"host {shown(self.host)}: rank 0 of {self.nnodes} nodes must listen where the other ranks "
                f"reach its /health: on dist_init_addr's host {leader} or {' / '.join(WILDCARDS)}"
            )
        return self


@dataclass(frozen=True)
class ProbeTarget:
    """What SGLang's readiness probe runs with: the venv's `python`, the service's `base_url` and its API
    `key_file`; on a rank other than 0 of several nodes, `leader_url`: rank 0's, whose /health is asked too
    (`pvegpu.plan.sglang_service.probe_target`)."""

    python: str
    base_url: str
    key_file: str | None
    leader_url: str | None = None

    @property
    def answers(self) -> str:
        """What answering means for this target, for the run's lines."""
        if self.leader_url is None:
            return f"{self.base_url}/health and /v1/models"
        return f"{self.base_url}/health, and rank 0 {self.leader_url}/health"
