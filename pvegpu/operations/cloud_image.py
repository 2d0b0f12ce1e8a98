"""The steps that give a new VM an OS from a cloud image, through the Proxmox API and the node's files.

`cloud_image` is what a VM with `vm.image` needs before it is created, and who its guest is: while the VM
does not exist, the image is on the node (downloaded with its checksum when given as a URL); the guest's SSH
host key pair and pyinfra's login key for it exist on this machine (generated once, 0600, never printed) and
the cloud-init user-data holding them is on the node. The VM role then creates the VM from the image, grows
its disk, starts it and waits for the guest (roles/q35_vm.py).

- `storage_content`: a storage offers the content types pvegpu needs (`import` for a downloaded image,
  `snippets` for the cloud-init user-data), added to the ones it has, never replacing them; `storages_offer`
  for each storage the VM's plan names (plan/vm.py `storages_used`);
- `image_downloaded`: the image volume exists on the node, else the node downloads it (`download-url` with
  the checksum: a mismatch fails the task, and the error names the URL and both sums). A volume already there
  (an earlier download, or another admin's file) is used only when its digest, hashed on the node by the
  node's state read, is `vm.image.checksum`; else it is refused naming both sums. Checked only while the VM
  does not exist: the image is read once, on create, and a later run never downloads it again;
- `snippet_file`: the cloud-init user-data on the node (mode 0600: it holds the guest's SSH host key);
- `disk_grown`: the system disk at least `size_gib` (an imported disk has the image's size); never shrunk.

Reads happen while preparing; writes are `api_command`s (or, for the snippet, an upload between two shell
commands) run while executing, so `--dry` shows them without making them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pyinfra import logger
from pyinfra.api.command import FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.local.files import LocalWriteError
from pvegpu.local.guest_keys import (
    GuestKeyError,
    GuestPlace,
    adopt_name_keyed_files,
    ensure_key_pair,
    host_key_files,
    login_key_files,
)
from pvegpu.models.pve import GuestConfig
from pvegpu.models.vm import ImageUrl, VmSpec
from pvegpu.operations.api_command import api_command, one_line_errors
from pvegpu.operations.files import upload_secret_file
from pvegpu.operations.guest_known import GuestIdentity
from pvegpu.operations.pve_guest import Guest
from pvegpu.operations.snippets import snippets_directory
from pvegpu.plan.cloud_init import image_volid, made_by_cloud_init, snippet_name, static_address, user_data
from pvegpu.plan.guest_leftovers import left_by_a_create
from pvegpu.pve.client import PveClient
from pvegpu.pve.errors import PveError, TaskFailedError
from pvegpu.pve.transport import Params
from pvegpu.run.node_state import node_file_sha256, node_image_digest
from pvegpu.run.plan import plan_of

_SIZE = re.compile(r"(?:^|,)size=(\d+(?:\.\d+)?)([KMGT]?)(?:,|$)")
_UNIT_GIB = {"K": 1 / 1024**2, "M": 1 / 1024, "G": 1.0, "T": 1024.0, "": 1 / 1024**3}


@operation()
@one_line_errors
def storage_content(*, api: PveClient, storage: str, wanted: Sequence[str]) -> Generator[FunctionCommand]:
    """Storage `storage` offers every content type in `wanted`, added to its own (read with its digest)."""
    try:
        config = api.storage(storage)
    except PveError as error:
        raise OperationError(f"storage {storage}: {error.line}") from None
    missing = [kind for kind in wanted if kind not in config.content]
    if not missing:
        host.noop(f"storage {storage} offers {', '.join(wanted)}")
        return
    content = [*config.content, *missing]
    logger.info(
        f"{host.print_prefix}storage {storage} content: {','.join(config.content)} -> {','.join(content)}"
    )
    yield api_command(_set_content, api, storage, content, config.digest, missing)


def storages_offer(api: PveClient, storages: Mapping[str, Sequence[str]]) -> None:
    """Each of `storages` (name -> content types: `VmPlan.storages`) offers its types (nothing when none)."""
    for storage, kinds in storages.items():
        storage_content(
            name=f"Storage {storage} offers {', '.join(kinds)}", api=api, storage=storage, wanted=kinds
        )


def _set_content(api: PveClient, storage: str, content: list[str], digest: str, missing: list[str]) -> None:
    try:
        api.update_storage_content(storage, content, digest)
        after = api.storage(storage)
    except PveError as error:
        raise OperationError(
            f"storage {storage}: content type {', '.join(missing)} not added: {error.line}"
        ) from None
    still = [kind for kind in missing if kind not in after.content]
    if still:
        raise OperationError(
            f"storage {storage}: content type {', '.join(still)} not added: reading it back shows "
            f"content {','.join(after.content)}"
        )


@operation()
@one_line_errors
def image_downloaded(
    *,
    api: PveClient,
    node: str,
    volid: str,
    url: str | None,
    checksum: str | None,
    algorithm: str | None,
    timeout_s: float,
) -> Generator[FunctionCommand]:
    """Volume `volid` (`<storage>:import/<file>`) exists on `node`; when it does not and `url` is given, the
    node downloads it with `checksum` (`algorithm`); without `url` (`vm.image.volume`) a missing volume is an
    error naming it. With `checksum`, a volume already there whose file's digest is another is refused."""
    storage, _, name = volid.partition(":")
    try:
        present = volid in api.storage_volumes(node, storage, "import")
    except PveError as error:
        raise OperationError(f"vm.image: the volumes of storage {storage} on {node}: {error.line}") from None
    if present and checksum is not None and algorithm is not None:
        _check_volume(api, node, volid, checksum, algorithm)
        host.noop(f"image {volid} is on {node} with the {algorithm} of vm.image.checksum")
        return
    if present:
        host.noop(f"image {volid} is on {node}")
        return
    if url is None:
        raise OperationError(f"vm.image.volume: {volid} does not exist on {node}")
    params: Params = {
        "url": url,
        "filename": name.removeprefix("import/"),
        "content": "import",
        "checksum": checksum,
        "checksum-algorithm": algorithm,
        "verify-certificates": 1,
    }
    logger.info(f"{host.print_prefix}image {volid}: download {url} ({algorithm} {checksum})")
    yield api_command(_download, api, _Download(node, storage, volid, url, params, timeout_s))


