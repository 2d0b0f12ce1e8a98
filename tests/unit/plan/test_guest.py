"""The guest roles' pure parts: DriverSpec, CUDA repository choice, flavour and version checks, the
cross-key check run at inventory load, and the SGLang unit's ExecStart and rendered files."""

from __future__ import annotations

from typing import Any

import pytest

from pvegpu.inventory.guests import exit_on_invalid_guests
from pvegpu.inventory.validate import ROLE_SPECS, validate_inventory
from pvegpu.models.driver import DRIVER_KEY, DriverSpec
from pvegpu.models.errors import InventoryError
from pvegpu.models.node import NodeSpec
from pvegpu.models.nvidia import LoadedModule, NvidiaSmi
from pvegpu.models.recipe import Checkpoint
from pvegpu.models.sglang import SglangSpec
from pvegpu.models.specs import host_specs
from pvegpu.operations.render import render
from pvegpu.plan.driver import (
    DriverPlan,
    apt_source_line,
    cuda_distro,
    flavour_problems,
    keyring_url,
    plan_driver,
    verify_problems,
)
from pvegpu.plan.errors import PlanError
from pvegpu.plan.guest import check_guest
from pvegpu.plan.nccl import plan_nccl
from pvegpu.plan.reboot import reboot_guard
from pvegpu.plan.recipe import plan_recipe
from pvegpu.plan.sglang import plan_sglang_argv
from pvegpu.plan.sglang_service import exec_start, exec_start_pre
from pvegpu.plan.sglang_started import record_start

NODE = {"name": "gpu-vm", "gpus": {"ids": ["10de:2bb1"], "count": 8}}


def problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(InventoryError) as error:
        validate_inventory([("h", {"node": NODE, **data})])
    return list(error.value.problems)


def test_driver_registered_with_defaults() -> None:
    assert ROLE_SPECS[DRIVER_KEY] is DriverSpec
    spec = DriverSpec()
    assert (spec.version, spec.package_version, spec.flavour, spec.allow_reboot) == (
        "580.95.05", "580.95.05-1", "open", False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("driver", "expected"),
    [
        (
            {"version": "570.86.15"},
            "h: driver.version: 570.86.15 is below 580.65.06, the oldest driver for the CUDA 13 runtime of "
            "SGLang 0.5.23",
        ),
        ({"version": "580"}, "h: driver.version: '580' is not an NVIDIA driver version like 580.95.05"),
        ({"flavour": "nouveau"}, "h: driver.flavour: must be one of open, proprietary (got 'nouveau')"),
        (
            {"repository": "ftp://mirror/cuda"},
            "h: driver.repository: 'ftp://mirror/cuda' is not an http(s):// or file: URL ending in /",
        ),
        ({"versoin": "580.95.05"}, "h: driver.versoin: unknown field (did you mean 'version'?)"),
    ],
)
def test_error_driver_field_named(driver: dict[str, Any], expected: str) -> None:
    assert problems({"driver": driver}) == [expected]


def test_floor_itself_is_accepted() -> None:
    assert DriverSpec(version="580.65.06").version == "580.65.06"


@pytest.mark.parametrize(
    ("os_id", "version_id", "distro"),
    [("debian", "12", "debian12"), ("debian", "13", "debian13"), ("ubuntu", "22.04", "ubuntu2204"),
     ("ubuntu", "24.04", "ubuntu2404")],
)  # fmt: skip
def test_cuda_distro(os_id: str, version_id: str, distro: str) -> None:
    assert cuda_distro(os_id, version_id) == distro


def test_error_cuda_distro_unsupported() -> None:
    with pytest.raises(PlanError) as error:
        cuda_distro("debian", "11")
    assert str(error.value) == (
        "driver: debian 11 is not a distribution NVIDIA's CUDA repository serves; "
        "supported: debian 12, debian 13, ubuntu 22.04, ubuntu 24.04"
    )


def test_repository_lines_default_and_mirror() -> None:
    assert apt_source_line(DriverSpec(), "ubuntu2404") == (
        "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
        "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/x86_64/ /\n"
    )
    mirror = DriverSpec(repository="file:/srv/pvegpu-lab/apt/")
    assert keyring_url(mirror, "debian12") == "file:/srv/pvegpu-lab/apt/cuda-keyring_1.1-1_all.deb"


