"""SGLang's API key on a lab VM guest (deploy/guest.py): with a good key the server answers only with it and
no process argv nor file pvegpu writes shows the key; an empty, world-readable or missing key file is refused
on the guest, naming the field and the path and never the key, while the running service keeps running.

One guest for every case: it boots and converges once (the slow part), then each bad key file is one more run.
`/server_info` answers that key only blanked (SGLang 0.5.23 shows both keys there; pvegpu's launcher blanks
them; the stand-in shows them as SGLang does).

The demo's two runs (deploy/site.py on a Proxmox lab node, then on its new VM's guest) with `-vv --debug`:
neither output holds the API token's secret, a private key pvegpu generated for the guest (host, login) or the
lab's root key, and no process of the lab machine (the node's and the guest's among them: nspawn's PID
namespaces are the lab machine's children) shows one in its `/proc/<pid>/cmdline`, sampled through both runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lab import guest_payload, hosts
from lab.pve import api_setup

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
    # -vv prints every command, --debug pyinfra's log of every command it runs
    return cli("-y", "-vv", "--debug", "--limit", guest.name, INVENTORY, DEPLOY, check=False)


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


def _get(lab_ssh: LabSsh, guest: hosts.LabHost, path: str, key: str) -> str:
    """The body of GET `path` on the guest's SGLang, sent with `Authorization: Bearer <key>`."""
    headers = {"Authorization": f"Bearer {key}"}
    probe = (
        '/opt/sglang/venv/bin/python -c "import urllib.request as u\n'
        f"r = u.Request('http://127.0.0.1:30000{path}', headers={headers!r})\n"
        'print(u.urlopen(r).read().decode())"'
    )
    return lab_ssh(guest, probe)


def _main_pid(lab_ssh: LabSsh, guest: hosts.LabHost) -> str:
    return lab_ssh(guest, "systemctl show -p MainPID --value sglang.service").strip()


def _put(path: Path, content: str, mode: int) -> None:
    path.write_text(content)
    path.chmod(mode)


def _early_reads() -> str:
    """The state reads pyinfra runs keep for the next run (pvegpu/run/early_read.py; the tier's cache)."""
    return (Path(os.environ["XDG_CACHE_HOME"]) / "pvegpu" / "early-reads.json").read_text()


def test_key_only_reaches_sglang_and_bad_key_files_never_stop_it(
    guest: hosts.LabHost, pyinfra_cli: PyinfraCli, lab_ssh: LabSsh, monkeypatch: pytest.MonkeyPatch
) -> None:
    _put(guest.root / "root/sglang-api-key", f"{KEY}\n", 0o600)
    _put(guest.root / "root/key-empty", "", 0o600)
    _put(guest.root / "root/key-readable", f"{OTHER_KEY}\n", 0o644)

    good = _deploy(pyinfra_cli, monkeypatch, guest, "/root/sglang-api-key")

    assert good.returncode == 0, good.stderr
    assert KEY not in good.stdout + good.stderr
    assert "/root/sglang-api-key" in _early_reads()  # the guest's read names the key's file...
    assert KEY not in _early_reads()  # ...never the key
    assert (_status(lab_ssh, guest, None), _status(lab_ssh, guest, KEY)) == ("401", "200")
    assert _status(lab_ssh, guest, "wrong-key") == "401"
    info = json.loads(_get(lab_ssh, guest, "/server_info", KEY))
    assert (info["api_key"], info["admin_api_key"]) == ("<redacted>", None)
    assert info["launch_command"].startswith("--api-key <redacted> --model-path ")
    assert KEY not in json.dumps(info)
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


class _CmdlineSampler(threading.Thread):
    """Every distinct `/proc/<pid>/cmdline` of the lab machine, read every few milliseconds until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: set[str] = set()
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.005):
            for proc in Path("/proc").iterdir():
                try:
                    argv = (proc / "cmdline").read_bytes() if proc.name.isdigit() else b""
                except OSError:  # the process ended
                    continue
                self.seen.add(argv.replace(b"\0", b" ").decode(errors="replace"))


def _private_key_lines(path: Path) -> list[str]:
    """The base64 lines of an OpenSSH private key: any one of them in an output or argv is a leak."""
    return [line for line in path.read_text().splitlines() if line and not line.startswith("-----")]


def _site(repo: Path) -> subprocess.CompletedProcess[str]:
    """One demo run (deploy/site.py, the lab inventory), printing every command and pyinfra's debug log."""
    return subprocess.run(
        [".venv/bin/pyinfra", "-y", "-vv", "--debug", "inventory/lab.py", "deploy/site.py"],
        cwd=repo, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600, check=False,
    )  # fmt: skip


def test_demo_runs_show_no_secret_in_their_output_or_any_cmdline() -> None:
    name = f"sd{os.getpid() % 10000}"  # lab host names: at most 11 characters, with `v100`
    repo = Path(__file__).resolve().parents[2]
    up = [".venv/bin/python", "-m", "lab", "up", name, "--topology", "reference", "--pve"]
    sampler = _CmdlineSampler()
    try:
        subprocess.run([*up, "--boot", "grub", "--mode", "nspawn", "--replace"], cwd=repo, check=True,
                       capture_output=True)  # fmt: skip
        sampler.start()
        runs = [_site(repo), _site(repo)]  # the node (and its VM), then the VM's guest
        sampler.stopping.set()
        sampler.join()
        for run in runs:
            assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        node = hosts.get_host(name)
        api = api_setup.record(node)
        assert api is not None
        keys = hosts.known_hosts_path().parent / hosts.GUEST_KEYS_DIR
        secrets = {
            "the API token's secret": [Path(api["token_file"]).read_text().strip()],
            # pvegpu/local/guest_keys.py: guest-keys/<cluster>/<node>-<vmid>...; the lab's node has no cluster
            "the guest's private host key": _private_key_lines(keys / name / f"{name}-100_ed25519"),
            "the guest's private login key": _private_key_lines(keys / name / f"{name}-100_login_ed25519"),
            "the lab's root key": _private_key_lines(node.key),
        }
        assert all(secrets.values()), secrets.keys()
        output = "".join(run.stdout + run.stderr for run in runs)
        assert f"[pyinfra.connectors.ssh] Running command on {name}v100: " in output  # the debug log
        cmdlines = "\n".join(sampler.seen)
        early_reads = _early_reads()
        assert "#pvegpu-node:hardware" in early_reads  # the node's read, kept for the next run
        # The sampler saw the runs, on this machine and on the node (root-only writes run pvesh there).
        assert "deploy/site.py" in cmdlines
        assert "pvesh " in cmdlines
        leaks = [
            (what, where)
            for what, values in secrets.items()
            for where, text in (
                ("output", output),
                ("a /proc/<pid>/cmdline", cmdlines),
                ("the reads kept for the next run", early_reads),
            )
            if any(value in text for value in values)
        ]
        assert leaks == []
    finally:
        sampler.stopping.set()
        hosts.down(name)