def _check_volume(api: PveClient, node: str, volid: str, checksum: str, algorithm: str) -> None:
    """OperationError unless the file of `volid` on `node` has `checksum`: a volume pvegpu did not download
    (or one changed since) must not become the VM's disk unchecked."""
    storage, _, name = volid.partition(":")
    try:
        directory = api.storage(storage).path
    except PveError as error:
        raise OperationError(f"vm.image.storage {storage}: {error.line}") from None
    if directory is None:
        raise OperationError(
            f"vm.image.storage {storage} has no directory: volume {volid} cannot be checked against "
            "vm.image.checksum"
        )
    path = f"{directory}/{name}"
    found = node_image_digest(host, path, algorithm)
    if found is None:
        raise OperationError(
            f"vm.image: volume {volid} is listed on {node}, but {path} is not a file: its {algorithm} "
            "cannot be checked"
        )
    if found != checksum:
        raise OperationError(
            f"vm.image: volume {volid} ({path}) on {node} has {algorithm} {found}, vm.image.checksum is "
            f"{checksum}: remove the volume (pvesm free {volid}) or fix vm.image.checksum"
        )


@dataclass(frozen=True)
class _Download:
    node: str
    storage: str
    volid: str
    url: str
    params: Params
    timeout_s: float


def _download(api: PveClient, job: _Download) -> None:
    url = job.url
    try:
        api.wait_task(api.download_url(job.node, job.storage, job.params), job.timeout_s)
    except TaskFailedError as error:
        raise OperationError(f"vm.image.url {url}: not downloaded: {error.message}") from None
    except PveError as error:
        raise OperationError(f"vm.image.url {url}: not downloaded: {error.line}") from None
    try:
        present = job.volid in api.storage_volumes(job.node, job.storage, "import")
    except PveError as error:
        raise OperationError(
            f"vm.image.url {url}: downloaded, reading it back failed: {error.line}"
        ) from None
    if not present:
        raise OperationError(f"vm.image.url {url}: the download task ended OK, but {job.volid} is not there")


@operation()
def snippet_file(*, path: str, content: str) -> Generator[StringCommand | FileUploadCommand]:
    """The cloud-init user-data `content` at `path` on the node, root-only (it holds a private host key):
    uploaded as a file into a root-only staging file, never on a command line, never logged."""
    remote = node_file_sha256(host, path)
    if remote == hashlib.sha256(content.encode()).hexdigest():
        host.noop(f"cloud-init user-data {path} is up to date")
        return
    yield from upload_secret_file(path, content, mode="0600")


