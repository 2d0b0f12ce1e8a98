"""The SGLang service's host-side state: the version in its venv, and whether its HTTP API answers.

`VERSION_SCRIPT` prints the venv's sglang version (`parse_venv` -> `VenvState`; run by
`pvegpu.facts.host_read`, the host's one state read); `SglangProbe(python, base_url, key_file)` -> `Probe`;
`SglangNcclChannels()` -> the NCCL channel records the running service logged (`pvegpu.facts.nccl`);
`SglangNcclTopologyFile()` -> NCCL's lines about its topology file from the same log;
`SglangNcclRuns()` -> those lines of every run still in the journal, by run (`pvegpu.facts.nccl_journal`).
The probe is one Python process on the host, a plain HTTP/1.0 client on a socket: it runs in every state read,
and the imports of urllib, `socket` and `json` cost more CPU than the rest of it, so it uses their C halves,
`_socket` and `_json`'s scanner (the one `json.loads` runs; an answer the scanner does not take whole goes to
`json.loads`, which decodes it or raises its own error). `GET /health`, then `GET /v1/models` with
`Authorization: Bearer <key>` read from `key_file` on the host (the key never leaves it); on a rank other
than 0 of several nodes (its target's `leader_url`), `GET /health` there and at rank 0. Parsing is pure
(`parse_venv`, `parse_probe`; the NCCL lines: `parse_transports`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.facts import FactBase
from typing_extensions import override

from pvegpu.facts.errors import FactParseError
from pvegpu.facts.nccl import parse_transports, topology_file_lines
from pvegpu.facts.nccl_journal import NcclRuns, parse_nccl_runs
from pvegpu.models.nccl import ChannelTransport
from pvegpu.models.sglang import ProbeTarget

PACKAGE = "sglang"
VERSION_SCRIPT = (
    "import importlib.metadata as m\n"
    "try:\n    print('version', m.version('sglang'))\n"
    "except m.PackageNotFoundError:\n    print('version none')\n"
)
PROBE_SCRIPT = """\
import _json, _socket, sys
base, key_file, leader = sys.argv[1], sys.argv[2], sys.argv[3]
def address(netloc):
    host, port = netloc.rpartition("@")[2], ""
    if host.startswith("["):
        host, _, port = host[1:].partition("]")
        port = port[1:]
    elif ":" in host:
        host, _, port = host.partition(":")
    if port and not port.isdigit():
        raise ValueError("Port could not be cast to integer value as " + repr(port))
    # An ASCII name as bytes: getaddrinfo would otherwise load the IDNA codec (and `re`) to encode it.
    host = host.lower()
    return host.encode() if host.isascii() else host, int(port or 80)
def connect(host, port):
    error = OSError("getaddrinfo returns an empty list")
    for family, kind, proto, _, sockaddr in _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM):
        connection = _socket.socket(family, kind, proto)
        try:
            connection.settimeout(5)
            connection.connect(sockaddr)
            return connection
        except OSError as failed:
            connection.close()
            error = failed
    raise error
def get(url, auth):
    netloc, _, path = url.partition("://")[2].partition("/")
    request = "GET /" + path + " HTTP/1.0\\r\\nHost: " + netloc + "\\r\\n"
    if auth and key_file:
        with open(key_file) as f:
            request += "Authorization: Bearer " + f.read().strip() + "\\r\\n"
    connection = connect(*address(netloc))
    try:
        connection.sendall((request + "\\r\\n").encode())
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    finally:
        connection.close()
    head, _, body = answer.partition(b"\\r\\n\\r\\n")
    first = head.split(b"\\r\\n", 1)[0]
    status = first.decode("latin-1").split(" ", 2)
    if len(status) < 2 or not status[0].startswith("HTTP/") or not status[1].isdigit():
        raise OSError("not an HTTP answer: " + repr(first[:60]))
    if not status[1].startswith("2"):
        raise OSError("HTTP Error " + status[1] + ": " + (status[2] if len(status) > 2 else ""))
    return body
class Decoding:
    strict, object_hook, object_pairs_hook = True, None, None
    parse_float, parse_int, parse_constant = float, int, float
def loads(body):
    try:
        text = body.decode().lstrip(" \\t\\n\\r")
        value, end = _json.make_scanner(Decoding())(text, 0)
        if not text[end:].strip(" \\t\\n\\r"):
            return value
    except Exception:
        pass
    import json
    return json.loads(body)
try:
    get(base + "/health", False)
    if leader:
        try:
            get(leader + "/health", False)
        except Exception as error:
            raise OSError("rank 0 at " + leader + ": " + str(error)) from None
        print("ok rank 0 at " + leader + " answers")
    else:
        models = loads(get(base + "/v1/models", True))["data"]
        print("ok " + ",".join(model["id"] for model in models))
except Exception as error:
    print("fail " + " ".join(str(error).split()))
