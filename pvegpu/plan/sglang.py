"""The `sglang serve` command line a spec asks for, checked against the pinned SGLang's option table.

Pure. `plan_sglang_argv(spec, gpu_count, flags)` returns the options that follow `sglang serve` (the
entry point SGLang 0.5.23 recommends; `python -m sglang.launch_server` is a deprecated alias), always with
full option names: SGLang's parser accepts unique prefixes, and a prefix that is unique today is ambiguous
tomorrow (`--cuda-graph-max-bs` in 0.5.20). `check_argv` refuses what the real parser would, plus
abbreviations, deprecated options and an option given twice. `profile_problems` refuses the extra arguments a
profile forbids (GPU P2P features in `vm`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from pvegpu.models.fields import shown
from pvegpu.models.sglang import SGLANG_KEY, SglangSpec
from pvegpu.models.sglang_options import (
    OptionTable,
    SglangOption,
    ValueRules,
    load_option_table,
)
from pvegpu.plan.errors import PlanError

# The keys never appear in the plan: SGLang reads them from this YAML file (`--config`), which the service
# writes at each start from its systemd credentials into its private runtime directory
# (`pvegpu.plan.sglang_service`). SGLang 0.5.23 turns each `option: value` of it into `--option value`.
RUNTIME_DIRECTORY = "sglang"
SECRETS_CONFIG = f"/run/{RUNTIME_DIRECTORY}/secrets.yaml"

# Options (by dest, each in the pinned option table) that make SGLang move data between GPUs peer to peer;
# the `vm` profile refuses them: passed-through GPUs have no P2P (NCCL uses shared memory there), and a
# P2P path in a VM hangs or corrupts data (NVIDIA/nccl #2335). The profile's plan already turns SGLang's
# custom all-reduce off (`--disable-custom-all-reduce`, pvegpu.plan.nccl).
VM_P2P_OPTIONS = {
    "enable_mscclpp": "MSCCL++ all-reduce and all-gather exchange GPU buffers peer to peer",
    "enable_symm_mem": "NCCL symmetric memory maps each GPU's buffers into its peers",
    "enable_torch_symm_mem": "torch symmetric-memory all-reduce maps buffers across GPUs (CUDA IPC)",
    "enable_nccl_nvls": "NVLink SHARP needs NVLink/NVSwitch between the GPUs",
    "flashinfer_allreduce_fusion_backend": "FlashInfer's fused all-reduce shares IPC buffers between GPUs",
    "enable_flashinfer_allreduce_fusion": "FlashInfer's fused all-reduce shares IPC buffers between GPUs",
    "enable_aiter_allreduce_fusion": "the AITER fused all-reduce is a custom all-reduce over IPC buffers",
}

# Option dest -> the SglangSpec field that sets it; extra_args may not set these.
_OWNED = {
    "model_path": "model_path",
    "served_model_name": "served_model_name",
    "tp_size": "tp_size",
    "pp_size": "pp_size",
    "quantization": "quantization",
    "kv_cache_dtype": "kv_cache_dtype",
    "mem_fraction_static": "mem_fraction_static",
    "context_length": "context_length",
    "chunked_prefill_size": "chunked_prefill_size",
    "cuda_graph_max_bs_decode": "cuda_graph_max_bs",
    "max_running_requests": "concurrency",
    "reasoning_parser": "reasoning_parser",
    "tool_call_parser": "tool_call_parser",
    "trust_remote_code": "trust_remote_code",
    "host": "host",
    "port": "port",
    "enable_metrics": "enable_metrics",
    "nnodes": "nnodes",
    "node_rank": "node_rank",
    "dist_init_addr": "dist_init_addr",
}

_INT = re.compile(r"-?\d+")
_HUMAN_INT = re.compile(r"\d+(\.\d+)?([kKmMgGtT]i?)?")


def check_layout(spec: SglangSpec, gpu_count: int) -> tuple[str, ...]:
    """Problems (`sglang.tp_size, sglang.pp_size: ...`) when tp_size x pp_size is not every node's GPUs."""
    total = gpu_count * spec.nnodes
    if spec.tp_size * spec.pp_size == total:
        return ()
    has = f"{gpu_count} GPUs" if spec.nnodes == 1 else f"{spec.nnodes} nodes x {gpu_count} GPUs = {total}"
    return (
        f"{SGLANG_KEY}.tp_size, {SGLANG_KEY}.pp_size: tp_size {spec.tp_size} x pp_size {spec.pp_size} = "
        f"{spec.tp_size * spec.pp_size} GPUs, but the node has {has}",
    )


