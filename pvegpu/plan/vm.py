"""The Q35 VM's config from its spec, the change to make to an existing VM, and readiness checks. Pure.

`vm_config(spec, mapping_ids, window, numa)` gives the keys pvegpu converges field by field;
`create_keys(spec)` the keys given only when the VM is created (disks are allocated then; the NIC gets its
MAC then):

    name, machine (q35 or pinned), bios ovmf, ostype l26, cpu host, sockets and cores (one socket, or
    plan/numa.py's layout with its numaN and affinity keys), memory, numa,
    hugepages (when set), balloon 0, agent 1, onboot, scsihw, hostpciN (mapping=<prefix>N,pcie=1),
    args (-fw_cfg name=opt/ovmf/X-PciMmio64Mb,... for vm.mmio = args, then the clique parts for
    vm.p2p = on) or cpu host,guest-phys-bits=N (plan/mmio.py),
    hookscript (pvegpu's pre-start hook, unless vm.self_heal is off; `off` deletes only pvegpu's),
    virtiofs0 (`pvegpu-models`: the node's model store, with `model` data and a qemu-server that has
    virtiofs, plan/model_share.py)

`diff_vm` compares with the config the API returns (ints and strings as Proxmox types them) and never
touches a disk that exists: a missing disk is added, an existing one is left as it is, nothing is recreated.
`args` is shared: pvegpu owns only its `X-PciMmio64Mb` part and its GPUDirect clique parts
(`-set device.hostpciN.x-nv-gpudirect-clique=C`, and the `hostpciN.0.` form of an earlier version,
plan/p2p.py) and keeps every other part verbatim; the clique parts are set here with `vm.p2p: on`, removed
with `off`, and with `probe` (`keep_clique`) left to the P2P operation (pvegpu/operations/p2p.py).
`cpu` never has `hidden=1` (kvm=off: the guest's NVIDIA driver then ignores the clique): pvegpu's `cpu`
value replaces the VM's, and when the VM's had `hidden=1` beside a clique, `VmChange.notes` says so.
pvegpu owns every `numaN` (a key it no longer plans is deleted: Proxmox refuses nodes whose memory does not
add up). `virtiofs0` is the model store's share (plan/model_share.py): a `virtiofsN` that already names
`pvegpu-models` is kept as it is (its options the operator's), a `virtiofs0` that names another directory is
the operator's and pvegpu takes the first free `virtiofsN`; without `model` only a `virtiofsN` naming
`pvegpu-models` is deleted. A running VM keeps a changed `virtiofsN` pending until its next cold start
(qemu-server cannot hotplug it): `pending_keys` names it like any other key.

`plan_vm` gathers all of it for a node's VM, once with the node's plan (plan/node.py `NodePlan.vm`): the keys,
the clique parts, the storages its files use, the functions not bound to vfio-pci yet, and why the VM cannot
be made (`VmPlan.problem`), which the VM role raises before any host is changed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pvegpu.models.hardware import HostHardware
from pvegpu.models.model import SHARE_ID, ModelSpec
from pvegpu.models.vm import ImageUrl, VmSpec
from pvegpu.plan.cloud_init import image_volid, snippet_volid
from pvegpu.plan.convert import CONVERSION_KEYS, needs_conversion
from pvegpu.plan.hostpci import HOSTPCI_KEY, desired_hostpci, diff_hostpci
from pvegpu.plan.mmio import MmioWindow, mmio_refusal
from pvegpu.plan.model_share import (
    MAX_VIRTIOFS,
    VIRTIOFS_KEY,
    ModelShare,
    no_virtiofs_line,
    virtiofs_available,
    virtiofs_dirid,
)
from pvegpu.plan.numa import NumaPlan
from pvegpu.plan.p2p import CLIQUE_PART, clique_args, own_clique, plan_cliques
from pvegpu.plan.topology import Topology

VFIO = "vfio-pci"
HOOKSCRIPT = "pvegpu-hook"  # the file name of pvegpu's pre-start hookscript in the snippets directory
NVIDIA = "10de"
DISPLAY = 0x03
_MMIO_ARG = re.compile(r"\s*-fw_cfg\s+name=opt/ovmf/X-PciMmio64Mb,string=\S+")
NUMA_NODE_KEY = re.compile(r"numa[0-9]+")
VIRTIOFS_N = re.compile(r"virtiofs[0-9]")
_TRUE = ("1", "on", "yes", "true")  # Proxmox's true booleans


@dataclass(frozen=True)
class VmPlan:
    """A node's VM as pvegpu wants it (module docstring): `config` and `create` (`vm_config`, `create_keys`),
    its GPUDirect clique parts (`clique`, plan/p2p.py: set in `args` with `vm.p2p: on`, by the P2P operation
    with `probe`), the storages its files and image use with the content types each must offer (`storages`),
    the functions of its GPUs not bound to vfio-pci when the node was read (`unbound`), and `problem`: why it
    cannot be made (None: it can). `share`: the model store it gets through virtiofs (plan/model_share.py;
    None: no `model` data, or a qemu-server without virtiofs, which `share_note` then says)."""

    spec: VmSpec
    config: Mapping[str, str]
    create: Mapping[str, str]
    clique: str
    storages: Mapping[str, Sequence[str]]
    unbound: tuple[str, ...]
    problem: str | None
    share: ModelShare | None = None
    share_note: str | None = None

    @property
    def created_with(self) -> dict[str, str]:
        """The keys a create of the VM sends (`POST /nodes/{node}/qemu`): `config` and `create`."""
        return {**self.config, **self.create}


def plan_vm(
    spec: VmSpec,
    hardware: HostHardware,
    topology: Topology,
    *,
    mapping_ids: Sequence[str],
    window: MmioWindow | None,
    numa: NumaPlan | None,
    numa_problem: str | None,
    cpu_vendor: str | None,
    root_user: str | None,
    model: ModelSpec | None = None,
    qemu_server: tuple[int, int, int] | None = None,
) -> VmPlan:
    """The plan of VM `spec` on a node with `hardware`, `topology` and CPU vendor `cpu_vendor` (the node's
    plan gives `mapping_ids`, the MMIO `window`, the `numa` layout or `numa_problem`); `root_user`: who writes
    root-only keys (`PveApiSpec.root_user`); `model`: the node's model store, shared through virtiofs when
    the node's `qemu_server` has it (plan/model_share.py). Never raises: what cannot be made is `problem`,
    in this order: a GPU that cannot be passed, the NUMA layout, an MMIO strategy the credentials cannot set,
    a window that cannot hold the BARs."""
    clique = clique_args(plan_cliques(topology, cpu_vendor))
    passable = passable_problem(topology)
    refusal = mmio_refusal(spec.mmio, root_user)
    problems = (
        None if passable is None else f"the GPUs cannot be passed: {passable}",
        numa_problem,
        refusal,
        None if window is None or window.problem is None else f"vm.mmio: {window.problem}",
    )
    share = note = None
    if model is not None and virtiofs_available(qemu_server):
        share = ModelShare(model.path)
    elif model is not None and qemu_server is not None:
        note = no_virtiofs_line(qemu_server)
    return VmPlan(
        spec=spec,
        config=vm_config(spec, mapping_ids, window, numa, clique, share=None if share is None else share.id),
        create=create_keys(spec),
        clique=clique,
        storages=storages_used(spec),
        unbound=unbound_functions(hardware, topology),
        problem=next((problem for problem in problems if problem is not None), None),
        share=share,
        share_note=note,
    )


def passable_problem(topology: Topology) -> str | None:
    """Why the GPUs cannot be passed to a VM (every refused card and topology problem), or None."""
    if topology.ok:
        return None
    gpus = topology.gpus
    return "; ".join([*topology.problems, *(f"{g.name}: {g.reason}" for g in gpus if g.reason)])


def storages_used(spec: VmSpec) -> dict[str, list[str]]:
    """The storages the VM's files and image use, each with the content types they need of it: `snippets`
    for the cloud-init user-data and the pre-start hookscript, `import` for a cloud image the node
    downloads."""
    wanted: dict[str, list[str]] = {}
    if spec.image is not None or spec.self_heal != "off":
        wanted[spec.snippets_storage] = ["snippets"]
    if isinstance(spec.image, ImageUrl):
        wanted.setdefault(spec.image.storage, []).insert(0, "import")
    return wanted


def vm_config(
    spec: VmSpec,
    mapping_ids: Sequence[str],
    window: MmioWindow | None,
    numa: NumaPlan | None = None,
    clique: str = "",
    *,
    share: str | None = None,
) -> dict[str, str]:
    """The keys pvegpu converges (see the module docstring), values as Proxmox stores them; `numa` None:
    one socket of `vm.cores`, no numaN (the flat layout). `clique`: plan/p2p.py's clique parts, set in
    `args` with `vm.p2p: on` (with `probe` and `off` plan/p2p's operation owns them). `share`: the directory
    mapping the VM gets as `virtiofs0` (plan/model_share.py; None: none)."""
    # plan/mmio.py: `host`, or `host,guest-phys-bits=N` with vm.mmio phys-bits (QEMU ignores phys-bits there).
    cpu = "host" if window is None or spec.mmio != "phys-bits" else window.cpu
    config = {
        "name": spec.name,
        "machine": spec.machine,
        "bios": "ovmf",
        "ostype": "l26",
        "cpu": cpu,
        "sockets": "1",
        "cores": str(spec.cores),
        "memory": str(spec.memory),
        "numa": "1" if spec.numa else "0",
        "balloon": "0",
        "agent": "1",
        "onboot": "1" if spec.onboot else "0",
        "scsihw": "virtio-scsi-single",
        **desired_hostpci(mapping_ids),
    }
    if numa is not None:
        config |= numa.keys()
    if spec.hugepages is not None:
        config["hugepages"] = spec.hugepages
    owned = [window.args] if window is not None and spec.mmio == "args" else []
    if spec.p2p == "on" and clique:
        owned.append(clique)
    if owned:
        config["args"] = " ".join(owned)
    if spec.self_heal != "off":
        config["hookscript"] = hookscript_volid(spec)
    if share is not None:
        config[VIRTIOFS_KEY] = share  # the dirid alone: Proxmox's defaults (plan/model_share.py)
    return config


def hookscript_volid(spec: VmSpec) -> str:
    """pvegpu's pre-start hookscript as a volume: `<snippets_storage>:snippets/pvegpu-hook`."""
    return f"{spec.snippets_storage}:snippets/{HOOKSCRIPT}"


def is_pvegpu_hookscript(value: object) -> bool:
    """Whether a VM's `hookscript` is pvegpu's (on any storage): `vm.self_heal: off` removes only that one."""
    return isinstance(value, str) and value.endswith(f":snippets/{HOOKSCRIPT}")


def create_keys(spec: VmSpec) -> dict[str, str]:
    """Keys given only on create: the EFI vars disk (4m, no pre-enrolled keys), the system disk, the NIC.

    Without `vm.image` the system disk is empty, `disk.size_gib` large. With it, the disk is imported from
    the image (`<storage>:0,import-from=<volid>`: Proxmox's syntax, size 0; grown to `disk.size_gib`
    afterwards), booted first (the cloud-init drive is a CD-ROM), and cloud-init gets its drive (`ide2`),
    the network (`ipconfig0`), no package upgrade at first boot (`ciupgrade 0`: the image as published) and
    pvegpu's user-data (`cicustom`, pvegpu/plan/cloud_init.py).
    """
    storage = spec.disk.storage
    keys = {
        "efidisk0": f"{storage}:1,efitype=4m,pre-enrolled-keys=0",
        "scsi0": f"{storage}:{spec.disk.size_gib},iothread=1",
        "net0": f"{spec.net.model},bridge={spec.net.bridge}",
    }
    if spec.image is not None:
        keys |= {
            "scsi0": f"{storage}:0,import-from={image_volid(spec)},iothread=1",
            "boot": "order=scsi0",
            "ide2": f"{storage}:cloudinit",
            "ipconfig0": spec.ipconfig,
            "ciupgrade": "0",
            "cicustom": f"user={snippet_volid(spec)}",
        }
    return keys


@dataclass(frozen=True)
class VmChange:
    """Keys to set (value as Proxmox stores it) and keys to delete; both empty: no change. `notes`: lines
    that say why a value of the VM's is replaced where that is not plain convergence (`hidden_dropped`)."""

    set: dict[str, str]
    delete: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.set or self.delete)


