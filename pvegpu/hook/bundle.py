"""The hook as the node gets it: a zipapp of the pvegpu modules it needs, and the wrapper Proxmox runs.

Why a zipapp (PEP 441) of pvegpu's own source files, built on the operator's machine: the hook must decide
with the same code the operator's run uses (parser, topology, mapping plan), at that version, with the node's
own python3 (Debian 12: 3.11, 13: 3.13) and no network. Those modules are stdlib-only (an import-linter
contract keeps them so), so no wheel, venv or dependency goes to the node: one file, ~100 KiB, that
`python3` runs directly. The archive is deterministic (stored, sorted, fixed timestamps), so its sha256
changes only when a module's source does: a run with the same pvegpu writes nothing.

- `modules()`: the entry module and every `pvegpu` module it imports, transitively (imports under
  `if TYPE_CHECKING:` do not count: they never run); raises BundleError naming a module that imports a
  package outside the standard library;
- `build()`: the zipapp bytes (`__main__.py` runs `pvegpu.hook.main`) of `HOOK_MODULES`: what `modules()`
  finds, written down so that a run reads no source to find it (the walk took ~30 ms of every run's CPU);
  a unit test holds the two equal, so a new import in the hook fails the tests until the list has it;
- `wrapper(...)`: the hookscript itself, a POSIX sh script naming the pvegpu version and the bundle's sha256.
  It runs the bundle only on `pre-start` and only when the file's sha256 is the one pvegpu wrote: anything
  else at that path is not run (root runs the hookscript); the start then goes on without pvegpu's repair,
  with one line (`mismatch_line`) in the start's task log (stdout, which Proxmox's run_command logs) and in
  the journal (`logger`), and Proxmox's own mapping check decides, as without the hook.
"""

from __future__ import annotations

import ast
import hashlib
import io
import shlex
import sys
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from pvegpu.hook.main import JOURNAL_TAG

ENTRY = "pvegpu.hook.main"
BUNDLE_PATH = "/usr/local/lib/pvegpu/pvegpu-hook.pyz"
PYTHON = "/usr/bin/python3"
_MAIN = "import sys\n\nfrom pvegpu.hook.main import main\n\nsys.exit(main())\n"
_EPOCH = (1980, 1, 1, 0, 0, 0)


HOOK_MODULES = (
    "pvegpu",
    "pvegpu.facts",
    "pvegpu.facts.hardware_parse",
    "pvegpu.facts.parsing",
    "pvegpu.facts.pci_cfg",
    "pvegpu.facts.section_config",
    "pvegpu.hook",
    "pvegpu.hook.decide",
    "pvegpu.hook.live_gauges",
    "pvegpu.hook.main",
    "pvegpu.hook.pre_start",
    "pvegpu.hook.pvesh",
    "pvegpu.models",
    "pvegpu.models.exporter",
    "pvegpu.models.hardware",
    "pvegpu.models.pve",
    "pvegpu.plan",
    "pvegpu.plan.errors",
    "pvegpu.plan.gauges",
    "pvegpu.plan.heal",
    "pvegpu.plan.mapping",
    "pvegpu.plan.ownership",
    "pvegpu.plan.topology",
)


class BundleError(RuntimeError):
    """The hook's modules cannot be bundled (one imports a package the node's python3 does not have)."""


@dataclass(frozen=True)
class Bundle:
    """The zipapp's bytes, their sha256, and the pvegpu version they were built from."""

    data: bytes
    sha256: str
    version: str


def modules(entry: str = ENTRY) -> tuple[str, ...]:
    """Every module the hook runs, sorted; packages' `__init__` included (module docstring)."""
    root = Path(__file__).resolve().parents[2]
    seen: set[str] = set()
    todo = [entry]
    while todo:
        name = todo.pop()
        for package in _packages(name):
            if package not in seen:
                seen.add(package)
                todo.extend(_imports(root, package))
    return tuple(sorted(seen))


