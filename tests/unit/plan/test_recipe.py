"""The serving recipe: chosen from the checkpoint and the GPUs, its exact options and env lines per workload,
MTP from the checkpoint's layer, P2P-only options, and the operator's overrides winning."""

from __future__ import annotations

import pytest

from pvegpu.models.recipe import Checkpoint, load_recipes
from pvegpu.models.sglang import SglangSpec
from pvegpu.plan.errors import PlanError
from pvegpu.plan.recipe import RecipePlan, plan_recipe
from pvegpu.plan.sglang import plan_sglang_argv

GPUS = ("10de:2bb1",) * 8
ADA = ("10de:26b1",) * 8  # RTX 6000 Ada: AD102, outside every chip range of the table
PATH = "/models/GLM-5-NVFP4"


def glm5(*, layers: frozenset[int] | None = frozenset(range(79)), nextn: int | None = 1) -> Checkpoint:
    return Checkpoint(PATH, ("GlmMoeDsaForCausalLM",), "NVFP4", 78, nextn, layers)


BASE = (
    "--attention-backend", "flashinfer",
    "--model-loader-extra-config", '{"enable_multithread_load":true,"num_threads":16}',
)  # fmt: skip
MTP = (
    "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
)  # fmt: skip
ENV = (
    ("SGLANG_ENABLE_JIT_DEEPGEMM", "0"),
    ("SAFETENSORS_FAST_GPU", "1"),
    ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
)


def test_compute_capability_from_the_pci_device_id() -> None:
    table = load_recipes()
    assert table.compute_capability("10de:2bb1") == "12.0"
    assert table.compute_capability("10de:2901") == "10.0"
    assert table.compute_capability("10de:26b1") is None
    assert table.compute_capability("1002:2bb1") is None


def test_glm5_with_mtp_throughput_on_the_vm_without_p2p() -> None:
    plan = plan_recipe(SglangSpec(), glm5(), GPUS, p2p=False)
    assert plan.name == "glm5-nvfp4-sm120"
    assert plan.argv == (*BASE, "--moe-runner-backend", "cutlass", *MTP)
    assert tuple((setting.name, setting.value) for setting in plan.env) == ENV
    assert plan.notes == ()
    assert plan.omitted == (
        "--flashinfer-allreduce-fusion-backend: no P2P between the GPUs (the reference's "
        "--enable-flashinfer-allreduce-fusion (deprecated in SGLang 0.5.23 for this option): a measurable "
        "gain; it shares IPC buffers between GPUs, so only where they talk P2P)",
    )
    lines = plan.env_file_lines()
    assert lines[:3] == (
        "# Recipe glm5-nvfp4-sm120 (pvegpu/data/sglang/recipes.json)",
        "# the reference: DeepGEMM needs WGMMA/TCGEN05, absent on SM120; SGLang 0.5.23 srt/environ.py (its "
        "SGLANG_ENABLE_DEEP_GEMM is gone there)",
        "SGLANG_ENABLE_JIT_DEEPGEMM=0",
    )
    assert lines[7:] == (
        "# sglang --attention-backend flashinfer: the reference: flashmla and trtllm attention are "
        "SM90/SM100 only",
        lines[8],
        "# sglang --moe-runner-backend cutlass: workload throughput: the reference's 1,010 (MTP off) and "
        "1,425 (MTP on) tok/s at 64 requests ran cutlass, the fastest upstream runner from 4 requests up",
        *lines[10:14],
        f"# left out: {plan.omitted[0]}",
    )
    assert lines[8].startswith("# sglang --model-loader-extra-config {")
    assert lines[10].startswith("# sglang --speculative-algorithm NEXTN: the reference: accept length")


def test_latency_workload_changes_only_the_runner() -> None:
    throughput = plan_recipe(SglangSpec(), glm5(), GPUS, p2p=True)
    latency = plan_recipe(SglangSpec(workload="latency"), glm5(), GPUS, p2p=True)
    assert throughput.argv == (
        *BASE[:2], "--flashinfer-allreduce-fusion-backend", "auto", *BASE[2:],
        "--moe-runner-backend", "cutlass", *MTP,
    )  # fmt: skip
    assert list(latency.argv) == ["flashinfer_cutlass" if w == "cutlass" else w for w in throughput.argv]


def test_checkpoint_without_the_mtp_layer_gets_no_mtp_and_says_which_has_it() -> None:
    plan = plan_recipe(SglangSpec(), glm5(layers=frozenset(range(78))), GPUS, p2p=False)
    assert plan.argv == (*BASE, "--moe-runner-backend", "cutlass")
    assert plan.notes == (
        "sglang.mtp: /models/GLM-5-NVFP4 has no MTP layer (model.layers.78 is not in its weight index): "
        "serving without speculative decoding; festr2/GLM-5-NVFP4-MTP has it",
    )
    no_nextn = plan_recipe(SglangSpec(), glm5(nextn=None), GPUS, p2p=False)
    assert no_nextn.notes == (
        "sglang.mtp: /models/GLM-5-NVFP4 has no MTP layer (its config.json has no num_nextn_predict_layers): "
        "serving without speculative decoding; festr2/GLM-5-NVFP4-MTP has it",
    )
    no_index = plan_recipe(SglangSpec(), glm5(layers=None), GPUS, p2p=False)
    assert "no weight index (model.safetensors.index.json)" in no_index.notes[0]