def secret_options(spec: SglangSpec) -> tuple[tuple[str, str], ...]:
    """`(option, key file)` for each key the spec gives SGLang: `("api-key", spec.api_key_file)`, and
    `("admin-api-key", ...)`. The option is SGLang's, without `--`, as its `--config` YAML spells it."""
    files = (("api-key", spec.api_key_file), ("admin-api-key", spec.admin_api_key_file))
    return tuple((option, path) for option, path in files if path is not None)


def profile_problems(profile: str, spec: SglangSpec, table: OptionTable | None = None) -> tuple[str, ...]:
    """`sglang.extra_args: <option> is refused in the vm profile: <reason>` for each extra argument that
    needs GPU P2P (`VM_P2P_OPTIONS`) when `profile` is `vm`; () otherwise."""
    if profile != "vm":
        return ()
    by_name = (table or load_option_table()).by_name()
    problems = []
    for arg in spec.extra_args:
        option = by_name.get(arg.partition("=")[0])
        if option is not None and option.dest in VM_P2P_OPTIONS:
            problems.append(
                f"{SGLANG_KEY}.extra_args: {option.names[0]} is refused in the vm profile: "
                f"{VM_P2P_OPTIONS[option.dest]}, and passed-through GPUs have no P2P"
            )
    return tuple(problems)


def plan_sglang_argv(spec: SglangSpec, gpu_count: int, flags: Sequence[str] = ()) -> tuple[str, ...]:
    """The full-name options of `sglang serve` for `spec` on a node with `gpu_count` GPUs.

    `flags` are the profile's flags from `pvegpu.plan.nccl` (placed before `spec.extra_args`).
    Raises PlanError, one `sglang.<field>: message` line per problem, when the layout does not fit the
    GPUs, an extra argument is unknown, abbreviated, deprecated, badly valued or sets a field's option.
    """
    problems = list(check_layout(spec, gpu_count))
    table = load_option_table()
    argv = [*_spec_options(spec), *flags]
    problems.extend(f"{SGLANG_KEY}: {problem}" for problem in check_argv(argv, table))
    extra = spec.extra_args
    problems.extend(f"{SGLANG_KEY}.extra_args: {p}" for p in check_argv(extra, table, require=False))
    by_name = table.by_name()
    given = {option.dest for option in map(by_name.get, argv) if option is not None}
    for arg in extra:
        option = by_name.get(arg.partition("=")[0])
        if option is None:
            continue
        if option.dest in _OWNED:
            problems.append(f"{SGLANG_KEY}.extra_args: {arg} is set by {SGLANG_KEY}.{_OWNED[option.dest]}")
        elif option.dest in given:
            problems.append(f"{SGLANG_KEY}.extra_args: {arg} is already set by the profile's plan")
    if problems:
        raise PlanError("\n".join(problems))
    return (*argv, *extra)


