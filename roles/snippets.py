"""The node's storages, ready for what the VM needs from them: the content types (`snippets` for the
cloud-init user-data and the pre-start hookscript, `import` for a cloud image the node downloads), added to
each storage's own types in one write, and the snippets directory the files go to."""

from __future__ import annotations

from pyinfra.api.exceptions import OperationError
from pyinfra.context import host

from pvegpu.models.pve import StorageConfig
from pvegpu.models.vm import ImageUrl, VmSpec
from pvegpu.operations.cloud_image import storage_content
from pvegpu.pve.client import PveClient
from pvegpu.pve.errors import PveError


def storages_used(spec: VmSpec) -> dict[str, list[str]]:
    """The storages the VM's files and image use, each with the content types they need of it."""
    wanted: dict[str, list[str]] = {}
    if spec.image is not None or spec.self_heal != "off":
        wanted[spec.snippets_storage] = ["snippets"]
    if isinstance(spec.image, ImageUrl):
        wanted.setdefault(spec.image.storage, []).insert(0, "import")
    return wanted


def storages_offer(api: PveClient, spec: VmSpec) -> None:
    """Each storage the VM's files and image use offers their content types (nothing when none is used)."""
    for storage, kinds in storages_used(spec).items():
        storage_content(
            name=f"Storage {storage} offers {', '.join(kinds)}", api=api, storage=storage, wanted=kinds
        )


def snippets_directory(api: PveClient, storage: str) -> str:
    """The directory of `vm.snippets_storage` `storage` (`<path>/snippets`); OperationError naming the
    field for a storage without one."""
    return directory_of(snippets_storage(api, storage))


def snippets_storage(api: PveClient, storage: str) -> StorageConfig:
    """`vm.snippets_storage` `storage`'s config; OperationError naming the field when it cannot be read."""
    try:
        return api.storage(storage)
    except PveError as error:
        raise OperationError(f"{host.name}: vm.snippets_storage {storage}: {error.line}") from None


def directory_of(config: StorageConfig) -> str:
    """snippets_directory of a storage config already read (the hook's role also checks it is local)."""
    storage, path = config.storage, config.path
    if path is None:
        raise OperationError(
            f"{host.name}: vm.snippets_storage {storage} has no directory (snippets need a dir-like storage)"
        )
    return f"{path}/snippets"