@operation()
@one_line_errors
def disk_grown(*, guest: Guest, disk: str, size_gib: int) -> Generator[FunctionCommand]:
    """VM `guest`'s `disk` is at least `size_gib` GiB (read from its config's `size=`); grown when smaller,
    never shrunk. A VM that does not exist yet (`--dry` before the run creates it) is read when the grow
    executes."""
    try:
        config = guest.config_or_none()
    except PveError as error:
        raise OperationError(f"VM {guest.vmid}: {error.line}") from None
    if config is None:
        logger.info(
            f"{host.print_prefix}VM {guest.vmid} {disk}: grown to {size_gib} GiB once created, if smaller"
        )
        yield api_command(_grow_created, guest, disk, size_gib)
        return
    value = config.values.get(disk)
    size = None if value is None else disk_size_gib(str(value))
    if size is None:
        raise OperationError(f"VM {guest.vmid}: {disk} has no size in its config ({value!r})")
    if size >= size_gib:
        host.noop(f"VM {guest.vmid} {disk} is {size:g} GiB (at least {size_gib})")
        return
    logger.info(f"{host.print_prefix}VM {guest.vmid} {disk}: {size:g} GiB -> {size_gib} GiB")
    yield api_command(_grow, guest, disk, size_gib, config.digest)


def _grow_created(guest: Guest, disk: str, size_gib: int) -> None:
    try:
        config = guest.api.vm_config(guest.node, guest.vmid)
    except PveError as error:
        raise OperationError(f"VM {guest.vmid} {disk} not grown to {size_gib} GiB: {error.line}") from None
    size = disk_size_gib(str(config.values.get(disk, "")))
    if size is None or size < size_gib:
        _grow(guest, disk, size_gib, config.digest)


def _grow(guest: Guest, disk: str, size_gib: int, digest: str) -> None:
    api, what = guest.api, f"VM {guest.vmid} {disk}"
    try:
        api.resize_vm_disk(guest.node, guest.vmid, disk, f"{size_gib}G", digest)
        after = disk_size_gib(str(api.vm_config(guest.node, guest.vmid).values.get(disk, "")))
    except PveError as error:
        raise OperationError(f"{what} not grown to {size_gib} GiB: {error.line}") from None
    if after is None or after < size_gib:
        raise OperationError(f"{what} not grown to {size_gib} GiB: reading it back shows {after} GiB")


def disk_size_gib(value: str) -> float | None:
    """The `size=` of a disk's property string in GiB (`size=2G` -> 2.0, `size=512M` -> 0.5), or None."""
    match = _SIZE.search(value)
    if match is None:
        return None
    return float(match.group(1)) * _UNIT_GIB[match.group(2)]


def cloud_image(guest: Guest, spec: VmSpec, timeout_s: float) -> GuestIdentity | None:
    """The steps of the module docstring for `spec` (which has an image), VM `guest`; the guest's identity for
    the later steps. None for a VM that exists and was not made from the image (an installed VM, e.g. one
    converted from i440FX): its guest's keys are not pvegpu's, so nothing here applies to it."""
    image = spec.image
    assert image is not None  # called only for a VM with an image
    known_hosts = Path(str(host.data.get("ssh_known_hosts_file")))  # required with vm.image (inventory)
    pve = plan_of(host).specs.pve
    place = GuestPlace(pve.cluster, pve.owner, guest.node, guest.vmid)  # its files are this cluster's guest's
    try:
        adopt_name_keyed_files(known_hosts, place, spec.name)  # never a new key for a guest that has one
    except GuestKeyError as error:
        raise OperationError(f"{host.name}: guest {spec.name}: {error}") from None
    volid = image_volid(spec)
    current = _config(guest)
    if current is not None and left_by_a_create(current.values):
        current = (
            None  # no VM yet: q35_vm makes it again (the leftover of pvegpu's dead create) or reports it
        )
    if current is not None and not made_by_cloud_init(current.values, spec):
        return None
    if current is None:
        image_downloaded(
            name="The VM's cloud image is on the node",
            api=guest.api,
            node=guest.node,
            volid=volid,
            url=image.url if isinstance(image, ImageUrl) else None,
            checksum=image.checksum if isinstance(image, ImageUrl) else None,
            algorithm=image.checksum_algorithm if isinstance(image, ImageUrl) else None,
            timeout_s=timeout_s,
        )
    private, _ = host_key_files(known_hosts, place)
    try:
        key_text, public_line = ensure_key_pair(private)
        _, login_public = ensure_key_pair(login_key_files(known_hosts, place)[0])
    except (GuestKeyError, LocalWriteError) as error:
        raise OperationError(f"{host.name}: guest {spec.name}: {error}") from None
    snippet_file(
        name="The guest's cloud-init user-data is on the node",
        path=f"{snippets_directory(guest.api, spec.snippets_storage)}/{snippet_name(spec.vmid)}",
        content=user_data(spec, key_text, public_line, login_public),
    )
    return GuestIdentity(spec.name, known_hosts, private, public_line, static_address(spec.ipconfig))


def _config(guest: Guest) -> GuestConfig | None:
    """The VM's config, None when it does not exist; OperationError when it cannot be read."""
    try:
        return guest.config_or_none()
    except PveError as error:
        raise OperationError(f"{host.name}: VM {guest.vmid}: {error.line}") from None
