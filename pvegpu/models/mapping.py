"""The cluster's PCI mappings pvegpu keeps (`<vm.mapping_prefix>N`): host data key `mapping`.

("pve1", {"node": {...}, "mapping": {"adopt": true}})
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictBool

MAPPING_KEY = "mapping"


class MappingSpec(BaseModel):
    """What pvegpu may do with the cluster's `gpuN` PCI mappings: host data key `mapping`."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    adopt: StrictBool = Field(
        default=False,
        description=(
            "Take over `gpuN` mappings that lack pvegpu's mark (the line `pvegpu-owner: <pve.owner>` in "
            "their description), e.g. ones made by hand: the run writes the mark, later runs need no switch. "
            "Without it such a mapping is refused, every mapping left as it is, and the node's pre-start "
            "hook does not repair it after a BIOS change (the VM's start is refused, naming it)."
        ),
    )
