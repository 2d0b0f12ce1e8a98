"""Real captured PCI listings (shared/fixtures/real) turned into HostHardware, so the topology planner is
tested on group layouts real kernels produced, not only on ones we generated.

The captures are evidence kept outside the repository: found via env PVEGPU_SHARED (default
`<repo>/../shared`); a test using them is skipped, with the path it looked at, when they are absent.

What the captures do not say is filled in the same way for every function, and never decides a verdict:
no domain in the listings (0000 assumed), no bridge chain (root bus 0000:00, correct for the Intel desktop
of 11, a stand-in for 09 and 10), no subsystem ids in 09/11 (0000:0000), no prog-if (00), no drivers.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from pvegpu.models.hardware import HostHardware, PciFunction

REPO = Path(__file__).resolve().parents[2]

# The classic group loop + `lspci -nns`:
# "IOMMU group 2 01:00.0 VGA compatible controller [0300]: NVIDIA ... [10de:1d01] (rev a1)"
_GROUP_LINE = re.compile(
    r"IOMMU [Gg]roup (?P<group>\d+) (?P<slot>[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) .*?\[(?P<cls>[0-9a-f]{4})\]: "
    r".*\[(?P<vendor>[0-9a-f]{4}):(?P<device>[0-9a-f]{4})\]"
)


def shared_file(relative: str) -> Path:
    """Path of <shared>/<relative>; skips the calling test, naming the path, when the file is absent."""
    path = Path(os.environ.get("PVEGPU_SHARED", REPO.parent / "shared")) / relative
    if not path.is_file():
        pytest.skip(f"real capture {path} not found (set PVEGPU_SHARED to the shared folder)")
    return path


def real_fixture(name: str) -> Path:
    """Path of shared/fixtures/real/<name> (see shared_file)."""
    return shared_file(f"fixtures/real/{name}")


def v100_shared_groups() -> HostHardware:
    """09: 6x Tesla V100 (10de:1db4) on an AMD host; groups 19 and 87 each hold two GPUs (switch without ACS).

    Source: github.com/Quansight/open-gpu-server docs/openstack.md @ a930630c, `lsiommu | grep NVIDIA`,
    so only the NVIDIA functions are listed.
    """
    return _from_group_listing(real_fixture("09_iommu_groups_6x_v100_amd_shared_groups.txt"))


def desktop_gt1030_with_rootport() -> HostHardware:
    """11: full group listing of an Intel Z370 desktop (kernel 6.8): GT 1030 (10de:1d01) + HDMI audio
    (10de:0fb8) share group 2 with the CPU root port 00:01.0 (a PCI bridge); the iGPU 8086:3e92 is alone
    in group 0. Source: github.com/asokolsky/asokolsky.github.io hardware/duo/iommu.md @ a5033908.
    """
    return _from_group_listing(real_fixture("11_iommu_groups_full_intel_desktop_gpu_with_rootport.txt"))


def rtx4000_sff_numa1() -> HostHardware:
    """10: `lspci -vnmm -d 10de::` of an RTX 4000 SFF Ada (10de:27b0, subsystem 10de:16fa) + its audio
    (10de:22bc), both in group 13; NUMANode 1 is printed on function .0 only.
    Source: github.com/ubicloud/ubicloud spec/prog/learn_pci_spec.rb @ 00857390 (a test heredoc,
    apparently taken from a real host).
    """
    text = real_fixture("10_lspci_vnmm_nvidia_rtx4000sff_ada_numa_iommugroup.txt").read_text()
    functions = []
    for record in text.split("\n\n"):
        tags = dict(line.split(":\t", 1) for line in record.splitlines() if ":\t" in line)
        functions.append(
            PciFunction(
                address=f"0000:{tags['Slot']}",
                vendor=tags["Vendor"],
                device=tags["Device"],
                subsystem_vendor=tags["SVendor"],
                subsystem_device=tags["SDevice"],
                class_code=int(tags["Class"], 16) << 8,
                driver=None,
                iommu_group=int(tags["IOMMUGroup"]),
                numa_node=int(tags["NUMANode"]) if "NUMANode" in tags else None,
                root_bus="0000:00",
            )
        )
    return HostHardware(functions=tuple(functions), iommu_present=True)


def _from_group_listing(path: Path) -> HostHardware:
    functions = []
    for line in path.read_text().splitlines():
        match = _GROUP_LINE.search(line)
        if match is None:
            continue
        functions.append(
            PciFunction(
                address=f"0000:{match['slot']}",
                vendor=match["vendor"],
                device=match["device"],
                subsystem_vendor="0000",
                subsystem_device="0000",
                class_code=int(match["cls"], 16) << 8,
                driver=None,
                iommu_group=int(match["group"]),
                numa_node=None,
                root_bus="0000:00",
            )
        )
    if not functions:
        raise ValueError(f"{path}: no IOMMU group lines")
    return HostHardware(functions=tuple(functions), iommu_present=True)
