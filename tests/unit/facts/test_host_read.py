"""The host state read (pvegpu/facts/host_read.py): the parser on a real capture from a lab VM guest, the
command run here with sh on real files (and the readiness probe against a real HTTP server), and the errors
for output of another shape."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pvegpu.facts.errors import FactParseError
from pvegpu.facts.host_read import HostRead, StateRequest, parse_state, state_command
from pvegpu.facts.next_boot import NextBoot, parse_next_boot
from pvegpu.facts.sglang import Probe, VenvState
from pvegpu.models.guest_state import MISSING, PathState, UnitState, UserEntry
from pvegpu.models.nvidia import LoadedModule
from pvegpu.models.p2p import RECORD_PATH, Identity, Record
from pvegpu.models.sglang import ProbeTarget
from tests.unit.fuzz_targets import GUEST_STATE_WITH_RECORD, P2P_RECORD, fixture

SAMPLE = fixture("guest_state_lab_vm.txt")
RECORD = Record("probe", "p2p", Identity("580.95.05", "6.18.44-fc-v1045", "hostpci0=mapping=gpu0,pcie=1; C"))


def test_parse_real_lab_guest() -> None:
    state = parse_state(SAMPLE)
    assert (state.os_release["ID"], state.os_release["VERSION_ID"], state.kernel) == (
        "debian",
        "12",
        "6.18.44-fc-v1045",
    )
    assert state.packages["nvidia-open"] == frozenset({"580.95.05-1"})
    assert state.packages["linux-headers-6.18.44-fc-v1045"] == frozenset({"1+pvegpulab"})
    assert state.path("/etc/pvegpu/sglang.env") == PathState(
        "file", "600", "root", "root", "7528240cdc51de27fc663ebd4cb06ced866304ed571b881f6a5cf035e2846920"
    )
    assert state.path("/var/lib/sglang") == PathState("directory", "755", "sglang", "sglang", None)
    assert state.path("/models/GLM-5-NVFP4/config.json") == MISSING
    with pytest.raises(KeyError):
        state.path("/not/requested")
    assert state.units == {
        "nvidia-persistenced.service": UnitState(running=True, enabled=True),
        "sglang.service": UnitState(running=True, enabled=True),
    }
    assert state.users == {"sglang": UserEntry("sglang", "/var/lib/sglang", "/usr/sbin/nologin", "sglang")}
    assert state.groups == frozenset({"sglang"})
    assert state.venvs == {"/opt/sglang/venv": VenvState(True, "0.5.23+pvegpulab")}
    assert state.module == LoadedModule("open", "580.95.05")
    assert [gpu.bus_id for gpu in state.smi.gpus] == [f"00000000:0{i}:00.0" for i in range(1, 9)]
    assert state.secrets == {}
    assert (state.records, state.p2p_record) == ({}, None)  # not requested: no records section


def test_parse_the_records_section() -> None:
    """The sample with the section a request for the P2P record adds (synthesized: fuzz_targets)."""
    state = parse_state(GUEST_STATE_WITH_RECORD)
    assert state.records == {RECORD_PATH: P2P_RECORD.text()}
    assert state.p2p_record == Record("probe", "shm", P2P_RECORD.identity, ("x",), "s")
    missing = parse_state((*SAMPLE[:-1], "#pvegpu:records", f"missing\t{RECORD_PATH}", "#pvegpu:end"))
    assert (missing.records, missing.p2p_record) == ({RECORD_PATH: None}, None)


def test_a_record_in_any_bytes_is_read() -> None:
    """A record may be a file pvegpu does not write (/etc/nccl.conf): bytes that are not UTF-8 are kept."""
    raw = b"# r\xe9seau\nNCCL_P2P_LEVEL=SYS\n"
    lines = (
        *SAMPLE[:-1],
        "#pvegpu:records",
        f"{base64.b64encode(raw).decode()}\t/etc/nccl.conf",
        "#pvegpu:end",
    )
    text = parse_state(lines).records["/etc/nccl.conf"]
    assert text == "# r\udce9seau\nNCCL_P2P_LEVEL=SYS\n"  # 0xe9 kept as a surrogate


def test_initramfs_images_older_than_the_blacklist(tmp_path: Path) -> None:
    """The `initramfs` section, run here with sh on real files (/boot moved under tmp_path)."""
    boot, blacklist = tmp_path / "boot", tmp_path / "pvegpu-nouveau.conf"
    boot.mkdir()
    for name, mtime in (("initrd.img-6.1.0-old", 100), ("initrd.img-6.1.0-new", 300), ("vmlinuz-6.1.0", 100)):
        (boot / name).write_text("")
        os.utime(boot / name, (mtime, mtime))
    blacklist.write_text("blacklist nouveau\n")
    os.utime(blacklist, (200, 200))

    def stale(after: Path) -> tuple[str, ...]:
        command = state_command(StateRequest(initramfs_after=str(after))).replace("/boot", str(boot))
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
        return parse_state(done.stdout.splitlines()).stale_initramfs

    assert stale(blacklist) == ("initrd.img-6.1.0-old",)
    assert stale(tmp_path / "absent.conf") == ()  # no blacklist yet: writing it refreshes
    assert parse_state(SAMPLE).stale_initramfs == ()  # not requested: no initramfs section
    assert "find /boot -maxdepth 1 -name 'initrd.img-*' ! -newer /etc/modprobe.d/x.conf" in state_command(
        StateRequest(initramfs_after="/etc/modprobe.d/x.conf")
    )


def test_command_reads_real_files(tmp_path: Path) -> None:
    (tmp_path / "a.conf").write_text("x=1\n")
    os.chmod(tmp_path / "a.conf", 0o640)
    (tmp_path / "key").write_text("sk-1\n")
    os.symlink("a.conf", tmp_path / "link")
    (tmp_path / "record.json").write_text(RECORD.text())
    paths = tuple(str(tmp_path / name) for name in ("a.conf", "link", "absent", ""))
    records = (str(tmp_path / "record.json"), str(tmp_path / "absent"), str(tmp_path))
    request = StateRequest(
        paths=paths, users=("root",), groups=("root", "no-such-group"), secrets=(str(tmp_path / "key"),),
        venvs=(str(tmp_path / "no-venv"),), records=records, version_file=str(tmp_path / "no-module"),
    )  # fmt: skip
    done = subprocess.run(["sh", "-c", state_command(request)], capture_output=True, text=True, check=True)

    state = parse_state(done.stdout.splitlines())

    user, group = (
        subprocess.run(["id", flag], capture_output=True, text=True, check=True).stdout.strip()
        for flag in ("-un", "-gn")
    )
    digest = hashlib.sha256(b"x=1\n").hexdigest()
    assert state.path(paths[0]) == PathState("file", "640", user, group, digest)
    assert state.path(paths[1]).kind == "link"
    assert state.path(paths[2]) == MISSING
    assert state.path(paths[3]).kind == "directory"  # "": the trailing slash of tmp_path
    assert state.users["root"].home == "/root"
    assert state.groups == frozenset({"root"})
    assert state.venvs == {str(tmp_path / "no-venv"): VenvState(False, None)}
    assert state.module is None
    assert state.secrets[str(tmp_path / "key")].lines == 1
    assert state.records == {records[0]: RECORD.text(), records[1]: None, records[2]: None}
    assert state.p2p_record is None  # the record read is not at RECORD_PATH


def test_command_reads_odd_paths_with_one_find_and_one_sha256sum(tmp_path: Path) -> None:
    """A FIFO is `other`; mode 000 reads `000` (root still hashes it); a name with a space keeps it; a
    regular file without a sha256sum line (one it could not read) keeps no digest."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "no mode").write_bytes(b"")
    os.chmod(tmp_path / "no mode", 0)
    paths = (str(tmp_path / "fifo"), str(tmp_path / "no mode"))
    command = state_command(StateRequest(paths=paths))
    assert command.count("sha256sum") == 1
    assert command.count("find ") == 1

    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    state = parse_state(done.stdout.splitlines())

    assert state.path(paths[0]).kind == "other"
    empty = hashlib.sha256(b"").hexdigest()
    assert (state.path(paths[1]).kind, state.path(paths[1]).mode, state.path(paths[1]).sha256) == (
        "file", "000", empty
    )  # fmt: skip
    assert parse_state(
        ("#pvegpu:os", "#pvegpu:kernel", "6.1.0", "#pvegpu:packages", "#pvegpu:paths", "f 600 root root\t/k",
         "#pvegpu:units", "#pvegpu:users", "#pvegpu:groups", "#pvegpu:venvs", "#pvegpu:module", "#pvegpu:smi",
         "#pvegpu:secrets", "#pvegpu:end")
    ).path("/k").sha256 is None  # fmt: skip


