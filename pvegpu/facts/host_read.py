"""A serving host's state, everything its roles decide from, read with ONE shell command (`HostRead`).

`state_command(request)` prints sections, each opened by a marker line `#pvegpu:<name>`, in this order:

    os        /etc/os-release
    kernel    `uname -r`
    packages  `<status abbrev>\\t<package>\\t<version>` for every package dpkg knows (`dpkg-query -W`)
    paths     `missing\\t<path>` per requested path that is not there; then, from one `find`, `<type> <mode>
              <user> <group>\\t<path>` per one that is (find's `%y`: f, d, l, others), and from one
              `sha256sum` over the regular files, `<sha256>  <path>` each: two processes for all of them,
              not four per path
    units     `systemctl show` of the requested units: `Id=`, `SubState=`, `UnitFileState=`,
              `NeedDaemonReload=` blocks
    users     per requested user that exists: its passwd line, then `:<primary group name>`
    groups    per requested group that exists: its group line
    venvs     per requested venv: `none\\t<venv>` (no interpreter) or `version <v>|none\\t<venv>` (sglang's:
              its dist-info's METADATA, else the venv's Python asked), checked in the background from the
              start of the command, as the probe is
    module    the NVIDIA version file (nothing: no module loaded)
    smi       nvidia-smi's GPU list, or its message (`pvegpu.facts.nvidia`), run in the background from the
              start of the command, as the venvs' check is
    secrets   the `SecretFiles` lines of the requested key files (counts only, never content)
    initramfs only when requested: the names of the /boot/initrd.img-* images not newer than the requested
              file (the nouveau blacklist: mkinitramfs copies /etc/modprobe.d, update-initramfs renames the
              new image into place, so an older image lacks it)
    records   only when some are requested: per small file read whole (the P2P probe's record; in a VM,
              the NCCL conf files; the checkpoint's config.json; what SGLang started from),
              `<base64 of its content>\t<path>`, or `missing\t<path>` (not a regular file)
    layers    only when requested: the `model.layers.N` numbers of a checkpoint's weight index (sorted,
              one a line), or `missing` (no index): whether it holds the MTP layer, without reading the
              whole map (GLM-5's names ~100,000 tensors)
    store     only when requested: the model directory's files, `<size> <mtime> <path>` each, or `missing`
              (`pvegpu.facts.model_store`): whether the fetcher's verified files are still as it left them
    probe     only when requested: SGLang's readiness probe (`pvegpu.facts.sglang.probe_command`), run in
              the background from the start of the command, so its HTTP calls overlap the other parts;
              nothing when the shell could not make its temporary file (the probe is then not read)
    next_boot only when requested: `next_boot.NextBoot`'s output (the kernel booted next, the modules DKMS
              built), PACKED in one line (`parsing.PACK`: its own section markers stay inside)
    end

`parse_state` is pure and strict: output of another shape raises FactParseError naming the line. A request
names only what the plan knows before anything is read (the roles' paths, units, users, venvs), so one read
serves every operation of a run (`pvegpu.run.host_state`).
"""

from __future__ import annotations

import binascii
import re
import shlex
from base64 import b64decode
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from pyinfra.api.facts import FactBase
from typing_extensions import override

from pvegpu.facts.errors import FactParseError
from pvegpu.facts.model_store import parse_store, store_command
from pvegpu.facts.next_boot import NextBoot, parse_next_boot
from pvegpu.facts.nvidia import nvidia_smi_command, parse_nvidia_smi, parse_version_file
from pvegpu.facts.p2p_record import parse_record
from pvegpu.facts.parsing import PACK, ParseError, unpacked
from pvegpu.facts.secret_files import SecretFiles, parse_secret_files
from pvegpu.facts.sections import marker, split_sections
from pvegpu.facts.sglang import VERSION_SCRIPT, Probe, VenvState, parse_probe, parse_venv, probe_command
from pvegpu.models.boot import KernelBoot
from pvegpu.models.guest_state import MISSING, PathKind, PathState, UnitState, UserEntry
from pvegpu.models.model_store import StoreFile
from pvegpu.models.nvidia import LoadedModule, NvidiaSmi
from pvegpu.models.p2p import RECORD_PATH, Record
from pvegpu.models.secret_file import SecretFile
from pvegpu.models.sglang import ProbeTarget

