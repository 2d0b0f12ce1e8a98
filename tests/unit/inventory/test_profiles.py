"""Profiles as states of the host (plan/profile.py) and the operations that switch between them: what each
profile owns, the vfio drop-ins removed, the reboot check without vfio, the managed VM parked, and a VM
start that waits for the binding a reboot of the same run brings. Facts in -> exact commands, API calls or
noop sentences out. API answers follow proxmox-api-behaviour.md §4-5 (synthesized)."""

from __future__ import annotations

from typing import Any

import pytest
from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import OperationError

from pvegpu.facts.node_read import NodeRead
from pvegpu.models.hardware import HostHardware
from pvegpu.models.node import GpuSelector
from pvegpu.operations.pve_guest import VM, Guest, guest_parked, guest_running, maps_gpus
from pvegpu.operations.reboot import REBOOT, reboot_if_pending
from pvegpu.operations.vfio import UPDATE_INITRAMFS, vfio_config
from pvegpu.plan.errors import PlanError
from pvegpu.plan.profile import HostProfile, held_by_vfio, host_profile, profile_functions
from pvegpu.plan.reboot import pending_reasons
from pvegpu.plan.topology import plan_topology
from pvegpu.pve.errors import PveError
from tests.unit.fake_pve import UPID_START, ConfigStore, FakeApi, execute, sequence, task_ok
from tests.unit.hostdata import RTX, fn, two_cards, written_files
from tests.unit.op_harness import node_state, run_op

ALL = ("0000:41:00.0", "0000:41:00.1", "0000:51:00.0", "0000:51:00.1")
SELECTOR = GpuSelector(ids=(RTX,), count=2)
RUNNING = ("BOOT_IMAGE=/boot/vmlinuz-6.8.12-4-pve", "root=/dev/mapper/pve-root", "ro", "quiet")


# --- what each profile owns ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "expected"),
    [
        ("vm", HostProfile("vm", ("amd_iommu=on", "iommu=pt", "pcie_aspm=off"), vfio=True, vm_running=True)),
        (
            "lxc",
            HostProfile(
                "lxc", ("iommu=pt", "pcie_port_pm=off", "pcie_aspm=off"), vfio=False, vm_running=False
            ),
        ),
        (
            "baremetal",
            HostProfile(
                "baremetal", ("iommu=pt", "pcie_port_pm=off", "pcie_aspm=off"), vfio=False, vm_running=False
            ),
        ),
    ],
)
def test_host_profile_owns(profile: str, expected: HostProfile) -> None:
    assert host_profile(profile, "amd", ("pcie_aspm=off",)) == expected


def shared_group() -> Any:
    """two_cards with the NIC moved into the first GPU's group: not passable, fine for the host driver."""
    hw = two_cards()
    nic = fn("0000:41:01.0", "8086:1521", 0x020000, group=14, driver="igb", root_bus="0000:40")
    return type(hw)(functions=(*hw.functions, nic), iommu_present=True)


def functions_of(profile: str, hw: HostHardware, selector: GpuSelector = SELECTOR) -> tuple[str, ...]:
    return profile_functions(profile, hw, plan_topology(hw, selector), selector)


def test_profile_functions_host_driver_profiles_take_card_functions_without_group_verdicts() -> None:
    assert functions_of("baremetal", shared_group()) == ALL
    assert functions_of("lxc", two_cards()) == ALL
    with pytest.raises(PlanError) as raised:
        functions_of("vm", shared_group())
    assert str(raised.value).startswith("node.gpus: gpu0 (0000:41:00): ")


@pytest.mark.parametrize(
    ("selector", "message"),
    [
        (
            GpuSelector(ids=("10de:ffff",)),
            "node.gpus.ids: 10de:ffff matches no display function on this host",
        ),
        (GpuSelector(ids=(RTX,), count=8), "node.gpus.count: "),
    ],
)
def test_error_profile_functions_bad_selector(selector: GpuSelector, message: str) -> None:
    with pytest.raises(PlanError) as raised:
        functions_of("baremetal", two_cards(), selector)
    assert str(raised.value).startswith(message)