def cpu_hidden(cpu: object) -> bool:
    """Whether a `cpu` value hides the hypervisor: its `hidden` option true (`1|on|yes|true`; qemu-server
    CPUConfig.pm then adds `kvm=off`)."""
    options = (part.partition("=") for part in str(cpu or "").split(","))
    return any(key.strip() == "hidden" and value.strip().lower() in _TRUE for key, _, value in options)


def hidden_dropped(cpu: object, clique: str) -> str | None:
    """The line said when the VM's `cpu`, with `hidden=1`, is replaced while `clique` (plan/p2p.py parts)
    is set; None when it has no `hidden=1` or no clique is set."""
    if not clique or not cpu_hidden(cpu):
        return None
    return (
        f"cpu {cpu} has hidden=1 (kvm=off), with which the guest's NVIDIA driver ignores the GPUDirect "
        "clique (vm.p2p): pvegpu's cpu value, without hidden, replaces it"
    )


def merge_args(current: str | None, mmio_args: str | None, clique: str | None = None) -> str:
    """`current` args as pvegpu wants them, in the order: the parts that are not pvegpu's (kept verbatim, in
    their order), pvegpu's X-PciMmio64Mb part (`mmio_args`; None: the current one kept), pvegpu's clique parts
    (`clique`, plan/p2p.py; None: the current ones kept, '' removes them)."""
    text = current or ""
    mmio = mmio_args if mmio_args is not None else " ".join(m.strip() for m in _MMIO_ARG.findall(text))
    cliques = clique if clique is not None else own_clique(text)
    rest = CLIQUE_PART.sub("", _MMIO_ARG.sub("", text)).strip()
    return " ".join(part for part in (rest, mmio, cliques) if part)


