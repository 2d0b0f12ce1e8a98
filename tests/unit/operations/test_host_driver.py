"""The NVIDIA driver where each profile serves from: packages per placement, the Proxmox host's boot files
(modules, device unit, apt preferences), the container's module check, the driver's reboot on a node through
the node's reboot guards, the device-node check, and the `vm` profile parking what the host driver left
(facts in -> exact commands or noop sentences out)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from pyinfra.api.exceptions import OperationError

from pvegpu.facts.host_driver import parse_host_driver
from pvegpu.facts.lxc_devices import ContainerDriverVersion, parse_nvml_version
from pvegpu.facts.next_boot import NextBoot
from pvegpu.facts.node_guests import NodeGuestList
from pvegpu.facts.node_read import NodeRead
from pvegpu.facts.nvidia import CharDevices, char_devices_command
from pvegpu.models.boot import KernelBoot
from pvegpu.models.driver import DriverSpec
from pvegpu.models.host_driver import HostDriverState, UnitState
from pvegpu.models.node_guests import NodeGuest, NodeGuests
from pvegpu.models.nvidia import LoadedModule
from pvegpu.operations.host_driver import host_driver_parked
from pvegpu.operations.nvidia import device_nodes_present, driver_module, refuse_driver_reboot
from pvegpu.operations.reboot import REBOOT
from pvegpu.operations.render import render
from pvegpu.plan.driver import KERNEL_PACKAGES, driver_packages
from pvegpu.plan.lxc import device_nodes
from pvegpu.plan.reboot import Ours, RebootGuard
from tests.unit.host_states import decide_from, host_state
from tests.unit.op_harness import FakeHost, node_state, run_op
from tests.unit.operations.test_guest import OPEN_580_FILE, FakeShell, call

DRIVER = DriverSpec()
KERNEL = "6.8.12-4-pve"
NODES = device_nodes(8, ())


def left_on(driver: HostDriverState) -> dict[type, object]:
    """The node's state read, with `driver` as what the host-driver profiles left."""
    return {NodeRead: node_state(driver=driver)}


# --- packages per placement -----------------------------------------------------------------------


def test_packages_guest_host_container() -> None:
    assert driver_packages(DRIVER, "guest", "6.1.0-27-amd64") == (
        "nvidia-open=580.95.05-1",
        "dkms",
        "linux-headers-6.1.0-27-amd64",
    )
    assert driver_packages(DRIVER, "pve-host", KERNEL) == (
        "nvidia-open=580.95.05-1",
        "nvidia-modprobe=580.95.05-1",
        "dkms",
        "proxmox-headers-6.8.12-4-pve",
        "proxmox-default-headers",
    )
    assert driver_packages(DriverSpec(version="590.48.01"), "container", KERNEL) == (
        "nvidia-driver-cuda=590.48.01-1",
    )


# --- files the role writes -------------------------------------------------------------------------


