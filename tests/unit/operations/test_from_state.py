"""The operations that decide from the host's one state read (pvegpu/operations/from_state.py): state in, the
exact commands pyinfra's own operation would run (files: the atomic write) or the noop sentence out."""

from __future__ import annotations

import hashlib
import logging

import pytest
from pyinfra.api.exceptions import OperationError
from pyinfra.api.output import format_text
from pyinfra.context import ctx_host
from pyinfra.facts.files import FileContents

from pvegpu.models.guest_state import MISSING, PathState, UnitState, UserEntry
from pvegpu.operations.files import write_file
from pvegpu.operations.from_state import directory, file_content, packages, service, system_group, system_user
from tests.unit.host_states import decide_from, host_state
from tests.unit.op_harness import FakeHost, run_op

ENV = "/etc/pvegpu/sglang.env"
CONTENT = "NCCL_DEBUG=INFO\n"
DIGEST = hashlib.sha256(CONTENT.encode()).hexdigest()
APT = (
    'DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef" '
    '-o Dpkg::Options::="--force-confold" install'
)


def test_noop_file_same_content_mode_owner(monkeypatch: pytest.MonkeyPatch) -> None:
    decide_from(monkeypatch, host_state(paths={ENV: PathState("file", "600", "root", "root", DIGEST)}))
    assert run_op(file_content, {}, path=ENV, content=CONTENT, mode="600") == (
        [],
        [f"file {ENV} is already uploaded"],
    )


@pytest.mark.parametrize(
    "current",
    [
        PathState("missing"),
        PathState("file", "600", "root", "root", "0" * 64),
        PathState("file", "644", "root", "root", DIGEST),
        PathState("file", "600", "sglang", "root", DIGEST),
        PathState("link", "777", "root", "root", None),
    ],
    ids=["absent", "content", "mode", "owner", "link"],
)
def test_update_file_written_atomically(monkeypatch: pytest.MonkeyPatch, current: PathState) -> None:
    decide_from(monkeypatch, host_state(paths={ENV: current}))
    commands, noops = run_op(file_content, {}, path=ENV, content=CONTENT, mode="600")
    assert (commands, noops) == ([write_file(ENV, CONTENT, mode="600").get_raw_value()], [])


def test_error_file_over_a_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    decide_from(monkeypatch, host_state(paths={ENV: PathState("directory", "755", "root", "root")}))
    with pytest.raises(OperationError) as error:
        run_op(file_content, {}, path=ENV, content=CONTENT)
    assert str(error.value) == f"{ENV} exists and is not a regular file (directory)"


@pytest.mark.parametrize(
    ("current", "commands", "noops"),
    [
        (PathState("missing"), ["mkdir -p /m", "chmod 755 /m", "chown sglang:sglang /m"], []),
        (PathState("directory", "700", "root", "root"), ["chmod 755 /m", "chown sglang:sglang /m"], []),
        (PathState("directory", "755", "sglang", "sglang"), [], ["directory /m already exists"]),
    ],
    ids=["create", "update", "noop"],
)
def test_directory(
    monkeypatch: pytest.MonkeyPatch, current: PathState, commands: list[str], noops: list[str]
) -> None:
    decide_from(monkeypatch, host_state(paths={"/m": current}))
    assert run_op(directory, {}, path="/m", mode="755", user="sglang", group="sglang") == (commands, noops)


def test_packages_installs_only_the_missing_or_other_version(monkeypatch: pytest.MonkeyPatch) -> None:
    installed = {"dkms": frozenset({"3.0.10-8"}), "nvidia-open": frozenset({"580.65.06-1"})}
    decide_from(monkeypatch, host_state(packages=installed))
    commands, noops = run_op(packages, {}, packages=("nvidia-open=580.95.05-1", "dkms", "linux-headers-6.1"))
    assert commands == [f"{APT} nvidia-open=580.95.05-1 linux-headers-6.1"]
    assert noops == ["package dkms is installed (3.0.10-8)"]


