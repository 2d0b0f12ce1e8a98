"""`vm.p2p: probe` against a Proxmox lab node and its VM guest (pvesh stand-in, guest agent stand-in, the
stand-in `torch` of the guest's SGLang venv, whose outcome the test picks in the guest's
/etc/pvegpu-lab/p2p-outcome): a hang, success, P2P slower than SHM and a wrong checksum, each ending in the
documented plan. The probe runs in deploy/vm.py runs: deploy/site.py, which also converges the guest,
defers it (a VM restart would cut the guest's connection).

- The probe needs the guest's driver and venv: until deploy/site.py installed them, the node says it is
  pending and keeps SHM. With them and no record, the node maps the GPUs single-function (`path=...:00.0`:
  QEMU's `-set` reaches `hostpciN`, never `hostpciN.0`), sets its clique parts
  (`-set device.hostpciN.x-nv-gpudirect-clique=C`, beside the operator's part and the MMIO window part) and
  restarts the VM, which the lab's real QEMU accepts; a failed probe maps them whole again. A lab guest
  loses what was installed when its VM restarts (the lab does not keep a guest's disk), so it is
  provisioned again before the probe runs.
- A hang: the probe is killed at `vm.p2p_probe_timeout_s`, the run stays within that bound plus the
  restart, the clique is removed, the VM restarted, the record says SHM, and the guest's plan is SHM. The
  next run changes nothing.
- Success: the clique stays, the guest's SGLang drops `--disable-custom-all-reduce` and gets
  `NCCL_P2P_LEVEL=SYS`; the next run changes nothing.
- Slower than SHM: back to no clique, and the warning gives both measurements.
- A wrong checksum: back to no clique, the warning names the pair and the direction.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab import boot, hosts
from lab.pve import node as pve_node
from pvegpu.facts.hardware import read_hardware_locally
from pvegpu.facts.pci_cfg import parse_pci_cfg
from pvegpu.models.node import GpuSelector
from pvegpu.models.pve import parse_map_entry
from pvegpu.plan.mmio import passed_functions, plan_mmio
from pvegpu.plan.p2p import NO_DRIVER, NO_VENV, clique_args, plan_cliques
from pvegpu.plan.topology import plan_topology
from tests.lab.test_lab_numa import vm_conf
from tests.lab.test_lab_vm import VM_INVENTORY, Cli, Ssh, prepare_host

pytestmark = pytest.mark.lab

MEMORY = 8192
TIMEOUT_S = 20
OPERATOR = "-msg timestamp=on"  # the operator's own part of `args` (no part pvegpu writes)
P2P = "Create and start the Q35 VM | GPU peer-to-peer in the VM (vm.p2p)"
RECORD = "var/lib/pvegpu/p2p-probe.json"
SHM_FLAGS = "--enable-p2p-check --disable-custom-all-reduce"


@pytest.fixture
def pve_name() -> Iterator[str]:
    name = f"p{os.getpid() % 10000}"
    yield name
    hosts.down(name)


def run(cli: Cli, deploy: str, *names: str) -> tuple[dict[str, str], list[str]]:
    """(operation name -> outcomes, the log lines without pyinfra's host prefix) of one `pyinfra --json`
    run limited to `names`; the run must succeed."""
    limits = [arg for name in names for arg in ("--limit", name)]
    result = cli("--json", "-y", *limits, VM_INVENTORY, deploy, check=False)
    assert result.returncode == 0, result.stderr
    outcome = {}
    for op in json.loads(result.stdout)["results"]["operations"]:
        outcome[op["name"]] = "+".join(kind for kind in ("success", "error", "no_change") if op[kind])
    lines = [line.split("] ", 1)[1].strip() for line in result.stderr.splitlines() if "] " in line]
    return outcome, lines


def guest_file(guest_name: str, path: str) -> Path:
    return hosts.get_host(guest_name).root / path


def outcome(guest_name: str, text: str) -> None:
    """The stand-in torch's outcome for the next probe (written after the guest's last restart)."""
    path = guest_file(guest_name, "etc/pvegpu-lab/p2p-outcome")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{text}\n")


def serving_plan(guest_name: str) -> tuple[str, str]:
    """(the NCCL_P2P lines of the guest's service environment, the P2P flags of its unit's argv)."""
    env = guest_file(guest_name, "etc/pvegpu/sglang.env").read_text()
    unit = guest_file(guest_name, "etc/systemd/system/sglang.service").read_text()
    p2p = " ".join(line for line in env.splitlines() if line.startswith("NCCL_P2P"))
    flags = " ".join(
        word for word in unit.split() if word in ("--enable-p2p-check", "--disable-custom-all-reduce")
    )
    return p2p, flags


def paths(node: hosts.LabHost) -> list[str]:
    """The `path` of each of pvegpu's mappings on the node (pci.cfg, in gpuN order)."""
    text = (node.root / "etc/pve/mapping/pci.cfg").read_text()
    return [parse_map_entry(line).path for mapping in parse_pci_cfg(text).mappings for line in mapping.map]