def test_mtp_off_by_the_operator() -> None:
    assert plan_recipe(SglangSpec(mtp=False), glm5(), GPUS, p2p=False).argv == (
        *BASE, "--moe-runner-backend", "cutlass",
    )  # fmt: skip


def test_error_mtp_with_pp_needs_the_opt_in() -> None:
    with pytest.raises(PlanError) as caught:
        plan_recipe(SglangSpec(tp_size=4, pp_size=2), glm5(), GPUS, p2p=False)
    assert str(caught.value) == (
        "sglang.mtp: MTP with pp_size 2 needs SGLang 0.5.23's opt-in SGLANG_ENABLE_PP_SPEC=1 (off by "
        'default; without it SGLang refuses to start: "PP + speculative decoding (MTP) is only supported on '
        "prefill nodes (disaggregation-mode=prefill)\"): set sglang.env SGLANG_ENABLE_PP_SPEC: '1', or "
        "sglang.mtp: false"
    )
    opted = SglangSpec(tp_size=4, pp_size=2, env={"SGLANG_ENABLE_PP_SPEC": "1"})
    assert plan_recipe(opted, glm5(), GPUS, p2p=False).argv[-8:] == MTP
    assert plan_recipe(SglangSpec(tp_size=4, pp_size=2, mtp=False), glm5(), GPUS, p2p=False).notes == ()


def test_operator_overrides_win_and_are_said() -> None:
    spec = SglangSpec(
        extra_args=("--attention-backend", "triton", "--moe-runner-backend=flashinfer_cutedsl"),
        env={"SAFETENSORS_FAST_GPU": "0"},
    )
    plan = plan_recipe(spec, glm5(), GPUS, p2p=False)
    assert plan.argv == (*BASE[2:], *MTP)
    assert [setting.name for setting in plan.env] == ["SGLANG_ENABLE_JIT_DEEPGEMM", "PYTORCH_CUDA_ALLOC_CONF"]
    assert plan.omitted[0] == "--attention-backend: sglang.extra_args sets it"
    assert plan.omitted[1].startswith("--flashinfer-allreduce-fusion-backend: no P2P between the GPUs")
    assert plan.omitted[2:] == (
        "--moe-runner-backend: sglang.extra_args sets it",
        "SAFETENSORS_FAST_GPU: sglang.env sets it",
    )
    argv = plan_sglang_argv(spec, 8, plan.argv)
    assert argv[-3:] == ("--attention-backend", "triton", "--moe-runner-backend=flashinfer_cutedsl")


def test_auto_without_a_match_or_without_weights() -> None:
    other = Checkpoint(PATH, ("Qwen3MoeForCausalLM",), None, 48, None, frozenset())
    plan = plan_recipe(SglangSpec(), other, GPUS, p2p=False)
    assert (plan.name, plan.argv, plan.env_file_lines()) == (None, (), ())
    assert plan.notes == (
        "sglang.recipe auto: no recipe for Qwen3MoeForCausalLM unquantized on compute capability 12.0 "
        "(glm5-nvfp4-sm120: GlmMoeDsaForCausalLM NVFP4 on compute capability 12.0): serving with the fields "
        "and extra_args only",
    )
    assert (
        plan_recipe(SglangSpec(), glm5(), ADA, p2p=False)
        .notes[0]
        .startswith(
            "sglang.recipe auto: no recipe for GlmMoeDsaForCausalLM NVFP4 on compute capability unknown"
        )
    )
    assert plan_recipe(SglangSpec(), None, GPUS, p2p=False).notes == (
        "sglang.recipe auto: no recipe yet: sglang.model_path has no config.json to choose by (the service "
        "gets the recipe once the weights are there)",
    )


def test_before_the_weights_a_known_repository_decides() -> None:
    with_mtp = plan_recipe(SglangSpec(model_repo="festr2/GLM-5-NVFP4-MTP"), None, GPUS, p2p=False)
    assert with_mtp.argv == (*BASE, "--moe-runner-backend", "cutlass", *MTP)
    without = plan_recipe(SglangSpec(model_repo="lukealonso/GLM-5-NVFP4"), None, GPUS, p2p=False)
    assert without.notes == (
        "sglang.mtp: lukealonso/GLM-5-NVFP4 has no MTP layer: serving without speculative decoding; "
        "festr2/GLM-5-NVFP4-MTP has it",
    )


def test_named_recipe_and_none() -> None:
    other = Checkpoint(PATH, ("Qwen3MoeForCausalLM",), None, 48, None, frozenset())
    named = plan_recipe(SglangSpec(recipe="glm5-nvfp4-sm120", mtp=False), other, ADA, p2p=False)
    assert named.argv == (*BASE, "--moe-runner-backend", "cutlass")
    assert plan_recipe(SglangSpec(recipe="none"), glm5(), GPUS, p2p=True) == RecipePlan(None)


def test_every_recipe_argv_is_accepted_by_the_pinned_table() -> None:
    for spec in (SglangSpec(), SglangSpec(workload="latency")):
        for p2p in (False, True):
            plan_sglang_argv(spec, 8, plan_recipe(spec, glm5(), GPUS, p2p=p2p).argv)


def test_error_unknown_recipe_names_the_choices() -> None:
    with pytest.raises(
        ValueError, match=r"'fast' is not a recipe \(choose from auto, none, glm5-nvfp4-sm120\)"
    ):
        SglangSpec(recipe="fast")