def test_device_unit_creates_every_node_before_guests() -> None:
    unit = render("nvidia_driver/pvegpu-nvidia-devices.service.j2", gpus=8)
    body = [line for line in unit.splitlines() if not line.startswith("#")]
    assert body == [
        "[Unit]",
        "Description=NVIDIA device nodes for containers (pvegpu)",
        "After=systemd-modules-load.service",
        "Before=pve-guests.service",
        "",
        "[Service]",
        "Type=oneshot",
        "RemainAfterExit=yes",
        "ExecStart=/usr/bin/nvidia-modprobe -c 0 -c 1 -c 2 -c 3 -c 4 -c 5 -c 6 -c 7 -c 255 -m",
        "ExecStart=/usr/bin/nvidia-modprobe -u -c 0",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    assert "# /dev/nvidia0..7, /dev/nvidiactl (minor 255) and /dev/nvidia-modeset.\n" in unit


def test_modules_load_drop_in() -> None:
    text = render("nvidia_driver/modules-load-pvegpu-nvidia.conf.j2")
    assert [line for line in text.splitlines() if not line.startswith("#")] == [
        "nvidia",
        "nvidia_uvm",
        "nvidia_modeset",
    ]


def test_container_preferences_forbid_modules_first_then_pin() -> None:
    text = render(
        "nvidia_driver/apt-preferences-pvegpu-nvidia.j2",
        version="580.95.05",
        container=True,
        kernel_packages=KERNEL_PACKAGES,
    )
    records = [
        [line for line in block.splitlines() if not line.startswith("#")] for block in text.split("\n\n")
    ]
    assert records == [
        [
            "Package: nvidia-kernel-open-dkms nvidia-kernel-dkms nvidia-open cuda-drivers dkms",
            "Pin: version *",
            "Pin-Priority: -1",
        ],
        [
            "Package: nvidia-* libnvidia-* cuda-drivers* firmware-nvidia-*",
            "Pin: version 580.95.05-*",
            "Pin-Priority: 1001",
        ],
    ]
    host = render(
        "nvidia_driver/apt-preferences-pvegpu-nvidia.j2",
        version="580.95.05",
        container=False,
        kernel_packages=KERNEL_PACKAGES,
    )
    assert "Pin-Priority: -1" not in host


# --- driver_module in a container --------------------------------------------------------------------


def test_noop_container_module_is_the_hosts_pinned_one(monkeypatch: pytest.MonkeyPatch) -> None:
    decide_from(monkeypatch, host_state(module=LoadedModule("open", "580.95.05")))
    commands, noops = run_op(
        driver_module,
        {},
        driver=DRIVER,
        installing=True,
        container=True,
    )
    assert (commands, noops) == ([], ["the host's open NVIDIA kernel module 580.95.05 is loaded"])


def test_error_container_names_host_module_and_userspace_versions_never_reboots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decide_from(monkeypatch, host_state(module=LoadedModule("open", "590.48.01")))
    with pytest.raises(OperationError) as error:
        run_op(
            driver_module,
            {},
            driver=DriverSpec(allow_reboot=True),
            installing=True,
            container=True,
        )
    assert str(error.value) == (
        "driver version mismatch: host kernel module open 590.48.01, container userspace open 580.95.05 "
        "(driver.version must be the host module's version)"
    )


def test_error_container_without_host_module(monkeypatch: pytest.MonkeyPatch) -> None:
    decide_from(monkeypatch, host_state(module=None))
    with pytest.raises(OperationError) as error:
        run_op(driver_module, {}, driver=DRIVER, installing=False, container=True)
    assert str(error.value) == (
        "the host has no NVIDIA kernel module loaded (/proc/driver/nvidia/version is absent): deploy the "
        "host (profile lxc) first"
    )


# --- driver_module on a Proxmox node: the node's reboot guards first ------------------------------------

# The lxc profile's node: its container 300 is pvegpu's (marked), the operator's VM 150 runs beside it.
GUARD = RebootGuard("pve1", Ours("lab", (("CT", 300),)), allow_foreign=False, driver_version="580.95.05")
OURS = NodeGuest("CT", 300, "llm", "running", "pvegpu", "pvegpu-owner: lab")
FOREIGN = NodeGuests((NodeGuest("VM", 150, "other", "running"), OURS))
REFUSED = (
    "not rebooting pve1: it would stop what is not pvegpu's: running VM 150 (other); stop or migrate them, "
    "or set pve_host.allow_reboot_with_foreign_guests: true"
)
OLD_FILE = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (x)"
# The next boot's kernel has the pinned module (DKMS built it for both).
BOOT_OK = KernelBoot(KERNEL, (KERNEL,), None, None, {KERNEL: ("580.95.05",)})


class NodeShell(FakeShell):
    """A Proxmox node `pve1` for the reboot's FunctionCommand (FakeShell's answers and facts)."""

    print_prefix = "[pve1] "
    name = "pve1"


def node_reboot(monkeypatch: pytest.MonkeyPatch, facts: Mapping[type, object]) -> NodeShell:
    """The driver's reboot on the node, with the old module still loaded after the install."""
    decide_from(monkeypatch, host_state(module=LoadedModule("open", "580.65.06")))
    commands, _ = run_op(
        driver_module, {}, driver=DriverSpec(allow_reboot=True), installing=True, guard=GUARD
    )
    shell = NodeShell({"cat": [OLD_FILE]}, facts)
    call(commands[0], shell)
    return shell


def test_error_driver_reboot_on_a_node_with_a_foreign_running_guest_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(OperationError) as error:
        node_reboot(monkeypatch, {NodeGuestList: FOREIGN})
    assert str(error.value) == REFUSED


def test_driver_reboot_on_a_node_reads_the_guests_with_the_inventorys_and_the_next_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("pvegpu.operations.reboot._DELAY_S", 0.0)
    facts: dict[type, object] = {NodeGuestList: NodeGuests((OURS,)), NextBoot: BOOT_OK}
    decide_from(monkeypatch, host_state(module=LoadedModule("open", "580.65.06")))
    commands, _ = run_op(
        driver_module, {}, driver=DriverSpec(allow_reboot=True), installing=True, guard=GUARD
    )
    shell = NodeShell({"cat": [OLD_FILE]}, facts)
    original = shell.run_shell_command

    def run(command: Any, print_output: bool = False) -> Any:
        if command.get_raw_value() == REBOOT:
            shell.answers = {"cat": [OPEN_580_FILE]}  # the new module is loaded at boot
        return original(command, print_output)

    monkeypatch.setattr(shell, "run_shell_command", run)
    call(commands[0], shell)
    assert shell.read == [("NodeGuestList", {"node": "pve1", "own": (("CT", 300),)}), ("NextBoot", {})]
    cat = "cat /proc/driver/nvidia/version 2>/dev/null || true"
    assert shell.ran == [cat, REBOOT, "<disconnect>", "<connect>", cat]


def test_error_driver_reboot_onto_a_kernel_without_the_module_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    newer = "6.14.8-2-pve"
    boot = KernelBoot(KERNEL, (KERNEL, newer), None, None, {KERNEL: ("580.95.05",)})
    with pytest.raises(OperationError) as error:
        node_reboot(monkeypatch, {NodeGuestList: NodeGuests((OURS,)), NextBoot: boot})
    assert str(error.value) == (
        f"pve1: reboot refused: kernel {newer} (next boot) has no NVIDIA module 580.95.05 built by DKMS "
        f"(built: none): apt install proxmox-headers-{newer}, then dkms autoinstall -k {newer}; or pin the "
        f"running kernel: proxmox-boot-tool kernel pin {KERNEL}"
    )


def test_error_driver_role_refuses_a_certain_reboot_before_any_operation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another module loaded: only a reboot replaces it, so the role refuses while it collects."""
    decide_from(monkeypatch, host_state(module=LoadedModule("open", "580.65.06")))
    with pytest.raises(OperationError) as error:
        refuse_driver_reboot(FakeHost({NodeGuestList: FOREIGN}), DriverSpec(allow_reboot=True), GUARD)  # type: ignore[arg-type]
    assert str(error.value) == REFUSED


@pytest.mark.parametrize(
    ("loaded", "allow"),
    [(None, True), (LoadedModule("open", "580.95.05"), True), (LoadedModule("open", "1.0"), False)],
)
def test_driver_role_reads_nothing_when_no_reboot_is_certain(
    monkeypatch: pytest.MonkeyPatch, loaded: LoadedModule | None, allow: bool
) -> None:
    """Nothing loaded (the new module may just load), the pinned one, or no reboot allowed: no guard read."""
    decide_from(monkeypatch, host_state(module=loaded))
    refuse_driver_reboot(FakeHost({}), DriverSpec(allow_reboot=allow), GUARD)  # type: ignore[arg-type]


# --- device_nodes_present ------------------------------------------------------------------------------


def test_char_devices_command_tests_each_path() -> None:
    assert char_devices_command(("/dev/nvidia0", "/dev/nvidia-uvm")) == (
        'for f in /dev/nvidia0 /dev/nvidia-uvm; do [ -c "$f" ] && echo "$f"; done; true'
    )


def test_noop_device_nodes() -> None:
    commands, noops = run_op(
        device_nodes_present, {CharDevices: frozenset(NODES)}, nodes=NODES, installing=False
    )
    assert (commands, noops) == ([], ["12 NVIDIA device nodes exist (/dev/nvidia0 .. /dev/nvidia-modeset)"])


def test_error_device_nodes_missing_named() -> None:
    present = frozenset(NODES) - {"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    with pytest.raises(OperationError) as error:
        run_op(device_nodes_present, {CharDevices: present}, nodes=NODES, installing=False)
    assert str(error.value) == (
        "missing NVIDIA device nodes: /dev/nvidia-uvm, /dev/nvidia-uvm-tools "
        "(pvegpu-nvidia-devices.service creates them)"
    )


def test_create_device_nodes_checked_on_the_host_after_install() -> None:
    commands, noops = run_op(device_nodes_present, {}, nodes=NODES, installing=True)
    assert noops == []
    assert len(commands) == 1
    call(commands[0], FakeShell({"for f in": list(NODES)}))
    shell = FakeShell({"for f in": list(NODES[:-1])})
    with pytest.raises(OperationError, match=r"^missing NVIDIA device nodes: /dev/nvidia-modeset "):
        call(commands[0], shell)
    assert shell.ran == [char_devices_command(NODES)]


# --- host_driver_parked (profile vm) ---------------------------------------------------------------


LEFT_BY_BAREMETAL = [
    "file /etc/modules-load.d/pvegpu-nvidia.conf",
    "file /etc/systemd/system/pvegpu-nvidia-devices.service",
    "file /etc/systemd/system/sglang.service",
    "file /etc/pvegpu/sglang.env",
    "unit sglang.service enabled active",
    "unit pvegpu-nvidia-devices.service enabled active",
    "unit nvidia-persistenced.service enabled active",
]


def test_parse_host_driver_state() -> None:
    state = parse_host_driver(["unit sglang.service  inactive", "unit nvidia-persistenced.service disabled"])
    assert state == HostDriverState(
        files=(),
        units=(
            UnitState("sglang.service", enabled=False, active=False),
            UnitState("nvidia-persistenced.service", enabled=False, active=False),
        ),
    )


def test_update_parks_units_and_files() -> None:
    commands, noops = run_op(
        host_driver_parked,
        left_on(parse_host_driver(LEFT_BY_BAREMETAL)),
        profile="vm",
        allow_stop=True,
    )
    assert noops == []
    assert commands == [
        "systemctl disable --now sglang.service pvegpu-nvidia-devices.service nvidia-persistenced.service",
        "rm -f /etc/modules-load.d/pvegpu-nvidia.conf /etc/systemd/system/pvegpu-nvidia-devices.service "
        "/etc/systemd/system/sglang.service /etc/pvegpu/sglang.env",
        "systemctl daemon-reload",
    ]


def test_noop_parking_not_allowed_says_what_it_would_do() -> None:
    commands, noops = run_op(
        host_driver_parked,
        left_on(parse_host_driver(LEFT_BY_BAREMETAL[:5])),
        profile="vm",
        allow_stop=False,
    )
    assert commands == []
    assert noops == [
        "profile vm: sglang.service running on the host; would stop and disable them and remove "
        "/etc/modules-load.d/pvegpu-nvidia.conf, /etc/systemd/system/pvegpu-nvidia-devices.service, "
        "/etc/systemd/system/sglang.service, /etc/pvegpu/sglang.env "
        "(pve_host.allow_reboot is false: not stopping them)"
    ]


def test_noop_parking_nothing_left() -> None:
    state = parse_host_driver([f"unit {u} disabled inactive" for u in ("sglang.service", "x.service")])
    commands, noops = run_op(host_driver_parked, left_on(state), profile="vm", allow_stop=False)
    assert (commands, noops) == ([], ["nothing loads or uses the NVIDIA driver on this host at boot"])


def test_stopped_units_parked_without_allow() -> None:
    state = parse_host_driver(
        ["file /etc/modules-load.d/pvegpu-nvidia.conf", "unit nvidia-persistenced.service enabled inactive"]
    )
    commands, _ = run_op(host_driver_parked, left_on(state), profile="vm", allow_stop=False)
    assert commands == [
        "systemctl disable --now nvidia-persistenced.service",
        "rm -f /etc/modules-load.d/pvegpu-nvidia.conf",
        "systemctl daemon-reload",
    ]


# --- the container's userspace version -------------------------------------------------------------


def test_container_userspace_version_from_nvml_file_name() -> None:
    lines = [
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.580.95.05",
    ]
    assert parse_nvml_version(lines) == "580.95.05"
    assert parse_nvml_version(["/usr/lib64/libnvidia-ml.so.570.86"]) == "570.86"
    assert parse_nvml_version(["/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"]) is None
    assert parse_nvml_version([]) is None
    assert ContainerDriverVersion().command(200) == (
        "pct exec 200 -- sh -c 'for f in /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.* "
        '/usr/lib64/libnvidia-ml.so.*; do [ -f "$f" ] && echo "$f"; done\' 2>/dev/null || true'
    )


def test_update_lxc_parks_only_the_hosts_sglang() -> None:
    commands, _ = run_op(
        host_driver_parked,
        left_on(parse_host_driver(LEFT_BY_BAREMETAL)),
        profile="lxc",
        allow_stop=True,
    )
    assert commands == [
        "systemctl disable --now sglang.service",
        "rm -f /etc/systemd/system/sglang.service /etc/pvegpu/sglang.env",
        "systemctl daemon-reload",
    ]


def test_noop_lxc_nothing_served_from_the_host() -> None:
    left = [line for line in LEFT_BY_BAREMETAL if "sglang" not in line]
    commands, noops = run_op(
        host_driver_parked,
        left_on(parse_host_driver(left)),
        profile="lxc",
        allow_stop=False,
    )
    assert (commands, noops) == ([], ["SGLang does not serve from this host (the container serves)"])


def test_error_a_guests_driver_reboot_onto_its_kernel_without_the_module_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A VM guest (no guard): its distribution's next kernel must have the module; the fix is Debian's."""
    guest_kernel, newer = "6.1.0-28-amd64", "6.1.0-31-amd64"
    boot = KernelBoot(guest_kernel, (guest_kernel, newer), None, None, {guest_kernel: ("580.95.05",)})
    decide_from(monkeypatch, host_state(module=LoadedModule("open", "580.65.06")))
    commands, _ = run_op(driver_module, {}, driver=DriverSpec(allow_reboot=True), installing=True)
    shell = NodeShell({"cat": [OLD_FILE]}, {NextBoot: boot})
    shell.name = "gpu-vm"
    with pytest.raises(OperationError) as error:
        call(commands[0], shell)
    assert str(error.value) == (
        f"gpu-vm: reboot refused: kernel {newer} (next boot) has no NVIDIA module 580.95.05 built by DKMS "
        f"(built: none): apt install linux-headers-{newer}, then dkms autoinstall -k {newer}; or keep "
        f"booting {guest_kernel} (GRUB_DEFAULT)"
    )
    assert shell.read == [("NextBoot", {})]
    assert REBOOT not in shell.ran
