"""`sglang serve` argv: exact full-name options per spec, and refusals checked against the 0.5.23 table."""

from __future__ import annotations

import pytest

from pvegpu.models.sglang import SglangSpec
from pvegpu.models.sglang_options import load_option_table
from pvegpu.plan.errors import PlanError
from pvegpu.plan.sglang import (
    SECRETS_CONFIG,
    VM_P2P_OPTIONS,
    check_argv,
    check_layout,
    plan_sglang_argv,
    profile_problems,
    secret_options,
)

TP8 = (
    "--model-path", "/models/GLM-5-NVFP4", "--served-model-name", "glm-5",
    "--tp-size", "8", "--pp-size", "1", "--quantization", "modelopt_fp4", "--kv-cache-dtype", "bf16",
    "--mem-fraction-static", "0.88", "--context-length", "131072", "--chunked-prefill-size", "8192",
    "--max-running-requests", "64", "--cuda-graph-max-bs-decode", "64",
    "--reasoning-parser", "glm45", "--tool-call-parser", "glm47",
    "--host", "127.0.0.1", "--port", "30000", "--enable-metrics",
)  # fmt: skip


def plan_error(spec: SglangSpec, gpus: int = 8, flags: tuple[str, ...] = ()) -> list[str]:
    with pytest.raises(PlanError) as caught:
        plan_sglang_argv(spec, gpus, flags)
    return str(caught.value).splitlines()


def test_create_tp8_defaults() -> None:
    assert plan_sglang_argv(SglangSpec(), 8) == TP8


def test_create_tp4_pp2_with_profile_flags_and_extra_args_last() -> None:
    spec = SglangSpec(tp_size=4, pp_size=2, extra_args=("--watchdog-timeout", "1200"))
    argv = plan_sglang_argv(spec, 8, ("--enable-p2p-check", "--disable-custom-all-reduce"))
    assert argv[4:8] == ("--tp-size", "4", "--pp-size", "2")
    assert argv[8:] == (
        *TP8[8:],
        "--enable-p2p-check", "--disable-custom-all-reduce", "--watchdog-timeout", "1200",
    )  # fmt: skip


def test_create_public_with_api_key_multi_node_and_options_off() -> None:
    spec = SglangSpec(
        model_path="/srv/glm",
        served_model_name="glm",
        pp_size=2,
        trust_remote_code=True,
        quantization=None,
        context_length=None,
        chunked_prefill_size=-1,
        reasoning_parser=None,
        tool_call_parser=None,
        api_key_file="/etc/pvegpu/sglang.key",
        host="0.0.0.0",
        port=8000,
        enable_metrics=False,
        nnodes=2,
        node_rank=1,
        dist_init_addr="10.0.0.1:5000",
    )
    assert plan_sglang_argv(spec, 8) == (
        "--model-path", "/srv/glm", "--served-model-name", "glm", "--trust-remote-code",
        "--tp-size", "8", "--pp-size", "2", "--kv-cache-dtype", "bf16", "--mem-fraction-static", "0.88",
        "--chunked-prefill-size", "-1", "--max-running-requests", "64", "--cuda-graph-max-bs-decode", "64",
        "--host", "0.0.0.0", "--port", "8000", "--config", "/run/sglang/secrets.yaml",
        "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:5000",
    )  # fmt: skip
    assert SECRETS_CONFIG == "/run/sglang/secrets.yaml"
    assert secret_options(spec) == (("api-key", "/etc/pvegpu/sglang.key"),)


def test_create_admin_key_with_the_api_key_reads_the_config_file() -> None:
    both = SglangSpec(api_key_file="/root/api.key", admin_api_key_file="/root/admin.key")
    assert plan_sglang_argv(both, 8)[-3:] == ("--config", "/run/sglang/secrets.yaml", "--enable-metrics")
    assert secret_options(both) == (("api-key", "/root/api.key"), ("admin-api-key", "/root/admin.key"))


