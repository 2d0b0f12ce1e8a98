"""`NodeRead`: everything a no-op run needs to know about a Proxmox node, in ONE command.

The parts, in order, each opened by a line `#pvegpu-node:<part>` and parsed by the facts' own pure parsers:

- `hardware`: every PCI function (`hardware_parse.hardware_command` under the request's sysfs root), sent as
  ONE line, gzip then base64: pyinfra reads a command's output a line at a time in Python, and the sysfs
  listing is the bulk of the read (~1,700 lines on the lab's 8-GPU node, more on a real server), which made
  a many-node run's reading CPU-bound here; gzip and base64 are in every Debian (Essential: yes);
- `cpu`: the kernel release and CPU vendor (`cpu.CpuAndKernel`);
- `boot`: the bootloader and pvegpu's boot files (`node_boot.parse_node_boot`);
- `driver`: what the host-driver profiles left (`host_driver.HostDriverFiles`, the request's files and units);
- `cmdline`: the running kernel command line (the request's `cmdline_path`);
- `sha256`: per fixed path of the request a line `path <path>` and its sha256 when it is a file; then, per
  storage directory in /etc/pve/storage.cfg (and /var/lib/vz, the `local` storage Proxmox assumes without
  that file), a line `dir <path>/snippets` and the sha256 of each `pvegpu-*` file in it: pvegpu's user-data
  snippets and hookscript, wherever `vm.snippets_storage` points, without asking the API first; and per
  image file the request names (while its `image_unless` file does not exist: the VM's config, as the image is
  read only to create the VM) a line `image <algorithm> <path>/import/<file>` and that file's digest when it
  is a file: the check of an image volume already there (pvegpu/operations/cloud_image.py);
- `pve`, only when the request names Proxmox config files (the VM's config, storage.cfg): per file a line
  `<base64 of its content>\t<path>`, or `missing\t<path>` (not a readable regular file), from which
  pvegpu/facts/pve_files.py computes the API's answers;
- `qemu`, only when the request names VM ids: per VM a line `<vmid>\t<pidfile>\t<cmdline>\t<state>`: the
  base64 of the first line of /var/run/qemu-server/<vmid>.pid, and when that is a PID, the base64 of its
  /proc/<pid>/cmdline and the state letter of its /proc/<pid>/stat; `-` for what is not there. What
  qemu-server's `check_running` reads: pvegpu/facts/pve_files.py `qemu_running` decides as it does;
- `exporter`, only when the request names pvegpu's textfiles: the node exporter's package, unit and those
  files' sha256 (pvegpu/facts/exporter_read.py), what roles/node_exporter.py decides from;
- `model`, only when the request names the node's model store (`model`): the fetcher's record and the
  store's file list (pvegpu/facts/model_store.py `store_read_command`), whether the model is complete as
  verified.

A part whose command fails (a sysfs root that is not a directory, a missing command line file) fails the whole
read with that command's message, as its own fact did.
"""

from __future__ import annotations

import base64
import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pyinfra.api.facts import FactBase
from typing_extensions import override

from pvegpu.facts.boot import KernelCmdline, parse_cmdline
from pvegpu.facts.cpu import CpuAndKernel, parse_cpu_kernel
from pvegpu.facts.errors import FactParseError, fact_errors
from pvegpu.facts.exporter_read import exporter_command, parse_exporter
from pvegpu.facts.hardware import hardware_command, parse_hardware
from pvegpu.facts.host_driver import HostDriverFiles, parse_host_driver
from pvegpu.facts.model_store import StoreRead, parse_store_read, store_read_command
from pvegpu.facts.node_boot import node_boot_command, parse_node_boot
from pvegpu.facts.parsing import PACK, unpacked
from pvegpu.facts.pvegpu_boot import BootFiles
from pvegpu.models.boot import BootLoaderInfo, CpuKernel
from pvegpu.models.exporter import EXPORTER_PACKAGE, EXPORTER_SERVICE, ExporterState
from pvegpu.models.hardware import HostHardware
from pvegpu.models.host_driver import HostDriverState
from pvegpu.models.pve import QEMU_RUN_DIR, QemuProcess

PARTS = ("hardware", "cpu", "boot", "driver", "cmdline", "sha256", "pve", "qemu", "exporter", "model", "end")
OPTIONAL_PARTS = ("pve", "qemu", "exporter", "model")  # printed only when requested
PART_MARKER = "#pvegpu-node:"
STORAGE_CFG = "/etc/pve/storage.cfg"
DEFAULT_STORAGE_DIR = "/var/lib/vz"
SNIPPET_PREFIX = "pvegpu-"
_SHA256_LINE = re.compile(r"([0-9a-f]{64})  (/.*)")
_DIR_LINE = re.compile(r"dir (/.*)")
_PATH_LINE = re.compile(r"path (/.*)")
_IMAGE_LINE = re.compile(r"image (sha256|sha384|sha512) (/.*)")
_DIGEST_LINE = re.compile(r"([0-9a-f]+)  (/.*)")
IMAGE_DIGEST_HEX = {"sha256": 64, "sha384": 96, "sha512": 128}