"""


@dataclass(frozen=True)
class VenvState:
    """`python`: the venv's interpreter exists; `version`: the installed sglang distribution's, or None."""

    python: bool
    version: str | None


@dataclass(frozen=True)
class Probe:
    """`ok`: /health and /v1/models answered; `detail`: the served model ids, or what failed."""

    ok: bool
    detail: str


def parse_venv(lines: Sequence[str]) -> VenvState:
    """`version 0.5.23` / `version none` / nothing (no interpreter). Pure; FactParseError otherwise."""
    text = [line.strip() for line in lines if line.strip()]
    if not text:
        return VenvState(python=False, version=None)
    words = text[-1].split()
    if len(words) != 2 or words[0] != "version":
        raise FactParseError(f"sglang venv: expected 'version <v>|none', got {text!r}")
    return VenvState(python=True, version=None if words[1] == "none" else words[1])


def parse_probe(lines: Sequence[str]) -> Probe:
    """`ok <id,...>` or `fail <reason>` (the probe's only outputs); nothing: the interpreter is missing."""
    text = " ".join(line.strip() for line in lines if line.strip())
    verdict, _, detail = text.partition(" ")
    if verdict == "ok":
        return Probe(True, detail)
    if verdict == "fail":
        return Probe(False, detail)
    return Probe(False, text or "the probe printed nothing (no Python in the venv?)")


def probe_command(target: ProbeTarget) -> StringCommand:
    """The probe as one command line (also run by the readiness wait and the host's state read). `-I -S`:
    the script needs the standard library alone, and a real SGLang venv's site-packages spend ~0.1 s on
    their .pth files at every start."""
    return StringCommand(
        QuoteString(target.python),
        "-I",
        "-S",
        "-c",
        QuoteString(PROBE_SCRIPT),
        QuoteString(target.base_url),
        QuoteString(target.key_file or ""),
        QuoteString(target.leader_url or ""),
    )


class SglangProbe(FactBase[Probe]):
    """Whether SGLang at `base_url` answers /health and /v1/models (`key_file`: the API key on the host);
    with `leader_url`, /health there and at rank 0's `leader_url`."""

    @staticmethod
    def default() -> Probe:
        return parse_probe([])

    @override
    def command(
        self, python: str, base_url: str, key_file: str | None = None, leader_url: str | None = None
    ) -> StringCommand:
        target = ProbeTarget(python, base_url, key_file, leader_url)
        return StringCommand(probe_command(target), "2>&1", "||", "true")

    @override
    def process(self, output: list[str]) -> Probe:
        return parse_probe(output)


# The `NCCL INFO`/`NCCL WARN` lines of the service's current run (its systemd invocation).
_NCCL_INFO_COMMAND = (
    'journalctl -u sglang.service -o cat --no-pager _SYSTEMD_INVOCATION_ID="'
    '$(systemctl show -p InvocationID --value sglang.service)" 2>/dev/null '
    "| grep -E 'NCCL (INFO|WARN)' || true"
)
# Every run's transport and topology-file lines still in the journal, tagged with its invocation (JSON).
_NCCL_RUNS_COMMAND = (
    'echo "current $(systemctl show -p InvocationID --value sglang.service 2>/dev/null)"; '
    "journalctl -u sglang.service -o json --output-fields=_SYSTEMD_INVOCATION_ID,MESSAGE --no-pager "
    "2>/dev/null | grep -E "
    "'NCCL INFO (Channel|Ring) [0-9]|NCCL INFO NCCL_TOPO_FILE |NCCL (INFO|WARN) Could not open XML' || true"
)


class SglangNcclChannels(FactBase[tuple[ChannelTransport, ...]]):
    """NCCL's channel lines from the journal of the service's current run (its systemd invocation), parsed
    by `parse_transports`; () when the service never ran or logged none."""

    @override
    def command(self) -> str:
        return _NCCL_INFO_COMMAND

    @staticmethod
    def default() -> tuple[ChannelTransport, ...]:
        return ()

    @override
    def process(self, output: list[str]) -> tuple[ChannelTransport, ...]:
        return parse_transports(output)


class SglangNcclTopologyFile(FactBase[tuple[str, ...]]):
    """NCCL's lines about `NCCL_TOPO_FILE` from the service's current run (`topology_file_lines`)."""

    @override
    def command(self) -> str:
        return _NCCL_INFO_COMMAND

    @staticmethod
    def default() -> tuple[str, ...]:
        return ()

    @override
    def process(self, output: list[str]) -> tuple[str, ...]:
        return topology_file_lines(output)


class SglangNcclRuns(FactBase[NcclRuns]):
    """NCCL's transport and topology-file lines of every run of the service still in its journal, grouped by
    run (`pvegpu.facts.nccl_journal`): the doctor's with and without the topology file."""

    @override
    def command(self) -> str:
        return _NCCL_RUNS_COMMAND

    @staticmethod
    def default() -> NcclRuns:
        return NcclRuns(current=None)

    @override
    def process(self, output: list[str]) -> NcclRuns:
        return parse_nccl_runs(output)