def test_flavour_proprietary_refused_on_blackwell_only() -> None:
    proprietary = DriverSpec(flavour="proprietary")
    assert flavour_problems(proprietary, ["10de:2bb1", "10de:26b1"]) == (
        "driver.flavour: the proprietary kernel module does not support Blackwell GPUs (10de:2bb1); use open",
    )
    assert flavour_problems(proprietary, ["10de:26b1"]) == ()  # RTX 6000 Ada
    assert flavour_problems(DriverSpec(), ["10de:2bb1"]) == ()


def test_verify_problems() -> None:
    assert verify_problems(DriverSpec(), None, NvidiaSmi((), "No devices were found"), 8) == (
        "no NVIDIA kernel module is loaded (/proc/driver/nvidia/version is absent)",
        "nvidia-smi failed: No devices were found",
    )
    assert verify_problems(DriverSpec(), LoadedModule("open", "580.95.05"), NvidiaSmi((), None), None) == ()


def test_check_guest_names_each_key() -> None:
    node = NodeSpec.model_validate({"name": "g", "gpus": {"ids": ["10de:2bb1"], "count": 8}})
    found = check_guest(
        node,
        DriverSpec(flavour="proprietary"),
        SglangSpec(tp_size=4, extra_args=("--tp", "2"), env={"NCCL_P2P_LEVEL": "SYS"}),
    )
    assert found == (
        "driver.flavour: the proprietary kernel module does not support Blackwell GPUs (10de:2bb1); use open",
        "sglang.env.NCCL_P2P_LEVEL: refused in the vm profile: it lets NCCL try P2P, "
        "which passed-through GPUs do not support",
        "sglang.tp_size, sglang.pp_size: tp_size 4 x pp_size 1 = 4 GPUs, but the node has 8 GPUs",
        "sglang.extra_args: --tp abbreviates --tp-size: use the full option name",
    )


def test_exit_on_invalid_guests_prints_lines_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    hosts = [("g1", {"node": NODE, "sglang": {"pp_size": 2}})]
    with pytest.raises(SystemExit) as exit_:
        exit_on_invalid_guests(hosts)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        "g1: sglang.tp_size, sglang.pp_size: tp_size 8 x pp_size 2 = 16 GPUs, but the node has 8 GPUs\n"
    )
    good = [("g1", {"node": NODE})]
    assert exit_on_invalid_guests(good) is good


# --- the SGLang unit ----------------------------------------------------------------------------


def vm_argv(spec: SglangSpec) -> tuple[str, ...]:
    return plan_sglang_argv(spec, 8, plan_nccl("vm", None, infiniband=False).argv)


def test_exec_start_plain() -> None:
    spec = SglangSpec(context_length=None, chunked_prefill_size=None, cuda_graph_max_bs=None)
    assert exec_start(spec, vm_argv(spec)) == (
        "/opt/sglang/venv/bin/sglang serve --model-path /models/GLM-5-NVFP4 --served-model-name glm-5 "
        "--tp-size 8 --pp-size 1 --quantization modelopt_fp4 --kv-cache-dtype bf16 "
        "--mem-fraction-static 0.88 --max-running-requests 64 --cuda-graph-max-bs-decode 64 "
        "--reasoning-parser glm45 --tool-call-parser glm47 --host 127.0.0.1 --port 30000 --enable-metrics "
        "--enable-p2p-check --disable-custom-all-reduce"
    )


def test_exec_start_with_the_recipe_quotes_its_json_for_systemd() -> None:
    spec = SglangSpec(concurrency=32, cuda_graph_max_bs=16)
    checkpoint = Checkpoint(spec.model_path, ("GlmMoeDsaForCausalLM",), "NVFP4", 78, 1, frozenset({78}))
    recipe = plan_recipe(spec, checkpoint, ("10de:2bb1",) * 8, p2p=False)
    argv = plan_sglang_argv(spec, 8, (*plan_nccl("vm", None, infiniband=False).argv, *recipe.argv))
    assert exec_start(spec, argv).split(" --enable-metrics ")[1] == (
        "--enable-p2p-check --disable-custom-all-reduce --attention-backend flashinfer "
        '--model-loader-extra-config "{\\"enable_multithread_load\\":true,\\"num_threads\\":16}" '
        "--moe-runner-backend cutlass --speculative-algorithm NEXTN --speculative-num-steps 3 "
        "--speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
    )
    assert " --max-running-requests 32 --cuda-graph-max-bs-decode 16 " in exec_start(spec, argv)


