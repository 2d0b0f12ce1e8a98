"""The reboot guard: what a reboot of the node would stop that is not pvegpu's refuses it, in one line, unless
`pve_host.allow_reboot_with_foreign_guests`. The guest list's parser on pvesh output in Proxmox's format
(synthesized from qemu-server `vmstatus`, pve-container `vmstatus` and pve-ha-manager API2/HA/Status.pm),
the pure decision, the switch's validation, and the lab stand-in's answers to the same endpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab import fakesys
from lab.pve import ha
from pvegpu.facts.node_guests import guest_paths, node_guests_command, parse_node_guests
from pvegpu.models.errors import InventoryError
from pvegpu.models.host import HOST_KEY, HostSpec
from pvegpu.models.node_guests import HaService, NodeGuest, NodeGuests
from pvegpu.models.spec_validation import spec_of
from pvegpu.plan.reboot import foreign_refusal
from tests.unit.lab.pve.test_pvesh import Pve


@pytest.fixture
def pve(tmp_path: Path) -> Pve:
    """The pvesh stand-in in a temporary directory (as tests/unit/lab/pve/test_pvesh.py's fixture)."""
    installed = Pve(tmp_path)
    fakesys.write_tree(installed.sysfs, "reference")
    settings = {"node": "pve1", "sysfs_root": str(installed.sysfs), "root": str(installed.root)}
    (tmp_path / "pve.json").write_text(json.dumps(settings))
    return installed


QEMU = [
    {"vmid": 100, "status": "running", "name": "gpu-vm", "cpus": 8, "maxmem": 1 << 30, "pid": 4242},
    {"vmid": 300, "status": "running", "name": "web", "cpus": 2, "maxmem": 1 << 30, "pid": 4343},
    {"vmid": 301, "status": "stopped", "name": "old", "cpus": 2, "maxmem": 1 << 30},
]
LXC = [{"vmid": 310, "type": "lxc", "status": "running", "name": "db", "cpus": 1, "maxmem": 1 << 29}]
HA_STATUS = [
    {"id": "quorum", "type": "quorum", "node": "pve1", "status": "OK", "quorate": 1},
    {"id": "fencing", "type": "fencing", "node": "pve1", "status": "standby", "armed-state": "standby"},
    {
        "id": "service:vm:300",
        "type": "service",
        "sid": "vm:300",
        "node": "pve1",
        "state": "started",
        "crm_state": "started",
        "request_state": "started",
        "status": "vm:300 (pve1, started)",
    },
    {"id": "service:vm:100", "type": "service", "sid": "vm:100", "node": "pve1", "request_state": "started"},
    {"id": "service:ct:320", "type": "service", "sid": "ct:320", "node": "pve2", "request_state": "started"},
    {"id": "service:vm:302", "type": "service", "sid": "vm:302", "node": "pve1", "request_state": "stopped"},
]


def output(qemu: object = QEMU, lxc: object = LXC, status: object = HA_STATUS) -> list[str]:
    qemu_path, lxc_path, ha_path = guest_paths("pve1")
    return [
        f"#pvegpu-guests:{qemu_path}",
        json.dumps(qemu),
        f"#pvegpu-guests:{lxc_path}",
        json.dumps(lxc),
        f"#pvegpu-guests:{ha_path}",
        json.dumps(status),
    ]


def test_command_reads_the_three_lists_as_root_and_always_exits_zero() -> None:
    assert node_guests_command("pve1") == (
        "if ! command -v pvesh >/dev/null 2>&1; then echo '#pvegpu-guests-no-pvesh'; else "
        "for p in /nodes/pve1/qemu /nodes/pve1/lxc /cluster/ha/status/current; "
        'do echo "#pvegpu-guests:$p"; pvesh get "$p" --output-format json 2>&1 || '
        'echo "#pvegpu-guests-failed:$?"; done; fi'
    )
    assert parse_node_guests(["#pvegpu-guests-no-pvesh"]) == NodeGuests()


def test_parse_guests_sorted_by_vmid_and_ha_services_only() -> None:
    listed = parse_node_guests(output())
    assert listed == NodeGuests(
        guests=(
            NodeGuest("VM", 100, "gpu-vm", "running"),
            NodeGuest("VM", 300, "web", "running"),
            NodeGuest("VM", 301, "old", "stopped"),
            NodeGuest("CT", 310, "db", "running"),
        ),
        ha=(
            HaService("vm:300", "pve1", "started", "started"),
            HaService("vm:100", "pve1", "started", None),
            HaService("ct:320", "pve2", "started", None),
            HaService("vm:302", "pve1", "stopped", None),
        ),
    )


def test_error_a_failed_pvesh_is_a_problem_not_a_fact_error() -> None:
    lines = output()
    lines[5:6] = ["403 Permission check failed (/, Sys.Audit)", "#pvegpu-guests-failed:255"]
    assert parse_node_guests(lines).problem == (
        "cannot list what a reboot would stop: pvesh get /cluster/ha/status/current: "
        "403 Permission check failed (/, Sys.Audit)"
    )
    assert parse_node_guests([]).problem == (
        "cannot list what a reboot would stop: pvesh get /nodes/<node>/qemu: no output"
    )


def test_error_foreign_guests_and_ha_resources_refuse_in_one_line() -> None:
    refusal = foreign_refusal(parse_node_guests(output()), "pve1", (100,), allowed=False)
    assert refusal == (
        "not rebooting pve1: it would stop what is not pvegpu's: running VM 300 (web), CT 310 (db); "
        "HA resources on the node: vm:300 (started); stop or migrate them, or set "
        "pve_host.allow_reboot_with_foreign_guests: true"
    )


def test_noop_only_pvegpus_guests_run_or_the_switch_is_set() -> None:
    own = parse_node_guests(output(qemu=QEMU[:1], lxc=[], status=[*HA_STATUS[:2], HA_STATUS[3]]))
    assert foreign_refusal(own, "pve1", (100,), allowed=False) is None
    assert foreign_refusal(parse_node_guests(output()), "pve1", (100,), allowed=True) is None
    # the CT is pvegpu's too (the lxc profile's `lxc.vmid`)
    assert (
        foreign_refusal(
            parse_node_guests(output(QEMU[:1], LXC, HA_STATUS[3:])), "pve1", (100, 310), allowed=False
        )
        is None
    )


def test_error_unreadable_list_refuses_without_the_switch() -> None:
    listed = NodeGuests(problem="cannot list what a reboot would stop: pvesh get /nodes/pve1/qemu: no output")
    assert foreign_refusal(listed, "pve1", (100,), allowed=False) == (
        "not rebooting pve1: cannot list what a reboot would stop: pvesh get /nodes/pve1/qemu: no output; "
        "or set pve_host.allow_reboot_with_foreign_guests: true"
    )


def test_error_odd_guest_name_shown_quoted() -> None:
    listed = NodeGuests(guests=(NodeGuest("VM", 300, "a b\x1b[2J", "running"),))
    assert foreign_refusal(listed, "pve1", (), allowed=False) == (
        "not rebooting pve1: it would stop what is not pvegpu's: running VM 300 ('a b\\x1b[2J'); "
        "stop or migrate them, or set pve_host.allow_reboot_with_foreign_guests: true"
    )


def test_error_switch_without_allow_reboot() -> None:
    with pytest.raises(InventoryError) as raised:
        spec_of({HOST_KEY: {"allow_reboot_with_foreign_guests": True}}, HOST_KEY, HostSpec)
    assert str(raised.value) == (
        "pve_host: allow_reboot_with_foreign_guests needs allow_reboot: true (no reboot without it)"
    )
    spec = {"allow_reboot": True, "allow_reboot_with_foreign_guests": True}
    assert spec_of({HOST_KEY: spec}, HOST_KEY, HostSpec).allow_reboot_with_foreign_guests


# --- the lab stand-in's answers ------------------------------------------------------------------------

RESOURCES_CFG = (
    "vm: 300\n\tstate started\n\tmax_restart 2\n\nct: 310\n\tcomment db\n\nvm: 302\n\tstate stopped\n"
)


def test_lab_ha_resources_index_as_the_section_config_parses_it() -> None:
    digest = ha.resources_index(RESOURCES_CFG)[0]["digest"]
    assert ha.resources_index(RESOURCES_CFG) == [
        {"type": "vm", "state": "started", "max_restart": 2, "sid": "vm:300", "digest": digest},
        {"type": "ct", "comment": "db", "sid": "ct:310", "digest": digest},
        {"type": "vm", "state": "stopped", "sid": "vm:302", "digest": digest},
    ]


def test_lab_ha_status_places_services_on_their_guests_node(pve: Pve) -> None:
    for folder, vmid, line in (("qemu-server", 300, "name: web\n"), ("lxc", 310, "hostname: db\n")):
        path = pve.root / "etc/pve" / folder / f"{vmid}.conf"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(line)
    (pve.root / "run/lxc").mkdir(parents=True)
    (pve.root / "run/lxc/310.running").write_text("")
    (pve.root / "etc/pve/ha").mkdir()
    (pve.root / "etc/pve/ha/resources.cfg").write_text(RESOURCES_CFG)

    status = pve.json("get", "/cluster/ha/status/current")
    lxc = pve.json("get", "/nodes/pve1/lxc")
    qemu = pve.json("get", "/nodes/pve1/qemu")

    assert [entry for entry in status if entry["type"] == "service"] == [
        {
            "id": "service:ct:310",
            "type": "service",
            "sid": "ct:310",
            "node": "pve1",
            "state": "queued",
            "status": "ct:310 (pve1, queued)",
            "request_state": "started",
            "max_restart": 1,
            "max_relocate": 1,
            "failback": 1,
            "comment": "db",
        },
        {
            "id": "service:vm:300",
            "type": "service",
            "sid": "vm:300",
            "node": "pve1",
            "state": "queued",
            "status": "vm:300 (pve1, queued)",
            "request_state": "started",
            "max_restart": 2,
            "max_relocate": 1,
            "failback": 1,
        },
        {
            "id": "service:vm:302",
            "type": "service",
            "sid": "vm:302",
            "state": "not found",
            "status": "vm:302 (---, not found)",
            "request_state": "stopped",
            "max_restart": 1,
            "max_relocate": 1,
            "failback": 1,
        },
    ]
    assert [(e["vmid"], e["type"], e["status"], e["name"]) for e in lxc] == [(310, "lxc", "running", "db")]
    assert [(e["vmid"], e["status"], e["name"]) for e in qemu] == [(300, "stopped", "web")]
    listed = parse_node_guests(output(qemu, lxc, status))
    assert foreign_refusal(listed, "pve1", (300,), allowed=False) == (
        "not rebooting pve1: it would stop what is not pvegpu's: running CT 310 (db); "
        "HA resources on the node: ct:310 (queued); stop or migrate them, or set "
        "pve_host.allow_reboot_with_foreign_guests: true"
    )