SECTIONS = (
    "os", "kernel", "packages", "paths", "units", "users", "groups", "venvs", "module", "smi", "secrets",
    "end",
)  # fmt: skip
# Printed only when requested (in this order, before `end`), so a read without them keeps its old shape.
_OPTIONAL = ("initramfs", "records", "layers", "store", "probe", "next_boot")
# pyinfra's readings of systemd's states (pyinfra.facts.systemd): these SubStates are "running", these
# UnitFileStates "enabled"; the operations that replace pyinfra's decide exactly as it did.
RUNNING_SUBSTATES = frozenset({"running", "waiting", "exited", "listening", "mounted"})
ENABLED_STATES = frozenset({"enabled", "static"})
# dpkg's installed states as pyinfra's DebPackages reads them (`ii`, `hi`: installed, held or not).
_INSTALLED = ("ii", "hi")
_PATH_LINE = re.compile(r"([a-zA-Z]) ([0-7]{1,4}) (\S+) (\S+)")
_DIGEST_LINE = re.compile(r"([0-9a-f]{64})  (/.*)")
_OS_LINE = re.compile(r"([A-Z0-9_]+)=(.*)")

_KINDS: dict[str, PathKind] = {"f": "file", "d": "directory", "l": "link"}  # find's %y; others: "other"


@dataclass(frozen=True)
class StateRequest:
    """What to read besides the fixed parts (OS, kernel, packages, module, nvidia-smi)."""

    paths: tuple[str, ...] = ()
    units: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    venvs: tuple[str, ...] = ()
    secrets: tuple[str, ...] = ()
    records: tuple[str, ...] = ()
    weight_index: str | None = None
    model_store: str | None = None
    initramfs_after: str | None = None
    version_file: str = "/proc/driver/nvidia/version"
    probe: ProbeTarget | None = None
    next_boot: bool = False


@dataclass(frozen=True)
class HostState:
    """The parsed output (module docstring). `path` of a path that was not requested raises KeyError: an
    operation deciding from a read that never looked would change the host on every run. `records` holds
    each requested record's text (None: missing); `p2p_record` is the P2P probe's record when it was
    requested and is one pvegpu wrote, else None; `stale_initramfs` the images older than the request's
    `initramfs_after` (none when not requested); `probe` SGLang's readiness when it was requested and read,
    else None, and `probe_target` what it probed (set from the request by `HostRead`)."""

    os_release: Mapping[str, str]
    kernel: str
    packages: Mapping[str, frozenset[str]]
    paths: Mapping[str, PathState]
    units: Mapping[str, UnitState]
    users: Mapping[str, UserEntry]
    groups: frozenset[str]
    venvs: Mapping[str, VenvState]
    module: LoadedModule | None
    smi: NvidiaSmi
    secrets: Mapping[str, SecretFile] = field(default_factory=dict)
    records: Mapping[str, str | None] = field(default_factory=dict)
    layers: frozenset[int] | None = None
    store: Mapping[str, StoreFile] | None = None
    p2p_record: Record | None = None
    stale_initramfs: tuple[str, ...] = ()
    probe: Probe | None = None
    probe_target: ProbeTarget | None = None
    next_boot: KernelBoot | None = None  # None: not requested

    def path(self, path: str) -> PathState:
        if path not in self.paths:
            raise KeyError(f"{path} is not in the host state read (pvegpu.run.host_state.state_request)")
        return self.paths[path]


def _open(section: str) -> str:
    return f"echo {shlex.quote(marker(section))}"


def _words(items: Sequence[str]) -> str:
    return " ".join(shlex.quote(item) for item in items)


# In a subshell: `set --` collects the paths that exist without touching the caller's arguments.
# `sha256sum -z` ends each line with NUL and leaves the name unescaped (a `\\` in a path would be escaped).
_PATH_SCRIPT = 'if [ -e "$p" ] || [ -L "$p" ]; then set -- "$@" "$p"; else printf "missing\\t%s\\n" "$p"; fi'
_PATHS_FOUND = (
    'if [ $# -gt 0 ]; then find "$@" -maxdepth 0 -printf "%y %m %u %g\\t%p\\n" -type f '
    '-exec sha256sum -z -- {} + 2>/dev/null | tr "\\0" "\\n"; fi'
)