def _wanted_args(current: str | None, desired: str | None, keep_clique: bool) -> str:
    """`merge_args` for vm_config's `args` value (None: it plans none): its MMIO part replaces pvegpu's (none:
    the current one kept); its clique parts (`vm.p2p: on`; none: removed) replace pvegpu's, unless
    `keep_clique`."""
    clique = None if keep_clique else own_clique(desired)
    mmio = CLIQUE_PART.sub("", desired or "").strip()
    return merge_args(current, mmio or None, clique)


def diff_vm(
    desired: Mapping[str, str],
    create: Mapping[str, str],
    current: Mapping[str, object],
    prefix: str,
    *,
    converting: bool = False,
    keep_clique: bool = False,
) -> VmChange:
    """What to PUT so `current` has `desired` (from vm_config); raises HostPciError for a taken slot.

    - plain keys: compared as text (`16` == 16); `hugepages` and every `numaN` not in `desired` are deleted;
    - `virtiofs0` (the model store's share): present when any `virtiofsN` names its dirid, else set at
      `virtiofs0`, or at the first free `virtiofsN` when `virtiofs0` names another directory (the
      operator's); without it in `desired`, each `virtiofsN` naming `pvegpu-models` is deleted (`virtiofs`);
    - `args`: only pvegpu's parts are compared and replaced: its MMIO part, and its clique parts
      (plan/p2p.py) as `desired` has them (none: removed), unless `keep_clique` (`vm.p2p: probe`);
    - `net0`: model and bridge compared, the MAC kept; `efidisk0`/`scsi0`: added when missing, else left;
    - a VM that is not Q35/OVMF yet (plan/convert.py): `machine`, `bios`, `efidisk0` and the `hostpciN`
      keys (`pcie=1` needs Q35) are left out unless `converting` (the conversion, once its guest is checked).
    """
    legacy = not converting and needs_conversion(current)
    if legacy:
        desired = {
            key: value
            for key, value in desired.items()
            if key not in CONVERSION_KEYS and not HOSTPCI_KEY.fullmatch(key)
        }
        create = {key: value for key, value in create.items() if key not in CONVERSION_KEYS}
    hostpci = {key: value for key, value in desired.items() if HOSTPCI_KEY.fullmatch(key)}
    to_set: dict[str, str] = {}
    for key, value in desired.items():
        if key in hostpci or key in ("args", VIRTIOFS_KEY):
            continue
        now = current.get(key)
        if now is None or str(now) != value:
            to_set[key] = value
    delete = ["hugepages"] if "hugepages" in current and "hugepages" not in desired else []
    now_args = None if current.get("args") is None else str(current["args"])
    args = _wanted_args(now_args, desired.get("args"), keep_clique)
    if args and args != now_args:
        to_set["args"] = args
    elif not args and now_args is not None and "args" not in desired:  # only pvegpu's clique parts were there
        delete.append("args")
    delete += sorted(
        (key for key in current if NUMA_NODE_KEY.fullmatch(key) and key not in desired),
        key=lambda k: int(k[4:]),
    )
    if "hookscript" not in desired and is_pvegpu_hookscript(current.get("hookscript")):
        delete.append("hookscript")
    shared, unshared, share_note = virtiofs(desired.get(VIRTIOFS_KEY), current)
    to_set.update(shared)
    delete += unshared
    for key in ("efidisk0", "scsi0"):
        if key not in current and key in create:
            to_set[key] = create[key]
    net = _net(current.get("net0"))
    model, _, bridge = create["net0"].partition(",bridge=")
    if net is None:
        to_set["net0"] = create["net0"]
    elif (net[0], net[2]) != (model, bridge):
        to_set["net0"] = f"{model}={net[1]},bridge={bridge}" if net[1] else create["net0"]
    note = hidden_dropped(current.get("cpu"), own_clique(args)) if "cpu" in to_set else None
    notes = tuple(line for line in (note, share_note) if line is not None)
    if legacy:
        return VmChange(to_set, tuple(delete), notes)
    change = diff_hostpci(hostpci, current, prefix)
    to_set.update(change.set)
    return VmChange(to_set, (*delete, *change.delete), notes)


