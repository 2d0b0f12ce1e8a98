"""model_store: the model's one store on the node (`model`), shared by every profile (README, "The model").

A Hugging Face source is fetched into the store and verified by `pvegpu-model-fetch.service` on the node
(pvegpu/operations/model_fetch.py: resumable, attached to when already running, progress lines, free space
checked first); the fetcher's files, the hub venv and the unit are written only while the store is not
complete as verified, so a no-op run reads the store in the node's one state read and sends nothing. A
`dir` source is served as it is. The VM reaches the store through the directory mapping and `virtiofs0`,
the container through `mp0` (roles/q35_vm.py, roles/lxc_gpu.py), bare metal at its path.
"""

from __future__ import annotations

from io import StringIO

from pyinfra import logger
from pyinfra.api.deploy import deploy
from pyinfra.context import host
from pyinfra.operations import apt, files, systemd
from pyinfra.operations.util import any_changed

from pvegpu.models.model_store import FETCH_CONFIG, FETCH_SCRIPT, FETCH_UNIT, FETCH_UNIT_FILE
from pvegpu.operations.model_fetch import fetch_unit, fetcher_source, model_fetch
from pvegpu.run.model_store import node_store_of


@deploy("Keep the model's store on the node")
def model_store() -> None:
    store = node_store_of(host)
    if store is None:
        return
    fetch = store.fetch
    if fetch is None:
        logger.info(f"{host.print_prefix}model: {store.path}: served as it is (model.source.dir)")
        return
    if not store.complete:
        files.directory(name="Create the model store", path=store.path, user="root", group="root", mode="755")
        apt.packages(name="Install Python's venv support (the hub venv)", packages=["python3-venv"])
        files.put(name="Upload pvegpu's model fetcher", src=StringIO(fetcher_source()), dest=FETCH_SCRIPT)
        files.put(name="Write the model fetch's settings", src=StringIO(fetch.config), dest=FETCH_CONFIG)
        unit = files.put(
            name=f"Write {FETCH_UNIT}", src=StringIO(fetch_unit(fetch, "model_store")), dest=FETCH_UNIT_FILE
        )
        systemd.daemon_reload(name=f"Reload systemd's units ({FETCH_UNIT})", _if=any_changed(unit))
    model_fetch(
        name=f"Fetch and verify {fetch.target.repo}",
        target=fetch.target,
        record=store.record,
        files=store.files,
    )