def test_pending_without_vfio_only_vfio_bound_functions_and_tokens_count() -> None:
    hw = two_cards(driver="vfio-pci", iommu=False)
    assert pending_reasons(
        (*RUNNING, "amd_iommu=on"), ("iommu=pt",), hw, ALL, ("amd_iommu=on", "iommu=pt"), vfio=False
    ) == (
        "/proc/cmdline lacks iommu=pt",
        "/proc/cmdline still has amd_iommu=on",
        "0000:41:00.0, 0000:41:00.1, 0000:51:00.0, 0000:51:00.1 still bound to vfio-pci",
    )
    # Unbound (no host driver installed) and nvidia/snd_hda_intel are both fine; no IOMMU groups too.
    assert (
        pending_reasons((*RUNNING, "iommu=pt"), ("iommu=pt",), two_cards(None, iommu=False), ALL, vfio=False)
        == ()
    )
    assert pending_reasons((*RUNNING, "iommu=pt"), ("iommu=pt",), two_cards(), ALL, vfio=False) == ()


# --- vfio_config(present=False) --------------------------------------------------------------


def test_update_vfio_removed_both_dropins_then_update_initramfs() -> None:
    commands, noops = run_op(
        vfio_config,
        {},
        files=written_files(modules_load="vfio\n", modprobe="blacklist nvidia\n"),
        present=False,
    )
    assert commands == [
        "rm -f /etc/modules-load.d/pvegpu-vfio.conf /etc/modprobe.d/pvegpu-vfio.conf",
        UPDATE_INITRAMFS.get_raw_value(),
    ]
    assert noops == []


def test_update_vfio_removed_only_the_dropin_left() -> None:
    commands, _ = run_op(vfio_config, {}, files=written_files(modprobe="blacklist nvidia\n"), present=False)
    assert commands == ["rm -f /etc/modprobe.d/pvegpu-vfio.conf", UPDATE_INITRAMFS.get_raw_value()]


def test_noop_vfio_dropins_absent() -> None:
    commands, noops = run_op(vfio_config, {}, files=written_files(), present=False)
    assert commands == []
    assert noops == [
        "/etc/modules-load.d/pvegpu-vfio.conf and /etc/modprobe.d/pvegpu-vfio.conf are absent: "
        "nothing binds GPUs to vfio-pci at boot"
    ]


# --- reboot_if_pending(vfio=False) -----------------------------------------------------------


def reboot(running: tuple[str, ...], driver: str | None, allow: bool) -> Any:
    return run_op(
        reboot_if_pending,
        {NodeRead: node_state(cmdline=running)},
        hardware=two_cards(driver=driver),
        tokens=("iommu=pt",),
        functions=ALL,
        allow_reboot=allow,
        retired=("amd_iommu=on",),
        vfio=False,
        timeout_s=60,
    )


def test_noop_host_driver_profile_nothing_pending() -> None:
    commands, noops = reboot((*RUNNING, "iommu=pt"), "nvidia", allow=True)
    assert commands == []
    assert noops == [
        "no reboot needed: the running kernel has iommu=pt and none of 4 GPU functions is bound to vfio-pci"
    ]


def test_noop_host_driver_profile_pending_not_allowed_says_what() -> None:
    commands, noops = reboot((*RUNNING, "amd_iommu=on", "iommu=pt"), "vfio-pci", allow=False)
    assert commands == []
    assert noops == [
        "reboot required: /proc/cmdline still has amd_iommu=on; 0000:41:00.0, 0000:41:00.1, 0000:51:00.0, "
        "0000:51:00.1 still bound to vfio-pci (pve_host.allow_reboot is false: not rebooting)"
    ]


def test_host_driver_profile_pending_and_allowed_reboots() -> None:
    commands, _ = reboot((*RUNNING, "amd_iommu=on", "iommu=pt"), "vfio-pci", allow=True)
    assert commands[0] == REBOOT
    assert isinstance(commands[1], FunctionCommand)


# --- guest_parked (a VM) ----------------------------------------------------------------------

