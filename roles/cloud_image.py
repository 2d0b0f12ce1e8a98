"""cloud_image: what a VM with `vm.image` needs before it is created, and who its guest is.

While the VM does not exist, the image is on the node (downloaded with its
checksum when given as a URL); the guest's SSH host key pair and pyinfra's login key for it exist on this
machine (generated once, 0600, never printed) and the cloud-init user-data holding them is on the node.
The VM role then creates the VM from the image, grows its disk, starts it and waits for the guest
(roles/q35_vm.py).
"""

from __future__ import annotations

from pathlib import Path

from pyinfra.api.exceptions import OperationError
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
from pvegpu.operations.cloud_image import image_downloaded, snippet_file
from pvegpu.operations.guest_known import GuestIdentity
from pvegpu.operations.pve_guest import VM, Guest
from pvegpu.plan.cloud_init import image_volid, made_by_cloud_init, snippet_name, static_address, user_data
from pvegpu.plan.guest_leftovers import left_by_a_create
from pvegpu.pve.client import PveClient
from pvegpu.pve.errors import PveError
from pvegpu.run.plan import plan_of
from roles.snippets import snippets_directory


def cloud_image(api: PveClient, node: str, spec: VmSpec, timeout_s: float) -> GuestIdentity | None:
    """The steps above for `spec` (which has an image) on `node`; the guest's identity for the later steps.
    None for a VM that exists and was not made from the image (an installed VM, e.g. one converted from
    i440FX): its guest's keys are not pvegpu's, so nothing here applies to it."""
    image = spec.image
    assert image is not None  # the VM role calls this only for a VM with an image
    known_hosts = Path(str(host.data.get("ssh_known_hosts_file")))  # required with vm.image (inventory)
    pve = plan_of(host).specs.pve
    place = GuestPlace(pve.cluster, pve.owner, node, spec.vmid)  # its files are this cluster's guest's
    try:
        adopt_name_keyed_files(known_hosts, place, spec.name)  # never a new key for a guest that has one
    except GuestKeyError as error:
        raise OperationError(f"{host.name}: guest {spec.name}: {error}") from None
    volid = image_volid(spec)
    current = _config(api, node, spec.vmid)
    if current is not None and left_by_a_create(current.values):
        current = (
            None  # no VM yet: q35_vm makes it again (the leftover of pvegpu's dead create) or reports it
        )
    if current is not None and not made_by_cloud_init(current.values, spec):
        return None
    if current is None:
        image_downloaded(
            name="The VM's cloud image is on the node",
            api=api,
            node=node,
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
        path=f"{snippets_directory(api, spec.snippets_storage)}/{snippet_name(spec.vmid)}",
        content=user_data(spec, key_text, public_line, login_public),
    )
    return GuestIdentity(spec.name, known_hosts, private, public_line, static_address(spec.ipconfig))


def _config(api: PveClient, node: str, vmid: int) -> GuestConfig | None:
    try:
        return Guest(VM, api, node, vmid).config_or_none()
    except PveError as error:
        raise OperationError(f"{host.name}: VM {vmid}: {error.line}") from None