@dataclass(frozen=True)
class NodeStateRequest:
    """What to read besides the hardware, CPU, boot state and command line every node read has."""

    sysfs_root: str = "/sys"
    cmdline_path: str = "/proc/cmdline"
    driver_files: tuple[str, ...] = ()
    driver_units: tuple[str, ...] = ()
    sha256_paths: tuple[str, ...] = ()
    pve_files: tuple[str, ...] = ()
    vmids: tuple[int, ...] = ()
    # (algorithm, file name) of image files hashed in each storage's `import/`, unless `image_unless` exists.
    image_files: tuple[tuple[str, str], ...] = ()
    image_unless: str | None = None
    exporter_files: tuple[str, ...] = ()  # pvegpu's textfiles: with them, the `exporter` part
    model_store: str | None = None  # the node's model store (`model`): with it, the `model` part


@dataclass(frozen=True)
class NodeState:
    """The parsed read (module docstring). `sha256` is only for a path the read covered (`covers`)."""

    hardware: HostHardware
    cpu_kernel: CpuKernel
    boot: BootLoaderInfo
    boot_files: BootFiles
    driver: HostDriverState
    cmdline: tuple[str, ...]
    files_sha256: Mapping[str, str]
    fixed_paths: tuple[str, ...]
    snippet_dirs: tuple[str, ...]
    pve_files: Mapping[str, bytes | None] = field(default_factory=dict)
    qemu_processes: Mapping[int, QemuProcess] = field(default_factory=dict)
    image_algorithms: Mapping[str, str] = field(default_factory=dict)  # path -> algorithm it was hashed with
    image_digests: Mapping[str, str] = field(default_factory=dict)
    exporter: ExporterState | None = None  # None: not requested
    model: StoreRead | None = None  # None: not requested

    def image_digest(self, path: str, algorithm: str) -> str | None:
        """The `algorithm` digest of the image file at `path` (None: no such file). KeyError when the read did
        not hash `path` with `algorithm`."""
        if self.image_algorithms.get(path) != algorithm:
            raise KeyError(
                f"{path} ({algorithm}) is not in the node state read (pvegpu.run.node_state.node_request)"
            )
        return self.image_digests.get(path)

    def covers(self, path: str) -> bool:
        """Whether the read looked for `path`: a fixed path, or a `pvegpu-*` file in a snippets directory."""
        directory, name = posixpath.split(path)
        return path in self.fixed_paths or (
            directory in self.snippet_dirs and name.startswith(SNIPPET_PREFIX)
        )

    def sha256(self, path: str) -> str | None:
        """The sha256 of the file at `path` (None: no such file). KeyError for a path the read did not cover:
        deciding from a read that never looked would rewrite the file on every run."""
        if not self.covers(path):
            raise KeyError(f"{path} is not in the node state read (pvegpu.run.node_state.node_request)")
        return self.files_sha256.get(path)


def node_read_command(request: NodeStateRequest) -> str:
    """The one POSIX-sh command of the read (module docstring); a failing part exits with its status."""
    # `$(...)` keeps the listing's exit status (a pipe would give gzip's); its final newline is not needed.
    hardware = f"listing=$({hardware_command(request.sysfs_root)}\n) || exit $?\n"
    parts = {
        "hardware": hardware + f"printf '%s\\n' \"$listing\" | {PACK}\necho",
        "cpu": CpuAndKernel().command(),
        "boot": node_boot_command(),
        "driver": HostDriverFiles().command(request.driver_files, request.driver_units),
        "cmdline": KernelCmdline().command(request.cmdline_path),
        "sha256": files_sha256_command(
            request.sha256_paths, images=request.image_files, images_unless=request.image_unless
        ),
        **({"pve": pve_files_command(request.pve_files)} if request.pve_files else {}),
        **({"qemu": qemu_processes_command(request.vmids)} if request.vmids else {}),
        **(
            {"exporter": exporter_command(EXPORTER_PACKAGE, EXPORTER_SERVICE, request.exporter_files)}
            if request.exporter_files
            else {}
        ),
        **({"model": store_read_command(request.model_store)} if request.model_store is not None else {}),
    }
    lines = [
        f"echo {shlex.quote(PART_MARKER + name)}\n( {script}\n) || exit $?" for name, script in parts.items()
    ]
    return "\n".join([*lines, f"echo {shlex.quote(PART_MARKER + 'end')}"])


