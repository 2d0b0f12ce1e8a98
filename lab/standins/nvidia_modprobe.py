#!/usr/bin/python3
"""STAND-IN nvidia-modprobe (pvegpu lab): creates NVIDIA device files the way NVIDIA's setuid tool does
(github.com/NVIDIA/nvidia-modprobe: nvidia-modprobe.c, modprobe-utils/nvidia-modprobe-utils.c,
common-utils/nvgetopt.c), on a lab host whose "loaded module" is the stand-in kernel package's version file.

Command line (nvgetopt rules: `-c N`, `-cN`, `-c=N`, `--create-nvidia-device-file[=]N`, bundled flags `-um`,
integers as strtol base 0, `--` ends the options):
  -c, --create-nvidia-device-file=MINOR      repeatable, at most 64
  -u, --unified-memory                       the -c minors are nvidia-uvm base minors
  -m, --modeset
  -f, --nvidia-capability-device-file=PATH   repeatable, at most 256
  -v, --version / -h, --help                 a one-line STAND-IN note, exit 0
A refused command line prints nvgetopt's line (e.g. `PROG: unrecognized option: "--x"`), then
`ERROR: Invalid commandline, please run `PROG --help` for usage information.` between blank lines, as the real
tool does when stderr is not a terminal (PROG is argv[0]: `/usr/bin/nvidia-modprobe`, also when found on PATH,
where the C tool would say `nvidia-modprobe`); exit 1.

What it does, in the real tool's order (stopping with exit 1 at the first failure):
- without -u: "loads" nvidia, then `/dev/nvidiaN` c 195:N per -c (minor 255: `/dev/nvidiactl`; a minor
  outside 0-255 fails);
- with -u: "loads" nvidia-uvm, then `/dev/nvidia-uvm` c U:N and `/dev/nvidia-uvm-tools` c U:N+1 per -c;
- -m: "loads" nvidia-modeset, then `/dev/nvidia-modeset` c 195:254;
- -f PATH: `/dev/nvidia-caps/nvidia-cap<M>` c C:M, M the `DeviceFileMinor:` line of PATH.
A node is mode 0666 root:root, or what `DeviceFileMode/UID/GID` in the parameters file say (the cap file
for -f; `DeviceFileModify: 0` leaves nodes alone); an existing node of the right type and numbers only gets
its mode and owner fixed, anything else at that path is replaced.

Lab model: "a module is loaded" means VERSION_FILE of /etc/pvegpu-lab/nvidia.env exists (it plays
/proc/driver/nvidia/version; the stand-in kernel package writes it) and the parameters file is `params`
beside it (plays /proc/driver/nvidia/params). Majors U and C come from /proc/devices (`nvidia-uvm`,
`nvidia-caps`); a lab machine has no NVIDIA module, so without them the lab constants 508 and 235 stand in
(values seen on real hosts; the real tool fails instead). The real tool fails silently; this stand-in says
why on stderr, marked STAND-IN. Not modelled: actually loading modules, -s/--nvswitch, -l/--nvlink,
-a/--auto-online-movable, IMEX channels (exit 1, saying so).
"""

from __future__ import annotations

import os
import stat
import string
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SETTINGS = Path("/etc/pvegpu-lab/nvidia.env")
PROC_DEVICES = Path("/proc/devices")
DEV = Path("/dev")
NVIDIA_MAJOR, CTL_MINOR, MODESET_MINOR = 195, 255, 254
LAB_MAJORS = {"nvidia-uvm": 508, "nvidia-caps": 235}  # STAND-IN majors when /proc/devices has none
MAX_MINORS, MAX_CAP_FILES = 64, 256
NOT_MODELLED = {"s": "--nvswitch", "l": "--nvlink", "a": "--auto-online-movable"}
# (long name, short letter, argument kind) as in nvidia-modprobe's option-table.h.
OPTIONS = (
    ("version", "v", None),
    ("help", "h", None),
    ("create-nvidia-device-file", "c", "int"),
    ("unified-memory", "u", None),
    ("modeset", "m", None),
    ("nvswitch", "s", None),
    ("nvlink", "l", None),
    ("nvidia-capability-device-file", "f", "string"),
    ("auto-online-movable", "a", None),
)


class CommandLineError(Exception):
    """nvgetopt refused an argument; the message is the line it printed on stderr."""


class TooManyError(Exception):
    """More -c or -f than the tool has room for; the message is its ERROR text."""


@dataclass
class Request:
    minors: list[int] = field(default_factory=list)
    cap_files: list[str] = field(default_factory=list)
    flags: set[str] = field(default_factory=set)


