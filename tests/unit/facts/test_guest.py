"""Parsers of the guest facts: NVIDIA version file, nvidia-smi CSV, CUDA apt source, SGLang venv and probe."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pvegpu.facts.errors import FactParseError
from pvegpu.facts.nvidia import parse_nvidia_smi, parse_version_file
from pvegpu.facts.sglang import PROBE_SCRIPT, Probe, VenvState, parse_probe, parse_venv, probe_command
from pvegpu.models.nvidia import LoadedModule, NvidiaGpu, NvidiaSmi
from pvegpu.models.sglang import ProbeTarget

# Open flavour: the line shape quoted from open-gpu-kernel-modules #543 (knowledge file, section 4.1); the
# build details after the version are synthesized. Proprietary: the documented "NVIDIA UNIX x86_64 Kernel
# Module" shape, synthesized.
OPEN = [
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:33:09 UTC 2025",
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1) ",
]
PROPRIETARY = ["NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.169  Wed Jun 11 12:00:00 UTC 2025"]


@pytest.mark.parametrize(
    ("lines", "module"),
    [
        (OPEN, LoadedModule("open", "580.95.05")),
        (PROPRIETARY, LoadedModule("proprietary", "570.169")),
        ([], None),
    ],
    ids=["open", "proprietary", "absent"],
)
def test_version_file(lines: list[str], module: LoadedModule | None) -> None:
    assert parse_version_file(lines) == module


def test_error_version_file_without_nvrm_line() -> None:
    with pytest.raises(
        FactParseError, match=r"no 'NVRM version: \.\.\. Kernel Module <version>' in 'garbage'"
    ):
        parse_version_file(["garbage"])


def test_nvidia_smi_csv() -> None:
    # Synthesized in the shape `--query-gpu=index,name,pci.bus_id,driver_version --format=csv,noheader`
    # prints (bus id as in the real capture 03: 00000000:01:00.0).
    lines = [
        "0, NVIDIA RTX 6000 Ada Generation, 00000000:01:00.0, 575.51.03",
        "1, NVIDIA RTX 6000 Ada Generation, 00000000:41:00.0, 575.51.03",
    ]
    assert parse_nvidia_smi(lines) == NvidiaSmi(
        (
            NvidiaGpu(0, "NVIDIA RTX 6000 Ada Generation", "00000000:01:00.0", "575.51.03"),
            NvidiaGpu(1, "NVIDIA RTX 6000 Ada Generation", "00000000:41:00.0", "575.51.03"),
        ),
        None,
    )


def test_nvidia_smi_failure_is_its_message() -> None:
    message = (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
        "Make sure that the latest NVIDIA driver is installed and running."
    )
    assert parse_nvidia_smi([message, ""]) == NvidiaSmi((), message)
    assert parse_nvidia_smi([]) == NvidiaSmi((), "nvidia-smi printed nothing (not installed?)")


def test_venv() -> None:
    assert parse_venv([]) == VenvState(False, None)
    assert parse_venv(["version none"]) == VenvState(True, None)
    assert parse_venv(["version 0.5.23"]) == VenvState(True, "0.5.23")
    with pytest.raises(FactParseError, match="expected 'version <v>\\|none', got \\['Traceback'\\]"):
        parse_venv(["Traceback"])


def test_probe() -> None:
    assert parse_probe(["ok glm-5"]) == Probe(True, "glm-5")
    assert parse_probe(["fail HTTP Error 401: Unauthorized"]) == Probe(False, "HTTP Error 401: Unauthorized")
    assert parse_probe([]) == Probe(False, "the probe printed nothing (no Python in the venv?)")


def test_probe_command_runs_the_standard_library_alone_against_a_real_server(tmp_path: Path) -> None:
    """`-I -S` (no site-packages, no environment) and the script's answers from a real HTTP server on
    loopback: /health open, /v1/models behind the key read from the key file."""
    key_file = tmp_path / "key"
    key_file.write_text("sk-probe\n")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/v1/models" and self.headers.get("Authorization") != "Bearer sk-probe":
                self.send_error(401, "Unauthorized")
                return
            body = b'{"data": [{"id": "glm-5"}]}' if self.path == "/v1/models" else b"ok"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            del args

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        command = probe_command(ProbeTarget(sys.executable, base, str(key_file))).get_raw_value()
        assert command.startswith(f"{sys.executable} -I -S -c 'import _json, _socket, sys\n")
        answered = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
        keyless = probe_command(ProbeTarget(sys.executable, base, None)).get_raw_value()
        refused = subprocess.run(["sh", "-c", keyless], capture_output=True, text=True, check=True)
    finally:
        server.shutdown()
    assert parse_probe(answered.stdout.splitlines()) == Probe(True, "glm-5")
    assert parse_probe(refused.stdout.splitlines()) == Probe(False, "HTTP Error 401: Unauthorized")


@contextlib.contextmanager
def _raw_server(reply: Callable[[bytes], bytes], connections: int) -> Iterator[int]:
    """A loopback listener that answers each of `connections` connections with `reply(request)` and closes
    it; yields its port."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        for _ in range(connections):
            connection, _ = listener.accept()
            with connection:
                connection.sendall(reply(connection.recv(4096)))

    threading.Thread(target=answer, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def _keyless_probe(port: int) -> str:
    """What the probe prints for SGLang at `port` on loopback, without a key."""
    command = probe_command(ProbeTarget(sys.executable, f"http://127.0.0.1:{port}", None)).get_raw_value()
    return subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, check=True, timeout=30
    ).stdout