def files_sha256_command(
    paths: Sequence[str],
    storage_cfg: str = STORAGE_CFG,
    images: Sequence[tuple[str, str]] = (),
    images_unless: str | None = None,
) -> str:
    """The `sha256` part (module docstring): `paths`, then pvegpu's files in each storage's snippets dir and
    the `images` ((algorithm, file name)) in its import dir, unless the file `images_unless` exists."""
    fixed = " ".join(shlex.quote(path) for path in paths)
    hashed = "".join(
        f'  p="$d"/import/{shlex.quote(name)}; echo "image {algorithm} $p"; '
        f'if [ -f "$p" ]; then {algorithm}sum -- "$p"; fi\n'
        for algorithm, name in images
        if algorithm in IMAGE_DIGEST_HEX  # the only digests the parser takes: nothing else lands in a command
    )
    if hashed and images_unless is not None:
        hashed = f"  if [ ! -e {shlex.quote(images_unless)} ]; then\n{hashed}  fi\n"
    return (
        f'for f in {fixed}; do echo "path $f"; if [ -f "$f" ]; then sha256sum -- "$f"; fi; done\n'
        f'{{ echo {DEFAULT_STORAGE_DIR}; awk \'$1 == "path" {{ sub(/^[ \\t]*path[ \\t]+/, ""); print }}\' '
        f"{shlex.quote(storage_cfg)} 2>/dev/null; }} | sort -u | while IFS= read -r d; do\n"
        '  echo "dir $d/snippets"\n'
        f'  for f in "$d"/snippets/{SNIPPET_PREFIX}*; do if [ -f "$f" ]; then sha256sum -- "$f"; fi; done\n'
        f"{hashed}done"
    )


def pve_files_command(paths: Sequence[str]) -> str:
    """The `pve` part (module docstring)."""
    return (
        f"for f in {' '.join(shlex.quote(path) for path in paths)}; do "
        'if [ -f "$f" ] && c=$(base64 -w 0 < "$f"); then printf \'%s\\t%s\\n\' "$c" "$f"; '
        "else printf 'missing\\t%s\\n' \"$f\"; fi; done"
    )


def qemu_processes_command(vmids: Sequence[int], run_dir: str = QEMU_RUN_DIR) -> str:
    """The `qemu` part (module docstring); `run_dir`: where the pidfiles are (tests)."""
    return (
        f"for v in {' '.join(str(vmid) for vmid in vmids)}; do f={shlex.quote(run_dir)}/$v.pid\n"
        "  p=-; c=-; s=-; n=''\n"
        '  if [ -f "$f" ]; then n=$(head -n 1 "$f"); p=$(printf \'%s\' "$n" | base64 -w 0); fi\n'
        '  case $n in ""|*[!0-9]*) ;; *)\n'
        '    c=$(base64 -w 0 2>/dev/null < "/proc/$n/cmdline") || c=-\n'
        "    s=$(sed 's/.*) //' 2>/dev/null < \"/proc/$n/stat\" | cut -d ' ' -f 1); s=${s:--} ;;\n"
        "  esac\n"
        '  printf \'%s\\t%s\\t%s\\t%s\\n\' "$v" "$p" "$c" "$s"\n'
        "done"
    )


def parse_node_state(lines: Sequence[str]) -> NodeState:
    """The read's output -> NodeState. Pure; FactParseError naming the part that is missing or malformed."""
    parts = _split_parts(lines)
    hashes, fixed, dirs, images = _parse_sha256(parts["sha256"])
    return NodeState(
        hardware=parse_hardware(fact_errors(unpacked)(parts["hardware"], "node state hardware")),
        cpu_kernel=parse_cpu_kernel(parts["cpu"]),
        boot=(boot := parse_node_boot(parts["boot"]))[0],
        boot_files=boot[1],
        driver=parse_host_driver(parts["driver"]),
        cmdline=parse_cmdline(parts["cmdline"]),
        files_sha256=hashes,
        fixed_paths=fixed,
        snippet_dirs=dirs,
        pve_files=_parse_pve_files(parts.get("pve", [])),
        qemu_processes=parse_qemu_processes(parts.get("qemu", [])),
        image_algorithms=images[0],
        image_digests=images[1],
        exporter=_parse_exporter(parts.get("exporter")),
        model=None if "model" not in parts else parse_store_read(parts["model"]),
    )


def _parse_exporter(lines: Sequence[str] | None) -> ExporterState | None:
    return None if lines is None else parse_exporter(lines)


