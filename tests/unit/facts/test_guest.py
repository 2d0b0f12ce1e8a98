"""Parsers of the guest facts: NVIDIA version file, nvidia-smi CSV, CUDA apt source, SGLang venv and probe."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pvegpu.facts.errors import FactParseError
from pvegpu.facts.nvidia import parse_nvidia_smi, parse_version_file
from pvegpu.facts.sglang import Probe, VenvState, parse_probe, parse_venv, probe_command
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
        assert command.startswith(f"{sys.executable} -I -S -c 'import json, socket, sys\n")
        answered = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
        keyless = probe_command(ProbeTarget(sys.executable, base, None)).get_raw_value()
        refused = subprocess.run(["sh", "-c", keyless], capture_output=True, text=True, check=True)
    finally:
        server.shutdown()
    assert parse_probe(answered.stdout.splitlines()) == Probe(True, "glm-5")
    assert parse_probe(refused.stdout.splitlines()) == Probe(False, "HTTP Error 401: Unauthorized")


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
    listener = socket.create_server(("127.0.0.1", 0))

    def answer_once() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(4096)
            connection.sendall(answer)

    threading.Thread(target=answer_once, daemon=True).start()
    base = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        command = probe_command(ProbeTarget(sys.executable, base, None)).get_raw_value()
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True, timeout=30)
    finally:
        listener.close()
    assert parse_probe(done.stdout.splitlines()) == Probe(False, detail)
