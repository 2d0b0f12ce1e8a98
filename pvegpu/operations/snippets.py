"""The snippets storage of the node's VM (`vm.snippets_storage`): its config, read through the API, and the
directory the cloud-init user-data and the pre-start hookscript go to; a storage that cannot be read or has
no directory stops the run naming the field."""

from __future__ import annotations

from pyinfra.api.exceptions import OperationError
from pyinfra.context import host

from pvegpu.models.pve import StorageConfig
from pvegpu.pve.client import PveClient
from pvegpu.pve.errors import PveError


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
    """snippets_directory of a storage config already read (`self_heal` also checks it is local)."""
    storage, path = config.storage, config.path
    if path is None:
        raise OperationError(
            f"{host.name}: vm.snippets_storage {storage} has no directory (snippets need a dir-like storage)"
        )
    return f"{path}/snippets"
