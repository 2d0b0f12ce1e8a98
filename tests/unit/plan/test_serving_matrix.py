"""The whole `sglang serve` argv for GLM-5-NVFP4 across the serving matrix: with and without the MTP layer,
each workload, each profile (a VM with and without proven P2P, lxc, baremetal), TP8 and TP4+PP2 (MTP refused
without SGLang 0.5.23's opt-in), one node and ranks 0 and 1 of two; every argv accepted by the pinned option
table (plan_sglang_argv checks it)."""

from __future__ import annotations

import itertools

import pytest

from pvegpu.models.recipe import Checkpoint
from pvegpu.models.sglang import SglangSpec
from pvegpu.plan.errors import PlanError
from pvegpu.plan.nccl import plan_nccl
from pvegpu.plan.recipe import plan_recipe
from pvegpu.plan.sglang import plan_sglang_argv

GPUS = ("10de:2bb1",) * 8
MODEL = "/models/GLM-5-NVFP4"
WITH_MTP = Checkpoint(MODEL, ("GlmMoeDsaForCausalLM",), "NVFP4", 78, 1, frozenset(range(79)))
WITHOUT_MTP = Checkpoint(MODEL, ("GlmMoeDsaForCausalLM",), "NVFP4", 78, 1, frozenset(range(78)))
HEADLINE = (
    "--model-path", MODEL, "--served-model-name", "glm-5", "--tp-size", "8", "--pp-size", "1",
    "--quantization", "modelopt_fp4", "--kv-cache-dtype", "bf16", "--mem-fraction-static", "0.88",
    "--context-length", "131072", "--chunked-prefill-size", "8192", "--max-running-requests", "64",
    "--cuda-graph-max-bs-decode", "64", "--reasoning-parser", "glm45", "--tool-call-parser", "glm47",
    "--host", "127.0.0.1", "--port", "30000", "--enable-metrics",
    "--enable-p2p-check", "--disable-custom-all-reduce",
    "--attention-backend", "flashinfer",
    "--model-loader-extra-config", '{"enable_multithread_load":true,"num_threads":16}',
    "--moe-runner-backend", "cutlass",
    "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
)  # fmt: skip
PROFILES = {  # profile and P2P -> the NCCL plan's flags, and whether the GPUs talk P2P
    ("vm", False): (("--enable-p2p-check", "--disable-custom-all-reduce"), False),
    ("vm", True): (("--enable-p2p-check",), True),
    ("lxc", True): ((), True),
    ("baremetal", True): ((), True),
}
# Layouts: one 8-GPU node TP8 or TP4 x PP2; two nodes TP8 x PP2, rank 0 listening for the others (with the
# key that needs) and rank 1.
LAYOUTS: dict[str, dict[str, object]] = {
    "tp8": {"tp_size": 8},
    "tp4pp2": {"tp_size": 4, "pp_size": 2},
    "tp8pp2 rank 0": {
        "tp_size": 8, "pp_size": 2, "nnodes": 2, "node_rank": 0, "dist_init_addr": "10.0.0.1:5000",
        "host": "0.0.0.0", "api_key_file": "/root/sglang-key",
    },
    "tp8pp2 rank 1": {
        "tp_size": 8, "pp_size": 2, "nnodes": 2, "node_rank": 1, "dist_init_addr": "10.0.0.1:5000",
    },
}  # fmt: skip


def argv_for(spec: SglangSpec, checkpoint: Checkpoint, profile: str, p2p: bool) -> tuple[str, ...]:
    if profile == "vm":
        flags = plan_nccl("vm", None, infiniband=False, p2p=p2p).argv
        assert flags == PROFILES[(profile, p2p)][0]
    else:
        flags = PROFILES[(profile, p2p)][0]  # plan_nccl gives host profiles no SGLang flag
    return plan_sglang_argv(spec, 8, (*flags, *plan_recipe(spec, checkpoint, GPUS, p2p=p2p).argv))


def test_headline_vm_tp8_throughput_with_mtp_is_exact() -> None:
    assert argv_for(SglangSpec(), WITH_MTP, "vm", False) == HEADLINE


def expected(
    layout: dict[str, object], flags: tuple[str, ...], p2p: bool, runner: str, mtp: bool
) -> tuple[str, ...]:
    """The argv from the headline's own words: the layout, the profile's flags, the runner, MTP."""
    head = list(HEADLINE[: HEADLINE.index("--enable-metrics")])
    head[head.index("--tp-size") + 1] = str(layout["tp_size"])
    head[head.index("--pp-size") + 1] = str(layout.get("pp_size", 1))
    if "host" in layout:
        head[head.index("--host") + 1] = str(layout["host"])
        head += ["--config", "/run/sglang/secrets.yaml"]
    if "host" not in layout:  # beyond loopback /metrics would be open without the key: off by default
        head.append("--enable-metrics")
    if "nnodes" in layout:
        head += [
            "--nnodes",
            "2",
            "--node-rank",
            str(layout["node_rank"]),
            "--dist-init-addr",
            "10.0.0.1:5000",
        ]
    recipe = ["--attention-backend", "flashinfer"]
    if p2p:
        recipe += ["--flashinfer-allreduce-fusion-backend", "auto"]
    recipe += [*HEADLINE[HEADLINE.index("--model-loader-extra-config") :][:2], "--moe-runner-backend", runner]
    speculative = list(HEADLINE[HEADLINE.index("--speculative-algorithm") :]) if mtp else []
    return (*head, *flags, *recipe, *speculative)


@pytest.mark.parametrize(
    ("profile", "layout", "workload", "mtp"),
    list(itertools.product(PROFILES, LAYOUTS, ("throughput", "latency"), (True, False))),
)
def test_matrix_argv(profile: tuple[str, bool], layout: str, workload: str, mtp: bool) -> None:
    fields = LAYOUTS[layout]
    opt_in = {"env": {"SGLANG_ENABLE_PP_SPEC": "1"}} if fields.get("pp_size", 1) != 1 else {}
    spec = SglangSpec.model_validate({**fields, "workload": workload, **opt_in})
    flags, p2p = PROFILES[profile]
    runner = "cutlass" if workload == "throughput" else "flashinfer_cutlass"
    checkpoint = WITH_MTP if mtp else WITHOUT_MTP
    assert argv_for(spec, checkpoint, *profile) == expected(fields, flags, p2p, runner, mtp)


def test_error_pp_with_mtp_without_the_opt_in_for_every_profile() -> None:
    for profile, p2p in PROFILES:
        with pytest.raises(
            PlanError, match=r"^sglang.mtp: MTP with pp_size 2 needs SGLang 0\.5\.23's opt-in"
        ):
            argv_for(SglangSpec(tp_size=4, pp_size=2), WITH_MTP, profile, p2p)
    # Without the MTP layer there is nothing to refuse.
    assert "--speculative-algorithm" not in argv_for(
        SglangSpec(tp_size=4, pp_size=2), WITHOUT_MTP, "vm", False
    )
