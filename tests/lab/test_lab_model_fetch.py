"""The model fetch (`sglang.model_repo`) against a lab VM guest and the lab's stand-in hub (lab/hub.py) on
the guest's network: the real huggingface_hub client in pvegpu's hub venv, run by
pvegpu-model-fetch.service. Cut mid-file (the unit killed, then the SSH connection cut): the next run
resumes (a Range request from the partial bytes) or attaches, and ends verified; a file changed on disk is
fetched again alone; too little space is refused before any byte with the numbers; a second run changes
nothing and asks nothing of the hub."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import hosts
from lab.guest_payload import up_guest
from lab.hub import CHUNK, REPO, SHARDS, TOKEN, Hub
from pvegpu.plan.model_fetch import size_text
from tests.lab.conftest import PYINFRA
from tests.lab.conftest import REPO as CHECKOUT
from tests.lab.test_lab_guest import DEPLOY, INVENTORY, LabSsh, PyinfraCli, deploy, starts

pytestmark = pytest.mark.lab

MODEL = "/srv/models/GLM-5-NVFP4-MTP"
TOKEN_FILE = "/root/hf-token"
FIRST, SECOND = SHARDS
FETCH = f"Fetch and verify {REPO}"
# The first shard's bytes a second while a test cuts the fetch: the cut comes after CHUNK bytes, ~5 s in,
# and leaves ~7 s before the shard completes, room for a loaded machine's SSH round trips.
CUT_RATE = 2_000_000
RESUME_RATE = 4_000_000  # the resumed run's ~3.5 s: long enough for its first progress line
PROGRESS = re.compile(r"model: [\d.]+ k?M?B of [\d.]+ MB \(\d+%\)")
_names = (f"m{os.getpid() % 10000}n{k}" for k in itertools.count(1))


@pytest.fixture
def guest() -> Iterator[hosts.LabHost]:
    name = next(_names)
    try:
        host = up_guest(name)
        token = host.root / TOKEN_FILE.lstrip("/")
        token.write_text(TOKEN + "\n")
        token.chmod(0o600)
        yield host
    finally:
        hosts.down(name)


@pytest.fixture
def hub(guest: hosts.LabHost, tmp_path: Path) -> Iterator[Hub]:
    served = Hub(guest, tmp_path / "hub")
    try:
        yield served
    finally:
        served.close()


def model_data(hub: Hub, model_path: str = MODEL) -> dict[str, object]:
    return {
        "sglang": {
            "model_path": model_path,
            "model_repo": REPO,
            "hf_endpoint": hub.url,
            "hf_token_file": TOKEN_FILE,
        }
    }


def background(guest: hosts.LabHost, data: dict[str, object]) -> subprocess.Popen[str]:
    env = {**os.environ, "PVEGPU_LAB_EXTRA_DATA": json.dumps(data)}
    argv = [str(PYINFRA), "-y", "--limit", guest.name, INVENTORY, DEPLOY]
    return subprocess.Popen(
        argv, cwd=CHECKOUT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip


def part_of(guest: hosts.LabHost, name: str) -> Path:
    return guest.root / MODEL.lstrip("/") / ".pvegpu/partial" / f"{name}.part"


def wait_for_bytes(part: Path, at_least: int, run: subprocess.Popen[str]) -> int:
    """The partial file's size once it holds `at_least` bytes (the run still going)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        size = part.stat().st_size if part.exists() else 0
        if size >= at_least:
            return size
        assert run.poll() is None, run.communicate()[0]
        time.sleep(0.1)
    raise AssertionError(f"{part}: fewer than {at_least} bytes after 120 s")


def shard_gets(requests: list[dict[str, object]], name: str) -> list[tuple[object, object]]:
    """(Range header, status) of each GET of file `name`."""
    return [
        (r["range"], r["status"])
        for r in requests
        if r["method"] == "GET" and str(r["path"]).endswith(f"/{name}") and "/resolve/" in str(r["path"])
    ]


Cli = tuple[PyinfraCli, LabSsh, pytest.MonkeyPatch]


