"""A Proxmox node's VM in this run, beyond its plan (pvegpu/plan/vm.py `VmPlan`, `plan_of(host).vm`): the
create ledger the VM role's create records to (`create_ledger`; `guest_ledger` for a guest of either kind:
the container role's with its plan's `created_with`, pvegpu/plan/lxc.py `ContainerPlan`)."""

from __future__ import annotations

from collections.abc import Mapping

from pyinfra.api.host import Host

from pvegpu.inventory.validate import KNOWN_HOSTS_KEY
from pvegpu.local.create_records import CreateLedger, ledger_beside
from pvegpu.pve.host_client import pve_client
from pvegpu.run.plan import plan_of


def create_ledger(target: Host) -> CreateLedger | None:
    """pvegpu's records of its creates of `target`'s VM (`guest_ledger` of the VM plan's create keys)."""
    vm = plan_of(target).vm
    assert vm is not None  # the VM role asks only with a VM plan
    return guest_ledger(target, "qemu", vm.created_with)


def guest_ledger(target: Host, kind: str, keys: Mapping[str, str]) -> CreateLedger | None:
    """The ledger beside `target`'s known_hosts file (pvegpu/local/create_records.py; None without one) for
    the identity a create of a `kind` guest (`qemu`, `lxc`) with `keys` runs as, its task's user: root@pam
    when `keys` hold a root-only one (the API client's `acts_as`, which sends nothing), else the token."""
    plan = plan_of(target)
    node, pve = plan.specs.node.name, plan.specs.pve
    user = pve_client(target).acts_as("POST", f"/nodes/{node}/{kind}", keys)
    known_hosts = target.data.get(KNOWN_HOSTS_KEY)
    return ledger_beside(known_hosts, user, cluster=pve.cluster, owner=pve.owner, node=node)