def test_command_reads_the_layers_of_a_weight_index(tmp_path: Path) -> None:
    """The layer numbers of the index's weight map (keys only: the shard names hold no layer), sorted."""
    index = tmp_path / "model.safetensors.index.json"
    weight_map = {
        "model.embed_tokens.weight": "model-00001-of-00003.safetensors",
        "model.layers.0.self_attn.q_a_proj.weight": "model-00001-of-00003.safetensors",
        "model.layers.10.mlp.experts.7.down_proj.weight_scale": "model-00002-of-00003.safetensors",
        "model.layers.2.input_layernorm.weight": "model-00002-of-00003.safetensors",
        "model.layers.78.eh_proj.weight": "model-00003-of-00003.safetensors",
        "model.layers.78.enorm.weight": "model-00003-of-00003.safetensors",
        "lm_head.weight": "model-00003-of-00003.safetensors",
    }
    index.write_text(json.dumps({"metadata": {"total_size": 1}, "weight_map": weight_map}, indent=2))

    def layers(path: Path) -> frozenset[int] | None:
        command = state_command(StateRequest(weight_index=str(path)))
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
        return parse_state(done.stdout.splitlines()).layers

    assert layers(index) == frozenset({0, 2, 10, 78})
    assert layers(tmp_path / "absent.json") is None
    assert parse_state(SAMPLE).layers is None  # not requested: no layers section


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (("#pvegpu:os",), "truncated output: the #pvegpu:kernel marker is missing"),
        (
            (*SAMPLE[:11], "6.1.0 extra", *SAMPLE[12:]),
            "host state: expected one kernel release line, got ['6.1.0 extra']",
        ),
        (
            tuple(line.replace("f 600 root root", "f 600 root") for line in SAMPLE),
            "host state: line 212: 'f 600 root\\t/etc/pvegpu/sglang.env' is not a path state line",
        ),
        (
            tuple(line.replace("SubState=running", "SubState running") for line in SAMPLE),
            "host state: line 224: 'SubState running' is not a systemctl show "
            "Id/SubState/UnitFileState/NeedDaemonReload line",
        ),
        (
            tuple(line.replace("sglang:x:997:", "sglang:x") for line in SAMPLE),
            "host state: line 233: 'sglang:x' is not a group line",
        ),
        (
            (
                *SAMPLE[:-1],
                "#pvegpu:records",
                f"{base64.b64encode(b'{}').decode()}#\t{RECORD_PATH}",
                "#pvegpu:end",
            ),
            "host state: line 250: 'e30=#\\t/var/lib/pvegpu/p2p-probe.json' is not a record line",
        ),
        (
            (*SAMPLE[:-1], "#pvegpu:initramfs", "/boot/initrd.img-6.1.0", "#pvegpu:end"),
            "host state: line 250: '/boot/initrd.img-6.1.0' is not an initramfs image name",
        ),
        (
            (*SAMPLE[:-1], "#pvegpu:initramfs", "#pvegpu:records", "#pvegpu:end", "x"),
            "line 252: 'x' after the end marker",
        ),
        (
            (*SAMPLE[:-1], "#pvegpu:layers", "0", "x78", "#pvegpu:end"),
            "host state: line 251: 'x78' is not a layer number",
        ),
        (
            (*SAMPLE[:-1], "#pvegpu:records", "e30=\tvar/lib", "#pvegpu:end"),
            "host state: line 250: 'e30=\\tvar/lib' is not a record line",
        ),
    ],
)
def test_error_names_the_line(lines: tuple[str, ...], message: str) -> None:
    with pytest.raises(FactParseError) as error:
        parse_state(lines)
    assert str(error.value) == message