def test_vm_p2p_options_are_named_by_the_pinned_table() -> None:
    dests = {option.dest for option in load_option_table().options}
    assert set(VM_P2P_OPTIONS) <= dests


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        (("--enable-mscclpp",),
         "--enable-mscclpp is refused in the vm profile: MSCCL++ all-reduce and all-gather exchange GPU "
         "buffers peer to peer"),
        (("--enable-symm-mem",),
         "--enable-symm-mem is refused in the vm profile: NCCL symmetric memory maps each GPU's buffers into "
         "its peers"),
        (("--enable-torch-symm-mem",),
         "--enable-torch-symm-mem is refused in the vm profile: torch symmetric-memory all-reduce maps "
         "buffers across GPUs (CUDA IPC)"),
        (("--enable-nccl-nvls",),
         "--enable-nccl-nvls is refused in the vm profile: NVLink SHARP needs NVLink/NVSwitch between "
         "the GPUs"),
        (("--flashinfer-allreduce-fusion-backend=trtllm",),
         "--flashinfer-allreduce-fusion-backend is refused in the vm profile: FlashInfer's fused all-reduce "
         "shares IPC buffers between GPUs"),
    ],
)  # fmt: skip
def test_error_vm_profile_refuses_p2p_options(extra: tuple[str, ...], problem: str) -> None:
    spec = SglangSpec(extra_args=("--watchdog-timeout", "1200", *extra))
    assert profile_problems("vm", spec) == (
        f"sglang.extra_args: {problem}, and passed-through GPUs have no P2P",
    )
    assert profile_problems("lxc", spec) == profile_problems("baremetal", spec) == ()


def test_multi_node_layout_counts_every_node() -> None:
    spec = SglangSpec(tp_size=8, pp_size=2, nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:5000")
    assert check_layout(spec, 8) == ()
    assert check_layout(spec.model_copy(update={"pp_size": 1}), 8) == (
        "sglang.tp_size, sglang.pp_size: tp_size 8 x pp_size 1 = 8 GPUs, "
        "but the node has 2 nodes x 8 GPUs = 16",
    )


def test_error_tp_times_pp_is_not_the_gpu_count() -> None:
    assert plan_error(SglangSpec(tp_size=4), 8) == [
        "sglang.tp_size, sglang.pp_size: tp_size 4 x pp_size 1 = 4 GPUs, but the node has 8 GPUs"
    ]
    assert plan_error(SglangSpec(tp_size=4, pp_size=2), 4) == [
        "sglang.tp_size, sglang.pp_size: tp_size 4 x pp_size 2 = 8 GPUs, but the node has 4 GPUs"
    ]


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        (("--enable-ep-moe",), "sglang.extra_args: --enable-ep-moe is not an option of sglang serve 0.5.23"),
        (("--cuda-graph-max-bs", "64"),
         "sglang.extra_args: --cuda-graph-max-bs is ambiguous: it abbreviates --cuda-graph-max-bs-decode, "
         "--cuda-graph-max-bs-prefill; use a full option name"),
        (("--watchdog", "60"),
         "sglang.extra_args: --watchdog abbreviates --watchdog-timeout: use the full option name"),
        (("--disable-cuda-graph",),
         "sglang.extra_args: --disable-cuda-graph is deprecated in sglang 0.5.23: "
         "Deprecated. Use --cuda-graph-backend-{decode,prefill}=disabled instead."),
        (("--fp4-gemm-backend", "b12x"),
         "sglang.extra_args: --fp4-gemm-backend: 'b12x' is not a choice (choose from auto, flashinfer_cudnn, "
         "flashinfer_cutedsl, flashinfer_cutlass, flashinfer_trtllm, marlin)"),
        (("--watchdog-timeout", "soon"),
         "sglang.extra_args: --watchdog-timeout: 'soon' is not a valid float"),
        (("--watchdog-timeout",), "sglang.extra_args: --watchdog-timeout expects a value"),
        (("--preferred-sampling-params", "{temperature: 0}"),
         "sglang.extra_args: --preferred-sampling-params: '{temperature: 0}' is not JSON (Expecting property "
         "name enclosed in double quotes: line 1 column 2 (char 1))"),
        (("--speculative-algorithm", "MTP"),
         "sglang.extra_args: --speculative-algorithm: 'MTP' is not a speculative algorithm of sglang 0.5.23 "
         "(choose from DFLASH, DSPARK, EAGLE, EAGLE3, FROZEN_KV_MTP, NEXTN, NGRAM, NONE, STANDALONE, UNO, "
         "in any case)"),
        (("--forward-hooks", "[NaN]"),
         "sglang.extra_args: --forward-hooks: '[NaN]' is not JSON (NaN is not a JSON value)"),
        (("--sidecar-args", "[1e400]"),
         "sglang.extra_args: --sidecar-args: '[1e400]' is not JSON (1e400 is beyond a double)"),
        (("--sidecar-args", "[1,]"),
         "sglang.extra_args: --sidecar-args: '[1,]' is not JSON (Expecting value: line 1 column 4 (char 3))"),
        (("--lora-paths", "plain", ' {"lora_name": "a"} '),
         "sglang.extra_args: --lora-paths: ' {\"lora_name\": \"a\"} ' is JSON without lora_path"),
        (("--lora-paths", "{a}"),
         "sglang.extra_args: --lora-paths: '{a}' is not JSON (Expecting property name enclosed in double "
         "quotes: line 1 column 2 (char 1))"),
        (("--cuda-graph-config", "[1]"),
         "sglang.extra_args: --cuda-graph-config: '[1]' is not a JSON object of phase -> settings "
         "(got list)"),
        (("--cuda-graph-config", '{"verify": {}}'),
         "sglang.extra_args: --cuda-graph-config: '{\"verify\": {}}' names an unknown phase 'verify' "
         "(phases: decode, prefill)"),
        (("--cuda-graph-config", '{"decode": 8}'),
         "sglang.extra_args: --cuda-graph-config: '{\"decode\": 8}' gives phase decode 8, not a JSON object "
         "of settings"),
        (("--cuda-graph-config", '{"decode": {"max_seq_len": 8}}'),
         "sglang.extra_args: --cuda-graph-config: '{\"decode\": {\"max_seq_len\": 8}}' gives phase decode an "
         "unknown key 'max_seq_len' (keys: backend, max_bs, bs)"),
        (("--cuda-graph-config", '{"prefill": {"backend": "tc_piecewise"}}'),
         "sglang.extra_args: --cuda-graph-config: '{\"prefill\": {\"backend\": \"tc_piecewise\"}}' gives "
         "phase prefill the retired backend tc_piecewise"),
        (("--json-model-override-args", "{index_topk: 1}"),
         "sglang.extra_args: --json-model-override-args: '{index_topk: 1}' is not JSON (Expecting property "
         "name enclosed in double quotes: line 1 column 2 (char 1))"),
        (("--model-loader-extra-config", '{"threads": Infinity}'),
         "sglang.extra_args: --model-loader-extra-config: '{\"threads\": Infinity}' is not JSON (Infinity "
         "is not a JSON value)"),
        (("--tensor-parallel-size", "8"),
         "sglang.extra_args: --tensor-parallel-size is set by sglang.tp_size"),
        (("--disable-custom-all-reduce",),
         "sglang.extra_args: --disable-custom-all-reduce is already set by the profile's plan"),
    ],
)  # fmt: skip
def test_error_extra_args_refused_naming_the_flag(extra: tuple[str, ...], problem: str) -> None:
    flags = ("--enable-p2p-check", "--disable-custom-all-reduce")
    assert plan_error(SglangSpec(extra_args=extra), flags=flags) == [problem]


