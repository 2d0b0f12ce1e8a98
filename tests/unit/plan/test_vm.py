"""plan/vm.py helpers and the `pve` spec / client settings (facts/pve.py)."""

from __future__ import annotations

import pytest

from pvegpu.models.errors import InventoryError
from pvegpu.models.node import GpuSelector
from pvegpu.models.pve_api import PveApiSpec
from pvegpu.plan.topology import plan_topology
from pvegpu.plan.vm import merge_args, nvidia_gpus, unbound_functions
from pvegpu.pve.host_client import PveSetupError, api_spec, connect
from tests.unit.hostdata import two_cards

MMIO = "-fw_cfg name=opt/ovmf/X-PciMmio64Mb,string=1024"


def test_merge_args_replaces_only_pvegpus_part() -> None:
    assert merge_args(None, MMIO) == MMIO
    assert merge_args(f"-cpu kvm=on {MMIO.replace('1024', '64')} -foo", MMIO) == f"-cpu kvm=on -foo {MMIO}"


def test_unbound_functions_names_each_function_and_its_driver() -> None:
    selector = GpuSelector(ids=("10de:2bb1",))
    bound = two_cards("vfio-pci")
    assert unbound_functions(bound, plan_topology(bound, selector)) == ()
    nvidia = two_cards("nvidia")
    assert unbound_functions(nvidia, plan_topology(nvidia, selector)) == (
        "0000:41:00.0 (nvidia)",
        "0000:41:00.1 (snd_hda_intel)",
        "0000:51:00.0 (nvidia)",
        "0000:51:00.1 (snd_hda_intel)",
    )
    assert nvidia_gpus(nvidia) == ("0000:41:00.0", "0000:51:00.0")


def test_api_spec_defaults_and_api_user() -> None:
    spec = api_spec({})
    assert (spec.backend, spec.cluster, spec.api_user) == ("ssh", None, "root@pam")
    https = PveApiSpec(backend="https", token_id="pvegpu@pve!deploy", token_file="/etc/pvegpu/token")
    assert https.api_user == "pvegpu@pve!deploy"


def test_error_https_without_token() -> None:
    with pytest.raises(InventoryError) as error:
        api_spec({"pve": {"backend": "https"}})
    assert str(error.value) == "pve: the https backend needs token_id and token_file"


def test_error_ssh_backend_without_an_address() -> None:
    with pytest.raises(PveSetupError) as error:
        connect(PveApiSpec(), {})
    assert str(error.value) == "pve.hostname: not set, and the host has no ssh_hostname"
