"""The PCI hardware fact: `hardware_parse.hardware_command` run on the host, parsed by
`hardware_parse.parse_hardware` (the pure, stdlib-only half, which the node's pre-start hook shares).

Here the parsers raise `FactParseError`, the form pyinfra reports as a per-host fact error.
"""

from __future__ import annotations

from pyinfra.api.facts import FactBase
from typing_extensions import override

from pvegpu.facts import hardware_parse
from pvegpu.facts.errors import fact_errors
from pvegpu.facts.hardware_parse import (
    hardware_command,
    parse_class,
    parse_id,
    parse_link_speed,
    parse_link_width,
    parse_numa_node,
    parse_resource_line,
)
from pvegpu.models.hardware import HostHardware

__all__ = [
    "PciHardware",
    "hardware_command",
    "parse_class",
    "parse_hardware",
    "parse_id",
    "parse_link_speed",
    "parse_link_width",
    "parse_numa_node",
    "parse_resource_line",
    "read_hardware_locally",
]

parse_hardware = fact_errors(hardware_parse.parse_hardware)
read_hardware_locally = fact_errors(hardware_parse.read_hardware_locally)


class PciHardware(FactBase[HostHardware]):
    """Every PCI function of the host, with its IOMMU group, driver, NUMA node, bridge chain, link and BARs.

    `host.get_fact(PciHardware, sysfs_root="/sys")`. Output that does not parse fails this host with a
    message naming the device and field (see `pvegpu.facts.errors`).
    """

    @override
    def command(self, sysfs_root: str = "/sys") -> str:
        return hardware_command(sysfs_root)

    @override
    @staticmethod
    def default() -> HostHardware:
        # pyinfra calls process() only for non-empty output; the command always prints its markers, so
        # this is returned only alongside a failed command (the host is failed then).
        return HostHardware(functions=(), iommu_present=False)

    @override
    def process(self, output: list[str]) -> HostHardware:
        return parse_hardware(output)
