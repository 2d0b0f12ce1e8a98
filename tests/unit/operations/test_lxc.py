"""The `lxc` profile's container: spec, plans (config keys, create keys, raw lines, diff), the device-node
fact's parser, and the operations: API state in -> exact API calls / shell lines out, or the noop sentence,
or the error. API answers follow proxmox-api-behaviour.md §6 (synthesized: config typed as Proxmox types
it, raw lines under `lxc`, `Configuration file ... does not exist` for a missing CT)."""

from __future__ import annotations

from typing import Any

import pytest
from pyinfra.api.exceptions import OperationError

from pvegpu.facts.lxc_devices import NvidiaNodes, parse_nvidia_nodes
from pvegpu.models.errors import InventoryError
from pvegpu.models.lxc import LXC_KEY, LxcSpec
from pvegpu.models.spec_validation import spec_of
from pvegpu.operations.lxc import container_driver, lxc_container, lxc_raw_lines, raw_lines_command
from pvegpu.operations.pve_guest import CT, Guest, guest_parked, guest_running
from pvegpu.plan.lxc import (
    SHM_ENTRY,
    SHM_PREFIX,
    ContainerChange,
    ContainerPlan,
    container_config,
    create_keys,
    diff_container,
    plan_lxc_devices,
    raw_lines,
    raw_of,
)
from pvegpu.pve.errors import PveError
from tests.unit.fake_pve import NONCED, ConfigStore, FakeApi, execute, sequence, task_ok
from tests.unit.op_harness import run_op

TEMPLATE = "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"
SPEC = LxcSpec(vmid=200, ostemplate=TEMPLATE, cores=8, memory=32768)
DEVICES = plan_lxc_devices(2, (8, 2), (), {})
CONFIG = container_config(SPEC, DEVICES)
CONFIG_PATH = "/nodes/pve1/lxc/200/config"
STATUS = "/nodes/pve1/lxc/200/status/current"
MISSING = PveError(500, "Configuration file 'nodes/pve1/lxc/200.conf' does not exist")
MODIFIED = "detected modified configuration - file changed by other user? Try again."


def ct_store(values: dict[str, object] | None) -> ConfigStore:
    return ConfigStore(values, missing=MISSING, mismatch=MODIFIED)


UPID_CREATE = "UPID:pve1:0000B1B2:0153F2C4:66A1B2C3:vzcreate:200:root@pam:"
UPID_START = "UPID:pve1:0000B1B3:0153F2C4:66A1B2C4:vzstart:200:root@pam:"
SHM = "lxc.mount.entry: tmpfs dev/shm tmpfs "


def test_spec_error_template_and_unknown_key() -> None:
    with pytest.raises(InventoryError) as raised:
        spec_of({LXC_KEY: {"vmid": 200, "ostemplate": "debian.tar", "gpus": 8}}, LXC_KEY, LxcSpec)
    assert str(raised.value).splitlines() == [
        "lxc.ostemplate: 'debian.tar' is not a template volume like local:vztmpl/<file>",
        "lxc.gpus: unknown field",
    ]


def test_create_keys_with_root_ssh_keys() -> None:
    keys = ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake op@desk", "ssh-rsa AAAAB3NzaC1yc2E= ci")
    spec = LxcSpec(vmid=200, ostemplate=TEMPLATE, ssh_public_keys=keys)
    assert create_keys(spec)["ssh-public-keys"] == (
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake op@desk\nssh-rsa AAAAB3NzaC1yc2E= ci\n"
    )
    with pytest.raises(InventoryError) as raised:
        spec_of(
            {LXC_KEY: {"vmid": 200, "ostemplate": TEMPLATE, "ssh_public_keys": ["AAAA key"]}},
            LXC_KEY,
            LxcSpec,
        )
    assert str(raised.value) == "lxc.ssh_public_keys.0: 'AAAA key' is not an OpenSSH public key line"