def strtol(text: str) -> int | None:
    """C `strtol(text, &end, 0)` when `end` reaches the end of `text` (nvgetopt's test); else None."""
    if not text:
        return 0  # nothing parsed and nothing left: nvgetopt takes it as 0
    body = text.lstrip(" \t\n\v\f\r")
    sign = -1 if body[:1] == "-" else 1
    body = body[1:] if body[:1] in ("+", "-") else body
    if body[:2].lower() == "0x" and body[2:3] and body[2] in string.hexdigits:
        base, digits, allowed = 16, body[2:], string.hexdigits
    elif body[:1] == "0":
        base, digits, allowed = 8, body, string.octdigits
    else:
        base, digits, allowed = 10, body, string.digits
    if not digits or any(c not in allowed for c in digits):
        return None
    return sign * int(digits, base)


def _option(name: str, by: str) -> tuple[str, str, str | None] | None:
    return next((o for o in OPTIONS if (o[0] if by == "long" else o[1]) == name), None)


def parse(argv: list[str], prog: str) -> Request:  # noqa: PLR0912
    """The options of `argv` (without argv[0]) as nvgetopt + nvidia-modprobe's main read them."""
    request, args, i = Request(), list(argv), 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-"):
            raise CommandLineError(f'{prog}: invalid option: "{arg}"')
        double = arg.startswith("--")
        name, eq, value = arg[2 if double else 1 :].partition("=")
        argument = value if eq else None
        shown = arg.split("=", 1)[0]  # nvgetopt prints its copy of the word, cut at "="
        if double and not name and argument is None:
            break  # "--" ends the options
        option = _option(name, "short" if len(name) == 1 else "long") if name else None
        if option is None and name and all(_option(c, "short") for c in name):
            first = _option(name[0], "short")
            if first is not None and first[2] is None:  # bundled flags: take the first, look again
                option, args[i] = first, "-" + name[1:]
                i -= 1
        if option is None and len(name) > 1 and strtol(name[1:]) is not None:
            candidate = _option(name[0], "short")
            if candidate is not None and candidate[2] == "int":
                option, argument = candidate, name[1:]
        if option is None:
            raise CommandLineError(f'{prog}: unrecognized option: "{shown}"')
        _, letter, kind = option
        if kind is None:
            if argument is not None:
                raise CommandLineError(
                    f'{prog}: option "{shown}" does not take an argument, but was given an argument of '
                    f'"{argument}".'
                )
            request.flags.add(letter)
            if letter in ("v", "h"):
                return request  # printed and exited at once, whatever follows
        else:
            if argument is None:
                i += 1
                if i >= len(args):
                    raise CommandLineError(f'{prog}: option "{shown}" requires an argument.')
                argument = args[i]
            elif not argument:
                raise CommandLineError(f'{prog}: option "{shown}" requires an argument.')
            _take(
                request, kind, argument, f'{prog}: "{argument}" is not a valid argument for option "{shown}".'
            )
        i += 1
    return request


def _take(request: Request, kind: str, argument: str, refused: str) -> None:
    """Record one option argument; `refused` is nvgetopt's line for a bad integer."""
    if kind == "string":
        if len(request.cap_files) == MAX_CAP_FILES:
            raise TooManyError("Too many NVIDIA capability device files requested.")
        request.cap_files.append(argument)
        return
    number = strtol(argument)
    if number is None:
        raise CommandLineError(refused)
    if len(request.minors) == MAX_MINORS:
        raise TooManyError("Too many NVIDIA character device files requested.")
    request.minors.append(number)


def _error(message: str) -> int:
    """nv_error_msg on a non-terminal stderr: blank line, `ERROR: <message>`, blank line; returns exit 1."""
    sys.stderr.write(f"\nERROR: {message}\n\n")
    return 1


# Installed on lab hosts as a lone script, so it reads /etc/pvegpu-lab/nvidia.env itself (as its siblings do).
def settings(path: Path) -> dict[str, str]:
    values = {"VERSION_FILE": "/proc/driver/nvidia/version"}
    if path.is_file():
        for line in path.read_text().splitlines():
            name, sep, value = line.partition("=")
            if sep and not name.startswith("#"):
                values[name.strip()] = value.strip()
    return values


def chardev_major(name: str, proc_devices: Path) -> int:
    """The major of `name` in the `Character devices:` section of /proc/devices, else the lab constant."""
    lines = proc_devices.read_text().splitlines() if proc_devices.is_file() else []
    section = lines[lines.index("Character devices:") + 1 :] if "Character devices:" in lines else []
    for line in section:
        if not line.strip():
            break
        words = line.split()
        if len(words) == 2 and words[1] == name and words[0].isdigit():
            return int(words[0])
    return LAB_MAJORS[name]


def file_parameters(path: Path | None) -> tuple[int, int, int, bool]:
    """(mode, uid, gid, modify) from `Name: value` lines (init_device_file_parameters)."""
    mode, uid, gid, modify = 0o666, 0, 0, True
    lines = path.read_text().splitlines() if path is not None and path.is_file() else []
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep or not value.strip().isdigit():
            break  # fscanf("%31[^:]: %u\n") stops at the first line it cannot read
        number = int(value)
        if name == "DeviceFileUID":
            uid = number
        elif name == "DeviceFileGID":
            gid = number
        elif name == "DeviceFileMode":
            mode = number
        elif name in ("ModifyDeviceFiles", "DeviceFileModify"):
            modify = number == 1
    return mode, uid, gid, modify