class _Sglang(BaseHTTPRequestHandler):
    """/health and /v1/models as SGLang answers them (the model list needs the key)."""

    def do_GET(self) -> None:
        if self.path == "/health":
            body = b""
        elif self.path == "/v1/models" and self.headers.get("Authorization") == "Bearer sk-1":
            body = json.dumps({"data": [{"id": "glm-5"}]}).encode()
        else:
            self.send_error(401)
            return
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


def test_the_probe_runs_beside_the_read(tmp_path: Path) -> None:
    """The `probe` section, run here with sh against a real HTTP server: the probe's verdict, with the target
    the request gave; a read without a probe request has no section (probe None)."""
    (tmp_path / "key").write_text("sk-1\n")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sglang)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        answered = ProbeTarget(sys.executable, url, str(tmp_path / "key"))
        refused = ProbeTarget(sys.executable, url, None)
        nothing = ProbeTarget(str(tmp_path / "no-venv/bin/python"), url, None)
        states = {}
        for target in (answered, refused, nothing):
            fact = HostRead()
            command = fact.command(StateRequest(probe=target))
            done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
            states[target] = fact.process(done.stdout.splitlines())
    finally:
        server.shutdown()
    assert command.startswith(
        'pvegpu_probe=$(mktemp 2>/dev/null) || pvegpu_probe=; if [ -n "$pvegpu_probe" ]'
    )
    assert (states[answered].probe, states[answered].probe_target) == (Probe(True, "glm-5"), answered)
    assert states[refused].probe == Probe(False, "HTTP Error 401: Unauthorized")
    missing = states[nothing].probe
    assert missing is not None
    assert not missing.ok
    assert "no-venv/bin/python" in missing.detail  # the shell's "not found" line
    assert (parse_state(SAMPLE).probe, parse_state(SAMPLE).probe_target) == (None, None)


