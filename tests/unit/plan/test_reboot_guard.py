"""The reboot guard: what a reboot of the node would stop that is not pvegpu's refuses it, in one line, unless
`pve_host.allow_reboot_with_foreign_guests`; a guest is pvegpu's only at the inventory's vmid (and kind) and
with pvegpu's mark for the inventory's owner. The guest list's parser on pvesh output in Proxmox's format
(synthesized from qemu-server `vmstatus`, pve-container `vmstatus`, qemu-server's `GET .../config` and
pve-ha-manager API2/HA/Status.pm), the pure decision, the guard's inputs from the specs, the switch's
validation, and the lab stand-in's answers to the same endpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab import fakesys
from lab.pve import ha
from pvegpu.facts.node_guests import config_path, guest_paths, node_guests_command, parse_node_guests
from pvegpu.models.errors import InventoryError
from pvegpu.models.host import HOST_KEY, HostSpec
from pvegpu.models.node_guests import HaService, NodeGuest, NodeGuests
from pvegpu.models.spec_validation import spec_of
from pvegpu.models.specs import host_specs
from pvegpu.plan.reboot import Ours, RebootGuard, foreign_refusal, reboot_guard
from tests.unit.lab.pve.test_pvesh import Pve


@pytest.fixture
def pve(tmp_path: Path) -> Pve:
    """The pvesh stand-in in a temporary directory (as tests/unit/lab/pve/test_pvesh.py's fixture)."""
    installed = Pve(tmp_path)
    fakesys.write_tree(installed.sysfs, "reference")
    settings = {"node": "pve1", "sysfs_root": str(installed.sysfs), "root": str(installed.root)}
    (tmp_path / "pve.json").write_text(json.dumps(settings))
    return installed


GPU_VM = {"vmid": 100, "status": "running", "name": "gpu-vm", "cpus": 8, "maxmem": 1 << 30, "pid": 4242}
QEMU = [
    {**GPU_VM, "tags": "pvegpu;llm"},
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


# VM 100's config as `pvesh get /nodes/pve1/qemu/100/config --output-format json` prints it (one line).
CONFIG_100 = {
    "name": "gpu-vm",
    "tags": "pvegpu;llm",
    "description": "GPU VM\npvegpu-owner: lab",
    "digest": "ab",
}
OURS = Ours("lab", (("VM", 100),))


def output(
    qemu: object = QEMU, lxc: object = LXC, status: object = HA_STATUS, config: list[str] | None = None
) -> list[str]:
    """The read's output; `config`: the lines of VM 100's config read (by default CONFIG_100's JSON)."""
    qemu_path, lxc_path, ha_path = guest_paths("pve1")
    return [
        f"#pvegpu-guests:{qemu_path}",
        json.dumps(qemu),
        f"#pvegpu-guests:{lxc_path}",
        json.dumps(lxc),
        f"#pvegpu-guests:{ha_path}",
        json.dumps(status),
        f"#pvegpu-guests:{config_path('pve1', 'VM', 100)}",
        *([json.dumps(CONFIG_100)] if config is None else config),
    ]


def test_command_reads_the_three_lists_as_root_and_always_exits_zero() -> None:
    assert node_guests_command("pve1") == (
        "if ! command -v pvesh >/dev/null 2>&1; then echo '#pvegpu-guests-no-pvesh'; else "
        "for p in /nodes/pve1/qemu /nodes/pve1/lxc /cluster/ha/status/current; "
        'do echo "#pvegpu-guests:$p"; pvesh get "$p" --output-format json 2>&1 || '
        'echo "#pvegpu-guests-failed:$?"; done; fi'
    )
    assert parse_node_guests(["#pvegpu-guests-no-pvesh"]) == NodeGuests()


def test_command_reads_the_config_of_each_of_the_inventorys_guests() -> None:
    assert node_guests_command("pve1", (("VM", 100), ("CT", 200))) == (
        "if ! command -v pvesh >/dev/null 2>&1; then echo '#pvegpu-guests-no-pvesh'; else "
        "for p in /nodes/pve1/qemu /nodes/pve1/lxc /cluster/ha/status/current /nodes/pve1/qemu/100/config "
        '/nodes/pve1/lxc/200/config; do echo "#pvegpu-guests:$p"; pvesh get "$p" --output-format json '
        '2>&1 || echo "#pvegpu-guests-failed:$?"; done; fi'
    )


def test_parse_guests_sorted_by_vmid_and_ha_services_only() -> None:
    listed = parse_node_guests(output())
    assert listed == NodeGuests(
        guests=(
            NodeGuest("VM", 100, "gpu-vm", "running", "pvegpu;llm", "GPU VM\npvegpu-owner: lab"),
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


def test_parse_a_failed_config_read_leaves_the_guest_undescribed_and_is_no_problem() -> None:
    failed = [
        "Configuration file 'nodes/pve1/qemu-server/100.conf' does not exist",
        "#pvegpu-guests-failed:2",
    ]
    listed = parse_node_guests(output(config=failed))
    assert listed.problem is None
    assert listed.guests[0] == NodeGuest("VM", 100, "gpu-vm", "running", "pvegpu;llm")


def test_error_foreign_guests_and_ha_resources_refuse_in_one_line() -> None:
    refusal = foreign_refusal(parse_node_guests(output()), "pve1", OURS, allowed=False)
    assert refusal == (
        "not rebooting pve1: it would stop what is not pvegpu's: running VM 300 (web), CT 310 (db); "
        "HA resources on the node: vm:300 (started); stop or migrate them, or set "
        "pve_host.allow_reboot_with_foreign_guests: true"
    )


def test_noop_only_pvegpus_guests_run_or_the_switch_is_set() -> None:
    own = parse_node_guests(output(qemu=QEMU[:1], lxc=[], status=[*HA_STATUS[:2], HA_STATUS[3]]))
    assert foreign_refusal(own, "pve1", OURS, allowed=False) is None
    assert foreign_refusal(parse_node_guests(output()), "pve1", OURS, allowed=True) is None
    # the CT is pvegpu's too (the lxc profile's `lxc.vmid`), marked like the VM
    marked_ct = [{**LXC[0], "tags": "pvegpu"}]
    lines = [*output(QEMU[:1], marked_ct, HA_STATUS[3:]), "#pvegpu-guests:/nodes/pve1/lxc/310/config"]
    lines.append(json.dumps({"hostname": "db", "tags": "pvegpu", "description": "pvegpu-owner: lab"}))
    both = Ours("lab", (("VM", 100), ("CT", 310)))
    assert foreign_refusal(parse_node_guests(lines), "pve1", both, allowed=False) is None


@pytest.mark.parametrize(
    ("tags", "config", "found"),
    [
        (None, [json.dumps(CONFIG_100)], "pvegpu-owner: lab without the tag pvegpu"),
        ("web", [json.dumps({"name": "gpu-vm"})], "no pvegpu mark"),
        ("pvegpu", [json.dumps({**CONFIG_100, "description": "pvegpu-owner: other"})], "pvegpu-owner: other"),
        ("pvegpu", ["no such VM", "#pvegpu-guests-failed:2"], "tag pvegpu without a pvegpu-owner: line"),
    ],
)
def test_error_a_running_vm_at_vm_vmid_without_pvegpus_mark_refuses_the_reboot(
    tags: str | None, config: list[str], found: str
) -> None:
    """Another admin's VM at the inventory's vmid (untagged, another owner's, unreadable config) is not
    pvegpu's: the reboot would stop it, and HA's vm:100 is not pvegpu's either."""
    vm = GPU_VM if tags is None else {**GPU_VM, "tags": tags}
    listed = parse_node_guests(output([vm], [], [HA_STATUS[3]], config=config))
    assert foreign_refusal(listed, "pve1", OURS, allowed=False) == (
        f"not rebooting pve1: it would stop what is not pvegpu's: running VM 100 (gpu-vm; {found}); "
        "HA resources on the node: vm:100 (unknown); stop or migrate them, or set "
        "pve_host.allow_reboot_with_foreign_guests: true"
    )


def test_error_a_marked_container_at_the_vms_vmid_is_not_the_vm() -> None:
    ct = {**LXC[0], "vmid": 100, "tags": "pvegpu"}
    listed = parse_node_guests(output([], [ct], [], config=["no such VM", "#pvegpu-guests-failed:2"]))
    assert foreign_refusal(listed, "pve1", OURS, allowed=False) == (
        "not rebooting pve1: it would stop what is not pvegpu's: running CT 100 (db); stop or migrate them, "
        "or set pve_host.allow_reboot_with_foreign_guests: true"
    )


def test_reboot_guard_names_the_inventorys_guests_owner_switch_and_driver() -> None:
    data = {
        "node": {"name": "pve1", "profile": "lxc", "gpus": {"ids": ["10de:2bb1"]}},
        "pve": {"cluster": "dc1"},
        "lxc": {"vmid": 310, "ostemplate": "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"},
        "driver": {"version": "590.48.01"},
        "pve_host": {"allow_reboot": True, "allow_reboot_with_foreign_guests": True},
    }
    assert reboot_guard(host_specs(data)) == RebootGuard(
        "pve1",
        Ours("dc1", (("CT", 310),)),
        allow_foreign=True,
        driver_version="590.48.01",
    )
    vm = {"node": {"name": "pve1", "gpus": {"ids": ["10de:2bb1"]}}, "vm": {"vmid": 100}}
    assert reboot_guard(host_specs(vm)) == RebootGuard("pve1", Ours("pve1", (("VM", 100),)), False, None)


def test_error_unreadable_list_refuses_without_the_switch() -> None:
    listed = NodeGuests(problem="cannot list what a reboot would stop: pvesh get /nodes/pve1/qemu: no output")
    assert foreign_refusal(listed, "pve1", OURS, allowed=False) == (
        "not rebooting pve1: cannot list what a reboot would stop: pvesh get /nodes/pve1/qemu: no output; "
        "or set pve_host.allow_reboot_with_foreign_guests: true"
    )


def test_error_odd_guest_name_shown_quoted() -> None:
    listed = NodeGuests(guests=(NodeGuest("VM", 300, "a b\x1b[2J", "running"),))
    assert foreign_refusal(listed, "pve1", Ours("lab"), allowed=False) == (
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
    web = "#pvegpu-owner%3A lab\nname: web\ntags: pvegpu\n"  # a description line as qemu-server writes it
    for folder, vmid, line in (("qemu-server", 300, web), ("lxc", 310, "hostname: db\n")):
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
    config = pve.json("get", "/nodes/pve1/qemu/300/config")

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
    assert [(e["vmid"], e["status"], e["name"], e["tags"]) for e in qemu] == [
        (300, "stopped", "web", "pvegpu")
    ]
    assert config["description"] == "pvegpu-owner: lab"
    lines = [
        *output(qemu, lxc, status, config=[]),
        "#pvegpu-guests:/nodes/pve1/qemu/300/config",
        json.dumps(config),
    ]
    listed = parse_node_guests(lines)
    assert foreign_refusal(listed, "pve1", Ours("lab", (("VM", 300),)), allowed=False) == (
        "not rebooting pve1: it would stop what is not pvegpu's: running CT 310 (db); "
        "HA resources on the node: ct:310 (queued); stop or migrate them, or set "
        "pve_host.allow_reboot_with_foreign_guests: true"
    )