def test_fetch_is_resumed_verified_attached_and_refused_without_space(
    guest: hosts.LabHost,
    hub: Hub,
    pyinfra_cli: PyinfraCli,
    lab_ssh: LabSsh,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cli = (pyinfra_cli, lab_ssh, monkeypatch)
    unit_killed_then_resumed(guest, hub, cli)
    unchanged_then_one_changed_file_fetched_again(guest, hub, cli)
    ssh_cut_then_attached(guest, hub, cli)
    refused_without_space(guest, hub, cli)


def unit_killed_then_resumed(guest: hosts.LabHost, hub: Hub, cli: Cli) -> None:
    """The unit killed mid-file: the run fails naming it, the partial bytes stay; the next run resumes from
    them (a Range request) and ends verified, and the service serves the model."""
    pyinfra_cli, lab_ssh, monkeypatch = cli
    data, model = model_data(hub), guest.root / MODEL.lstrip("/")
    hub.set_rate(CUT_RATE)
    cut = background(guest, data)
    wait_for_bytes(part_of(guest, FIRST), CHUNK, cut)
    lab_ssh(guest, "systemctl kill --signal=SIGKILL pvegpu-model-fetch.service")
    hub.set_rate(RESUME_RATE)
    output = cut.communicate(timeout=120)[0]
    assert cut.returncode != 0
    # The fetcher writes its status each second: the last one may count fewer bytes than are on disk.
    assert re.search(
        r"model: pvegpu-model-fetch\.service ended signal \(last status: running, [\d.]+ [kM]?B of "
        r"24\.3 MB\); the next run resumes from the bytes on disk",
        output,
    ), output
    kept = part_of(guest, FIRST).stat().st_size
    assert kept % CHUNK == 0
    assert 0 < kept < SHARDS[FIRST]
    hub.log()

    resumed = deploy(pyinfra_cli, monkeypatch, guest, data)
    assert resumed.rc == 0, resumed.stderr
    assert resumed.outcome[FETCH] == "success"
    assert PROGRESS.search(resumed.stderr), resumed.stderr
    requests = hub.log()
    assert shard_gets(requests, FIRST) == [(f"bytes={kept}-", 206)]
    assert shard_gets(requests, SECOND) == []  # done before the cut
    assert (model / FIRST).read_bytes() == hub.files[FIRST]
    assert not (model / ".pvegpu/partial").exists()
    record = json.loads((model / ".pvegpu/model.json").read_text())
    assert (record["commit"], record["complete"], sorted(record["files"])) == (
        hub.commit,
        True,
        sorted(hub.files),
    )
    assert lab_ssh(guest, f"stat -c '%U %a' {MODEL}/{FIRST}") == "sglang 644\n"
    assert starts(lab_ssh, guest) == 1


def unchanged_then_one_changed_file_fetched_again(guest: hosts.LabHost, hub: Hub, cli: Cli) -> None:
    """A second run changes nothing and asks nothing of the hub; a file changed on disk is found and
    fetched again, alone."""
    pyinfra_cli, _, monkeypatch = cli
    data, model = model_data(hub), guest.root / MODEL.lstrip("/")
    again = deploy(pyinfra_cli, monkeypatch, guest, data)
    assert (again.rc, again.changed()) == (0, [])
    assert hub.log() == []

    with (model / SECOND).open("r+b") as shard:
        first_byte = shard.read(1)
        shard.seek(0)
        shard.write(bytes([first_byte[0] ^ 0xFF]))
    mended = deploy(pyinfra_cli, monkeypatch, guest, data)
    assert mended.rc == 0, mended.stderr
    assert f"model: {REPO}@main: {SECOND} changed since it was verified" in mended.stderr
    requests = hub.log()
    assert (shard_gets(requests, FIRST), shard_gets(requests, SECOND)) == ([], [(None, 200)])
    assert (model / SECOND).read_bytes() == hub.files[SECOND]


def ssh_cut_then_attached(guest: hosts.LabHost, hub: Hub, cli: Cli) -> None:
    """The SSH connection cut mid-file (the run killed): the unit goes on, the next run attaches to it (one
    GET of the file in all), then no change."""
    pyinfra_cli, lab_ssh, monkeypatch = cli
    data, model = model_data(hub), guest.root / MODEL.lstrip("/")
    (model / FIRST).unlink()
    hub.set_rate(CUT_RATE)
    cut = background(guest, data)
    wait_for_bytes(part_of(guest, FIRST), CHUNK, cut)
    os.killpg(cut.pid, signal.SIGKILL)
    cut.communicate(timeout=60)
    assert lab_ssh(guest, "systemctl is-active pvegpu-model-fetch.service || true") == "activating\n"
    attached = deploy(pyinfra_cli, monkeypatch, guest, data)
    assert attached.rc == 0, attached.stderr
    assert "model: attaching to the fetch already running (pvegpu-model-fetch.service)" in attached.stderr
    assert shard_gets(hub.log(), FIRST) == [(None, 200)]
    assert (model / FIRST).read_bytes() == hub.files[FIRST]
    hub.set_rate(0)
    assert deploy(pyinfra_cli, monkeypatch, guest, data).changed() == []


def refused_without_space(guest: hosts.LabHost, hub: Hub, cli: Cli) -> None:
    """Too little space (a 1 MiB tmpfs): refused before any byte, naming both numbers."""
    pyinfra_cli, lab_ssh, monkeypatch = cli
    lab_ssh(guest, "mkdir -p /srv/small && mount -t tmpfs -o size=1m tmpfs /srv/small")
    small = deploy(pyinfra_cli, monkeypatch, guest, model_data(hub, "/srv/small/GLM-5"))
    assert small.rc != 0
    free = int(lab_ssh(guest, "df -B1 --output=avail /srv/small | tail -n 1"))
    needed = sum(len(data) for data in hub.files.values())
    line = f"model: needs {size_text(needed)} on /srv/small/GLM-5, {size_text(free)} free"
    assert line in small.stderr, small.stderr
    assert not [r for r in hub.log() if r["method"] == "GET" and "/resolve/" in str(r["path"])]
