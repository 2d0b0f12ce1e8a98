"""pvegpu's gauges (pvegpu/plan/gauges.py): the exact text each file gets for given values."""

from __future__ import annotations

import pytest

from pvegpu.plan import gauges
from pvegpu.plan.gauges import HookGpu, MappingHealth, ModelValue, NextBootValue, P2pValue

MAPPING_HELP = (
    "# HELP pvegpu_mapping_healthy 1: the node's map line of this GPU mapping matches the live hardware "
    "(status valid); 0: drift (a renumbering the hook can repair) or changed\n"
    "# TYPE pvegpu_mapping_healthy gauge\n"
)
NEXT_BOOT_HELP = (
    "# HELP pvegpu_next_boot_module_ready 1: the kernel the host boots next has the NVIDIA module of the "
    "driver built; 0: a reboot would lose the driver\n# TYPE pvegpu_next_boot_module_ready gauge\n"
)


def test_mapping_gauges_one_line_per_gpu_with_address_and_status_then_the_check_time() -> None:
    gpus = [
        MappingHealth("gpu0", "0000:41:00", "valid"),
        MappingHealth("gpu1", "0000:52:00", "drift"),
        MappingHealth("gpu2", "", "changed"),
    ]
    assert gauges.render(gauges.mapping_gauges("pve1", 100, 1765000000.0, gpus)) == (
        MAPPING_HELP
        + 'pvegpu_mapping_healthy{mapping="gpu0",node="pve1",path="0000:41:00",status="valid",vmid="100"} 1\n'
        + 'pvegpu_mapping_healthy{mapping="gpu1",node="pve1",path="0000:52:00",status="drift",vmid="100"} 0\n'
        + 'pvegpu_mapping_healthy{mapping="gpu2",node="pve1",path="",status="changed",vmid="100"} 0\n'
        + "# HELP pvegpu_mapping_checked_timestamp_seconds When the node's gauges timer last checked the "
        "VM's mappings\n# TYPE pvegpu_mapping_checked_timestamp_seconds gauge\n"
        'pvegpu_mapping_checked_timestamp_seconds{node="pve1",vmid="100"} 1765000000\n'
    )


def test_mapping_gauges_of_a_vm_without_gpu_mapping_only_the_check_time() -> None:
    assert gauges.render(gauges.mapping_gauges("n", 7, 5.0, [])).splitlines()[-1] == (
        'pvegpu_mapping_checked_timestamp_seconds{node="n",vmid="7"} 5'
    )


def test_error_mapping_status_outside_the_list() -> None:
    with pytest.raises(ValueError, match="'refused' is not a mapping status"):
        gauges.mapping_gauges("n", 7, 0.0, [MappingHealth("gpu0", "", "refused")])


def test_node_file_of_a_host_driver_node_has_the_next_boot() -> None:
    boot = NextBootValue("6.8.12-4-pve", "590.48.01", ready=True)
    assert gauges.node_file(boot) == (
        NEXT_BOOT_HELP + 'pvegpu_next_boot_module_ready{kernel="6.8.12-4-pve",driver="590.48.01"} 1\n'
    )


def test_node_file_with_nothing_to_say_is_empty() -> None:
    """A `vm` node's mappings are the timer's (`mapping_gauges`), not the run's."""
    assert gauges.node_file() == ""


def test_sglang_help_is_the_timer_scripts_two_gauges() -> None:
    assert gauges.sglang_help() == {
        "pvegpu_sglang_ready": "1: SGLang answered /health and /v1/models at the gauges timer's last check",
        "pvegpu_sglang_ready_checked_timestamp_seconds": (
            "When the gauges timer last probed SGLang (Unix time)"
        ),
    }


def test_serving_file_every_gauge_in_order() -> None:
    text = gauges.serving_file(
        model=ModelValue("/srv/models/GLM-5", "festr2/GLM-5-NVFP4-MTP", "main", complete=True),
        p2p=P2pValue("probe", used=False, record=("probe", "shm")),
        next_boot=NextBootValue("6.1.0-28-amd64", "590.48.01", ready=False),
    )
    assert text == (
        "# HELP pvegpu_model_complete 1: the model directory holds the pinned revision as verified (sha256 "
        "once, then size and mtime)\n# TYPE pvegpu_model_complete gauge\n"
        'pvegpu_model_complete{path="/srv/models/GLM-5",repo="festr2/GLM-5-NVFP4-MTP",revision="main"} 1\n'
        "# HELP pvegpu_p2p_enabled 1: the VM guest's NCCL plan uses P2P between its GPUs; 0: SHM (label: "
        'vm.p2p)\n# TYPE pvegpu_p2p_enabled gauge\npvegpu_p2p_enabled{mode="probe"} 0\n'
        "# HELP pvegpu_p2p_verdict 1 for the P2P probe's verdict recorded in the VM guest (p2p or shm), and "
        'its mode\n# TYPE pvegpu_p2p_verdict gauge\npvegpu_p2p_verdict{mode="probe",verdict="shm"} 1\n'
        + NEXT_BOOT_HELP
        + 'pvegpu_next_boot_module_ready{kernel="6.1.0-28-amd64",driver="590.48.01"} 0\n'
    )