def test_exec_start_with_key_passes_only_the_config_path() -> None:
    spec = SglangSpec(
        host="0.0.0.0", api_key_file="/etc/pvegpu/api-key", served_model_name="glm 5%", enable_metrics=False,
        context_length=None, chunked_prefill_size=None, cuda_graph_max_bs=None, reasoning_parser=None,
        tool_call_parser=None, quantization=None,
    )  # fmt: skip
    assert exec_start(spec, vm_argv(spec)) == (
        "/opt/sglang/venv/bin/python /usr/local/lib/pvegpu/sglang-secrets.py serve "
        "--model-path /models/GLM-5-NVFP4 "
        '--served-model-name "glm 5%%" --tp-size 8 --pp-size 1 --kv-cache-dtype bf16 '
        "--mem-fraction-static 0.88 --max-running-requests 64 --cuda-graph-max-bs-decode 64 "
        "--host 0.0.0.0 --port 30000 --config /run/sglang/secrets.yaml "
        "--enable-p2p-check --disable-custom-all-reduce"
    )
    assert exec_start_pre(spec) == "/opt/sglang/venv/bin/python /usr/local/lib/pvegpu/sglang-secrets.py"
    assert exec_start_pre(SglangSpec()) is None


SHM = "the SHM path's throughput at high concurrency (experimental until measured on this box)"


def test_env_file_vm_and_baremetal_say_why() -> None:
    vm = plan_nccl("vm", None, infiniband=False)
    text = render("sglang/sglang.env.j2", profile="vm", profile_note="no P2P here", lines=vm.env_file_lines())
    assert text == (
        "# Managed by pvegpu (role sglang): the environment of sglang.service. "
        "Each setting says why it is set.\n"
        "# Profile vm: no P2P here\n"
        f"# 64 CUDA work queues (CUDA's default 8) so NCCL's kernels overlap: {SHM}\n"
        "CUDA_DEVICE_MAX_CONNECTIONS=64\n"
        f"# 8 MiB buffers per channel (NCCL's default 4 MiB): {SHM}\n"
        "NCCL_BUFFSIZE=8388608\n"
        "# log each channel's transport (P2P, SHM, NET) so pvegpu's doctor can check it\n"
        "NCCL_DEBUG=INFO\n"
        "# no InfiniBand/RoCE adapter: skip NCCL's IB probe, use sockets between nodes\n"
        "NCCL_IB_DISABLE=1\n"
        f"# 32 channels over shared memory: {SHM}\n"
        "NCCL_MIN_NCHANNELS=32\n"
        "# P2P between the VM's GPUs is not proven (vm.p2p); without this NCCL's AMD rule lets 2-GPU groups "
        "(TP4+PP2's pipeline pairs) try it\n"
        "NCCL_P2P_DISABLE=1\n"
        "# sglang --enable-p2p-check: P2P is not supported between passed-through GPUs; without the check "
        "SGLang assumes it works\n"
        "# sglang --disable-custom-all-reduce: SGLang's custom all-reduce needs P2P, which the VM lacks; "
        "NCCL all-reduces over shared memory\n"
    )


def test_unit_file_with_keys_loads_them_as_credentials_for_the_config_script() -> None:
    text = render(
        "sglang/sglang.service.j2",
        sglang_version="0.5.23",
        served_model_name="glm-5",
        model_path="/models/GLM-5-NVFP4",
        user="sglang",
        env_file="/etc/pvegpu/sglang.env",
        credentials=(("api-key", "/root/key"), ("admin-api-key", "/root/admin")),
        runtime_directory="sglang",
        exec_start_pre="/v/bin/python /usr/local/lib/pvegpu/sglang-secrets.py",
        exec_start="/v/bin/sglang serve --config /run/sglang/secrets.yaml",
        store_mount=None,
        record_start=record_start(("/etc/systemd/system/sglang.service", "/etc/pvegpu/sglang.env"), "/v"),
    )
    assert text.splitlines()[7:19] == [
        "User=sglang",
        "Group=sglang",
        "EnvironmentFile=/etc/pvegpu/sglang.env",
        "LoadCredential=api-key:/root/key",
        "LoadCredential=admin-api-key:/root/admin",
        "# What it starts from, at every start (pvegpu/plan/sglang_started.py): a run restarts it from this "
        "record.",
        'ExecStartPre=-+/bin/sh -c "sha256sum -z -- \\"$$@\\" \\"$$0\\"/lib/python*/site-packages/'
        'sglang-*.dist-info/METADATA > /run/pvegpu-sglang.started" /v /etc/systemd/system/sglang.service '
        "/etc/pvegpu/sglang.env",
        "RuntimeDirectory=sglang",
        "RuntimeDirectoryMode=0700",
        "ExecStartPre=/v/bin/python /usr/local/lib/pvegpu/sglang-secrets.py",
        "Environment=SGLANG_LOGGING_CONFIG_PATH=/run/sglang/logging.json",
        "ExecStart=/v/bin/sglang serve --config /run/sglang/secrets.yaml",
    ]


