"""A storage's directory from storage.cfg is not pvegpu's to trust: one holding what a shell or a line-based
read could take for syntax is refused when it is read (`PveClient.storage`), naming the storage; the node
state read, which takes the paths from storage.cfg itself, never runs one.

pve-storage's own check (src/PVE/Storage/Plugin.pm, verify_path) lets all of these through: any path of `/`
and one character other than `;`, `(`, `)`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from pyinfra.api.exceptions import OperationError

from pvegpu.facts.node_read import files_sha256_command
from pvegpu.models.pve import StorageConfig
from pvegpu.operations.cloud_image import storage_content
from pvegpu.pve.errors import PveError
from tests.unit.fake_pve import FakeApi
from tests.unit.op_harness import run_op


def _api(path: str) -> FakeApi:
    answer = {"storage": "local", "type": "dir", "content": "iso,snippets", "path": path, "digest": "d1"}
    return FakeApi({("GET", "/storage/local"): answer})


@pytest.mark.parametrize(
    ("path", "shown"),
    [
        ("/var/lib/`x`", "'/var/lib/`x`'"),
        ("/var/lib/$(id)", "'/var/lib/$(id)'"),
        ("/var/lib/vz\nExecStart=/bin/sh", "'/var/lib/vz\\nExecStart=/bin/sh'"),
        ("/var/lib/\x1b[2Jvz", "'/var/lib/\\x1b[2Jvz'"),
        ('/var/lib/"vz', "'/var/lib/\"vz'"),
        ("/var/lib/'vz", '"/var/lib/\'vz"'),
        ("/var/lib/\\vz", "'/var/lib/\\\\vz'"),
    ],
)
def test_error_a_storage_path_with_shell_syntax_is_refused_naming_the_storage(path: str, shown: str) -> None:
    with pytest.raises(PveError) as raised:
        _api(path).client.storage("local")

    assert raised.value.line == (
        f"GET /storage/local: storage local: path {shown} holds a character pvegpu will not put in a command"
    )


def test_a_storage_path_with_a_space_is_read() -> None:
    assert _api("/mnt/my store").client.storage("local") == StorageConfig(
        "local", ("iso", "snippets"), "/mnt/my store", "d1", type="dir"
    )


def test_error_a_backtick_storage_path_fails_the_step_before_any_write() -> None:
    api = _api("/var/lib/`reboot`")

    with pytest.raises(OperationError) as raised:
        run_op(storage_content, {}, api=api.client, storage="local", wanted=["snippets"])

    assert str(raised.value) == (
        "storage local: GET /storage/local: storage local: path '/var/lib/`reboot`' holds a character pvegpu "
        "will not put in a command"
    )
    assert api.calls == [("GET", "/storage/local", {})]


def test_the_node_state_read_never_runs_a_storage_path(tmp_path: Path) -> None:
    """storage.cfg paths go through `read -r` into a quoted "$d": a backtick or `$(...)` stays text."""
    ran = tmp_path / "ran"
    cfg = tmp_path / "storage.cfg"
    cfg.write_text(
        f"dir: a\n\tpath {tmp_path}/`touch {ran}`\n\tcontent snippets\n\n"
        f"dir: b\n\tpath {tmp_path}/$(touch {ran})\n\tcontent snippets\n"
    )

    done = subprocess.run(
        ["sh", "-c", files_sha256_command((), storage_cfg=str(cfg))],
        capture_output=True,
        text=True,
        check=False,
    )

    assert not ran.exists()
    assert f"dir {tmp_path}/`touch {ran}`/snippets" in done.stdout.splitlines()
    assert f"dir {tmp_path}/$(touch {ran})/snippets" in done.stdout.splitlines()
