"""pvegpu's pre-start hookscript on the node: the zipapp of the hook's modules and the wrapper Proxmox runs.

`hook_installed` compares each file's sha256 on the node with what this pvegpu builds (pvegpu/hook/bundle.py)
and writes only a file that differs, atomically (pvegpu/operations/files.py): the zipapp at
`bundle.BUNDLE_PATH` (0644 root, uploaded to its staging name, then checked and renamed), the wrapper in the
snippets directory (0755 root: Proxmox runs it as the VM's `hookscript`). The same pvegpu gives the same
bytes, so a second run changes nothing; another pvegpu version or another mode rewrites them.
"""

from __future__ import annotations

import hashlib
import io
import posixpath
from collections.abc import Generator

from pyinfra.api.command import FileUploadCommand, StringCommand
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.hook.bundle import BUNDLE_PATH, Bundle
from pvegpu.node_state import node_file_sha256
from pvegpu.operations.files import install_staged, temp_path, write_file


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
    if bundle_now != bundle.sha256:
        yield StringCommand("mkdir", "-p", posixpath.dirname(BUNDLE_PATH))
        yield FileUploadCommand(io.BytesIO(bundle.data), temp_path(BUNDLE_PATH))
        yield install_staged(BUNDLE_PATH, bundle.sha256)
    if wrapper_now != wrapper_sha256:
        yield StringCommand("mkdir", "-p", posixpath.dirname(wrapper_path))
        yield write_file(wrapper_path, wrapper, mode="0755", check="sh -n")