def _spec_options(spec: SglangSpec) -> list[str]:
    argv = ["--model-path", spec.model_path, "--served-model-name", spec.served_model_name]
    if spec.trust_remote_code:
        argv.append("--trust-remote-code")
    argv += ["--tp-size", str(spec.tp_size), "--pp-size", str(spec.pp_size)]
    if spec.quantization is not None:
        argv += ["--quantization", spec.quantization]
    argv += ["--kv-cache-dtype", spec.kv_cache_dtype, "--mem-fraction-static", str(spec.mem_fraction_static)]
    optional = (
        ("--context-length", spec.context_length),
        ("--chunked-prefill-size", spec.chunked_prefill_size),
        ("--max-running-requests", spec.concurrency),
        ("--cuda-graph-max-bs-decode", spec.cuda_graph_max_bs or spec.concurrency),
        ("--reasoning-parser", spec.reasoning_parser),
        ("--tool-call-parser", spec.tool_call_parser),
    )
    argv += [word for flag, value in optional if value is not None for word in (flag, str(value))]
    argv += ["--host", spec.host, "--port", str(spec.port)]
    if secret_options(spec):
        argv += ["--config", SECRETS_CONFIG]
    if spec.enable_metrics:
        argv.append("--enable-metrics")
    if spec.nnodes > 1:
        argv += ["--nnodes", str(spec.nnodes), "--node-rank", str(spec.node_rank)]
        argv += ["--dist-init-addr", str(spec.dist_init_addr)]
    return argv


def check_argv(
    argv: Sequence[str], table: OptionTable | None = None, *, require: bool = True
) -> tuple[str, ...]:
    """Every problem SGLang's parser, or pvegpu's stricter rules, find in `argv` (options after `serve`).

    Refused: a word that is not an option, an unknown option, an abbreviation (unique or ambiguous), a
    deprecated option, an option given twice, a missing or unexpected value, a value outside the choices
    or not of the option's number type, and (with `require`) a missing required option. Each problem
    names the option. `table` defaults to the pinned SGLang's.
    """
    table = table or load_option_table()
    by_name = table.by_name()
    problems: list[str] = []
    seen: dict[str, str] = {}
    index = 0
    while index < len(argv):
        token = argv[index]
        index += 1
        if not token.startswith("--"):
            problems.append(f"{shown(token)} is not an option (a value with no option before it)")
            continue
        name, has_inline, inline = token.partition("=")
        option = by_name.get(name)
        if option is None:
            problems.append(_unknown(name, by_name, table.version))
            index = _skip_values(argv, index)
            continue
        if option.deprecated is not None:
            problems.append(f"{name} is deprecated in sglang {table.version}: {option.deprecated}")
        if option.dest in seen:
            problems.append(f"{name} is given twice (also as {seen[option.dest]})")
        seen[option.dest] = name
        if not option.takes_value:
            if has_inline:
                problems.append(f"{name} takes no value (got {shown(inline)})")
            continue
        values, index = _values(option, argv, index, inline if has_inline else None)
        problems.extend(_value_problems(name, option, values, table))
    if require:
        missing = [option for option in table.options if option.required and option.dest not in seen]
        problems.extend(f"{option.names[0]} is required" for option in missing)
    return tuple(problems)


def _unknown(name: str, by_name: dict[str, SglangOption], version: str) -> str:
    candidates = sorted(n for n in by_name if n.startswith(name))
    canonical = sorted({by_name[n].names[0] for n in candidates})
    if len(canonical) > 1:
        return f"{name} is ambiguous: it abbreviates {', '.join(canonical)}; use a full option name"
    if canonical:
        return f"{name} abbreviates {canonical[0]}: use the full option name"
    return f"{name} is not an option of sglang serve {version}"


def _skip_values(argv: Sequence[str], index: int) -> int:
    while index < len(argv) and not argv[index].startswith("--"):
        index += 1
    return index


def _values(
    option: SglangOption, argv: Sequence[str], index: int, inline: str | None
) -> tuple[list[str], int]:
    if inline is not None:
        return [inline], index
    if option.nargs in ("+", "*"):
        end = _skip_values(argv, index)
        return list(argv[index:end]), end
    if index < len(argv) and not argv[index].startswith("--"):
        return [argv[index]], index + 1
    return [], index