LXC_NODE = {
    "node": {"name": "pve1", "profile": "lxc", "gpus": {"ids": ["10de:2bb1"], "count": 8}},
    "lxc": {"vmid": 310, "ostemplate": "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"},
    "driver": {"version": "590.48.01"},
}
DEBIAN13 = {"ID": "debian", "VERSION_ID": "13"}
REPO13 = "https://developer.download.nvidia.com/compute/cuda/repos/debian13/x86_64/"


def test_driver_plan_of_a_proxmox_node_and_of_its_container() -> None:
    """The node builds the module for Proxmox's kernels, makes 8 device nodes, turns HMM off and guards its
    reboot; the container gets userspace alone, no device nodes, no guard."""
    specs = host_specs(LXC_NODE)
    node = plan_driver(specs, "pve-host", DEBIAN13, "6.14.8-2-pve", 8)
    assert node == DriverPlan(
        driver=specs.driver,
        placement="pve-host",
        source_line=f"deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {REPO13} /\n",
        list_path="/etc/apt/sources.list.d/cuda-debian13-x86_64.list",
        keyring_url=f"{REPO13}cuda-keyring_1.1-1_all.deb",
        packages=(
            "nvidia-open=590.48.01-1", "nvidia-modprobe=590.48.01-1", "dkms", "proxmox-headers-6.14.8-2-pve",
            "proxmox-default-headers",
        ),
        gpus=8,
        hmm_off=True,
        guard=reboot_guard(specs),
        gpu_count=8,
    )  # fmt: skip
    assert node.device_nodes == (
        *(f"/dev/nvidia{n}" for n in range(8)),
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
    )  # fmt: skip
    container = plan_driver(specs, "container", DEBIAN13, "6.14.8-2-pve", 0)
    assert (container.packages, container.gpus, container.hmm_off, container.guard, container.container) == (
        ("nvidia-driver-cuda=590.48.01-1",), 0, False, None, True
    )  # fmt: skip


def test_error_driver_plan_refuses_the_proprietary_flavour_on_blackwell_and_an_unserved_distribution() -> (
    None
):
    proprietary = host_specs({**LXC_NODE, "driver": {"version": "590.48.01", "flavour": "proprietary"}})
    with pytest.raises(PlanError) as error:
        plan_driver(proprietary, "guest", DEBIAN13, "6.12.48+deb13-amd64", 0)
    assert str(error.value) == (
        "driver.flavour: the proprietary kernel module does not support Blackwell GPUs (10de:2bb1); use open"
    )
    with pytest.raises(PlanError) as error:
        plan_driver(host_specs(LXC_NODE), "guest", {"ID": "debian", "VERSION_ID": "11"}, "5.10.0-30-amd64", 0)
    assert str(error.value).startswith(
        "driver: debian 11 is not a distribution NVIDIA's CUDA repository serves"
    )


def test_unit_file_of_the_nodes_mounted_store_needs_the_mount() -> None:
    text = render(
        "sglang/sglang.service.j2",
        sglang_version="0.5.23",
        served_model_name="glm-5",
        model_path="/srv/models/GLM-5",
        user="sglang",
        env_file="/etc/pvegpu/sglang.env",
        credentials=(),
        runtime_directory="sglang",
        exec_start_pre=None,
        exec_start="/v/bin/sglang serve",
        store_mount="srv-models-GLM\\x2d5.mount",
        record_start=record_start(("/etc/systemd/system/srv-models-GLM\\x2d5.mount",), "/v"),
    )
    assert text.splitlines()[:6] == [
        "# Managed by pvegpu (role sglang). SGLang 0.5.23 serving glm-5 from /srv/models/GLM-5.",
        "[Unit]",
        "Description=SGLang serving glm-5",
        "Wants=network-online.target",
        "After=network-online.target nvidia-persistenced.service",
        "RequiresMountsFor=/srv/models/GLM-5",
    ]
    # systemd unquotes the doubled backslash to the unit name's one: the record names the file itself.
    assert (
        'ExecStartPre=-+/bin/sh -c "sha256sum -z -- \\"$$@\\" \\"$$0\\"/lib/python*/site-packages/'
        'sglang-*.dist-info/METADATA > /run/pvegpu-sglang.started" /v '
        '"/etc/systemd/system/srv-models-GLM\\\\x2d5.mount"'
    ) in text.splitlines()