def test_serving_file_leaves_out_what_the_host_does_not_have() -> None:
    """SGLang's readiness is never the run's (the timer's script writes it: no series in two files)."""
    assert gauges.serving_file() == ""
    assert gauges.serving_file(p2p=P2pValue("on", used=True)).splitlines()[-1] == (
        'pvegpu_p2p_enabled{mode="on"} 1'
    )


def test_the_same_values_render_the_same_bytes() -> None:
    """What makes a second run change nothing: no time, no order that depends on anything but the values."""
    first = gauges.serving_file(model=ModelValue("/m", "o/m", "abc", complete=True))
    assert first == gauges.serving_file(model=ModelValue("/m", "o/m", "abc", complete=True))


def test_label_values_are_escaped() -> None:
    text = gauges.serving_file(model=ModelValue('/m"x\\y\nz', "o/m", "r", complete=False))
    assert text.splitlines()[-1] == 'pvegpu_model_complete{path="/m\\"x\\\\y\\nz",repo="o/m",revision="r"} 0'


def test_hook_file_refused_start_with_each_gpu() -> None:
    gpus = [HookGpu("gpu0", "0000:41:00", "unchanged", True), HookGpu("gpu5", "0000:d1:00", "refused", False)]
    assert gauges.render(gauges.hook_gauges(100, "pve1", "refused", 1765000000.0, gpus)) == (
        "# HELP pvegpu_hook_last_run_timestamp_seconds When the pre-start hook last ran for this VM (Unix "
        "time)\n# TYPE pvegpu_hook_last_run_timestamp_seconds gauge\n"
        'pvegpu_hook_last_run_timestamp_seconds{node="pve1",vmid="100"} 1765000000\n'
        "# HELP pvegpu_hook_start_allowed 1: the pre-start hook let the VM start; 0: it refused the start\n"
        '# TYPE pvegpu_hook_start_allowed gauge\npvegpu_hook_start_allowed{node="pve1",vmid="100"} 0\n'
        "# HELP pvegpu_hook_result 1 for the pre-start hook's last result for this VM\n"
        "# TYPE pvegpu_hook_result gauge\n"
        'pvegpu_hook_result{node="pve1",vmid="100",result="refused"} 1\n'
        "# HELP pvegpu_hook_mapping_healthy 1: the GPU mapping is valid after the pre-start hook's repairs; "
        "0: changed hardware, not repaired\n# TYPE pvegpu_hook_mapping_healthy gauge\n"
        'pvegpu_hook_mapping_healthy{node="pve1",vmid="100",mapping="gpu0",path="0000:41:00",status="unchanged"}'
        " 1\n"
        'pvegpu_hook_mapping_healthy{node="pve1",vmid="100",mapping="gpu5",path="0000:d1:00",status="refused"}'
        " 0\n"
    )


@pytest.mark.parametrize(
    ("result", "allowed"),
    [("valid", 1), ("repaired", 1), ("refused", 0), ("unchecked", 1), ("failed", 1)],
)
def test_hook_start_allowed_follows_the_result(result: str, allowed: int) -> None:
    text = gauges.render(gauges.hook_gauges(7, "n", result, 12.5))
    assert f'pvegpu_hook_start_allowed{{node="n",vmid="7"}} {allowed}\n' in text
    assert 'pvegpu_hook_last_run_timestamp_seconds{node="n",vmid="7"} 12.5\n' in text
    assert "pvegpu_hook_mapping_healthy" not in text  # no GPU: the gauge is left out


def test_error_hook_result_outside_the_list() -> None:
    with pytest.raises(ValueError, match="'ok' is not a hook result"):
        gauges.hook_gauges(7, "n", "ok", 0.0)


def test_error_a_gauge_without_help_text() -> None:
    with pytest.raises(KeyError, match="pvegpu_other"):
        gauges.render([gauges.Gauge("pvegpu_other", (gauges.Sample((), 1.0),))])