# A venv's sglang version: from its one `sglang-*.dist-info/METADATA` in the site-packages of the interpreter
# `bin/python` resolves to (`pythonX.Y`: a symlinked venv, what `python3 -m venv` makes), read by the shell,
# since a Python started in a real SGLang venv spends ~0.1 s on its .pth files; else (copied interpreter,
# no or several dist-infos) that Python is asked, as importlib.metadata sees it.
_VENV_SCRIPT = (
    'if [ -x "$v/bin/python" ]; then r=; i=$(readlink -f -- "$v/bin/python"); i=${i##*/}; '
    "case $i in python[0-9]*.[0-9]*) n=0; "
    'for f in "$v/lib/$i/site-packages"/sglang-*.dist-info/METADATA; do '
    '[ -f "$f" ] && n=$((n+1)) && m=$f; done; '
    "if [ $n -eq 1 ]; then while IFS= read -r l; do case $l in "
    '"Version: "*) r="version ${l#Version: }"; break;; "") break;; esac; done < "$m"; fi;; esac; '
    '[ -n "$r" ] || r=$("$v/bin/python" -c "$s" 2>&1 | tail -n 1); printf "%s\\t%s\\n" "$r" "$v"; '
    'else printf "none\\t%s\\n" "$v"; fi'
)


def state_command(request: StateRequest) -> str:
    """The one command (module docstring); it exits 0 whatever it finds."""
    secrets = SecretFiles().command(request.secrets) if request.secrets else "true"
    venvs = (
        f"s={shlex.quote(VERSION_SCRIPT)}; for v in {_words(request.venvs)}; do {_VENV_SCRIPT}; done"
        if request.venvs
        else ""
    )
    parts = [
        f"{_open('os')}; cat /etc/os-release 2>/dev/null",
        f"{_open('kernel')}; uname -r",
        f"{_open('packages')}; "
        "dpkg-query -W -f='${db:Status-Abbrev}\\t${Package}\\t${Version}\\n' 2>/dev/null",
        f"{_open('paths')}; "
        f"(set --; for p in {_words(request.paths)}; do {_PATH_SCRIPT}; done; {_PATHS_FOUND})"
        if request.paths
        else f"{_open('paths')}",
        f"{_open('units')}; if [ -n {shlex.quote(' '.join(request.units))} ] && command -v systemctl "
        ">/dev/null; then systemctl show --property Id --property SubState --property UnitFileState "
        "--property NeedDaemonReload "
        f"{_words(request.units)} 2>/dev/null; fi",
        f"{_open('users')}; for u in {_words(request.users)}; do "
        'e=$(getent passwd "$u") && printf "%s:%s\\n" "$e" "$(id -gn "$u")"; done'
        if request.users
        else f"{_open('users')}",
        f'{_open("groups")}; for g in {_words(request.groups)}; do getent group "$g"; done'
        if request.groups
        else f"{_open('groups')}",
        f"{_open('venvs')}; {_collected(_VENVS, venvs)}" if venvs else f"{_open('venvs')}",
        f"{_open('module')}; cat {shlex.quote(request.version_file)} 2>/dev/null",
        f"{_open('smi')}; {_collected(_SMI, nvidia_smi_command())}",
        f"{_open('secrets')}; {secrets}",
        *(
            [
                f"{_open('initramfs')}; find /boot -maxdepth 1 -name 'initrd.img-*' "
                f"! -newer {shlex.quote(request.initramfs_after)} -printf '%f\\n' 2>/dev/null"
            ]
            if request.initramfs_after is not None
            else []
        ),
        *(
            [
                f"{_open('records')}; for r in {_words(request.records)}; do "
                'if [ -f "$r" ]; then printf "%s\\t%s\\n" "$(base64 -w0 < "$r")" "$r"; '
                'else printf "missing\\t%s\\n" "$r"; fi; done'
            ]
            if request.records
            else []
        ),
        *(
            [
                f'{_open("layers")}; i={shlex.quote(request.weight_index)}; if [ -f "$i" ]; then '
                'grep -o \'"model\\.layers\\.[0-9][0-9]*\\.\' "$i" | cut -d. -f3 | sort -un; '
                "else echo missing; fi"
            ]
            if request.weight_index is not None
            else []
        ),
        *(
            [f"{_open('store')}; {store_command(request.model_store)}"]
            if request.model_store is not None
            else []
        ),
        *([_probe_part()] if request.probe is not None else []),
        *([_next_boot_part()] if request.next_boot else []),
        f"{_open('end')}",
    ]
    command = f"{_started(_SMI, nvidia_smi_command())}; " + "; ".join(f"{{ {part}; }}" for part in parts)
    if venvs:
        command = f"{_started(_VENVS, venvs)}; {command}"
    if request.probe is None:
        return command
    probe = probe_command(request.probe).get_raw_value()
    return (
        "pvegpu_probe=$(mktemp 2>/dev/null) || pvegpu_probe=; "
        f'if [ -n "$pvegpu_probe" ]; then {{ {probe} > "$pvegpu_probe" 2>&1 || true; }} & fi; {command}'
    )


