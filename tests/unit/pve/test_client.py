"""pvegpu.pve: the exact pvesh argv of each call, what canned pvesh output turns into, and the https backend
against a real local TLS server.

Canned pvesh stdout/stderr/exit codes follow shared/knowledge/proxmox-api-behaviour.md (§0.1 async tasks print
the UPID and exit 0 even when they fail; §0.2 compact sorted JSON, null prints nothing; §0.4 error texts and
exit codes; §3 mapping endpoints; §4.7 the stale-mapping start failure). They are synthesized from that spec,
not captured from a Proxmox host.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import IPv4Address
from pathlib import Path

import paramiko
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import NameOID

from pvegpu.models.pve import (
    BackupJob,
    GuestConfig,
    MappingCheck,
    MappingState,
    PciMapping,
    ReplicationJob,
    Severity,
    VmStatus,
)
from pvegpu.pve.client import PveClient, upid_node
from pvegpu.pve.errors import (
    PveConnectionError,
    PveConnectionLostError,
    PveError,
    TaskFailedError,
    TaskTimeoutError,
)
from pvegpu.pve.https import connect_https
from pvegpu.pve.ssh import ssh_transport
from pvegpu.pve.transport import CommandTransport, pvesh_argv

MAP_1 = "id=10de:2bb1,node=pve1,path=0000:41:00,iommugroup=14,subsystem-id=10de:204b"
MAP_2 = "id=10de:2bb1,node=pve2,path=0000:21:00,iommugroup=16,subsystem-id=10de:204b"
DIGEST = "2f4f8a0ce4e2b3a1d0c9f6e5a4b3c2d1e0f9a8b7"
DIGEST_MISMATCH = (
    "update hardware mapping failed: detected modified configuration - file changed by other user? Try again."
)
UPID_START = "UPID:pve1:000A1B2C:0153F2C4:66A1B2C3:qmstart:100:root@pam:"
STALE = (
    "PCI device mapping invalid (hardware probably changed): "
    "'iommugroup' does not match for 'gpu0' (13 != 12) "
)


@dataclass
class Pvesh:
    """A runner that records each argv and answers with the next canned (stdout, stderr, exit code)."""

    answers: list[tuple[str, str, int]]
    calls: list[list[str]] = field(default_factory=list)

    def __call__(self, argv: list[str]) -> tuple[str, str, int]:
        self.calls.append(argv)
        return self.answers.pop(0)


def client(*answers: tuple[str, str, int], sudo: bool = False) -> tuple[PveClient, Pvesh]:
    pvesh = Pvesh(list(answers))
    return PveClient(CommandTransport(pvesh, sudo=sudo)), pvesh


OK_NULL = ("", "", 0)


# ------------------------------------------------------------------------------------------ exact argv


def test_create_mapping_repeats_map_for_each_entry() -> None:
    api, pvesh = client(OK_NULL)
    api.create_mapping(PciMapping("gpu0", (MAP_1, MAP_2)))
    assert pvesh.calls == [
        [
            "pvesh", "create", "/cluster/mapping/pci",
            "--id", "gpu0", "--map", MAP_1, "--map", MAP_2,
            "--output-format", "json",
        ]
    ]  # fmt: skip


def test_update_mapping_sends_the_whole_map_and_the_digest() -> None:
    api, pvesh = client(OK_NULL, sudo=True)
    api.update_mapping(PciMapping("gpu0", (MAP_1,), mdev=False), DIGEST)
    assert pvesh.calls == [
        [
            "sudo", "pvesh", "set", "/cluster/mapping/pci/gpu0",
            "--map", MAP_1, "--mdev", "0", "--digest", DIGEST,
            "--output-format", "json",
        ]
    ]  # fmt: skip


def test_vm_calls_argv() -> None:
    api, pvesh = client(
        (f'"{UPID_START}"\n', "", 0),
        ("update VM 100: -delete balloon -hostpci0 mapping=gpu0,pcie=1 -onboot 1\n", "", 0),
        (f'"{UPID_START}"\n', "", 0),
        OK_NULL,
    )
    assert (
        api.create_vm("pve1", 100, {"name": "llm", "hostpci0": "mapping=gpu0,pcie=1", "numa": True})
        == UPID_START
    )
    api.update_vm_config(
        "pve1", 100, {"hostpci0": "mapping=gpu0,pcie=1", "onboot": True}, DIGEST, ("balloon",)
    )
    api.start_vm("pve1", 100)
    api.delete_mapping("gpu9")
    assert pvesh.calls == [
        [
            "pvesh", "create", "/nodes/pve1/qemu",
            "--vmid", "100", "--name", "llm", "--hostpci0", "mapping=gpu0,pcie=1", "--numa", "1",
            "--output-format", "json",
        ],
        [
            "pvesh", "set", "/nodes/pve1/qemu/100/config",
            "--hostpci0", "mapping=gpu0,pcie=1", "--onboot", "1", "--delete", "balloon", "--digest", DIGEST,
            "--output-format", "json",
        ],
        ["pvesh", "create", "/nodes/pve1/qemu/100/status/start", "--output-format", "json"],
        ["pvesh", "delete", "/cluster/mapping/pci/gpu9", "--output-format", "json"],
    ]  # fmt: skip


def test_pvesh_argv_leaves_out_none_and_keeps_order() -> None:
    assert pvesh_argv("GET", "/cluster/mapping/pci", {"check-node": None}) == [
        "pvesh",
        "get",
        "/cluster/mapping/pci",
        "--output-format",
        "json",
    ]


# ------------------------------------------------------------------------------------ canned output


def test_mappings_with_check_node() -> None:
    listed = [
        {
            "checks": [
                {
                    "message": "Invalid configuration: 'iommugroup' does not match for 'gpu0' (22 != 14)\n",
                    "severity": "error",
                }
            ],
            "digest": DIGEST,
            "id": "gpu0",
            "map": [MAP_1],
            "type": "pci",
        },
        {"checks": [], "digest": DIGEST, "id": "nic0", "map": ["node=pve1,path=0000:43:00.0,id=8086:1592"],
         "mdev": 1, "type": "pci"},
    ]  # fmt: skip
    api, pvesh = client((json.dumps(listed, separators=(",", ":"), sort_keys=True) + "\n", "", 0))
    assert api.mappings(check_node="pve1") == (
        MappingState(
            PciMapping("gpu0", (MAP_1,)),
            DIGEST,
            (
                MappingCheck(
                    Severity.ERROR,
                    "Invalid configuration: 'iommugroup' does not match for 'gpu0' (22 != 14)\n",
                ),
            ),
        ),
        MappingState(
            PciMapping("nic0", ("node=pve1,path=0000:43:00.0,id=8086:1592",), mdev=True), DIGEST, ()
        ),
    )
    assert pvesh.calls[0][3:5] == ["--check-node", "pve1"]


def test_mapping_get_and_not_found() -> None:
    api, _ = client(
        (json.dumps({"digest": DIGEST, "map": [MAP_1], "type": "pci"}) + "\n", "", 0),
        ("", "mapping 'gpu7' not found\n", 255),
    )
    assert api.mapping("gpu0") == MappingState(PciMapping("gpu0", (MAP_1,)), DIGEST)
    assert api.mapping("gpu7") is None


def test_error_digest_mismatch_keeps_proxmox_message() -> None:
    message = DIGEST_MISMATCH
    api, _ = client(("", message + "\n", 255))
    with pytest.raises(PveError) as raised:
        api.update_mapping(PciMapping("gpu0", (MAP_1,)), "0" * 40)
    assert (raised.value.status, raised.value.message, raised.value.errors) == (500, message, {})


def test_error_parameter_verification_with_usage() -> None:
    stderr = (
        "400 Parameter verification failed.\n"
        "map[0]: invalid format - invalid key in comma-separated list property: ['node\n"
        "pvesh create <api_path> --id <string> --map <array> [OPTIONS] [FORMAT_OPTIONS]\n"
    )
    api, _ = client(("", stderr, 255))
    with pytest.raises(PveError) as raised:
        api.create_mapping(PciMapping("gpu0", (MAP_1,)))
    assert (raised.value.status, raised.value.message, raised.value.errors) == (
        400,
        "Parameter verification failed.",
        {"map[0]": "invalid format - invalid key in comma-separated list property: ['node"},
    )
    assert str(raised.value) == (
        "400 Parameter verification failed.\n"
        "map[0]: invalid format - invalid key in comma-separated list property: ['node"
    )


def test_error_unknown_option_keeps_getopt_line() -> None:
    stderr = (
        "Unknown option: lxc.cgroup2.devices.allow\n"
        "400 unable to parse option\n"
        "pvesh set <api_path> [OPTIONS]\n"
    )
    api, _ = client(("", stderr, 255))
    with pytest.raises(PveError) as raised:
        api.update_lxc_config("pve1", 200, {"lxc.cgroup2.devices.allow": "c 195:* rwm"}, DIGEST)
    assert (raised.value.status, raised.value.message) == (
        400,
        "Unknown option: lxc.cgroup2.devices.allow\nunable to parse option",
    )


def test_error_failed_start_returns_upid_and_wait_reads_exitstatus() -> None:
    """pvesh prints the UPID and exits 0 although the task failed; the exitstatus carries the error."""
    status = {
        "exitstatus": STALE, "id": "100", "node": "pve1", "pid": 662316, "pstart": 22278852,
        "starttime": 1722921667, "status": "stopped", "type": "qmstart", "upid": UPID_START,
        "user": "root@pam",
    }  # fmt: skip
    api, pvesh = client(
        (f'"{UPID_START}"\n', STALE + "\n", 0),
        (json.dumps(status, sort_keys=True) + "\n", "", 0),
    )
    upid = api.start_vm("pve1", 100)
    with pytest.raises(TaskFailedError) as raised:
        api.wait_task(upid, timeout=60)
    assert (raised.value.upid, raised.value.message) == (UPID_START, STALE)
    assert pvesh.calls[1] == [
        "pvesh", "get", f"/nodes/pve1/tasks/{UPID_START}/status", "--output-format", "json",
    ]  # fmt: skip


def test_wait_task_polls_until_stopped_ok() -> None:
    running = json.dumps({"status": "running", "upid": UPID_START}) + "\n"
    done = json.dumps({"exitstatus": "OK", "status": "stopped", "upid": UPID_START}) + "\n"
    api, pvesh = client((running, "", 0), (running, "", 0), (done, "", 0))
    slept: list[float] = []
    status = api.wait_task(UPID_START, timeout=10, interval=2, clock=lambda: 0.0, sleep=slept.append)
    assert (status.ok, slept, len(pvesh.calls)) == (True, [2, 2], 3)


def test_error_wait_task_timeout() -> None:
    running = (json.dumps({"status": "running", "upid": UPID_START}) + "\n", "", 0)
    api, _ = client(running, running, running)
    now = iter([0.0, 5.0, 10.5])
    with pytest.raises(TaskTimeoutError) as raised:
        api.wait_task(UPID_START, timeout=10, clock=lambda: next(now), sleep=lambda _: None)
    assert str(raised.value) == f"504 task {UPID_START} still running after 10 s"


def test_task_with_warnings_succeeded() -> None:
    done = (json.dumps({"exitstatus": "WARNINGS: 2", "status": "stopped", "upid": UPID_START}) + "\n", "", 0)
    api, _ = client(done)
    status = api.wait_task(UPID_START, timeout=1)
    assert (status.ok, status.exitstatus) == (True, "WARNINGS: 2")


@pytest.mark.parametrize("exitstatus", ["WARNINGS: ", "WARNINGS: 1 more", "unexpected status", "warnings: 1"])
def test_error_task_exitstatus_that_is_an_error(exitstatus: str) -> None:
    done = (json.dumps({"exitstatus": exitstatus, "status": "stopped", "upid": UPID_START}) + "\n", "", 0)
    api, _ = client(done)
    with pytest.raises(TaskFailedError) as raised:
        api.wait_task(UPID_START, timeout=1)
    assert str(raised.value) == f"500 {exitstatus}"


def test_qemu_put_output_before_json_and_null_result() -> None:
    api, _ = client(("update VM 100: -cores 4\n", "", 0))
    api.update_vm_config("pve1", 100, {"cores": 4}, DIGEST)  # the handler's line before no JSON: no error


def test_vm_config_status_and_lxc() -> None:
    config = {"cores": 8, "digest": DIGEST, "hostpci0": "mapping=gpu0,pcie=1", "memory": "65536", "numa": 1}
    status = {"ha": {"managed": 0}, "name": "llm", "qmpstatus": "stopped", "status": "stopped", "vmid": 100}
    lxc = {"digest": DIGEST, "hostname": "ct", "lxc": [["lxc.cgroup2.devices.allow", "c 195:* rwm"]]}
    api, _ = client(*((json.dumps(x, sort_keys=True) + "\n", "", 0) for x in (config, status, lxc)))
    assert api.vm_config("pve1", 100) == GuestConfig(
        {"cores": 8, "hostpci0": "mapping=gpu0,pcie=1", "memory": "65536", "numa": 1}, DIGEST
    )
    assert api.vm_status("pve1", 100) == VmStatus(100, "stopped", "stopped", "llm")
    assert api.lxc_config("pve1", 200).values["lxc"] == [["lxc.cgroup2.devices.allow", "c 195:* rwm"]]


def test_what_holds_a_guest_ha_replication_and_backup_jobs() -> None:
    """pve-ha-manager API2/HA/Resources.pm `index` (each section with `sid`, `type`, its options, `digest`),
    pve-manager API2/ReplicationConfig.pm `index` (ReplicationConfig.pm parse_config: integer `guest`,
    `jobnum`) and API2/Backup.pm `index` (jobs.cfg's vzdump sections: `vmid`/`exclude` pve-vmid-lists,
    `all`/`enabled` booleans as 1/0, plus `next-run`)."""
    ha = [
        {"digest": DIGEST, "sid": "vm:100", "state": "started", "type": "vm"},
        {"sid": "ct:101", "type": "ct"},
    ]
    replication = [
        {"guest": 100, "id": "100-0", "jobnum": 0, "schedule": "*/15", "target": "pve2", "type": "local"}
    ]
    backup = [
        {"all": 1, "enabled": 1, "exclude": "101,102", "id": "backup-5f3c2a1b-7d4e", "mode": "snapshot",
         "next-run": 1721941200, "schedule": "21:00", "storage": "local", "type": "vzdump"},
        {"enabled": 0, "id": "listed", "node": "pve1", "type": "vzdump", "vmid": "100 101;102"},
        {"id": "pooled", "pool": "gpu", "type": "vzdump"},
    ]  # fmt: skip
    api, pvesh = client(*((json.dumps(x, sort_keys=True) + "\n", "", 0) for x in (ha, replication, backup)))

    assert api.ha_resources() == ("vm:100", "ct:101")
    assert api.replication_jobs() == (ReplicationJob("100-0", 100),)
    assert api.backup_jobs() == (
        BackupJob("backup-5f3c2a1b-7d4e", all=True, exclude=(101, 102)),
        BackupJob("listed", vmids=(100, 101, 102), node="pve1", enabled=False),
        BackupJob("pooled", pool="gpu"),
    )
    assert [argv[1:3] for argv in pvesh.calls] == [
        ["get", "/cluster/ha/resources"],
        ["get", "/cluster/replication"],
        ["get", "/cluster/backup"],
    ]


def test_error_backup_job_with_a_vmid_list_that_is_not_one() -> None:
    api, _ = client(('[{"id": "b", "type": "vzdump", "vmid": "100,abc"}]\n', "", 0))
    with pytest.raises(PveError) as error:
        api.backup_jobs()
    assert error.value.line == (
        'GET /cluster/backup: expected an integer \'vmid\', got \'[{"id": "b", "type": "vzdump", '
        '"vmid": "100,abc"}]\''
    )


def test_error_upid_node_refuses_non_upid() -> None:
    assert upid_node(UPID_START) == "pve1"
    with pytest.raises(ValueError, match=r"^'UPID:pve1:x' is not a Proxmox task id \(UPID\)$"):
        upid_node("UPID:pve1:x")


# ------------------------------------------------------------------------------------------ ssh


@pytest.fixture
def ssh_server(tmp_path: Path) -> Iterator[tuple[int, paramiko.PKey, str]]:
    """A paramiko SSH server on 127.0.0.1 that completes key exchange and refuses every authentication.
    Yields its port, its host key, and a key file the client may offer (refused like any other)."""
    key_file = tmp_path / "host_key"
    key_file.write_bytes(
        Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        )
    )
    key = paramiko.Ed25519Key.from_private_key_file(str(key_file))
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        with listener:
            conn, _ = listener.accept()
            transport = paramiko.Transport(conn)
            transport.add_server_key(key)
            try:
                transport.start_server(server=paramiko.ServerInterface())
                transport.join(5)  # until the client hangs up
            except (paramiko.SSHException, EOFError, OSError):  # the client hangs up mid-handshake
                pass
            finally:
                transport.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port, key, str(key_file)
    thread.join(10)


def test_error_ssh_unknown_host_key_is_refused(
    ssh_server: tuple[int, paramiko.PKey, str], tmp_path: Path
) -> None:
    port, _, _ = ssh_server
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(PveConnectionError) as raised:
        PveClient(ssh_transport("127.0.0.1", port=port, known_hosts=str(empty), timeout=5))
    assert (
        raised.value.message
        == f"ssh root@127.0.0.1:{port}: Server '[127.0.0.1]:{port}' not found in known_hosts"
    )
    assert empty.read_text() == ""  # nothing was added


def test_ssh_known_host_key_passes_to_authentication(
    ssh_server: tuple[int, paramiko.PKey, str], tmp_path: Path
) -> None:
    port, key, key_file = ssh_server
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {key.get_name()} {key.get_base64()}\n")
    with pytest.raises(PveConnectionError) as raised:
        PveClient(
            ssh_transport("127.0.0.1", port=port, known_hosts=str(known), key_filename=key_file, timeout=5)
        )
    # past the host key check: the server refuses the login
    assert (
        raised.value.message
        == f"ssh root@127.0.0.1:{port}: Bad authentication type; allowed types: ['password']"
    )


# ------------------------------------------------------------------------------------------ https


@dataclass
class Recorded:
    """Responses by (method, path) and what the server received."""

    responses: dict[tuple[str, str], tuple[int, str, object]]
    received: list[tuple[str, str, str, str]] = field(default_factory=list)
    drops: int = 0  # requests received and then cut off: the connection closes without an answer


def _serve(recorded: Recorded, cert: Path, key: Path) -> tuple[ThreadingHTTPServer, int]:
    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode()
            recorded.received.append((self.command, self.path, body, self.headers.get("Authorization", "")))
            if recorded.drops:
                recorded.drops -= 1
                self.close_connection = True
                return
            path = self.path.split("?", 1)[0]
            status, reason, payload = recorded.responses[(self.command, path)]
            data = json.dumps(payload).encode()
            self.send_response(status, reason)
            self.send_header("Content-Type", "application/json;charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _answer  # noqa: N815

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server, server.server_address[1]


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """A self-signed certificate for 127.0.0.1: (cert file, key file, SHA-256 fingerprint AA:BB:…)."""
    directory = tmp_path_factory.mktemp("tls")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pve1")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(IPv4Address("127.0.0.1"))]), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    digest = hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest().upper()
    return cert_file, key_file, ":".join(digest[i : i + 2] for i in range(0, 64, 2))


# Recorded in the API's HTTP shape: {"data": ...}; errors as status + reason (= Proxmox's message) + errors.
LISTED = {"data": [{"digest": DIGEST, "id": "gpu0", "map": [MAP_1], "type": "pci", "checks": []}]}


@pytest.fixture
def https_api(certificate: tuple[Path, Path, str]) -> Iterator[tuple[Recorded, int]]:
    cert, key, _ = certificate
    recorded = Recorded(
        {
            ("GET", "/api2/json/cluster/mapping/pci"): (200, "OK", LISTED),
            ("POST", "/api2/json/cluster/mapping/pci"): (200, "OK", {"data": None}),
            ("PUT", "/api2/json/cluster/mapping/pci/gpu0"): (500, DIGEST_MISMATCH, {"data": None}),
            ("PUT", "/api2/json/cluster/mapping/pci/x"): (
                400,
                "Parameter verification failed.",
                {"data": None, "errors": {"map": "property is missing and it is not optional"}},
            ),
        }
    )
    server, port = _serve(recorded, cert, key)
    yield recorded, port
    server.shutdown()


def test_https_verifies_tls_by_default(https_api: tuple[Recorded, int]) -> None:
    recorded, port = https_api
    api = connect_https("127.0.0.1", "root@pam!pvegpu", "secret", port=port)
    with pytest.raises(PveConnectionError) as raised:
        api.mappings()
    assert "CERTIFICATE_VERIFY_FAILED" in raised.value.message
    assert recorded.received == []


def test_https_with_ca_file(https_api: tuple[Recorded, int], certificate: tuple[Path, Path, str]) -> None:
    recorded, port = https_api
    api = connect_https("127.0.0.1", "root@pam!pvegpu", "secret", port=port, ca_file=str(certificate[0]))
    assert api.mappings(check_node="pve1") == (MappingState(PciMapping("gpu0", (MAP_1,)), DIGEST, ()),)
    assert recorded.received == [
        ("GET", "/api2/json/cluster/mapping/pci?check-node=pve1", "", "PVEAPIToken=root@pam!pvegpu=secret")
    ]


def test_https_pinned_fingerprint_sends_map_repeated(
    https_api: tuple[Recorded, int], certificate: tuple[Path, Path, str]
) -> None:
    recorded, port = https_api
    api = connect_https("127.0.0.1", "root@pam!pvegpu", "secret", port=port, fingerprint=certificate[2])
    api.create_mapping(PciMapping("gpu0", (MAP_1, MAP_2)))
    method, path, body, _ = recorded.received[0]
    assert (method, path) == ("POST", "/api2/json/cluster/mapping/pci")
    assert body == "id=gpu0&map=" + "&map=".join(
        m.replace(":", "%3A").replace(",", "%2C").replace("=", "%3D") for m in (MAP_1, MAP_2)
    )


def test_drift_https_read_the_connection_drops_under_is_sent_once_more(
    https_api: tuple[Recorded, int], certificate: tuple[Path, Path, str]
) -> None:
    recorded, port = https_api
    api = connect_https("127.0.0.1", "root@pam!pvegpu", "secret", port=port, fingerprint=certificate[2])
    recorded.drops = 1

    assert api.mappings(check_node="pve1") == (MappingState(PciMapping("gpu0", (MAP_1,)), DIGEST, ()),)

    assert [(method, path) for method, path, _, _ in recorded.received] == [
        ("GET", "/api2/json/cluster/mapping/pci?check-node=pve1")
    ] * 2


def test_error_https_write_the_connection_drops_under_is_not_sent_again(
    https_api: tuple[Recorded, int], certificate: tuple[Path, Path, str]
) -> None:
    recorded, port = https_api
    api = connect_https("127.0.0.1", "root@pam!pvegpu", "secret", port=port, fingerprint=certificate[2])
    recorded.drops = 1

    with pytest.raises(PveConnectionLostError) as raised:
        api.create_mapping(PciMapping("gpu0", (MAP_1,)))

    assert (raised.value.endpoint, raised.value.message) == (
        "POST /cluster/mapping/pci",
        f"https://127.0.0.1:{port}/api2/json: connection lost after the call was sent: "
        "('Connection aborted.', RemoteDisconnected('Remote end closed connection without response'))",
    )
    assert [(method, path) for method, path, _, _ in recorded.received] == [
        ("POST", "/api2/json/cluster/mapping/pci")
    ]


def test_error_https_wrong_fingerprint_is_refused(https_api: tuple[Recorded, int]) -> None:
    recorded, port = https_api
    api = connect_https(
        "127.0.0.1", "root@pam!pvegpu", "secret", port=port, fingerprint=":".join(["AB"] * 32)
    )
    with pytest.raises(PveConnectionError) as raised:
        api.mappings()
    assert "Fingerprints did not match" in raised.value.message
    assert recorded.received == []


def test_error_https_keeps_proxmox_messages(
    https_api: tuple[Recorded, int], certificate: tuple[Path, Path, str]
) -> None:
    _, port = https_api
    api = connect_https("127.0.0.1", "root@pam!pvegpu", "secret", port=port, fingerprint=certificate[2])
    with pytest.raises(PveError) as raised:
        api.update_mapping(PciMapping("gpu0", (MAP_1,)), DIGEST)
    assert (raised.value.status, raised.value.message) == (500, DIGEST_MISMATCH)
    with pytest.raises(PveError) as raised:
        api.update_mapping(PciMapping("x", ()), DIGEST)
    assert (raised.value.status, raised.value.message, raised.value.errors) == (
        400,
        "Parameter verification failed.",
        {"map": "property is missing and it is not optional"},
    )


@pytest.mark.parametrize(
    ("token", "fingerprint", "message"),
    [
        ("root@pam", None, "API token id 'root@pam' is not user@realm!name"),
        (
            "root@pam!t",
            "AA:BB",
            "fingerprint 'AA:BB' is not a SHA-256 fingerprint (32 colon-separated hex pairs)",
        ),
    ],
)
def test_error_https_bad_settings(token: str, fingerprint: str | None, message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        connect_https("127.0.0.1", token, "secret", fingerprint=fingerprint)


def test_the_ssh_backend_never_imports_requests() -> None:
    """requests and urllib3 load only for `https` (pvegpu.pve.https): ~0.06 s of every other run's start."""
    code = "import sys, pvegpu.pve.host_client, roles.site; print({'requests', 'urllib3'} & set(sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout == "set()\n"


def test_agent_file_read_its_text_or_none() -> None:
    api, pvesh = client(
        ('{"content":"ID=debian\\n","truncated":0}\n', "", 0),
        ("", "QEMU guest agent is not running\n", 255),
        ('{"content":null}\n', "", 0),
    )
    assert api.agent_file_read("pve1", 100, "/etc/os-release") == "ID=debian\n"
    assert api.agent_file_read("pve1", 100, "/etc/os-release") is None  # the agent does not answer
    assert api.agent_file_read("pve1", 100, "/etc/os-release") is None  # nothing readable as text
    assert pvesh.calls[0] == [
        "pvesh", "get", "/nodes/pve1/qemu/100/agent/file-read",
        "--file", "/etc/os-release", "--output-format", "json",
    ]  # fmt: skip