def make_node(path: Path, major: int, minor: int, parameters: Path | None) -> bool:
    """mknod_helper: make `path` a char device major:minor with the parameters' mode and owner."""
    mode, uid, gid, modify = file_parameters(parameters)
    if not modify:
        return True
    try:
        rdev = os.makedev(major, minor)
    except (OverflowError, ValueError):
        return False
    try:
        found: os.stat_result | None = path.stat()
    except FileNotFoundError:
        found = None
    right_node = found is not None and stat.S_ISCHR(found.st_mode) and found.st_rdev == rdev
    if (
        right_node
        and found is not None
        and (stat.S_IMODE(found.st_mode), found.st_uid, found.st_gid)
        == (
            mode,
            uid,
            gid,
        )
    ):
        return True
    created = not right_node
    try:
        if found is not None and not right_node:
            path.unlink()
        if created:
            os.mknod(path, stat.S_IFCHR | mode, rdev)
        os.chmod(path, mode)
        os.chown(path, uid, gid)
    except OSError:
        if created:
            path.unlink(missing_ok=True)
        return False
    return True


def cap_minor(cap_file: Path) -> int | None:
    """The `DeviceFileMinor:` of a capability /proc file, None when it has none."""
    lines = cap_file.read_text().splitlines() if cap_file.is_file() else []
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep or not value.strip().lstrip("-").isdigit():
            return None
        if name == "DeviceFileMinor":
            return int(value)
    return None


Node = tuple[Path, int, int, Path | None]  # path, major, minor, parameters file


def steps(request: Request, dev: Path, params: Path, proc_devices: Path) -> Iterator[Node | str]:
    """The nodes to make, in the real tool's order; a string where it would stop (why)."""
    if "u" in request.flags:
        uvm = chardev_major("nvidia-uvm", proc_devices)
        for minor in request.minors:
            yield dev / "nvidia-uvm", uvm, minor, None
            yield dev / "nvidia-uvm-tools", uvm, minor + 1, None
    else:
        for minor in request.minors:
            if not 0 <= minor <= CTL_MINOR:
                yield f"no NVIDIA device file for minor {minor}"
                return
            yield dev / ("nvidiactl" if minor == CTL_MINOR else f"nvidia{minor}"), NVIDIA_MAJOR, minor, params
    if "m" in request.flags:
        yield dev / "nvidia-modeset", NVIDIA_MAJOR, MODESET_MINOR, params
    for cap in map(Path, request.cap_files):
        cap_number = cap_minor(cap)
        if cap_number is None:
            yield f"{cap} names no DeviceFileMinor"
            return
        caps = chardev_major("nvidia-caps", proc_devices)
        yield dev / f"nvidia-caps/nvidia-cap{cap_number}", caps, cap_number, cap


def create(request: Request, dev: Path, version_file: Path, proc_devices: Path) -> str | None:
    """Make the nodes `request` asks for, in order; None, or why it stopped (the real tool is silent)."""
    if not version_file.is_file():
        return f"the NVIDIA kernel module is not loaded ({version_file} is absent)"
    for step in steps(request, dev, version_file.with_name("params"), proc_devices):
        if isinstance(step, str):
            return step
        path, major, minor, parameters = step
        if path.parent != dev:
            path.parent.mkdir(mode=0o755, exist_ok=True)  # /dev/nvidia-caps
        if not make_node(path, major, minor, parameters):
            return f"could not create {path} (c {major}:{minor})"
    return None


def main(
    argv: list[str],
    prog: str = "nvidia-modprobe",
    *,
    config: Path = SETTINGS,
    dev: Path = DEV,
    proc_devices: Path = PROC_DEVICES,
) -> int:
    try:
        request = parse(argv, prog)
    except CommandLineError as error:
        sys.stderr.write(f"{error}\n")
        return _error(f"Invalid commandline, please run `{prog} --help` for usage information.\n")
    except TooManyError as error:
        return _error(str(error))
    if request.flags & {"v", "h"}:
        print(f"{prog}: pvegpu lab STAND-IN for NVIDIA's nvidia-modprobe (device files only)")
        return 0
    unmodelled = sorted(NOT_MODELLED[f] for f in request.flags if f in NOT_MODELLED)
    if unmodelled:
        sys.stderr.write(f"{prog}: pvegpu lab STAND-IN: {', '.join(unmodelled)} is not modelled\n")
        return 1
    problem = create(request, dev, Path(settings(config)["VERSION_FILE"]), proc_devices)
    if problem is not None:
        sys.stderr.write(f"{prog}: pvegpu lab STAND-IN: {problem}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], sys.argv[0]))
