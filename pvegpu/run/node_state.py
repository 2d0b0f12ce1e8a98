"""`node_state_of(host)`: a Proxmox node's `NodeState` (pvegpu/facts/node_read.py), read once per node and
run in one command: the PCI hardware and CPU/kernel the node's plan is computed from, and everything its
operations decide from (boot files, bootloader, running command line, the host-driver profiles' leftovers, the
sha256 of pvegpu's hook and snippet files; with `vm` data, the Proxmox files and the VM's QEMU process whose
API answers pvegpu/facts/pve_files.py computes: pvegpu/run/read_ahead.py).

The plan and the roles read it while pyinfra prepares the run. An operation decides from it while no
operation on the node has run a command since it was read (`unchanged_node_state`): so a no-op run reads the
node once, preparing and running alike. After a change an operation reads what it needs on its own, as it
would without this read (the running command line, one file's sha256, the driver units), so that it decides
from what the change left and a converging run costs no more reads than before (the bootloader's probe,
`proxmox-boot-tool status`, mounts every ESP: not again for the command line). Waits that must see the node
change (a reboot's) read their own facts. pyinfra prepares its hosts at the same time (one greenlet each),
and a guest's roles plan from its node's state: a read in flight is waited for, not sent again.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import cast
from weakref import WeakKeyDictionary

from gevent.lock import Semaphore
from pyinfra.api.host import Host
from pyinfra.api.state import State
from pyinfra.facts.files import Sha256File

from pvegpu.facts.boot import KernelCmdline
from pvegpu.facts.host_driver import HostDriverFiles
from pvegpu.facts.node_read import STORAGE_CFG, ImageDigest, NodeRead, NodeState, NodeStateRequest
from pvegpu.hook.bundle import BUNDLE_PATH
from pvegpu.models.dir_mapping import DIRECTORY_CFG
from pvegpu.models.exporter import TEXTFILES, TIMER_FILES
from pvegpu.models.host_driver import HostDriverState
from pvegpu.models.model import MODEL_KEY, ModelSpec
from pvegpu.models.node import NODE_KEY, NodeSpec
from pvegpu.models.spec_validation import spec_of
from pvegpu.models.vm import VM_KEY, ImageUrl, VmSpec
from pvegpu.plan.host_driver import DRIVER_FILES, DRIVER_UNITS
from pvegpu.plan.model_fetch import node_fetch_target
from pvegpu.run.early_read import recording
from pvegpu.run.progress import commands_run

# Per run and node: the read, and how many of the node's operations had run commands when it was taken.
_STATES: WeakKeyDictionary[State, dict[str, tuple[int, NodeState]]] = WeakKeyDictionary()
_READING: WeakKeyDictionary[State, dict[str, AbstractContextManager[object]]] = WeakKeyDictionary()


def _greenlet_lock() -> AbstractContextManager[object]:
    """A lock that blocks only the greenlet that waits on it (pyinfra's hosts share one thread)."""
    return cast(AbstractContextManager[object], Semaphore())


def node_request(
    node: NodeSpec, vm: VmSpec | None = None, model: ModelSpec | None = None
) -> NodeStateRequest:
    """The read of a node with the `node` settings: every file the node's operations decide from; with `vm`,
    also its config, storage.cfg, the PCI and directory mappings (the model store's, pvegpu/operations/
    mapping_dir.py) and its QEMU process (pidfile, command line, state), the
    API's answers for which pvegpu/facts/pve_files.py computes; with a `vm.image` URL, the digest of the
    image file in each storage's `import/` while the VM does not exist (`image_downloaded` checks a volume
    there); the node exporter and pvegpu's textfiles (pvegpu/run/exporter.py); with `model` fetched from a
    hub, the fetcher's record and the store's files (roles/model_store.py)."""
    image = None if vm is None else vm.image
    return NodeStateRequest(
        sysfs_root=str(node.sysfs_root),
        cmdline_path=str(node.cmdline_path),
        driver_files=DRIVER_FILES,
        driver_units=DRIVER_UNITS,
        sha256_paths=(BUNDLE_PATH,),
        pve_files=()
        if vm is None
        else (vm_config_path(node.name, vm.vmid), STORAGE_CFG, MAPPING_CFG, DIRECTORY_CFG),
        vmids=() if vm is None else (vm.vmid,),
        image_files=((image.checksum_algorithm, image.stored_name),) if isinstance(image, ImageUrl) else (),
        image_unless=None if vm is None else vm_config_path(node.name, vm.vmid),
        exporter_files=(*TEXTFILES, *TIMER_FILES),
        model_store=None if model is None or node_fetch_target(model) is None else model.path,
    )


MAPPING_CFG = "/etc/pve/mapping/pci.cfg"


def vm_config_path(node: str, vmid: int) -> str:
    """The file `GET /nodes/{node}/qemu/{vmid}/config` reads (pmxcfs; `/etc/pve/qemu-server` links there on
    the node itself)."""
    return f"/etc/pve/nodes/{node}/qemu-server/{vmid}.conf"


def node_state_of(target: Host) -> NodeState:
    """The state of Proxmox node `target` (module docstring), read on first use in this run."""
    with _READING.setdefault(target.state, {}).setdefault(target.name, _greenlet_lock()):
        states = _STATES.setdefault(target.state, {})
        if target.name not in states:
            vm = spec_of(target.data, VM_KEY, VmSpec) if target.data.get(VM_KEY) is not None else None
            model = (
                spec_of(target.data, MODEL_KEY, ModelSpec) if target.data.get(MODEL_KEY) is not None else None
            )
            request = node_request(spec_of(target.data, NODE_KEY, NodeSpec), vm, model)
            with recording(target):
                states[target.name] = (commands_run(target), target.get_fact(NodeRead, request=request))
        return states[target.name][1]


def unchanged_node_state(target: Host) -> NodeState | None:
    """`node_state_of(target)` while no operation on `target` has run a command since it was read; else None
    (the operation reads what it needs on its own)."""
    state = node_state_of(target)
    read_at, _ = _STATES[target.state][target.name]
    return state if commands_run(target) == read_at else None


def running_cmdline(target: Host, cmdline_path: str) -> tuple[str, ...]:
    """The running kernel command line of node `target` (`cmdline_path`: where it is read)."""
    state = unchanged_node_state(target)
    if state is not None:
        return state.cmdline
    return target.get_fact(KernelCmdline, cmdline_path=cmdline_path)


def driver_leftovers(target: Host) -> HostDriverState:
    """What the host-driver profiles left on node `target` (pvegpu/plan/host_driver.py)."""
    state = unchanged_node_state(target)
    if state is not None:
        return state.driver
    return target.get_fact(HostDriverFiles, files=DRIVER_FILES, units=DRIVER_UNITS)


def node_file_sha256(target: Host, path: str) -> str | None:
    """The sha256 of the file at `path` on node `target` (None: no such file): from the node's state read when
    it covered `path` (pvegpu's hook and snippet files) and nothing changed since, else read on its own."""
    state = unchanged_node_state(target)
    if state is not None and state.covers(path):
        return state.sha256(path)
    return target.get_fact(Sha256File, path=path)


def node_image_digest(target: Host, path: str, algorithm: str) -> str | None:
    """The `algorithm` digest of the image file at `path` on node `target` (None: no such file): from the
    node's state read when it hashed `path` so and nothing changed since, else read on its own."""
    state = unchanged_node_state(target)
    if state is not None and state.image_algorithms.get(path) == algorithm:
        return state.image_digest(path, algorithm)
    return target.get_fact(ImageDigest, path=path, algorithm=algorithm)