CONFIG = "/nodes/pve1/qemu/100/config"
STATUS = "/nodes/pve1/qemu/100/status/current"
STOP = "/nodes/pve1/qemu/100/status/stop"
UPID_STOP = "UPID:pve1:0000A1B4:0153F2C5:66A1B2C5:qmstop:100:root@pam:"
TASK_STOP = f"/nodes/pve1/tasks/{UPID_STOP}/status"
SHUTDOWN = "/nodes/pve1/qemu/100/status/shutdown"
UPID_SHUTDOWN = "UPID:pve1:0000A1B6:0153F2C7:66A1B2C7:qmshutdown:100:root@pam:"
TASK_SHUTDOWN = f"/nodes/pve1/tasks/{UPID_SHUTDOWN}/status"


def vm(onboot: int | None = 1, hostpci: str = "mapping=gpu0,pcie=1") -> dict[str, object]:
    values: dict[str, object] = {"name": "llm", "hostpci0": hostpci, "digest": "c0ffee"}
    if onboot is not None:
        values["onboot"] = onboot
    return values


def vm_store(values: dict[str, object]) -> ConfigStore:
    missing = PveError(500, "Configuration file 'nodes/pve1/qemu-server/100.conf' does not exist")
    return ConfigStore(values, missing=missing, mismatch="checksum mismatch (file change by other user?)")


def status(state: str) -> dict[str, object]:
    return {"vmid": 100, "status": state, "qmpstatus": state, "name": "llm"}


def park(api: FakeApi, allow: bool = True) -> tuple[list[Any], list[str]]:
    return run_op(
        guest_parked,
        {},
        guest=Guest(VM, api.client, "pve1", 100),
        prefix="gpu",
        profile="baremetal",
        allow_stop=allow,
        timeout_s=5,
    )


def test_update_running_vm_onboot_cleared_then_shut_down() -> None:
    store = vm_store(vm())
    api = FakeApi(
        {
            ("GET", CONFIG): store.get,
            ("GET", STATUS): sequence(status("running"), status("stopped")),
            ("PUT", CONFIG): store.put,
            ("POST", SHUTDOWN): UPID_SHUTDOWN,
            ("GET", TASK_SHUTDOWN): task_ok(UPID_SHUTDOWN),
        }
    )

    commands, noops = park(api)
    assert noops == []
    execute(commands)

    assert api.writes() == [  # a clean shutdown, never a plain power-off
        ("PUT", CONFIG, {"onboot": 0, "digest": "c0ffee"}),
        ("POST", SHUTDOWN, {"timeout": 5}),
    ]


def test_update_vm_shutdown_timed_out_then_stopped_said_so(caplog: pytest.LogCaptureFixture) -> None:
    store = vm_store(vm(onboot=0))
    timed_out = {
        "upid": UPID_SHUTDOWN,
        "status": "stopped",
        "exitstatus": "VM quit/powerdown failed - got timeout",
    }
    api = FakeApi(
        {
            ("GET", CONFIG): store.get,
            ("GET", STATUS): sequence(status("running"), status("stopped")),
            ("POST", SHUTDOWN): UPID_SHUTDOWN,
            ("GET", TASK_SHUTDOWN): timed_out,
            ("POST", STOP): UPID_STOP,
            ("GET", TASK_STOP): task_ok(UPID_STOP),
        }
    )

    commands, _ = park(api)
    execute(commands)

    assert api.writes() == [("POST", SHUTDOWN, {"timeout": 5}), ("POST", STOP, {})]
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"[pve1] VM 100 did not shut down within 5 s (task {UPID_SHUTDOWN}: "
        "VM quit/powerdown failed - got timeout): stopping it"
    ]


def test_noop_running_vm_not_allowed_says_what_it_would_do() -> None:
    api = FakeApi({("GET", CONFIG): vm(), ("GET", STATUS): status("running")})

    commands, noops = park(api, allow=False)

    assert commands == []
    assert noops == [
        "profile baremetal: VM 100 is running on pve1 with the GPUs; would stop it and set onboot 0 "
        "(pve_host.allow_reboot is false: not stopping it)"
    ]
    assert api.writes() == []