def test_error_bad_profile_flag_is_named() -> None:
    assert plan_error(SglangSpec(), flags=("--enable-p2p",)) == [
        "sglang: --enable-p2p abbreviates --enable-p2p-check: use the full option name"
    ]


def test_check_argv_mirrors_the_parser() -> None:
    assert (
        check_argv(("--model", "/m", "--ep", "1", "--lora-paths", "a", "b", "--chunked-prefill-size", "-1"))
        == ()
    )
    assert check_argv(("--context-length", "128k", "--kv-cache-dtype=fp8_e4m3", "--model-path", "/m")) == ()
    assert check_argv(("--model-path", "/m", "--preferred-sampling-params", '{"temperature": 0}')) == ()
    # SGLang upper-cases the algorithm and reads NEXTN as EAGLE; json_list_type takes any JSON, a list or not
    assert (
        check_argv(("--model-path", "/m", "--speculative-algorithm", "nextn", "--forward-hooks", "{}")) == ()
    )
    lora = ("--model-path", "/m", "--lora-paths", "a=/x", '{"lora_name": "b", "lora_path": "/y"}')
    assert check_argv(lora) == ()
    graphs = '{"decode": {"max_bs": 64}, "prefill": {"backend": "breakable", "max_seq_len": 4096}}'
    loader = '{"enable_multithread_load": true, "num_threads": 8}'
    assert (
        check_argv(
            ("--model-path", "/m", "--cuda-graph-config", graphs, "--model-loader-extra-config", loader)
        )
        == ()
    )
    assert check_argv(("--tp-size", "8", "stray")) == (
        "'stray' is not an option (a value with no option before it)",
        "--model-path is required",
    )
    assert check_argv(("--model", "/m", "--model-path", "/n", "--enable-metrics=1", "--port", "x")) == (
        "--model-path is given twice (also as --model)",
        "--enable-metrics takes no value (got '1')",
        "--port: 'x' is not a valid int",
    )
    assert check_argv(("--nope", "1", "2"), require=False) == (
        "--nope is not an option of sglang serve 0.5.23",
    )