def _split_parts(lines: Sequence[str]) -> dict[str, list[str]]:
    printed = [n for n in PARTS if n not in OPTIONAL_PARTS or PART_MARKER + n in lines]
    parts: dict[str, list[str]] = {}
    current: list[str] | None = None
    for number, line in enumerate(lines, start=1):
        if line.startswith(PART_MARKER):
            name = line[len(PART_MARKER) :]
            expected = printed[len(parts)] if len(parts) < len(printed) else None
            if name != expected:
                raise FactParseError(
                    f"node state line {number}: {line!r} where {PART_MARKER}{expected} belongs"
                )
            current = parts[name] = []
        elif current is None or "end" in parts:
            raise FactParseError(f"node state line {number}: {line!r} outside the read's parts")
        else:
            current.append(line)
    if "end" not in parts:
        missing = printed[len(parts)]
        raise FactParseError(f"node state: truncated output, the {PART_MARKER}{missing} marker is missing")
    return parts


_Images = tuple[dict[str, str], dict[str, str]]  # path -> algorithm; path -> digest


def _parse_sha256(
    lines: Sequence[str],
) -> tuple[dict[str, str], tuple[str, ...], tuple[str, ...], _Images]:
    hashes: dict[str, str] = {}
    fixed: list[str] = []
    dirs: list[str] = []
    algorithms: dict[str, str] = {}
    digests: dict[str, str] = {}
    image: str | None = None  # the path of the `image` line just read: its digest line may follow
    for line in lines:
        last, image = image, None
        if match := _IMAGE_LINE.fullmatch(line):
            algorithms[image := match[2]] = match[1]
        elif last is not None and (match := _DIGEST_LINE.fullmatch(line)) and match[2] == last:
            if len(match[1]) != IMAGE_DIGEST_HEX[algorithms[last]]:
                raise FactParseError(f"node state sha256: not a {algorithms[last]} digest: {line!r}")
            digests[last] = match[1]
        elif match := _SHA256_LINE.fullmatch(line):
            hashes[match[2]] = match[1]
        elif match := _PATH_LINE.fullmatch(line):
            fixed.append(match[1])
        elif match := _DIR_LINE.fullmatch(line):
            dirs.append(match[1])
        elif line.strip():
            raise FactParseError(f"node state sha256: unexpected line {line!r}")
    return hashes, tuple(fixed), tuple(dirs), (algorithms, digests)


def _parse_pve_files(lines: Sequence[str]) -> dict[str, bytes | None]:
    files: dict[str, bytes | None] = {}
    for line in lines:
        head, tab, path = line.partition("\t")
        if not tab or not path.startswith("/"):
            raise FactParseError(f"node state pve: unexpected line {line!r}")
        try:
            files[path] = None if head == "missing" else base64.b64decode(head, validate=True)
        except ValueError:
            raise FactParseError(f"node state pve: {path} is not in base64") from None
    return files


def parse_qemu_processes(lines: Sequence[str]) -> dict[int, QemuProcess]:
    """The `qemu` part's lines -> per vmid its `QemuProcess`. Pure; FactParseError for another line."""
    found: dict[int, QemuProcess] = {}
    for line in lines:
        fields = line.split("\t")
        try:
            if len(fields) != 4 or not re.fullmatch(r"[0-9]{1,9}", fields[0]):
                raise ValueError(line)
            pidfile, cmdline = (None if f == "-" else base64.b64decode(f, validate=True) for f in fields[1:3])
        except ValueError:
            raise FactParseError(f"node state qemu: unexpected line {line!r}") from None
        state = None if fields[3] == "-" else fields[3]
        found[int(fields[0])] = QemuProcess(pidfile, cmdline, state)
    return found


class NodeRead(FactBase[NodeState]):
    """`host.get_fact(NodeRead, request=NodeStateRequest(...))`: the node's state (module docstring)."""

    @override
    def command(self, request: NodeStateRequest) -> str:
        return node_read_command(request)

    @override
    def process(self, output: list[str]) -> NodeState:
        return parse_node_state(output)


class ImageDigest(FactBase[str | None]):
    """`host.get_fact(ImageDigest, path=..., algorithm=...)`: the `algorithm` (sha256, sha384, sha512)
    digest of the image file at `path` (None: not a file), for an image the node read did not hash."""

    @override
    def command(self, path: str, algorithm: str) -> str:
        if algorithm not in IMAGE_DIGEST_HEX:
            raise ValueError(f"{algorithm} is not a digest pvegpu hashes images with")
        quoted = shlex.quote(path)
        return f"if [ -f {quoted} ]; then {algorithm}sum -- {quoted}; fi"

    @override
    def process(self, output: list[str]) -> str | None:
        return parse_image_digest(output)


def parse_image_digest(lines: Sequence[str]) -> str | None:
    """`ImageDigest`'s output -> the digest, None for no output; FactParseError for another line."""
    for line in lines:
        match = _DIGEST_LINE.fullmatch(line)
        if match is None or len(match[1]) not in IMAGE_DIGEST_HEX.values():
            raise FactParseError(f"image digest: unexpected line {line!r}")
        return match[1]
    return None