def test_update_stopped_vm_only_onboot_cleared_even_when_not_allowed() -> None:
    store = vm_store(vm())
    api = FakeApi(
        {("GET", CONFIG): store.get, ("GET", STATUS): status("stopped"), ("PUT", CONFIG): store.put}
    )

    commands, _ = park(api, allow=False)
    execute(commands)

    assert store.values == {**vm(onboot=None), "onboot": 0, "digest": "c0ffee+"}

    assert api.writes() == [("PUT", CONFIG, {"onboot": 0, "digest": "c0ffee"})]


@pytest.mark.parametrize(
    ("config", "noop"),
    [
        (vm(onboot=0), "VM 100 on pve1 is stopped and not started at boot (onboot 0)"),
        (vm(onboot=None), "VM 100 on pve1 is stopped and not started at boot (onboot 0)"),
        (
            vm(hostpci="0000:61:00.0,pcie=1"),
            "VM 100 on pve1 maps none of pvegpu's gpuN mappings: not pvegpu's, left alone",
        ),
    ],
)
def test_noop_guest_parked_vm(config: dict[str, object], noop: str) -> None:
    api = FakeApi({("GET", CONFIG): config, ("GET", STATUS): status("stopped")})

    assert park(api) == ([], [noop])
    assert api.writes() == []


def test_noop_vm_absent() -> None:
    missing = PveError(500, "Configuration file 'nodes/pve1/qemu-server/100.conf' does not exist")
    api = FakeApi({("GET", CONFIG): missing})

    assert park(api) == ([], ["VM 100 does not exist on pve1: no VM holds the GPUs"])


def test_maps_gpus_only_pvegpus_prefix() -> None:
    assert maps_gpus({"hostpci3": "mapping=gpu12,pcie=1"}, "gpu")
    assert not maps_gpus({"hostpci0": "mapping=gpux,pcie=1", "net0": "mapping=gpu0"}, "gpu")
    assert not maps_gpus({"hostpci0": "mapping=mygpu0,pcie=1"}, "gpu")


# --- guest_running (a VM) with a recheck at execution ----------------------------------------

START = "/nodes/pve1/qemu/100/status/start"
TASK_START = f"/nodes/pve1/tasks/{UPID_START}/status"


def start_later(api: FakeApi, later: tuple[str, ...]) -> Any:
    return run_op(
        guest_running,
        {},
        guest=Guest(VM, api.client, "pve1", 100),
        unbound=("0000:41:00.0 (nvidia)",),
        timeout_s=5,
        recheck=lambda _host: later,
    )


def test_update_start_waits_for_the_binding_a_reboot_brings() -> None:
    api = FakeApi(
        {
            ("GET", CONFIG): vm(),
            ("GET", STATUS): sequence(status("stopped"), status("running")),
            ("POST", START): UPID_START,
            ("GET", TASK_START): task_ok(UPID_START),
        }
    )
    commands, _ = start_later(api, ())
    assert len(commands) == 1
    execute(commands)
    assert api.writes() == [("POST", START, {})]


def test_error_start_refused_when_still_unbound_at_execution() -> None:
    api = FakeApi({("GET", CONFIG): vm(), ("GET", STATUS): status("stopped")})
    commands, _ = start_later(api, ("0000:41:00.0 (no driver)",))
    with pytest.raises(OperationError) as error:
        execute(commands)  # one error line for the host (an api_command), no traceback
    assert str(error.value) == (
        "refusing to start VM 100: vfio binding not in effect on pve1 for 0000:41:00.0 (no driver) "
        "(run deploy/host.py)"
    )
    assert api.writes() == []


def test_held_by_vfio_only_without_reboot_on_host_driver_profiles() -> None:
    on_vfio = two_cards(driver="vfio-pci")
    assert held_by_vfio("baremetal", on_vfio, ALL[:2], allow_reboot=False) == (
        "profile baremetal: 0000:41:00.0, 0000:41:00.1 still bound to vfio-pci until the host reboots "
        "(pve_host.allow_reboot is false): not installing the host driver or serving yet"
    )
    assert held_by_vfio("lxc", on_vfio, ALL, allow_reboot=True) is None
    assert held_by_vfio("vm", on_vfio, ALL, allow_reboot=False) is None
    assert held_by_vfio("lxc", two_cards(driver=None), ALL, allow_reboot=False) is None