def test_no_temporary_file_no_probe(tmp_path: Path) -> None:
    """Where mktemp fails the probe does not run and the read says so (probe None), not 'not ready'."""
    (tmp_path / "mktemp").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "mktemp").chmod(0o755)
    command = state_command(StateRequest(probe=ProbeTarget(sys.executable, "http://127.0.0.1:9", None)))
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True, env=env)
    assert "#pvegpu:probe" in done.stdout
    assert parse_state(done.stdout.splitlines()).probe is None


class _Follower(BaseHTTPRequestHandler):
    """A rank >= 1 of SGLang 0.5.23: its health-only server (no /v1/models)."""

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


def test_a_follower_probe_asks_its_own_health_then_rank_0s() -> None:
    """Rank >= 1 (`leader_url` set): ready when its health server and rank 0's /health answer; rank 0 down
    is named as such; /v1/models is never asked (the health server has none)."""
    own = ThreadingHTTPServer(("127.0.0.1", 0), _Follower)
    leader = ThreadingHTTPServer(("127.0.0.1", 0), _Sglang)
    for server in (own, leader):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    own_url, leader_url = (f"http://127.0.0.1:{server.server_address[1]}" for server in (own, leader))
    try:
        verdicts = []
        for target in (
            ProbeTarget(sys.executable, own_url, None, leader_url),
            ProbeTarget(sys.executable, own_url, None, "http://127.0.0.1:9"),
            ProbeTarget(sys.executable, "http://127.0.0.1:9", None, leader_url),
        ):
            fact = HostRead()
            done = subprocess.run(
                ["sh", "-c", fact.command(StateRequest(probe=target))],
                capture_output=True,
                text=True,
                check=True,
            )
            verdicts.append(fact.process(done.stdout.splitlines()).probe)
    finally:
        own.shutdown()
        leader.shutdown()
    assert verdicts == [
        Probe(True, f"rank 0 at {leader_url} answers"),
        Probe(False, "rank 0 at http://127.0.0.1:9: [Errno 111] Connection refused"),
        Probe(False, "[Errno 111] Connection refused"),
    ]


