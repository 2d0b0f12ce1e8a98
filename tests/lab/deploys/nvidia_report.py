"""Lab-tier test deploy: write the NVIDIA functions the PciHardware fact reads, one line each, to REPORT.

Line format: `<address> <vendor:device> class=<0xCCCCCC> group=<N>`. One operation, so a second run against
an unchanged host must report no change.
"""

from __future__ import annotations

from io import StringIO

from pyinfra.context import host
from pyinfra.operations import files

from pvegpu.facts.hardware import PciHardware
from pvegpu.models.node import NodeSpec

REPORT = "/root/pvegpu-nvidia-functions.txt"

node = NodeSpec.model_validate(host.data.node)
hardware = host.get_fact(PciHardware, sysfs_root=node.sysfs_root)
report = "".join(
    f"{f.address} {f.id} class=0x{f.class_code:06x} group={f.iommu_group}\n"
    for f in hardware.functions
    if f.vendor == "10de"
)
files.put(name="Write the NVIDIA functions the PCI fact found", src=StringIO(report), dest=REPORT)
