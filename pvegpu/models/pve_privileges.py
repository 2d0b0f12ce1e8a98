"""The Proxmox VE privileges pvegpu's API token needs, where Proxmox checks each one, and why. Pure data.

One role holding exactly `PVE_PRIVILEGES`' names, granted (propagating) on `/` to the user and to its
privilege-separated token, lets every API call pvegpu makes through the token pass (the README's `pveum`
recipe, the doctor's `GET /access/permissions` check and the lab node's seed all read this list). Keys only
root@pam may set (`hookscript`, `args`, `hugepages`, `affinity`, `lock`, raw `host=` passthrough, a CT's
`devN`) are beyond any privilege: pvegpu sets those as root on the node.

`path` is the ACL path the check names (qemu-server API2/Qemu.pm, API2/Qemu/Agent.pm; pve-container
LXC.pm check_ct_modify_config_perm; pve-storage API2/Storage/*.pm, Storage.pm check_volume_access;
pve-manager API2/Cluster/Mapping/PCI.pm and Dir.pm, API2/Tasks.pm, API2/Backup.pm; pve-ha-manager
API2/HA/Resources.pm; pve-guest-common GuestHelpers.pm check_vnet_access); `{vmid}`, `{storage}`, `{id}`,
`{node}`, `{bridge}`, `{dirid}` stand for the object's own id (`{dirid}`: the model store's directory
mapping, `pvegpu-models`, on a `vm` node with `model` data). A privilege checked on two paths is listed
once per path.
"""

from __future__ import annotations

from dataclasses import dataclass

ROLE_NAME = "PVEGPU"
ACL_PATH = "/"  # granted once, propagating: covers every `path` below


@dataclass(frozen=True)
class PvePrivilege:
    """One privilege: its Proxmox `name`, the ACL `path` Proxmox checks it on, and `why` pvegpu needs it."""

    name: str
    path: str
    why: str


PVE_PRIVILEGES: tuple[PvePrivilege, ...] = (
    PvePrivilege("VM.Allocate", "/vms/{vmid}", "create and destroy the VMs and containers it manages"),
    PvePrivilege("VM.Audit", "/vms/{vmid}", "read a guest's config, status, tasks and replication jobs"),
    PvePrivilege("VM.Config.CPU", "/vms/{vmid}", "set cores, sockets, cpu, numa and numaN"),
    PvePrivilege("VM.Config.Memory", "/vms/{vmid}", "set memory"),
    PvePrivilege(
        "VM.Config.HWType", "/vms/{vmid}", "set machine, vga, scsihw, serial0 and mapped hostpciN devices"
    ),
    PvePrivilege("VM.Config.Options", "/vms/{vmid}", "set name, ostype, bios, agent, onboot, description"),
    PvePrivilege(
        "VM.Config.Disk",
        "/vms/{vmid}",
        "set the boot disk, efidisk0, boot order, virtiofs0 and a container's mpN; resize the disk",
    ),
    PvePrivilege("VM.Config.Network", "/vms/{vmid}", "set net0 and a container's hostname"),
    PvePrivilege("VM.Config.Cloudinit", "/vms/{vmid}", "set ciuser, sshkeys, ipconfig0 and cicustom"),
    PvePrivilege("VM.PowerMgmt", "/vms/{vmid}", "start, stop and shut down guests"),
    PvePrivilege(
        "VM.GuestAgent.Audit", "/vms/{vmid}", "read the guest's addresses and file systems (guest agent)"
    ),
    PvePrivilege("VM.GuestAgent.FileRead", "/vms/{vmid}", "read files in the guest (guest agent file-read)"),
    PvePrivilege(
        "VM.GuestAgent.FileWrite", "/vms/{vmid}", "write files in the guest (guest agent file-write)"
    ),
    PvePrivilege(
        "VM.GuestAgent.Unrestricted",
        "/vms/{vmid}",
        "run the P2P probe in the guest (guest agent exec and exec-status)",
    ),
    PvePrivilege(
        "Datastore.Allocate",
        "/storage/{storage}",
        "read a storage's config, enable the snippets and import content types on it, free the volumes of "
        "pvegpu's own dead create",
    ),
    PvePrivilege(
        "Datastore.AllocateSpace", "/storage/{storage}", "allocate the guests' disks and cloud-init drives"
    ),
    PvePrivilege(
        "Datastore.AllocateTemplate",
        "/storage/{storage}",
        "download cloud images and templates (download-url)",
    ),
    PvePrivilege("Datastore.Audit", "/storage/{storage}", "list a storage's content"),
    PvePrivilege("Mapping.Audit", "/mapping/pci/{id}", "read the cluster's PCI mappings"),
    PvePrivilege("Mapping.Modify", "/mapping/pci/{id}", "create, update and delete the GPUs' PCI mappings"),
    PvePrivilege("Mapping.Use", "/mapping/pci/{id}", "pass a mapped GPU to a VM (hostpciN mapping=)"),
    PvePrivilege(
        "Mapping.Modify",
        "/mapping/dir/{dirid}",
        "create (checked on /mapping/dir) and update the model store's directory mapping",
    ),
    PvePrivilege("Mapping.Use", "/mapping/dir/{dirid}", "give the VM the model store (virtiofs0)"),
    PvePrivilege("SDN.Use", "/sdn/zones/localnetwork/{bridge}", "attach a guest's net0 to its bridge"),
    PvePrivilege(
        "Sys.Audit",
        "/nodes/{node}",
        "see the guests' tasks started by root@pam; with Sys.Modify on /: download-url",
    ),
    PvePrivilege(
        "Sys.Audit",
        "/",
        "read the HA resources and backup jobs that hold or include a dead create pvegpu destroys",
    ),
    PvePrivilege(
        "Sys.Modify",
        "/",
        "download-url (with Sys.Audit on /, or Sys.AccessNetwork on the node); create a privileged container",
    ),
)


def privilege_names() -> tuple[str, ...]:
    """The role's privileges, sorted, each once (one may be checked on several paths): what `pveum role add
    PVEGPU --privs` takes (comma-joined)."""
    return tuple(sorted({privilege.name for privilege in PVE_PRIVILEGES}))
