"""The model store in the lxc profile's container (pvegpu/plan/lxc.py): the `mp0` line, the `mpN` chosen when
the operator holds `mp0`, the root-only routing of a bind mount and the inventory's refusal without a root
path (pvegpu/models/pve_root_only.py, root_only_features.py). Config values as pve-container prints them."""

from __future__ import annotations

import pytest

from pvegpu.models.lxc import LxcSpec
from pvegpu.models.model import ModelSpec
from pvegpu.models.pve_api import PveApiSpec
from pvegpu.models.pve_root_only import root_only_params
from pvegpu.models.root_only_features import root_only_problems
from pvegpu.plan.errors import PlanError
from pvegpu.plan.lxc import diff_container, plan_container

STORE = "/srv/models/GLM-5-NVFP4"
LINE = f"{STORE},mp={STORE},ro=1"
SPEC = LxcSpec(vmid=200, ostemplate="local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst")
PLAN = plan_container(SPEC, 1, (8, 1), (), {}, host_module="580.95.05", store=STORE)


def test_create_container_gets_mp0_read_only_at_the_same_path() -> None:
    assert PLAN.store == STORE
    assert PLAN.created_with["mp0"] == LINE
    assert "mp0" not in plan_container(SPEC, 1, (8, 1), (), {}, host_module=None).created_with


def test_update_mp0_set_when_the_container_has_none() -> None:
    change = diff_container(PLAN.config, dict(PLAN.config), STORE)
    assert (change.set, change.delete) == ({"mp0": LINE}, ())


def test_update_operators_mp0_kept_the_store_takes_the_first_free_mpn() -> None:
    current = {
        **PLAN.config,
        "mp0": "/tank/data,mp=/data",
        "mp1": "local-lvm:vm-200-disk-1,mp=/scratch,size=8G",
    }
    change = diff_container(PLAN.config, current, STORE)
    assert (change.set, change.delete) == ({"mp2": LINE}, ())


def test_noop_store_already_mounted_at_another_mpn() -> None:
    current = {**PLAN.config, "mp0": "/tank/data,mp=/data", "mp3": LINE}
    assert not diff_container(PLAN.config, current, STORE).changed


def test_error_every_mpn_taken() -> None:
    current = {**PLAN.config, **{f"mp{n}": f"/d{n},mp=/d{n}" for n in range(256)}}
    with pytest.raises(PlanError, match=f"^every mpN is taken: the model store {STORE} cannot be mounted$"):
        diff_container(PLAN.config, current, STORE)


@pytest.mark.parametrize(
    ("params", "root_only"),
    [
        ({"mp0": LINE}, ("mp0",)),
        ({"mp1": "local-lvm:8,mp=/scratch"}, ()),  # a storage volume: VM.Config.Disk and the storage's
        ({"delete": "mp0"}, ()),  # deleting one: VM.Config.Disk only
    ],
)
def test_bind_mount_is_routed_as_root_only(params: dict[str, object], root_only: tuple[str, ...]) -> None:
    assert root_only_params("PUT", "/nodes/pve1/lxc/200/config", params) == root_only


def test_error_model_on_lxc_without_a_root_path_is_one_line() -> None:
    pve = PveApiSpec(
        backend="https", token_id="pvegpu@pve!deploy", token_file="/etc/pvegpu/pve-token", root_ssh=False
    )
    model = ModelSpec.model_validate({"source": {"dir": STORE}})
    lines = root_only_problems("lxc", None, SPEC, pve, None, model=model)
    assert lines[1] == (
        "model: the API token pvegpu@pve!deploy cannot set 'mp0' (Proxmox allows bind mounts to root@pam "
        "only): leave `model` unset, or let pvegpu reach the node as root over SSH (pve.root_ssh: true)"
    )
    assert len(root_only_problems("lxc", None, SPEC, pve, None)) == 1  # devN alone without `model`
    assert root_only_problems("vm", None, None, pve, None, model=model) == []  # virtiofs0 needs no root
