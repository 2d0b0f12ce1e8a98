"""plan.lxc: the container's NVIDIA device entries per Proxmox version (exact lines from
shared/knowledge/sglang-nccl-drivers-lxc-bios.md §4.3), /proc/devices parsing, the driver drift check, and
the container's plan."""

from __future__ import annotations

import pytest

from pvegpu.facts.lxc_devices import parse_proc_devices
from pvegpu.models.lxc import LxcSpec
from pvegpu.plan.errors import PlanError
from pvegpu.plan.lxc import LxcDevices, plan_container, plan_lxc_devices, shm_line, version_drift

CAPS = ("/dev/nvidia-caps/nvidia-cap2", "/dev/nvidia-caps/nvidia-cap1")
# Synthesized in /proc/devices' format (fs/char_dev.c `%3d %s`), majors as §4.3 reports seen in the wild.
PROC_DEVICES = [
    "Character devices:",
    "  1 mem",
    "195 nvidia",
    "195 nvidia-modeset",
    "226 drm",
    "235 nvidia-caps",
    "508 nvidia-uvm",
    "",
    "Block devices:",
    "  7 loop",
    "259 blkext",
]


def test_parse_proc_devices_character_section_only() -> None:
    assert parse_proc_devices(PROC_DEVICES) == {
        "mem": 1,
        "nvidia": 195,
        "nvidia-modeset": 195,
        "drm": 226,
        "nvidia-caps": 235,
        "nvidia-uvm": 508,
    }
    assert parse_proc_devices([]) == {}


def test_native_dev_entries_cover_every_gpu_and_control_node_on_8_1() -> None:
    devices = plan_lxc_devices(8, (8, 1), CAPS, {})
    assert devices == LxcDevices(
        dev={
            **{f"dev{n}": f"/dev/nvidia{n},gid=44" for n in range(8)},
            "dev8": "/dev/nvidiactl,gid=44",
            "dev9": "/dev/nvidia-uvm,gid=44",
            "dev10": "/dev/nvidia-uvm-tools,gid=44",
            "dev11": "/dev/nvidia-modeset,gid=44",
            "dev12": "/dev/nvidia-caps/nvidia-cap1,gid=44",
            "dev13": "/dev/nvidia-caps/nvidia-cap2,gid=44",
        },
        raw=(),
    )


def test_raw_lines_before_8_1_with_majors_from_proc_devices() -> None:
    devices = plan_lxc_devices(2, (8, 0), CAPS, parse_proc_devices(PROC_DEVICES))
    lines = [f"{key}: {value}" for key, value in devices.raw]
    assert devices.dev == {}
    assert lines == [
        "lxc.cgroup2.devices.allow: c 195:* rwm",
        "lxc.cgroup2.devices.allow: c 508:* rwm",
        "lxc.cgroup2.devices.allow: c 235:* rwm",
        "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-modeset dev/nvidia-modeset none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir",
    ]


def test_raw_lines_without_caps() -> None:
    devices = plan_lxc_devices(1, (7, 4), (), {"nvidia-uvm": 510})
    assert devices.raw[:2] == (
        ("lxc.cgroup2.devices.allow", "c 195:* rwm"),
        ("lxc.cgroup2.devices.allow", "c 510:* rwm"),
    )
    assert (
        "lxc.mount.entry",
        "/dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir",
    ) not in devices.raw


def test_error_older_proxmox_without_uvm_major() -> None:
    with pytest.raises(PlanError) as raised:
        plan_lxc_devices(8, (8, 0), CAPS, {"nvidia": 195})
    assert str(raised.value) == (
        "host: /proc/devices has no nvidia-uvm / nvidia-caps major (nvidia_uvm not loaded?): "
        "cannot write the lxc.cgroup2 lines Proxmox 8.0 needs"
    )


@pytest.mark.parametrize(
    ("host", "container", "problem"),
    [
        ("580.95.05", "580.95.05", None),
        (
            "580.95.05",
            "590.48.01",
            "driver version mismatch: host kernel module 580.95.05, container userspace 590.48.01 "
            "(NVML fails with 'Driver/library version mismatch'; install the container's userspace at "
            "580.95.05, without a kernel module)",
        ),
        ("580.95.05", None, "the container has no NVIDIA userspace driver; the host module is 580.95.05"),
        (
            None,
            "580.95.05",
            "the host has no NVIDIA kernel module loaded: the container's driver has nothing to match",
        ),
    ],
)
def test_version_drift(host: str | None, container: str | None, problem: str | None) -> None:
    assert version_drift(host, container) == problem


SPEC = LxcSpec(vmid=200, ostemplate="local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst")


def test_create_container_plan_holds_config_create_keys_raw_lines_and_the_host_module() -> None:
    plan = plan_container(SPEC, 2, (8, 1), (), {}, host_module="580.95.05")
    assert plan.waiting is None
    assert (plan.config["dev0"], plan.config["dev1"]) == ("/dev/nvidia0,gid=44", "/dev/nvidia1,gid=44")
    assert plan.create["ostemplate"] == SPEC.ostemplate
    assert plan.raw == (shm_line(SPEC.shm_gib),)
    assert plan.host_module == "580.95.05"


def test_noop_container_plan_waits_for_the_uvm_major_while_no_module_is_loaded() -> None:
    plan = plan_container(SPEC, 2, (8, 0), (), {"nvidia": 195}, host_module=None)
    assert plan.waiting == (
        "container not converged yet: host: /proc/devices has no nvidia-uvm major (nvidia_uvm not loaded?): "
        "cannot write the lxc.cgroup2 lines Proxmox 8.0 needs; run again"
    )
    assert (plan.config, plan.create, plan.raw) == ({}, {}, ())


def test_error_container_plan_refuses_missing_majors_once_the_module_is_loaded() -> None:
    with pytest.raises(PlanError, match="has no nvidia-uvm major"):
        plan_container(SPEC, 2, (8, 0), (), {"nvidia": 195}, host_module="580.95.05")
