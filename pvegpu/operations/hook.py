"""pvegpu's pre-start hookscript on the node: the zipapp of the hook's modules and the wrapper Proxmox runs.

`self_heal` is the VM role's step for `vm.self_heal` `repair` or `check`: the hookscript is on the node (its
storage offering `snippets`: pvegpu/operations/cloud_image.py `storages_offer`) before the VM role sets the
VM's `hookscript` to it (check_hookscript refuses a volume that does not exist). With `off` nothing is
installed and the VM role removes pvegpu's `hookscript` from the VM (plan/vm.py).

`hook_installed` compares each file's sha256 on the node with what this pvegpu builds (pvegpu/hook/bundle.py)
and writes only a file that differs, atomically (pvegpu/operations/files.py): the zipapp at
`bundle.BUNDLE_PATH` (0644 root, uploaded to its staging name, then checked and renamed), the wrapper in the
snippets directory (0755 root: Proxmox runs it as the VM's `hookscript`). The same pvegpu gives the same
bytes, so a second run changes nothing; another pvegpu version or another mode rewrites them.

Root runs the hookscript at every VM start, so it lives only where no one but this node's root can change it:
- `shared_storage_refusal`: a shared snippets storage is refused before any host is changed (`self_heal`
  raises it while pyinfra collects operations): a network type (pve-storage's @SHARED_STORAGE, glusterfs
  too) or any storage marked `shared 1` is written from other nodes, or by whoever else mounts it, and every
  node would run it;
- before writing, the snippets directory and the bundle's must be root's and not writable by group or
  others (`directory_check`); they are checked only when something is written (the state read of a no-op
  run does not list directories' owners), so a no-op run stays one remote command. The wrapper checks the
  bundle's sha256 in turn (pvegpu/hook/bundle.py), so a changed zipapp is never run.
"""

from __future__ import annotations

import hashlib
import io
import posixpath
import shlex
from collections.abc import Generator

from pyinfra.api.command import FileUploadCommand, StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.hook.bundle import BUNDLE_PATH, Bundle, build
from pvegpu.hook.bundle import wrapper as wrapper_text
from pvegpu.models.node import NodeSpec
from pvegpu.models.pve import StorageConfig
from pvegpu.models.vm import VmSpec
from pvegpu.operations.files import install_staged, temp_path, write_file
from pvegpu.operations.snippets import directory_of, snippets_storage
from pvegpu.plan.vm import HOOKSCRIPT
from pvegpu.pve.client import PveClient
from pvegpu.run.node_state import node_file_sha256

# pve-storage src/PVE/Storage/Plugin.pm @SHARED_STORAGE (parse_config sets `shared` for them), and glusterfs,
# shared as long as Proxmox shipped it (PVE 8); only the ones with a directory can offer snippets.
SHARED_TYPES = frozenset(
    ("cephfs", "cifs", "drbd", "glusterfs", "iscsi", "iscsidirect", "nfs", "pbs", "rbd", "zfs")
)


def shared_storage_refusal(config: StorageConfig) -> str | None:
    """Why the hook may not go to `vm.snippets_storage` `config` (module docstring), or None."""
    if config.type in SHARED_TYPES:
        why = f"type {config.type}, shared by every node that mounts it"
    elif config.shared:
        why = f"type {config.type or 'unknown'}, marked shared 1"
    else:
        return None
    return (
        f"vm.snippets_storage {config.storage} is shared ({why}): pvegpu's pre-start hookscript runs as root "
        "on every VM start, so it goes only to node-local storage; set vm.snippets_storage to a local dir "
        "storage (local) or vm.self_heal: off"
    )


def directory_check(directory: str) -> StringCommand:
    """Fails, naming `directory`, unless it is root's and not writable by group or others."""
    quoted = shlex.quote(directory)
    message = shlex.quote(
        f"pvegpu: {directory} must be owned by root and not writable by group or others to hold the "
        f"pre-start hookscript, so nothing was written; run: chown root:root {directory} && chmod go-w "
        f"{directory}"
    )
    return StringCommand(
        f'[ -n "$(find {quoted} -maxdepth 0 -type d -user 0 ! -perm /022)" ] || '
        f"{{ echo {message} >&2 ; exit 1 ; }}"
    )


@operation()
def hook_installed(
    *, bundle: Bundle, wrapper_path: str, wrapper: str
) -> Generator[FileUploadCommand | StringCommand]:
    """The zipapp `bundle` at BUNDLE_PATH and the hookscript text `wrapper` at `wrapper_path`, each written
    only when its sha256 on the node differs."""
    bundle_now = node_file_sha256(host, BUNDLE_PATH)
    wrapper_sha256 = hashlib.sha256(wrapper.encode()).hexdigest()
    wrapper_now = node_file_sha256(host, wrapper_path)
    if bundle_now == bundle.sha256 and wrapper_now == wrapper_sha256:
        host.noop(
            f"pvegpu {bundle.version} hook is installed: {wrapper_path}, {BUNDLE_PATH} ({bundle.sha256[:12]})"
        )
        return
    directories = (posixpath.dirname(wrapper_path), posixpath.dirname(BUNDLE_PATH))
    yield StringCommand("mkdir", "-p", *directories)
    for directory in directories:
        yield directory_check(directory)
    if bundle_now != bundle.sha256:
        yield FileUploadCommand(io.BytesIO(bundle.data), temp_path(BUNDLE_PATH))
        yield install_staged(BUNDLE_PATH, bundle.sha256)
    if wrapper_now != wrapper_sha256:
        yield write_file(wrapper_path, wrapper, mode="0755", check="sh -n")


def self_heal(api: PveClient, node: NodeSpec, spec: VmSpec, owner: str) -> None:
    """The hookscript for the VM `spec` on `node` (module docstring; nothing for `self_heal: off`); the hook
    repairs only mappings marked with `owner` (pvegpu/plan/ownership.py)."""
    if spec.self_heal == "off":
        return
    storage = snippets_storage(api, spec.snippets_storage)
    refusal = shared_storage_refusal(storage)
    if refusal is not None:
        raise OperationError(f"{host.name}: {refusal}")
    bundle = build()
    hook_installed(
        name="The node's pre-start hookscript is installed",
        bundle=bundle,
        wrapper_path=f"{directory_of(storage)}/{HOOKSCRIPT}",
        wrapper=wrapper_text(
            bundle,
            mode=spec.self_heal,
            prefix=spec.mapping_prefix,
            owner=owner,
            sysfs_root=str(node.sysfs_root),
        ),
    )