def test_packages_downgrade_to_the_pin_and_say_each_version_change(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A container's userspace back to the host module's older build: apt-get -y refuses a downgrade unless
    told; each pinned package at another version is named with both."""
    decide_from(monkeypatch, host_state(packages={"nvidia-driver-cuda": frozenset({"590.48.01-1"})}))
    with caplog.at_level(logging.INFO):
        commands, _ = run_op(
            packages,
            {},
            packages=("nvidia-driver-cuda=580.95.05-1",),
            no_recommends=True,
            allow_downgrades=True,
        )
    assert commands == [
        'DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef" -o '
        'Dpkg::Options::="--force-confold" install --no-install-recommends --allow-downgrades '
        "nvidia-driver-cuda=580.95.05-1"
    ]
    assert "nvidia-driver-cuda: 590.48.01-1 -> 580.95.05-1" in caplog.messages[-1]


def test_noop_packages_no_recommends(monkeypatch: pytest.MonkeyPatch) -> None:
    decide_from(monkeypatch, host_state(packages={"python3-venv": frozenset({"3.11.2-1+b1"})}))
    assert run_op(packages, {}, packages=["python3-venv"], no_recommends=True) == (
        [],
        ["package python3-venv is installed (3.11.2-1+b1)"],
    )


@pytest.mark.parametrize(
    ("unit", "kwargs", "commands"),
    [
        (None, {"enabled": True}, ["systemctl start sglang.service", "systemctl enable sglang.service"]),
        (UnitState(running=True, enabled=True), {"enabled": True}, []),
        (UnitState(running=False, enabled=True), {"restarted": True}, ["systemctl start sglang.service"]),
        (UnitState(running=True, enabled=True), {"restarted": True}, ["systemctl restart sglang.service"]),
    ],
    ids=["start-enable", "noop", "restart-starts-stopped", "restart"],
)
def test_service(
    monkeypatch: pytest.MonkeyPatch, unit: UnitState | None, kwargs: dict[str, bool], commands: list[str]
) -> None:
    decide_from(monkeypatch, host_state(units={} if unit is None else {"sglang.service": unit}))
    assert run_op(service, {}, service="sglang.service", **kwargs)[0] == commands


def test_system_group(monkeypatch: pytest.MonkeyPatch) -> None:
    decide_from(monkeypatch, host_state())
    assert run_op(system_group, {}, group="sglang") == (["groupadd -r sglang"], [])
    decide_from(monkeypatch, host_state(groups=frozenset({"sglang"})))
    assert run_op(system_group, {}, group="sglang") == ([], ["group sglang exists"])


USER = {"user": "sglang", "group": "sglang", "home": "/var/lib/sglang", "shell": "/usr/sbin/nologin"}


def test_create_system_user_then_its_home(monkeypatch: pytest.MonkeyPatch) -> None:
    decide_from(monkeypatch, host_state(paths={"/var/lib/sglang": MISSING}))
    assert run_op(system_user, {}, **USER)[0] == [
        "useradd -d /var/lib/sglang -s /usr/sbin/nologin -g sglang -r -M sglang",
        "mkdir -p /var/lib/sglang",
        "chown sglang:sglang /var/lib/sglang",
    ]


def test_update_system_user_what_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = UserEntry("sglang", "/home/sglang", "/usr/sbin/nologin", "users")
    home = PathState("directory", "755", "sglang", "sglang")
    decide_from(monkeypatch, host_state(users={"sglang": entry}, paths={"/var/lib/sglang": home}))
    assert run_op(system_user, {}, **USER) == (
        ["usermod -d /var/lib/sglang -g sglang sglang"],
        ["directory /var/lib/sglang already exists"],
    )


def test_diff_shows_the_old_and_new_lines(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    decide_from(monkeypatch, host_state(paths={ENV: PathState("file", "600", "root", "root", "0" * 64)}))
    fake = FakeHost({FileContents: ["NCCL_DEBUG=WARN"]}, diff=True)
    with ctx_host.use(fake), caplog.at_level(logging.INFO):
        commands = list(file_content._inner(path=ENV, content=CONTENT, mode="600"))
    assert len(commands) == 1
    assert fake.logged == [f"Will modify {format_text(ENV, bold=True)}"]
    shown = [record.getMessage() for record in caplog.records]
    assert shown == ["  @@ -1 +1 @@", "  - NCCL_DEBUG=WARN", "  + NCCL_DEBUG=INFO", ""]


def test_error_a_path_the_read_never_looked_at(monkeypatch: pytest.MonkeyPatch) -> None:
    decide_from(monkeypatch, host_state())
    with pytest.raises(KeyError, match="/etc/other is not in the host state read"):
        run_op(file_content, {}, path="/etc/other", content=CONTENT)