# The venvs' version check may start a Python per venv (`_VENV_SCRIPT`'s fallback, with its site-packages'
# .pth files), so it runs in the background from the start, its output kept in a temporary file and printed
# in its place; inline, as before, when the shell cannot make the file.
_VENVS = "pvegpu_venvs"
# nvidia-smi too: it takes tens of milliseconds (more with the GPUs idle and persistence off).
_SMI = "pvegpu_smi"


def _started(var: str, command: str) -> str:
    return (
        f"{var}=$(mktemp 2>/dev/null) || {var}=; "
        f'if [ -n "${var}" ]; then {{ {command}; }} > "${var}" 2>&1 & {var}_pid=$!; fi'
    )


def _collected(var: str, command: str) -> str:
    return f'if [ -n "${var}" ]; then wait "${var}_pid"; cat "${var}"; rm -f "${var}"; else {command}; fi'


def _next_boot_part() -> str:
    return f"{_open('next_boot')}; {{ {NextBoot().command()}; }} | {PACK}; echo"


def _probe_part() -> str:
    # The background probe is the command's only job; without its temporary file nothing ran.
    show = 'wait; cat "$pvegpu_probe"; rm -f "$pvegpu_probe"'
    return f'{_open("probe")}; if [ -n "$pvegpu_probe" ]; then {show}; fi'


def parse_state(lines: Sequence[str]) -> HostState:
    """The `HostState` of `state_command`'s output. Pure; FactParseError naming the line for another shape."""
    printed = [name for name in _OPTIONAL if marker(name) in lines]
    sections = split_sections(lines, (*SECTIONS[:-1], *printed, "end"))

    def text(name: str) -> list[str]:
        return [line for _, line in sections[name]]

    records = _records(sections.get("records", []))
    try:
        return HostState(
            os_release=_os_release(sections["os"]),
            kernel=_kernel(sections["kernel"]),
            packages=_packages(sections["packages"]),
            paths=_paths(sections["paths"]),
            units=_units(sections["units"]),
            users=_users(sections["users"]),
            groups=frozenset(_groups(sections["groups"])),
            venvs=_venvs(sections["venvs"]),
            module=parse_version_file(text("module")),
            smi=parse_nvidia_smi(text("smi")),
            secrets=parse_secret_files(text("secrets")),
            records=records,
            layers=_layers(sections["layers"]) if "layers" in sections else None,
            store=parse_store(text("store")) if "store" in sections else None,
            p2p_record=parse_record(records.get(RECORD_PATH)),
            stale_initramfs=_initramfs(sections.get("initramfs", [])),
            probe=parse_probe(text("probe")) if sections.get("probe") else None,
            next_boot=(
                parse_next_boot(unpacked(text("next_boot"), "next boot")) if "next_boot" in sections else None
            ),
        )
    except FactParseError:
        raise
    except ParseError as error:
        raise FactParseError(str(error)) from None


def _fail(number: int, line: str, what: str) -> FactParseError:
    return FactParseError(f"host state: line {number}: {line!r} is not {what}")


def _os_release(lines: list[tuple[int, str]]) -> dict[str, str]:
    values = {}
    for number, line in lines:
        if not line.strip() or line.startswith("#"):
            continue
        match = _OS_LINE.fullmatch(line)
        if match is None:
            raise _fail(number, line, "an os-release KEY=value line")
        try:
            words = shlex.split(match[2])
        except ValueError:
            raise _fail(number, line, "an os-release KEY=value line") from None
        values[match[1]] = " ".join(words)
    return values


def _kernel(lines: list[tuple[int, str]]) -> str:
    if len(lines) != 1 or not lines[0][1].strip() or len(lines[0][1].split()) != 1:
        raise FactParseError(f"host state: expected one kernel release line, got {[t for _, t in lines]!r}")
    return lines[0][1].strip()


def _packages(lines: list[tuple[int, str]]) -> dict[str, frozenset[str]]:
    found: dict[str, set[str]] = {}
    for number, line in lines:
        fields = line.split("\t")
        if len(fields) != 3 or not fields[1]:
            raise _fail(number, line, "a dpkg-query status/package/version line")
        status, name, version = fields
        if status[:2] in _INSTALLED and version:
            found.setdefault(name, set()).add(version)
    return {name: frozenset(versions) for name, versions in found.items()}