def _value_problems(name: str, option: SglangOption, values: list[str], table: OptionTable) -> list[str]:
    if not values:
        return [] if option.nargs in ("?", "*") else [f"{name} expects a value"]
    problems = []
    for value in values:
        if option.choices is not None and value not in option.choices:
            choices = ", ".join(option.choices)
            problems.append(f"{name}: {shown(value)} is not a choice (choose from {choices})")
        elif (problem := _parsed_value_problem(option, value, table)) is not None:
            problems.append(f"{name}: {shown(value)} {problem}")
        elif not _fits_type(option.type, value):
            problems.append(f"{name}: {shown(value)} is not a valid {option.type}")
    return problems


def _parsed_value_problem(option: SglangOption, value: str, table: OptionTable) -> str | None:
    """Why SGLang refuses `value` where it parses the string itself, or None: `json.loads` for the `loads`
    type, orjson for `json_list_type`, `--cuda-graph-config`'s phases and keys, `--lora-paths`' JSON
    entries, the JSON options read at start, and the speculative algorithm (upper-cased, at start)."""
    rules = table.values
    if option.dest == "speculative_algorithm":
        if value.upper() in rules.speculative_algorithms:
            return None
        known = ", ".join(sorted(rules.speculative_algorithms))
        return f"is not a speculative algorithm of sglang {table.version} (choose from {known}, in any case)"
    if option.type == "parse_cuda_graph_config_arg":
        return _cuda_graph_config_problem(value, rules)
    if option.action == "LoRAPathAction":
        return _lora_path_problem(value.strip())
    parser = {"loads": "loads", "json_list_type": "orjson"}.get(option.type or "")
    parser = parser or rules.json_at_start.get(option.dest)
    return None if parser is None else _loaded(value, strict=parser == "orjson")[1]


def _cuda_graph_config_problem(value: str, rules: ValueRules) -> str | None:
    config, error = _loaded(value, strict=False)
    if error is not None:
        return error
    if not isinstance(config, dict):
        return f"is not a JSON object of phase -> settings (got {type(config).__name__})"
    return next(filter(None, (_phase_problem(p, s, rules) for p, s in config.items())), None)


def _phase_problem(phase: str, settings: object, rules: ValueRules) -> str | None:
    allowed = rules.cuda_graph_config_keys.get(phase)
    if allowed is None:
        return f"names an unknown phase {shown(phase)} (phases: {', '.join(rules.cuda_graph_config_keys)})"
    if not isinstance(settings, dict):
        return f"gives phase {phase} {json.dumps(settings)}, not a JSON object of settings"
    if (unknown := next((key for key in settings if key not in allowed), None)) is not None:
        return f"gives phase {phase} an unknown key {shown(unknown)} (keys: {', '.join(allowed)})"
    if settings.get("backend") in rules.cuda_graph_retired_backends:
        return f"gives phase {phase} the retired backend {settings['backend']}"
    return None


def _lora_path_problem(stripped: str) -> str | None:
    if not (stripped.startswith("{") and stripped.endswith("}")):
        return None
    entry, error = _loaded(stripped, strict=False)
    if error is not None:
        return error
    missing = [key for key in ("lora_name", "lora_path") if key not in entry]
    return f"is JSON without {' and '.join(missing)}" if missing else None


def _loaded(value: str, *, strict: bool) -> tuple[Any, str | None]:
    """(the JSON value, None), or (None, why it is not JSON): `json.loads`, or with `strict` orjson's rules
    (no NaN, Infinity or number beyond a double, which json.loads takes)."""
    try:
        if strict:
            return json.loads(value, parse_constant=_no_constant, parse_float=_finite_float), None
        return json.loads(value), None
    except ValueError as error:
        return None, f"is not JSON ({error})"


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON value")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"{text} is beyond a double")
    return number


def _fits_type(type_name: str | None, value: str) -> bool:
    if type_name == "int":
        return _INT.fullmatch(value) is not None
    if type_name == "human_readable_int":
        return _INT.fullmatch(value) is not None or _HUMAN_INT.fullmatch(value) is not None
    if type_name == "float":
        try:
            float(value)
        except ValueError:
            return False
    return True
