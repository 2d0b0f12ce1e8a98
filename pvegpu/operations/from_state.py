"""Operations that decide from the host's one state read (`pvegpu.run.host_state.state_of`), in place of
pyinfra's
`files.put`, `files.directory`, `apt.packages`, `systemd.service`, `server.group` and `server.user`.

Each yields the commands pyinfra's would on a change (a file goes through
`pvegpu.operations.files.write_file`, atomically), or says why nothing is to do. None reads the host again
on its own, except `file_content` under `--diff`: it reads the old content of a file it is about to change,
to show the difference.
"""

from __future__ import annotations

import hashlib
from collections.abc import Generator, Sequence

from pyinfra import logger
from pyinfra.api.command import QuoteString, StringCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.api.output import format_text
from pyinfra.context import host
from pyinfra.facts.apt import noninteractive_apt
from pyinfra.facts.files import FileContents
from pyinfra.operations.util import files as file_utils
from pyinfra.operations.util.packaging import ensure_packages
from pyinfra.operations.util.service import handle_service_control

from pvegpu.models.guest_state import PathState, UnitState
from pvegpu.operations.files import write_file
from pvegpu.run.host_state import state_of

SYSTEMCTL = "systemctl {1} {0}"


@operation()
def file_content(
    *, path: str, content: str, mode: str = "644", user: str = "root", group: str = "root"
) -> Generator[StringCommand]:
    """`path` holds `content` with `mode` and owner `user:group`; written atomically when any differs."""
    current = state_of(host).path(path)
    if current.kind in ("directory", "other"):
        raise OperationError(f"{path} exists and is not a regular file ({current.kind})")
    digest = hashlib.sha256(content.encode()).hexdigest()
    same = (current.kind, current.sha256, current.mode, current.user, current.group)
    if same == ("file", digest, mode, user, group):
        host.noop(f"file {path} is already uploaded")
        return
    if host.state.config.DIFF and current.sha256 != digest:
        _log_diff(path, content, current)
    yield write_file(path, content, mode=mode, owner=f"{user}:{group}")


def _log_diff(path: str, content: str, current: PathState) -> None:
    """As pyinfra's files.put shows a change under `--diff` (the old content read only here)."""
    old: list[str] = []
    if current.kind == "file":
        old = [f"{line}\n" for line in host.get_fact(FileContents, path=path) or []]
    host.log(f"Will {'modify' if old else 'create'} {format_text(path, bold=True)}", logger.info)
    for line in file_utils.generate_color_diff(old, content.splitlines(keepends=True)):
        logger.info("  %s", line)
    logger.info("")


def _directory(
    path: str, mode: str | None, user: str | None, group: str | None, *, link_ok: bool = False
) -> Generator[StringCommand]:
    """pyinfra's files.directory, decided from the state read."""
    current = state_of(host).path(path)
    if current.kind == "link" and link_ok:
        host.noop(f"directory {path} already exists (as a link)")
        return
    if current.kind == "missing":
        yield StringCommand("mkdir", "-p", QuoteString(path))
        if mode:
            yield file_utils.chmod(path, mode)
        if user or group:
            yield file_utils.chown(path, user, group)
        return
    if current.kind != "directory":
        raise OperationError(f"{path} exists and is not a directory ({current.kind})")
    changed = False
    if mode and current.mode != mode:
        yield file_utils.chmod(path, mode)
        changed = True
    if (user and current.user != user) or (group and current.group != group):
        yield file_utils.chown(path, user, group)
        changed = True
    if not changed:
        host.noop(f"directory {path} already exists")


@operation()
def directory(
    *, path: str, mode: str | None = None, user: str | None = None, group: str | None = None
) -> Generator[StringCommand]:
    """`path` is a directory, with `mode` and owner when given (created with `mkdir -p`)."""
    yield from _directory(path, mode, user, group)


@operation()
def packages(
    *, packages: Sequence[str], no_recommends: bool = False, allow_downgrades: bool = False
) -> Generator[str]:
    """apt packages (`name` or `name=version`) installed, as pyinfra's apt.packages installs them; each
    pinned package at another version says which (`nvidia-driver-cuda: 590.48.01-1 -> 580.95.05-1`).
    `allow_downgrades`: the pinned version may be older than the installed one (apt-get -y refuses that
    otherwise): the NVIDIA driver's, whose version follows `driver.version` both ways."""
    install = "install --no-install-recommends" if no_recommends else "install"
    if allow_downgrades:
        install += " --allow-downgrades"
    installed = {name: set(versions) for name, versions in state_of(host).packages.items()}
    for name, _, version in (package.partition("=") for package in packages if "=" in package):
        if installed.get(name) and version not in installed[name]:
            logger.info(f"{host.print_prefix}{name}: {', '.join(sorted(installed[name]))} -> {version}")
    yield from ensure_packages(
        host,
        list(packages),
        installed,
        True,
        install_command=noninteractive_apt(install),
        uninstall_command=noninteractive_apt("remove"),
        upgrade_command=noninteractive_apt(install),
        version_join="=",
    )


@operation()
def service(
    *, service: str, running: bool | None = True, enabled: bool | None = None, restarted: bool = False
) -> Generator[StringCommand]:
    """A systemd unit started (`running`, True by default as in pyinfra: so a `restarted` unit that is not
    running is started), restarted when it runs (`restarted`), enabled (`enabled`), as pyinfra's
    systemd.service does it."""
    unit = state_of(host).units.get(service, UnitState(running=False, enabled=False))
    yield from handle_service_control(host, service, {service: unit.running}, SYSTEMCTL, running, restarted)
    if enabled is True and not unit.enabled:
        yield StringCommand("systemctl", "enable", QuoteString(service))
    elif enabled is False and unit.enabled:
        yield StringCommand("systemctl", "disable", QuoteString(service))


@operation()
def system_group(*, group: str) -> Generator[StringCommand]:
    """A system group (`groupadd -r`)."""
    if group in state_of(host).groups:
        host.noop(f"group {group} exists")
        return
    yield StringCommand("groupadd", "-r", QuoteString(group))


@operation()
def system_user(*, user: str, group: str, home: str, shell: str) -> Generator[StringCommand]:
    """A system user without a created home (`useradd -r -M`) in `group`, with `home` (then made a directory
    the user owns) and `shell`; an existing one gets what differs (`usermod`)."""
    existing = state_of(host).users.get(user)
    if existing is None:
        yield StringCommand(
            "useradd", "-d", QuoteString(home), "-s", QuoteString(shell), "-g", QuoteString(group),
            "-r", "-M", QuoteString(user),
        )  # fmt: skip
    else:
        changes: list[str | QuoteString] = []
        for flag, want, have in (("-d", home, existing.home), ("-s", shell, existing.shell)):
            if want != have:
                changes += [flag, QuoteString(want)]
        if group != existing.group:
            changes += ["-g", QuoteString(group)]
        if changes:
            yield StringCommand("usermod", *changes, QuoteString(user))
    yield from _directory(home, None, user, group, link_ok=True)