def build() -> Bundle:
    """The zipapp of `HOOK_MODULES` (module docstring)."""
    root = Path(__file__).resolve().parents[2]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        files = {
            _source(root, name).relative_to(root).as_posix(): _source(root, name) for name in HOOK_MODULES
        }
        entries = {**{name: path.read_bytes() for name, path in files.items()}, "__main__.py": _MAIN.encode()}
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, _EPOCH)
            info.external_attr = 0o100644 << 16
            archive.writestr(info, entries[name])
    data = buffer.getvalue()
    return Bundle(data, hashlib.sha256(data).hexdigest(), _version())


def wrapper(
    bundle: Bundle,
    *,
    mode: str,
    prefix: str,
    owner: str,
    sysfs_root: str,
    bundle_path: str = BUNDLE_PATH,
    python: str = PYTHON,
) -> str:
    """The hookscript: on `pre-start`, `exec python3 BUNDLE_PATH --mode ... "$@"` (Proxmox adds `<vmid>
    <phase>`) when the bundle's sha256 is `bundle.sha256`, else `mismatch_line` and exit 0 (module docstring);
    other phases exit 0 at once. `owner`: the id in pvegpu's mark (the hook repairs only mappings that carry
    it). `bundle_path` and `python` are for tests."""
    options = ["--mode", mode, "--prefix", prefix, "--owner", owner, "--sysfs-root", sysfs_root]
    command = shlex.join([python, bundle_path, *options])
    line = mismatch_line("$1", bundle_path, bundle)
    return (
        "#!/bin/sh\n"
        f"# pvegpu {bundle.version} pre-start hookscript, written by pvegpu (a run rewrites it).\n"
        f"# bundle {bundle_path} sha256 {bundle.sha256}\n"
        '[ "$2" = pre-start ] || exit 0\n'
        f"sum=$(sha256sum 2>/dev/null < {shlex.quote(bundle_path)}) || sum=\n"
        f'if [ "${{sum%% *}}" != {bundle.sha256} ]; then\n'
        f'  line="{line}"\n'
        '  echo "$line"\n'
        f'  logger -t {JOURNAL_TAG} -- "$line" 2>/dev/null || :\n'
        "  exit 0\n"
        "fi\n"
        f'exec {command} "$@"\n'
    )


def mismatch_line(vmid: str, bundle_path: str, bundle: Bundle) -> str:
    """The wrapper's line when the bundle at `bundle_path` is not `bundle` (missing, or other bytes)."""
    return (
        f"pvegpu: VM {vmid}: {bundle_path} is not the hook pvegpu {bundle.version} installed (sha256 "
        f"{bundle.sha256[:12]}), so it is not run; the start goes on without pvegpu's repair and Proxmox's "
        "own mapping check decides; a pvegpu run on the node reinstalls it"
    )


def _version() -> str:
    try:
        return metadata.version("pvegpu")
    except metadata.PackageNotFoundError:
        return "unknown"


def _packages(name: str) -> list[str]:
    """`pvegpu.plan.heal` -> its packages and itself: pvegpu, pvegpu.plan, pvegpu.plan.heal."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _source(root: Path, name: str) -> Path:
    path = root.joinpath(*name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _imports(root: Path, name: str) -> list[str]:
    """The `pvegpu` modules `name` imports at run time; BundleError for a package outside the stdlib."""
    tree = ast.parse(_source(root, name).read_text(encoding="utf-8"))
    found: list[str] = []
    for node in _runtime_nodes(tree.body):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            base = node.module
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            top = target.split(".")[0]
            if top == "pvegpu":
                if _source(root, target).exists():
                    found.append(target)
            elif top not in sys.stdlib_module_names and top != "__future__":
                raise BundleError(f"{name} imports {target}, which the node's python3 does not have")
    return found


def _runtime_nodes(body: list[ast.stmt]) -> list[ast.AST]:
    """Every statement of `body`, nested blocks and function bodies included (a lazy import runs too), but
    not the blocks of `if TYPE_CHECKING:` (only the type checker reads them). Imports are statements, so
    expressions are not walked: a run builds the bundle, and walking every node took most of its time."""
    nodes: list[ast.AST] = []
    todo: list[ast.AST] = list(body)
    while todo:
        node = todo.pop()
        nodes.append(node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        for block in _BLOCKS:
            todo.extend(getattr(node, block, ()))
    return nodes


# The fields that hold nested statements (`handlers`: except clauses, `cases`: match cases, each with a body).
_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")