@dataclass(frozen=True)
class Box:
    """The node, its guest's name, the CLI, and the `args` parts expected."""

    node: hosts.LabHost
    guest: str
    cli: Cli
    mmio: str
    clique: str
    slots: tuple[str, ...]  # the GPUs' slots, in gpuN order

    def whole(self) -> list[str]:
        return list(self.slots)

    def single(self) -> list[str]:
        """Each slot's display function: how a GPU with a clique is mapped."""
        return [f"{slot}.0" for slot in self.slots]

    def vm(self) -> tuple[dict[str, str], list[str]]:
        return run(self.cli, "deploy/vm.py", self.node.name)

    def site(self) -> tuple[dict[str, str], list[str]]:
        return run(self.cli, "deploy/site.py", self.node.name, self.guest)

    def args(self) -> str:
        return vm_conf(self.node)["args"]


def test_vm_p2p_probe_hang_success_slower_checksum(
    pve_name: str, pyinfra_cli: Cli, lab_ssh: Ssh, monkeypatch: pytest.MonkeyPatch
) -> None:
    vm_data = {
        "self_heal": "off",
        "cores": 8,
        "memory": MEMORY,
        "p2p": "probe",
        "p2p_probe_timeout_s": TIMEOUT_S,
    }
    monkeypatch.setenv("PVEGPU_LAB_VM_DATA", json.dumps(vm_data))
    node = pve_node.up(pve_name, "reference")
    boot.install(node, "grub")
    prepare_host(pyinfra_cli, monkeypatch, node)
    hardware = read_hardware_locally(node.root / node.sysfs_root.lstrip("/"))
    gpus = plan_topology(hardware, GpuSelector(ids=("10de:2bb1",)))
    mmio = plan_mmio(passed_functions(hardware, gpus.gpus), MEMORY).args
    vendor = "amd" if "AuthenticAMD" in Path("/proc/cpuinfo").read_text() else "intel"
    clique = clique_args(plan_cliques(gpus, vendor))
    if not clique:
        pytest.skip("the lab node's CPU (this machine's) is not AMD: the reference box has no clique then")
    slots = tuple(gpu.address for gpu in gpus.gpus)
    box = Box(node, f"{pve_name}v100", pyinfra_cli, f"{OPERATOR} {mmio}", clique, slots)

    # The VM is new, its guest not provisioned: the probe waits; the operator adds a part of their own.
    ops, lines = box.vm()
    assert ops[P2P] == "no_change"
    assert NO_DRIVER in lines
    assert paths(node) == box.whole()  # no clique yet: every function of each card
    lab_ssh(node, f"pvesh set /nodes/{pve_name}/qemu/100/config --args '{OPERATOR} {mmio}'")
    box.site()
    assert serving_plan(box.guest) == ("NCCL_P2P_DISABLE=1", SHM_FLAGS)
    _clique_set(box)
    _hang(box)
    guest_file(box.guest, RECORD).unlink()
    _clique_set(box)
    _success(box)
    _slower(box)
    box.site()  # the restarted guest provisioned again
    guest_file(box.guest, RECORD).unlink()
    _clique_set(box)
    _checksum(box)
    _on_then_off(box, monkeypatch, vm_data)


def _clique_set(box: Box) -> None:
    """Driver and venv there, no record: the clique is set and the VM restarted; the lab guest comes back
    bare, so the probe waits for the next provisioning (deploy/site.py)."""
    ops, lines = box.vm()
    assert ops[P2P] == "success"
    assert box.args() == f"{box.mmio} {box.clique}"
    assert paths(box.node) == box.single()  # QEMU's `-set` reaches `hostpciN`, not `hostpciN.0`
    assert "VM 100: mapping gpu0 on " + box.node.name + ": single-function (its display function)" in lines
    assert f"VM 100 restarted with the clique; {NO_VENV}" in lines
    box.site()


