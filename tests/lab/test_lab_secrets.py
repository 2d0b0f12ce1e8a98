"""SGLang's API key on a lab VM guest (deploy/guest.py): with a good key the server answers only with it and
no process argv nor file pvegpu writes shows the key; an empty, world-readable or missing key file is refused
on the guest, naming the field and the path and never the key, while the running service keeps running.

One guest for every case: it boots and converges once (the slow part), then each bad key file is one more run.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lab import guest_payload, hosts

pytestmark = pytest.mark.lab

INVENTORY = "tests/lab/inventories/guest_role.py"
DEPLOY = "deploy/guest.py"
KEY = "s3cret-lab-key-4f1c9a"  # the key; every check below looks for this text
OTHER_KEY = "readable-by-all-7d2e"  # what the world-readable file holds
WRITTEN = "/etc/systemd/system/sglang.service /etc/pvegpu /usr/local/lib/pvegpu"  # every file pvegpu writes

PyinfraCli = Callable[..., subprocess.CompletedProcess[str]]
LabSsh = Callable[[hosts.LabHost, str], str]


@pytest.fixture
def guest() -> Iterator[hosts.LabHost]:
    name = f"s{os.getpid() % 10000}n1"
    try:
        yield guest_payload.up_guest(name)
    finally:
        hosts.down(name)


def _deploy(
    cli: PyinfraCli, monkeypatch: pytest.MonkeyPatch, guest: hosts.LabHost, key_file: str
) -> subprocess.CompletedProcess[str]:
    extra = {"sglang": {"host": "0.0.0.0", "api_key_file": key_file}}
    monkeypatch.setenv("PVEGPU_LAB_EXTRA_DATA", json.dumps(extra))
    return cli("-y", "-vv", "--limit", guest.name, INVENTORY, DEPLOY, check=False)  # -vv prints every command


def _status(lab_ssh: LabSsh, guest: hosts.LabHost, key: str | None) -> str:
    """The HTTP status of GET /v1/models on the guest, with `Authorization: Bearer <key>` when given."""
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    probe = (
        '/opt/sglang/venv/bin/python -c "import urllib.request as u, urllib.error as e\n'
        f"r = u.Request('http://127.0.0.1:30000/v1/models', headers={headers!r})\n"
        "try: print(u.urlopen(r).status)\n"
        'except e.HTTPError as x: print(x.code)"'
    )
    return lab_ssh(guest, probe).strip()


def _main_pid(lab_ssh: LabSsh, guest: hosts.LabHost) -> str:
    return lab_ssh(guest, "systemctl show -p MainPID --value sglang.service").strip()


def _put(path: Path, content: str, mode: int) -> None:
    path.write_text(content)
    path.chmod(mode)


def test_key_only_reaches_sglang_and_bad_key_files_never_stop_it(
    guest: hosts.LabHost, pyinfra_cli: PyinfraCli, lab_ssh: LabSsh, monkeypatch: pytest.MonkeyPatch
) -> None:
    _put(guest.root / "root/sglang-api-key", f"{KEY}\n", 0o600)
    _put(guest.root / "root/key-empty", "", 0o600)
    _put(guest.root / "root/key-readable", f"{OTHER_KEY}\n", 0o644)

    good = _deploy(pyinfra_cli, monkeypatch, guest, "/root/sglang-api-key")

    assert good.returncode == 0, good.stderr
    assert KEY not in good.stdout + good.stderr
    assert (_status(lab_ssh, guest, None), _status(lab_ssh, guest, KEY)) == ("401", "200")
    assert _status(lab_ssh, guest, "wrong-key") == "401"
    assert KEY not in lab_ssh(guest, "ps -eo args")  # what any user of the guest sees
    lab_machine_ps = subprocess.run(["ps", "-eo", "args"], check=True, capture_output=True, text=True)
    assert KEY not in lab_machine_ps.stdout
    assert lab_ssh(guest, f"grep -rlF {KEY} {WRITTEN} || echo none") == "none\n"
    journal = lab_ssh(guest, "journalctl -u sglang.service -o cat --no-pager")
    assert KEY not in journal
    assert "server_args=" not in journal  # SGLang logs it at INFO; pvegpu's logging config holds it back
    assert "LoadCredential=api-key:/root/sglang-api-key\n" in lab_ssh(
        guest, "cat /etc/systemd/system/sglang.service"
    )
    # The one file holding the key: in the service's own runtime directory, readable by its user alone.
    assert (
        lab_ssh(guest, "stat -c '%a %U' /run/sglang /run/sglang/secrets.yaml /run/sglang/logging.json")
        == "700 sglang\n600 sglang\n600 sglang\n"
    )
    serving = _main_pid(lab_ssh, guest)
    assert serving != "0"

    refusals = {
        "/root/key-empty": "is empty: it must hold the secret (an empty API key lets every client in)",
        "/root/key-readable": (
            "has mode 644: group or others may read it; it must be 0600 or stricter (chmod 600)"
        ),
        "/root/key-missing": "does not exist on the host",
    }
    for path, problem in refusals.items():
        bad = _deploy(pyinfra_cli, monkeypatch, guest, path)

        assert bad.returncode == 1, (path, bad.stderr)
        assert f"{guest.name}: sglang.api_key_file: {path} {problem}\n" in bad.stderr
        assert OTHER_KEY not in bad.stdout + bad.stderr
        assert KEY not in bad.stdout + bad.stderr
        assert _main_pid(lab_ssh, guest) == serving, path
        assert lab_ssh(guest, "systemctl is-active sglang.service") == "active\n"
        assert "LoadCredential=api-key:/root/sglang-api-key\n" in lab_ssh(
            guest, "cat /etc/systemd/system/sglang.service"
        )
    assert (_status(lab_ssh, guest, None), _status(lab_ssh, guest, KEY)) == ("401", "200")