def virtiofs(
    dirid: str | None, current: Mapping[str, object], own: str = SHARE_ID
) -> tuple[dict[str, str], list[str], str | None]:
    """(keys to set, keys to delete, a note) so `current` shares the directory mapping `dirid` once (None:
    shares `own` nowhere); see `diff_vm`. The note says why it is not set: every virtiofsN taken."""
    keys = sorted((key for key in current if VIRTIOFS_N.fullmatch(key)), key=lambda k: int(k[8:]))
    if dirid is None:
        return {}, [key for key in keys if virtiofs_dirid(current[key]) == own], None
    if any(virtiofs_dirid(current[key]) == dirid for key in keys):
        return {}, [], None
    free = next((f"virtiofs{n}" for n in range(MAX_VIRTIOFS) if f"virtiofs{n}" not in current), None)
    if free is None:
        return {}, [], f"every virtiofsN is taken: the model store ({dirid}) is not shared with the VM"
    return {free: dirid}, [], None


def _net(value: object) -> tuple[str, str, str] | None:
    """(model, MAC or '', bridge) of a netN value; None when absent."""
    if value is None:
        return None
    head, _, rest = str(value).partition(",")
    model, _, mac = head.partition("=")
    options = dict(part.partition("=")[::2] for part in rest.split(",") if part)
    return model, mac, options.get("bridge", "")