def _hang(box: Box) -> None:
    """Killed at the time bound, back to SHM; once the guest is provisioned again, no change."""
    outcome(box.guest, "hang")
    started = time.monotonic()
    ops, lines = box.vm()
    took = time.monotonic() - started
    assert ops[P2P] == "success"
    hang = f"the probe did not finish within {TIMEOUT_S} s and was killed: P2P hangs in this VM"
    assert f"P2P probe failed: {hang}; NCCL plan SHM" in lines
    assert TIMEOUT_S <= took < TIMEOUT_S + 120, took
    assert box.args() == box.mmio
    assert paths(box.node) == box.whole()  # the clique gone: the cards whole again
    record = json.loads(guest_file(box.guest, RECORD).read_text())
    assert (record["mode"], record["verdict"], record["failures"]) == ("probe", "shm", [hang])
    box.site()  # the restarted guest provisioned again
    assert serving_plan(box.guest) == ("NCCL_P2P_DISABLE=1", SHM_FLAGS)
    again, _ = box.vm()
    assert set(again.values()) == {"no_change"}
    assert box.args() == box.mmio
    assert paths(box.node) == box.whole()


def _success(box: Box) -> None:
    """The clique stays, the guest's plan is P2P, the next run changes nothing."""
    outcome(box.guest, "success")
    ops, lines = box.vm()
    assert ops[P2P] == "success"
    measured = "all-reduce latency 3.0 us with P2P vs 13.0 us with SHM, bus bandwidth 78.7 GB/s vs 34.9 GB/s"
    assert f"P2P proven in the VM ({measured}): NCCL plan P2P" in lines
    assert box.args() == f"{box.mmio} {box.clique}"
    assert paths(box.node) == box.single()
    ops, lines = box.site()
    assert "vm.p2p probe: NCCL plan P2P" in lines
    assert serving_plan(box.guest) == ("NCCL_P2P_LEVEL=SYS", "--enable-p2p-check")
    again, _ = box.site()
    assert set(again.values()) == {"no_change"}, {k: v for k, v in again.items() if v != "no_change"}


def _slower(box: Box) -> None:
    """P2P slower than SHM (the clique in place: no restart before the probe): back to SHM."""
    guest_file(box.guest, RECORD).unlink()
    outcome(box.guest, "slower")
    _, lines = box.vm()
    measured = "all-reduce latency 40.0 us with P2P vs 13.0 us with SHM, bus bandwidth 14.0 GB/s vs 34.9 GB/s"
    assert f"P2P probe failed: P2P does not beat SHM: {measured}; NCCL plan SHM" in lines
    assert box.args() == box.mmio
    assert paths(box.node) == box.whole()


def _checksum(box: Box) -> None:
    """Copies from GPU 2 to GPU 5 arrive corrupted: the pair and the direction are named, back to SHM."""
    outcome(box.guest, "checksum 2 5")
    _, lines = box.vm()
    assert "P2P probe failed: GPU 2 <-> GPU 5: checksum mismatch copying 2->5; NCCL plan SHM" in lines
    assert box.args() == box.mmio
    box.site()
    assert serving_plan(box.guest) == ("NCCL_P2P_DISABLE=1", SHM_FLAGS)


PENDING = "Create and start the Q35 VM | Apply the VM's pending changes (a cold restart)"
MAPPINGS = "Sync the PCI mappings | Sync the PCI mappings with the live IOMMU groups"


def _on_then_off(box: Box, monkeypatch: pytest.MonkeyPatch, vm_data: dict[str, object]) -> None:
    """`on` on the running VM: the GPUs mapped single-function, the clique in `args` (pending while the VM
    runs), the VM cold-restarted (`pve_host.allow_reboot`) under real QEMU; then `off`: whole slots and no
    clique again, restarted. Each second run changes nothing."""
    for mode, args, shape in (("on", f"{box.mmio} {box.clique}", box.single), ("off", box.mmio, box.whole)):
        monkeypatch.setenv("PVEGPU_LAB_VM_DATA", json.dumps({**vm_data, "p2p": mode}))
        ops, lines = box.vm()
        assert (ops[MAPPINGS], ops[PENDING]) == ("success", "success"), lines
        assert "VM 100: args pending: cold restart to apply them" in lines
        assert "VM 100 restarted: its pending changes apply" in lines
        assert (box.args(), paths(box.node)) == (args, shape())
        again, _ = box.vm()
        assert set(again.values()) == {"no_change"}, {k: v for k, v in again.items() if v != "no_change"}