def _sglang(models: bytes) -> Callable[[bytes], bytes]:
    """Answers of a server that says `ok` at /health and `models` at /v1/models."""

    def reply(request: bytes) -> bytes:
        body = models if request.startswith(b"GET /v1/models ") else b"ok"
        return b"HTTP/1.0 200 OK\r\n\r\n" + body

    return reply


def _models_verdict(body: bytes) -> str:
    """What the probe printed for a /v1/models answer when it parsed it with `json.loads` (as the fast path
    must, byte for byte)."""
    try:
        return "ok " + ",".join(model["id"] for model in json.loads(body)["data"])
    except Exception as error:  # the probe's own catch-all
        return "fail " + " ".join(str(error).split())


@pytest.mark.parametrize(
    "body",
    [
        b'{"object": "list", "data": [{"id": "glm-5", "object": "model"}]}',
        b' \r\n{"data": [{"id": "a"}, {"id": "b\\u00e9"}]}\n ',
        b'\xef\xbb\xbf{"data": [{"id": "bom"}]}',
        '{"data": [{"id": "utf16"}]}'.encode("utf-16"),
        b"",
        b"<html>busy</html>",
        b'{"data": [{"id": "x"}]} trailing',
        b'{"data": [{"name": "x"}]}',
        b'{"data": [NaN, 1e999]}',
        b'{"data": [{"id": "a"}], "data": []}',
        b'{"data": [{"id": "\x01"}]}',
    ],
)
def test_probe_reads_v1_models_exactly_as_json_loads_does(body: bytes) -> None:
    """The probe decodes /v1/models with `_json`'s scanner and leaves anything else to `json.loads`: its
    verdict on each body is the one `json.loads` gives (the ids, or json's own error text)."""
    with _raw_server(_sglang(body), 2) as port:
        printed = _keyless_probe(port)  # /health, then /v1/models
    assert printed == _models_verdict(body) + "\n"


def _imported(*argv: str) -> list[str]:
    """The modules `python -I -S -X importtime` loads running `argv`, in order."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-X", "importtime", *argv], capture_output=True, text=True, check=True
    )
    lines = done.stderr.splitlines()
    return [line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")]


def test_a_probe_that_answers_loads_only_the_c_halves_of_socket_and_json() -> None:
    """It runs in every state read: past the interpreter's own start it loads `_json` and `_socket` alone (a
    host name encoded without the IDNA codec, which would load `re`)."""
    with _raw_server(_sglang(b'{"data": [{"id": "m"}]}'), 2) as port:
        probed = _imported("-c", PROBE_SCRIPT, f"http://localhost:{port}", "", "")
    started = _imported("-c", "pass")
    assert [name for name in probed if name not in started] == ["_json", "_socket"]


def test_probe_names_a_refused_connection_and_a_bad_port() -> None:
    """The probe's socket errors are the ones `socket.create_connection` and urllib's port parsing raise."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]  # closed again below: nothing listens there
    refused = probe_command(ProbeTarget(sys.executable, f"http://127.0.0.1:{port}", None)).get_raw_value()
    bad_port = probe_command(ProbeTarget(sys.executable, "http://127.0.0.1:30k", None)).get_raw_value()
    outputs = [
        subprocess.run(["sh", "-c", c], capture_output=True, text=True, check=True, timeout=30).stdout
        for c in (refused, bad_port)
    ]
    assert outputs == [
        "fail [Errno 111] Connection refused\n",
        "fail Port could not be cast to integer value as '30k'\n",
    ]


@pytest.mark.parametrize(
    ("answer", "detail"),
    [
        (
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n",
            "HTTP Error 503: Service Unavailable",
        ),
        (b"SSH-2.0-OpenSSH_9.2p1\r\n", "not an HTTP answer: b'SSH-2.0-OpenSSH_9.2p1'"),
        (b"", "not an HTTP answer: b''"),
    ],
)
def test_probe_command_names_what_answered_instead_of_sglang(answer: bytes, detail: str) -> None:
    """The probe's own HTTP/1.0 client on a raw server: a status other than 2xx as urllib named it (`HTTP
    Error <code>: <reason>`), and anything that is not HTTP at the port with its first bytes."""
    with _raw_server(lambda _: answer, 1) as port:
        printed = _keyless_probe(port)
    assert parse_probe(printed.splitlines()) == Probe(False, detail)
