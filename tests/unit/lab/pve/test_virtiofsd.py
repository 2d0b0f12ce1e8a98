"""virtiofs at a lab VM start's QEMU check: qemu-server's virtiofsd command line and Debian 12's daemon
(lab/pve/virtiofsd.py), the lab's replacements in the first run (lab/pve/qemu_check.py lab_run), and real
QEMU (7.2, `-S`) realizing `vhost-user-fs-pci` against the real daemon, or refusing it with its own text (the
lab hypervisor's part: test_qemu_check.py).

qemu-server 9.2.6 src/PVE/QemuServer/Virtiofs.pm start_virtiofsd is the command line's source."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from lab.pve import virtiofsd
from lab.pve.qemu_check import lab_run, verdict
from lab.pve.qemu_config import QemuCmdlineError

CONF = {"machine": "q35", "ostype": "l26", "memory": "393216", "virtiofs0": "models"}
SOCKET = "/run/qemu-server/virtiofsd/vm100-fs0"
REFUSED = (
    f"kvm: -chardev socket,id=virtiofs0,path={SOCKET}: Failed to connect to '{SOCKET}': Connection refused"
)


def test_qemu_server_command_line_and_debians_daemon() -> None:
    options = {"dirid": "models", "cache": "never", "direct-io": "1", "expose-acl": "1"}

    argv = virtiofsd.qemu_server_argv(7, options, "/srv/models", windows=True)

    assert argv == [
        *(
            "/usr/libexec/virtiofsd",
            "--fd=7",
            "--shared-dir=/srv/models",
            "--posix-acl",
            "--announce-submounts",
        ),
        *("--allow-direct-io", "--cache=never", "--inode-file-handles=prefer", "--syslog"),
    ]
    assert virtiofsd.lab_argv(argv) == [
        *("/usr/lib/qemu/virtiofsd", "--fd=7", "-o", "source=/srv/models", "-o", "posix_acl", "-o", "xattr"),
        *("-o", "announce_submounts", "-o", "allow_direct_io", "-o", "cache=none"),
    ]
    assert virtiofsd.qemu_server_argv(3, {"dirid": "m"}, "/m", windows=False) == [
        *("/usr/libexec/virtiofsd", "--fd=3", "--shared-dir=/m", "--announce-submounts", "--syslog"),
    ]


def test_lab_run_keeps_the_shared_memfd_and_moves_the_socket() -> None:
    run = lab_run(100, CONF, [], 46, "/tmp/lab-sockets")

    assert run.argv[run.argv.index("-m") :] == [
        *(
            "-m",
            "393216",
            "-object",
            "memory-backend-memfd,id=virtiofs-mem,size=393216M,reserve=off,share=on",
        ),
        *("-readconfig", run.argv[run.argv.index("-readconfig") + 1]),
        *("-chardev", "socket,id=virtiofs0,path=/tmp/lab-sockets/vm100-fs0"),
        *("-device", "vhost-user-fs-pci,queue-size=1024,chardev=virtiofs0,tag=models"),
        *("-machine", "hpet=off,memory-backend=virtiofs-mem,type=q35"),
    ]
    assert run.sockets == {0: "/tmp/lab-sockets/vm100-fs0"}
    assert run.as_on_node(["kvm: Failed to connect to '/tmp/lab-sockets/vm100-fs0'"]) == [
        f"kvm: Failed to connect to '{SOCKET}'"
    ]


@pytest.mark.parametrize(
    "value", ["models", "models,cache=metadata,expose-acl=1,direct-io=1", "dirid=m,cache=never"]
)
def test_qemu_realizes_the_device_against_the_real_daemon(tmp_path: Path, value: str) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shared = {0: str(tmp_path / "a"), 9: str(tmp_path / "b")}

    assert verdict(100, CONF | {"virtiofs0": value, "virtiofs9": "other"}, [], 46, shared) is None


def test_error_qemu_refuses_a_mount_tag_over_36_bytes(tmp_path: Path) -> None:
    tag = "a" * 37

    assert verdict(100, CONF | {"virtiofs0": tag}, [], 46, {0: str(tmp_path)}) == [
        f"kvm: -device vhost-user-fs-pci,queue-size=1024,chardev=virtiofs0,tag={tag}: "
        "tag property must be 36 bytes or less"
    ]


def test_error_a_daemon_that_cannot_serve_fails_qemus_connect_at_qemu_servers_path(tmp_path: Path) -> None:
    assert verdict(100, CONF, [], 46, {0: str(tmp_path / "none")}) == [REFUSED]


def test_error_no_directory_for_a_virtiofs_key() -> None:
    with pytest.raises(QemuCmdlineError) as raised:
        verdict(100, CONF, [], 46, {})
    assert str(raised.value) == "no shared directory resolved for 'virtiofs0'"


def test_a_daemon_qemu_never_reached_is_stopped(tmp_path: Path) -> None:
    share = virtiofsd.Share(str(tmp_path / "fs0"), {"dirid": "m"}, str(tmp_path))
    started = time.monotonic()
    with virtiofsd.running([share]) as daemons:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.connect(share.socket)  # the daemon listens on the socket the lab made
        probe.close()
    assert [d.returncode is not None for d in daemons] == [True]
    assert time.monotonic() - started < virtiofsd.STOP_S + 3