def unbound_functions(hw: HostHardware, topology: Topology) -> tuple[str, ...]:
    """`address (driver)` of every function of the selected cards not bound to vfio-pci right now."""
    found = []
    for card in topology.gpus:
        for address in card.functions:
            driver = hw.by_address[address].driver
            if driver != VFIO:
                found.append(f"{address} ({driver or 'no driver'})")
    return tuple(found)


def nvidia_gpus(hw: HostHardware) -> tuple[str, ...]:
    """Addresses of the NVIDIA display functions `hw` shows (what a guest counts as its GPUs)."""
    return tuple(f.address for f in hw.functions if f.vendor == NVIDIA and f.class_code >> 16 == DISPLAY)


def pending_keys(next_start: Mapping[str, object], now: Mapping[str, object]) -> tuple[str, ...]:
    """The keys a running VM's next cold start changes, sorted: those whose value differs between its config
    with pending values applied (`next_start`, `GET …/config`) and without (`now`, `current=1`), deleted
    ones included; `digest` aside. Proxmox keeps such a change in `[PENDING]` while the VM runs (`args`,
    `hostpciN`, `cpu`, `machine`, ...: qemu-server API2/Qemu.pm `$update_vm_api`, what it cannot
    hotplug) and applies it only when QEMU starts again; a reboot inside the guest keeps the same QEMU."""
    keys = (set(next_start) | set(now)) - {"digest"}
    return tuple(sorted(key for key in keys if str(next_start.get(key)) != str(now.get(key))))


def apply_command(vmid: int) -> str:
    """The command on the node that applies a running VM's pending changes: a cold restart."""
    return f"qm shutdown {vmid} && qm start {vmid}"


def pending_report(vmid: int, node: str, keys: Sequence[str], why_not: str) -> str:
    """The warning for pending changes pvegpu does not apply itself (`why_not`: the reason)."""
    them = "it" if len(keys) == 1 else "them"
    return (
        f"VM {vmid}: {', '.join(keys)} pending: Proxmox applies {them} at the VM's next cold start, not "
        f"while it runs nor at a reboot inside the guest; {why_not}; to apply {them}, on {node}: "
        f"{apply_command(vmid)}"
    )