def test_container_config_and_create_keys() -> None:
    assert CONFIG == {
        "hostname": "llm-ct",
        "cores": "8",
        "memory": "32768",
        "swap": "0",
        "onboot": "1",
        "dev0": "/dev/nvidia0,gid=44",
        "dev1": "/dev/nvidia1,gid=44",
        "dev2": "/dev/nvidiactl,gid=44",
        "dev3": "/dev/nvidia-uvm,gid=44",
        "dev4": "/dev/nvidia-uvm-tools,gid=44",
        "dev5": "/dev/nvidia-modeset,gid=44",
    }
    assert create_keys(SPEC) == {
        "ostemplate": TEMPLATE,
        "rootfs": "local-lvm:64",
        "unprivileged": "1",
        "net0": "name=eth0,bridge=vmbr0,ip=dhcp",
    }
    assert raw_lines(SPEC, DEVICES) == (
        ("lxc.mount.entry", "tmpfs dev/shm tmpfs size=16G,nosuid,nodev,create=dir 0 0"),
    )


def test_diff_container_sets_changed_keys_and_deletes_foreign_dev_entries() -> None:
    current: dict[str, object] = {**CONFIG, "cores": 4, "onboot": 1, "dev9": "/dev/dri/card0", "lxc": []}
    assert diff_container(CONFIG, current) == ContainerChange(set={"cores": "8"}, delete=("dev9",))


def test_raw_of_reads_the_api_pairs() -> None:
    assert raw_of({"lxc": [["lxc.cgroup2.devices.allow", "c 195:* rwm"]]}) == (
        ("lxc.cgroup2.devices.allow", "c 195:* rwm"),
    )
    assert raw_of({}) == ()


def test_parse_nvidia_nodes() -> None:
    # Synthesized in the command's output shape; /proc/devices lines as fs/char_dev.c prints them.
    lines = [
        "#pvegpu:caps",
        "/dev/nvidia-caps/nvidia-cap2",
        "/dev/nvidia-caps/nvidia-cap1",
        "#pvegpu:devices",
        "Character devices:",
        "195 nvidia",
        "509 nvidia-uvm",
        "#pvegpu:end",
    ]
    assert parse_nvidia_nodes(lines) == NvidiaNodes(
        caps=("/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"),
        majors={"nvidia": 195, "nvidia-uvm": 509},
    )


# --- lxc_container ---------------------------------------------------------------------------


PLAN = ContainerPlan(SPEC, CONFIG, create_keys(SPEC), raw_lines(SPEC, DEVICES), host_module="580.95.05")


def converge(api: FakeApi) -> tuple[list[Any], list[str]]:
    return run_op(
        lxc_container,
        {},
        guest=Guest(CT, api.client, "pve1", 200),
        container=PLAN,
        timeout_s=5,
    )


def test_container_plan_creates_with_its_config_and_create_keys() -> None:
    assert PLAN.created_with == {**CONFIG, **create_keys(SPEC)}
    assert list(PLAN.created_with)[:2] == ["hostname", "cores"]  # the config first, as the POST sends it


def test_create_container_with_devices() -> None:
    store = ct_store(None)
    created = {**CONFIG, "cores": 8, "memory": 32768, "swap": 0, "onboot": 1, "digest": "d1"}
    api = FakeApi(
        {
            ("GET", CONFIG_PATH): store.get,
            ("POST", "/nodes/pve1/lxc"): store.create(created, UPID_CREATE),
            ("GET", f"/nodes/pve1/tasks/{UPID_CREATE}/status"): task_ok(UPID_CREATE),
        }
    )
    commands, noops = converge(api)
    execute(commands)
    assert noops == []
    created = {"vmid": 200, **CONFIG, **create_keys(SPEC), **NONCED}
    assert api.writes() == [("POST", "/nodes/pve1/lxc", created)]


def test_noop_container_has_its_config() -> None:
    typed = {**CONFIG, "cores": 8, "memory": 32768, "swap": 0, "onboot": 1, "digest": "d1"}
    api = FakeApi({("GET", CONFIG_PATH): typed})
    assert converge(api) == ([], ["CT 200 on pve1 has its config: 6 device entries"])