def _venv_state(venv: Path) -> VenvState:
    """The `venvs` section of the command run here with sh, for one venv."""
    command = state_command(StateRequest(venvs=(str(venv),)))
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    return parse_state(done.stdout.splitlines()).venvs[str(venv)]


def _site_packages(venv: Path, python: str) -> Path:
    return venv / "lib" / Path(python).name / "site-packages"


def test_a_symlinked_venv_is_read_from_its_dist_info_without_starting_python(tmp_path: Path) -> None:
    """`bin/python` -> the real interpreter (pythonX.Y, as `python3 -m venv` links it): the version is the
    METADATA's, which that Python (no pyvenv.cfg, no sglang) would not report."""
    interpreter = os.path.realpath(sys.executable)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(interpreter, venv / "bin/python")
    dist = _site_packages(venv, interpreter) / "sglang-0.5.23.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.4\nName: sglang\nVersion: 0.5.23\n\nVersion: 9\n")
    assert _venv_state(venv) == VenvState(True, "0.5.23")
    # Two dist-infos: the interpreter decides (it has no sglang on its path).
    (dist.parent / "sglang-0.5.22.dist-info").mkdir()
    (dist.parent / "sglang-0.5.22.dist-info/METADATA").write_text("Name: sglang\nVersion: 0.5.22\n")
    assert _venv_state(venv) == VenvState(True, None)


def test_a_venv_of_another_interpreter_or_a_copied_one_asks_its_python(tmp_path: Path) -> None:
    """A dist-info under another pythonX.Y than the interpreter's (the OS's python3 upgraded under the venv)
    is not taken; a copied `bin/python` (not pythonX.Y once resolved) is run."""
    interpreter = os.path.realpath(sys.executable)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    os.symlink(interpreter, venv / "bin/python")
    stale = venv / "lib/python3.1/site-packages/sglang-0.5.23.dist-info"
    stale.mkdir(parents=True)
    (stale / "METADATA").write_text("Name: sglang\nVersion: 0.5.23\n")
    assert _venv_state(venv) == VenvState(True, None)
    copied = tmp_path / "copied"
    (copied / "bin").mkdir(parents=True)
    (copied / "bin/python").write_text("#!/bin/sh\necho 'version 7.7'\n")
    os.chmod(copied / "bin/python", 0o755)
    assert _venv_state(copied) == VenvState(True, "7.7")


def test_the_next_boot_section_is_what_next_boot_reads_on_its_own() -> None:
    """Packed in one line, so that NextBoot's own section markers stay inside it; only when requested."""

    def state(request: StateRequest) -> list[str]:
        done = subprocess.run(
            ["sh", "-c", state_command(request)], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    alone = subprocess.run(["sh", "-c", NextBoot().command()], capture_output=True, text=True, check=True)
    assert parse_state(state(StateRequest(next_boot=True))).next_boot == parse_next_boot(
        alone.stdout.splitlines()
    )
    assert parse_state(state(StateRequest())).next_boot is None
