"""Every role spec of one host, validated once: `host_specs(host.data) -> HostSpecs`.

Roles read a host's specs from its plan (pvegpu/plan/node.py), which holds one `HostSpecs`, instead of
re-validating the host's data at every step. A role key that is absent gets its model's defaults, except
`vm`, `lxc` and `model`, whose absence means "no managed VM / container / model store" (None).
"""

from __future__ import annotations

from dataclasses import dataclass

from pvegpu.models.bench import BENCH_KEY, BenchSpec
from pvegpu.models.driver import DRIVER_KEY, DriverSpec
from pvegpu.models.host import HOST_KEY, HostSpec
from pvegpu.models.lxc import LXC_KEY, LxcSpec
from pvegpu.models.mapping import MAPPING_KEY, MappingSpec
from pvegpu.models.model import MODEL_KEY, ModelSpec
from pvegpu.models.node import NODE_KEY, NodeSpec
from pvegpu.models.pve_api import PVE_KEY, PveApiSpec
from pvegpu.models.sglang import SGLANG_KEY, SglangSpec
from pvegpu.models.spec_validation import HostDataLike, spec_of
from pvegpu.models.vm import VM_KEY, VmSpec


@dataclass(frozen=True)
class HostSpecs:
    """The validated specs of one host, one per role key."""

    node: NodeSpec
    host: HostSpec
    pve: PveApiSpec
    vm: VmSpec | None
    lxc: LxcSpec | None
    driver: DriverSpec
    sglang: SglangSpec
    bench: BenchSpec
    mapping: MappingSpec
    model: ModelSpec | None


def host_specs(data: HostDataLike) -> HostSpecs:
    """Every spec of one host's data (`host.data` or a mapping); raises InventoryError when any is invalid
    (inventories validated them at load time already, so a role never sees that)."""
    return HostSpecs(
        node=spec_of(data, NODE_KEY, NodeSpec),
        host=spec_of(data, HOST_KEY, HostSpec),
        pve=spec_of(data, PVE_KEY, PveApiSpec),
        vm=None if data.get(VM_KEY, None) is None else spec_of(data, VM_KEY, VmSpec),
        lxc=None if data.get(LXC_KEY, None) is None else spec_of(data, LXC_KEY, LxcSpec),
        driver=spec_of(data, DRIVER_KEY, DriverSpec),
        sglang=spec_of(data, SGLANG_KEY, SglangSpec),
        bench=spec_of(data, BENCH_KEY, BenchSpec),
        mapping=spec_of(data, MAPPING_KEY, MappingSpec),
        model=None if data.get(MODEL_KEY, None) is None else spec_of(data, MODEL_KEY, ModelSpec),
    )