def test_update_container_with_digest_deletes_stale_dev() -> None:
    store = ct_store({**CONFIG, "dev1": "/dev/nvidia7,gid=44", "dev6": "/dev/nvidia1", "digest": "d1"})
    api = FakeApi({("GET", CONFIG_PATH): store.get, ("PUT", CONFIG_PATH): store.put})
    commands, _ = converge(api)
    execute(commands)
    assert store.values == {**CONFIG, "digest": "d1+"}
    assert api.writes() == [
        ("PUT", CONFIG_PATH, {"dev1": "/dev/nvidia1,gid=44", "delete": "dev6", "digest": "d1"})
    ]


def test_error_update_concurrent_edit_not_overwritten() -> None:
    store = ct_store({**CONFIG, "cores": 4, "digest": "d1"})
    api = FakeApi({("GET", CONFIG_PATH): store.get, ("PUT", CONFIG_PATH): store.put})
    commands, _ = converge(api)
    store.values = {**CONFIG, "cores": 4, "hostname": "theirs", "digest": "d2"}  # someone else's edit
    with pytest.raises(OperationError) as error:
        execute(commands)
    assert str(error.value) == (
        f"CT 200 config not updated, nothing overwritten: PUT /nodes/pve1/lxc/200/config: {MODIFIED}"
    )


# --- lxc_raw_lines ---------------------------------------------------------------------------

WANTED = raw_lines(SPEC, DEVICES)


def raw(api: FakeApi) -> tuple[list[Any], list[str]]:
    return run_op(
        lxc_raw_lines,
        {},
        guest=Guest(CT, api.client, "pve1", 200),
        wanted=WANTED,
        replace=f"{SHM_ENTRY}: {SHM_PREFIX}",
    )


def test_create_raw_lines_written_for_a_new_container() -> None:
    commands, _ = raw(FakeApi({("GET", CONFIG_PATH): MISSING}))
    assert commands == [raw_lines_command(200, [f"{SHM}size=16G,nosuid,nodev,create=dir 0 0"], SHM)]


def test_update_raw_shm_line_of_another_size_replaced() -> None:
    old = [["lxc.mount.entry", "tmpfs dev/shm tmpfs size=8G,nosuid,nodev,create=dir 0 0"]]
    commands, _ = raw(FakeApi({("GET", CONFIG_PATH): {"lxc": old, "digest": "d1"}}))
    assert commands == [raw_lines_command(200, [f"{SHM}size=16G,nosuid,nodev,create=dir 0 0"], SHM)]


def test_noop_raw_lines_present() -> None:
    lines = [list(pair) for pair in WANTED]
    assert raw(FakeApi({("GET", CONFIG_PATH): {"lxc": lines, "digest": "d1"}})) == (
        [],
        ["/etc/pve/lxc/200.conf has its 1 raw lxc lines"],
    )


# --- guest_running (a container), container_driver -------------------------------------------


def running(api: FakeApi) -> tuple[list[Any], list[str]]:
    return run_op(guest_running, {}, guest=Guest(CT, api.client, "pve1", 200), timeout_s=5)


def test_noop_and_start_container() -> None:
    up = FakeApi({("GET", CONFIG_PATH): {"digest": "d1"}, ("GET", STATUS): {"status": "running"}})
    assert running(up) == ([], ["CT 200 is running on pve1"])

    down = FakeApi(
        {
            ("GET", CONFIG_PATH): {"digest": "d1"},
            ("GET", STATUS): sequence({"status": "stopped"}, {"status": "running"}),
            ("POST", "/nodes/pve1/lxc/200/status/start"): UPID_START,
            ("GET", f"/nodes/pve1/tasks/{UPID_START}/status"): task_ok(UPID_START),
        }
    )
    commands, _ = running(down)
    execute(commands)
    assert down.writes() == [("POST", "/nodes/pve1/lxc/200/status/start", {})]


def drift(host: str | None, container: str | None) -> tuple[list[Any], list[str]]:
    return run_op(container_driver, {}, vmid=200, host_module=host, container_userspace=container)