def _paths(lines: list[tuple[int, str]]) -> dict[str, PathState]:
    paths: dict[str, PathState] = {}
    digests: dict[str, str] = {}
    for number, line in lines:
        if hashed := _DIGEST_LINE.fullmatch(line):
            digests[hashed[2]] = hashed[1]
            continue
        head, tab, path = line.partition("\t")
        if not tab or not path.startswith("/"):
            raise _fail(number, line, "a path state line")
        if head == "missing":
            paths[path] = MISSING
            continue
        match = _PATH_LINE.fullmatch(head)
        if match is None:
            raise _fail(number, line, "a path state line")
        kind, mode, user, group = match.groups()
        paths[path] = PathState(_KINDS.get(kind, "other"), mode.lstrip("0").zfill(3), user, group, None)
    for path, digest in digests.items():  # a regular file sha256sum could not read keeps None
        state = paths.get(path)
        if state is not None and state.kind == "file":
            paths[path] = replace(state, sha256=digest)
    return paths


_UNIT_PROPERTIES = ("Id", "SubState", "UnitFileState", "NeedDaemonReload")


def _units(lines: list[tuple[int, str]]) -> dict[str, UnitState]:
    units: dict[str, UnitState] = {}
    block: dict[str, str] = {}

    def close() -> None:
        if block:
            unit = block.get("Id", "")
            units[unit] = UnitState(
                running=block.get("SubState", "") in RUNNING_SUBSTATES,
                enabled=block.get("UnitFileState", "") in ENABLED_STATES,
                needs_reload=block.get("NeedDaemonReload") == "yes",
            )
            block.clear()

    for number, line in [*lines, (0, "")]:
        if not line.strip():
            close()
            continue
        key, equals, value = line.partition("=")
        if not equals or key not in _UNIT_PROPERTIES or (key == "Id" and not value):
            raise _fail(number, line, "a systemctl show Id/SubState/UnitFileState/NeedDaemonReload line")
        block[key] = value
    return units


def _users(lines: list[tuple[int, str]]) -> dict[str, UserEntry]:
    users = {}
    for number, line in lines:
        fields = line.split(":")
        if len(fields) != 8 or not fields[0]:
            raise _fail(number, line, "a passwd line with its primary group")
        users[fields[0]] = UserEntry(fields[0], home=fields[5], shell=fields[6], group=fields[7])
    return users


def _groups(lines: list[tuple[int, str]]) -> list[str]:
    names = []
    for number, line in lines:
        fields = line.split(":")
        if len(fields) != 4 or not fields[0]:
            raise _fail(number, line, "a group line")
        names.append(fields[0])
    return names


def _venvs(lines: list[tuple[int, str]]) -> dict[str, VenvState]:
    venvs = {}
    for number, line in lines:
        head, tab, venv = line.partition("\t")
        if not tab or not venv:
            raise _fail(number, line, "a venv line")
        try:
            venvs[venv] = parse_venv([] if head == "none" else [head])
        except FactParseError:
            raise _fail(number, line, "a venv line") from None
    return venvs


def _initramfs(lines: list[tuple[int, str]]) -> tuple[str, ...]:
    for number, line in lines:
        if not line.startswith("initrd.img-") or "/" in line:
            raise _fail(number, line, "an initramfs image name")
    return tuple(line for _, line in lines)


def _layers(lines: list[tuple[int, str]]) -> frozenset[int] | None:
    if [line for _, line in lines] == ["missing"]:
        return None
    for number, line in lines:
        if not line.isdigit():
            raise _fail(number, line, "a layer number")
    return frozenset(int(line) for _, line in lines)


def _records(lines: list[tuple[int, str]]) -> dict[str, str | None]:
    records: dict[str, str | None] = {}
    for number, line in lines:
        head, tab, path = line.partition("\t")
        if not tab or not path.startswith("/"):
            raise _fail(number, line, "a record line")
        try:
            # surrogateescape: a record may be a file pvegpu does not write (NCCL's conf files), in any bytes
            records[path] = (
                None if head == "missing" else b64decode(head, validate=True).decode(errors="surrogateescape")
            )
        except binascii.Error:
            raise _fail(number, line, "a record line") from None
    return records


class HostRead(FactBase[HostState]):
    """`host.get_fact(HostRead, request=StateRequest(...))` (module docstring). Read it through
    `pvegpu.run.host_state.state_of`, which reads it once per host and run."""

    # The request, for `process`: pyinfra calls `command` and `process` on one instance.
    request: StateRequest | None = None

    @override
    def command(self, request: StateRequest) -> str:
        self.request = request
        return state_command(request)

    @override
    def process(self, output: list[str]) -> HostState:
        return targeted(parse_state(output), self.request)


def targeted(state: HostState, request: StateRequest | None) -> HostState:
    """`state` with `probe_target` set to what `request` probed, when the read holds the probe's verdict."""
    if state.probe is None or request is None:
        return state
    return replace(state, probe_target=request.probe)
