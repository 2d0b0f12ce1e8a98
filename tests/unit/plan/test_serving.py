"""plan.serving: the NCCL profile in force as the doctor names it (ServingNccl.describe), and the SGLang
service's plan (plan_serving)."""

from __future__ import annotations

import pytest

from pvegpu.models.nccl import ConfSetting
from pvegpu.models.secret_file import SecretFile, SecretFileKind
from pvegpu.models.sglang import ProbeTarget, SglangSpec
from pvegpu.plan.errors import PlanError
from pvegpu.plan.model_fetch import ModelFetch, serving_fetch_target
from pvegpu.plan.nccl import plan_nccl
from pvegpu.plan.serving import PROFILE_NOTES, ServingNccl, plan_serving


def test_describe_names_the_profile_its_reason_and_settings() -> None:
    shm = ServingNccl(plan_nccl("vm", None, infiniband=False), None, p2p=False)
    assert shm.describe("vm") == (
        "NCCL profile SHM (profile vm: no P2P between passed-through GPUs): CUDA_DEVICE_MAX_CONNECTIONS=64 "
        "NCCL_BUFFSIZE=8388608 NCCL_DEBUG=INFO NCCL_IB_DISABLE=1 NCCL_MIN_NCHANNELS=32 NCCL_P2P_DISABLE=1 "
        "--enable-p2p-check --disable-custom-all-reduce"
    )
    proven = ServingNccl(plan_nccl("vm", None, infiniband=False, p2p=True), None, p2p=True)
    assert proven.describe("vm").startswith(
        "NCCL profile P2P (profile vm: P2P between the VM's GPUs is proven or forced, vm.p2p): "
    )
    assert "NCCL_P2P_DISABLE" not in proven.describe("vm")


KEY_FILE = "/etc/pvegpu/api-key"
SPEC = SglangSpec(tp_size=2, api_key_file=KEY_FILE)
GPUS = ("10de:2bb1", "10de:2bb1")
SHM = ServingNccl(plan_nccl("vm", None, infiniband=False), None, p2p=False)
KEY_OK = {KEY_FILE: SecretFile(KEY_FILE, SecretFileKind.FILE, uid=0, mode=0o600, size=33, lines=1)}


def test_create_serving_plan_gives_the_argv_env_lines_and_unit_values() -> None:
    plan = plan_serving("vm", SPEC, SHM, checkpoint=None, gpu_ids=GPUS, secrets=KEY_OK, conf_files={})
    assert plan.argv[-2:] == ("--enable-p2p-check", "--disable-custom-all-reduce")  # the NCCL plan's flags
    assert plan.argv[plan.argv.index("--tp-size") + 1] == "2"
    assert plan.exec_start == (
        "/opt/sglang/venv/bin/python /usr/local/lib/pvegpu/sglang-secrets.py serve " + " ".join(plan.argv)
    )
    assert plan.exec_start_pre == "/opt/sglang/venv/bin/python /usr/local/lib/pvegpu/sglang-secrets.py"
    assert plan.credentials == (("api-key", KEY_FILE),)
    assert plan.env_lines == SHM.plan.env_file_lines()  # no recipe yet: no config.json to choose by
    assert plan.recipe.notes == (
        "sglang.recipe auto: no recipe yet: sglang.model_path has no config.json to choose by (the service "
        "gets the recipe once the weights are there)",
    )
    assert plan.profile_note == PROFILE_NOTES["vm"]


def test_error_serving_plan_names_every_problem_one_line_each() -> None:
    missing = {KEY_FILE: SecretFile(KEY_FILE, SecretFileKind.MISSING)}
    conf = {"/etc/nccl.conf": (ConfSetting(3, "NCCL_P2P_LEVEL", "SYS"),)}
    with pytest.raises(PlanError) as error:
        plan_serving("vm", SPEC, SHM, checkpoint=None, gpu_ids=GPUS, secrets=missing, conf_files=conf)
    assert str(error.value) == (
        f"sglang.api_key_file: {KEY_FILE} does not exist on the host\n"
        "/etc/nccl.conf:3: NCCL_P2P_LEVEL is refused in the vm profile: it lets NCCL try P2P, which "
        "passed-through GPUs do not support (NCCL reads this file for every variable the service's "
        "environment leaves unset; remove the line)"
    )


def test_error_serving_plan_refuses_a_layout_the_gpus_do_not_fit() -> None:
    with pytest.raises(PlanError, match="tp_size 8 x pp_size 1 = 8 GPUs, but the node has 2 GPUs"):
        plan_serving("lxc", SglangSpec(), SHM, checkpoint=None, gpu_ids=GPUS, secrets={}, conf_files={})


def test_create_serving_plan_gives_the_probe_target_and_no_model_fetch_without_model_repo() -> None:
    plan = plan_serving("vm", SPEC, SHM, checkpoint=None, gpu_ids=GPUS, secrets=KEY_OK, conf_files={})
    assert plan.probe == ProbeTarget("/opt/sglang/venv/bin/python", "http://127.0.0.1:30000", KEY_FILE)
    assert plan.model_fetch is None


def test_create_serving_plan_gives_the_model_fetchs_config_and_exec_start_with_model_repo() -> None:
    spec = SglangSpec(tp_size=2, api_key_file=KEY_FILE, model_repo="Qwen/Qwen3-0.6B")
    target = serving_fetch_target(spec)
    assert target is not None
    plan = plan_serving(
        "vm", spec, SHM, checkpoint=None, gpu_ids=GPUS, secrets=KEY_OK, conf_files={}, fetch=target
    )
    assert (plan.model_directory, plan.store_mount) == (True, None)
    assert plan.model_fetch == ModelFetch(
        target=target,
        config=(
            '{\n "dir": "/models/GLM-5-NVFP4",\n "endpoint": null,\n "repo": "Qwen/Qwen3-0.6B",\n'
            ' "revision": null,\n "workers": 8\n}\n'
        ),
        exec_start=(
            "/opt/pvegpu/hub/bin/python /usr/local/lib/pvegpu/model-fetch.py /etc/pvegpu/model-fetch.json"
        ),
    )