def test_drift_container_driver() -> None:
    assert drift("580.95.05", "580.95.05") == (
        [],
        ["CT 200: userspace driver 580.95.05 equals the host kernel module"],
    )
    assert drift("580.95.05", None) == (
        [],
        [
            "CT 200: driver versions not compared: the container has no NVIDIA userspace driver; "
            "the host module is 580.95.05"
        ],
    )
    with pytest.raises(OperationError) as error:
        drift("580.95.05", "590.48.01")
    assert str(error.value) == (
        "CT 200: driver version mismatch: host kernel module 580.95.05, container userspace 590.48.01 "
        "(NVML fails with 'Driver/library version mismatch'; install the container's userspace at "
        "580.95.05, without a kernel module)"
    )


# --- guest_parked (a container) ---------------------------------------------------------------

SHUTDOWN = "/nodes/pve1/lxc/200/status/shutdown"
UPID_SHUTDOWN = "UPID:pve1:0000B1B4:0153F2C5:66A1B2C5:vzshutdown:200:root@pam:"


def park(api: FakeApi, allow: bool = True) -> tuple[list[Any], list[str]]:
    return run_op(
        guest_parked,
        {},
        guest=Guest(CT, api.client, "pve1", 200),
        profile="vm",
        allow_stop=allow,
        timeout_s=5,
    )


def test_update_running_container_onboot_cleared_then_shut_down() -> None:
    store = ct_store({"onboot": 1, "digest": "d1"})
    api = FakeApi(
        {
            ("GET", CONFIG_PATH): store.get,
            ("GET", STATUS): sequence({"status": "running"}, {"status": "stopped"}),
            ("PUT", CONFIG_PATH): store.put,
            ("POST", SHUTDOWN): UPID_SHUTDOWN,
            ("GET", f"/nodes/pve1/tasks/{UPID_SHUTDOWN}/status"): task_ok(UPID_SHUTDOWN),
        }
    )
    commands, _ = park(api)
    execute(commands)
    assert api.writes() == [  # a clean shutdown, never a plain power-off
        ("PUT", CONFIG_PATH, {"onboot": 0, "digest": "d1"}),
        ("POST", SHUTDOWN, {"timeout": 5}),
    ]


def test_noop_running_container_not_allowed_says_what_it_would_do() -> None:
    api = FakeApi(
        {("GET", CONFIG_PATH): {"onboot": 1, "digest": "d1"}, ("GET", STATUS): {"status": "running"}}
    )
    assert park(api, allow=False) == (
        [],
        [
            "profile vm: CT 200 is running on pve1 with the GPUs; would stop it and set onboot 0 "
            "(pve_host.allow_reboot is false: not stopping it)"
        ],
    )
    assert api.writes() == []


def test_noop_container_parked_or_absent() -> None:
    parked = FakeApi(
        {("GET", CONFIG_PATH): {"onboot": 0, "digest": "d1"}, ("GET", STATUS): {"status": "stopped"}}
    )
    assert park(parked) == ([], ["CT 200 on pve1 is stopped and not started at boot (onboot 0)"])
    assert park(FakeApi({("GET", CONFIG_PATH): MISSING})) == (
        [],
        ["CT 200 does not exist on pve1: no container holds the GPUs"],
    )


def test_error_locked_container_is_reported_with_its_task_and_pct_unlock() -> None:
    upid = "UPID:pve1:0000A1B5:0153F2C6:66A1B2C6:vzcreate:200:root@pam:"
    dead = {"upid": upid, "type": "vzcreate", "id": "200", "status": "unexpected status", "endtime": 1}
    api = FakeApi(
        {("GET", CONFIG_PATH): {"lock": "create", "digest": "5tub"}, ("GET", "/nodes/pve1/tasks"): [dead]}
    )

    with pytest.raises(OperationError) as error:
        park(api)

    assert str(error.value) == (
        f"CT 200 is locked (create); its last task {upid} no longer runs (exit status: unexpected status): "
        "check CT 200 on pve1, remove the lock with `pct unlock 200` there, then run again"
    )
    assert api.writes() == []
