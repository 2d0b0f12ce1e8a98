"""The pvegpu lab's STAND-IN for Proxmox VE's API (NOT Proxmox), laid out like Proxmox's own code; the pvesh
(lab/pve/pvesh.py) and pveproxy (lab/pve/pveproxy.py) stand-ins answer through it. Debian's python3,
standard library only: lab/pve/node.py copies this package into a lab node's /usr/lib/pvegpu-lab/.

    errors.py         PVE::Exception: `die`, 400 parameter errors, Getopt's refusals
    settings.py       the stand-in's settings ($PVEGPU_LAB_PVE_CONFIG), the local-node check
    rest.py           PVE::RESTHandler: commands and methods, an endpoint, one call
    jsonschema.py     PVE::JSONSchema: parameter schemas, value checks, property strings
    formats.py        JSONSchema's formats and standard options, the property-string formats
    guest_schema.py   qemu-server's and pve-container's config keys
    pmxcfs.py         /etc/pve: reads, atomic writes, locks, digests
    sectionconfig.py  mapping/pci.cfg, mapping/directory.cfg, replication.cfg, jobs.cfg (on pvegpu's
                      section-config reader)
    mapping_dir.py    PVE::Mapping::Dir's checks: a directory mapping's entries, the local node's
    storage.py        pve-storage: storage.cfg, volume ids, volumes
    tasks.py          fork_worker: UPIDs, task logs
    guest_config.py   guest config files, pending changes
    sysfs.py          SysFSTools and qemu-server's PCI checks on the node's sysfs
    hypervisor.py     guest processes and the lab hypervisor's requests
    drives.py         qemu-server's drives, disk allocation and import
    cloudinit.py      cloud-init for the hypervisor
    hookscript.py     guest hookscripts
    permissions.py    the permission checks inside the handlers (qemu-server's, and those it shares)
    ct_permissions.py pve-container's permission checks inside its handlers
    api/              the route table and call_api; one module per API subtree (its schemas, handlers,
                      routes and permissions side by side)

Its neighbours: access.py (access control) and ha.py (HA state) beside it, and pvegpu's section-config
reader (pvegpu/facts/section_config.py), imported here for the package's modules. Imported as
`lab.pve.pvelib` they come from the repository; imported top-level (the node's /usr/lib/pvegpu-lab/, where
node.py ships section_config.py beside the package, or lab/pve/ when a test runs pvesh.py as a script) they
are the modules beside the package, the reader from the repository's pvegpu/facts when it is there.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING or __name__.startswith("lab."):
    from lab.pve import access as access
    from lab.pve import ha as ha
    from pvegpu.facts import section_config as section_config
else:  # top-level: the node's /usr/lib/pvegpu-lab/, or lab/pve/ for a script
    _FACTS = Path(__file__).resolve().parents[3] / "pvegpu" / "facts"  # the repository's; none on a node
    if (_FACTS / "section_config.py").is_file():
        sys.path.append(str(_FACTS))
    import access
    import ha
    import section_config

__all__ = ["access", "ha", "section_config"]
