"""The node's pre-start hook (pvegpu/hook): its decision and exact lines on the lab's generated trees (it
repairs only mappings that carry pvegpu's mark), the zipapp run by the node's python3 against a temporary
/etc/pve and a recording `pvesh`, the bundle's contents, the install operation, and the VM's `hookscript`
key (plan/vm.py)."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import syslog
import time
import zipfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyinfra.api.command import FileUploadCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.context import ctx_host

from lab.fakesys import write_tree
from pvegpu.facts.hardware import read_hardware_locally
from pvegpu.facts.node_read import NodeRead
from pvegpu.facts.pci_cfg import render_pci_cfg
from pvegpu.hook import main as main_module
from pvegpu.hook import pre_start as pre_start_module
from pvegpu.hook.bundle import BUNDLE_PATH, HOOK_MODULES, PYTHON, Bundle, BundleError, build, modules, wrapper
from pvegpu.hook.decide import FIX_COMMAND, Mode, Start, decide, mapped_ids
from pvegpu.models.hardware import HostHardware
from pvegpu.models.node import NodeSpec
from pvegpu.models.pve import PciMapping, StorageConfig
from pvegpu.models.vm import VmSpec
from pvegpu.operations.hook import directory_check, hook_installed, self_heal, shared_storage_refusal
from pvegpu.plan.mapping import plan_mappings
from pvegpu.plan.ownership import owner_line
from pvegpu.plan.topology import plan_vendor_topology
from pvegpu.plan.vm import create_keys, diff_vm, vm_config
from tests.unit.op_harness import NODE_DATA, FakeHost, node_state, run_op

NAMES = ("reference", "reference-renumbered", "reference-missing-gpu")
CONFIG = "boot: order=scsi0\nhostpci0: mapping=gpu0,pcie=1\nhostpci1: 0000:99:00\n" + "".join(
    f"hostpci{n}: mapping=gpu{n},pcie=1\n" for n in range(2, 8)
)
CONFIG_8 = "".join(f"hostpci{n}: mapping=gpu{n},pcie=1\n" for n in range(8)) + "name: llm\n"
RENUMBERED = [
    "pvegpu: gpu0 pve1: 0000:41:00 group 14 -> 0000:21:00 group 16, repaired",
    "pvegpu: gpu1 pve1: 0000:51:00 group 17 -> 0000:31:00 group 19, repaired",
    "pvegpu: gpu2 pve1: 0000:61:00 group 20 -> 0000:41:00 group 22, repaired",
    "pvegpu: gpu3 pve1: 0000:71:00 group 23 -> 0000:51:00 group 25, repaired",
    "pvegpu: gpu4 pve1: 0000:c1:00 group 29 -> 0000:a1:00 group 31, repaired",
    "pvegpu: gpu5 pve1: 0000:d1:00 group 32 -> 0000:b1:00 group 34, repaired",
    "pvegpu: gpu6 pve1: 0000:e1:00 group 35 -> 0000:c1:00 group 37, repaired",
    "pvegpu: gpu7 pve1: 0000:f1:00 group 38 -> 0000:d1:00 group 40, repaired",
]
OWNER = "lab"
REPAIR = Start(100, "pve1", Mode.REPAIR, "gpu", OWNER)


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sys")
    for name in NAMES:
        write_tree(root / name, name)
    return {name: root / name for name in NAMES}


@pytest.fixture(scope="module")
def hw(trees: dict[str, Path]) -> dict[str, HostHardware]:
    return {name: read_hardware_locally(path) for name, path in trees.items()}


def mapped(hw: HostHardware, node: str = "pve1", unmarked: str = "") -> tuple[PciMapping, ...]:
    """pvegpu's mappings of `hw` on `node`, marked as pvegpu writes them, but `unmarked` (an id)."""
    return tuple(
        m if m.id == unmarked else replace(m, description=owner_line(OWNER))
        for m in plan_mappings({node: plan_vendor_topology(hw, "10de")})
    )


def test_mapped_ids_are_the_current_sections_mapping_keys_in_hostpci_order() -> None:
    text = "hostpci10: mapping=gpu9\nhostpci2: host=0000:41:00\nhostpci1: mapping=gpu0,pcie=1\n[snap]\n"
    text += "hostpci3: mapping=gpu5\n"
    assert mapped_ids(text) == ("gpu0", "gpu9")
    assert mapped_ids(CONFIG) == tuple(f"gpu{n}" for n in (0, 2, 3, 4, 5, 6, 7))


def test_noop_valid_mappings_one_line_nothing_to_write(hw: dict[str, HostHardware]) -> None:
    decision = decide(REPAIR, CONFIG_8, mapped(hw["reference"]), hw["reference"])
    assert decision.lines == ("pvegpu: VM 100 on pve1: 8 GPU mappings valid",)
    assert (decision.repairs, decision.refused) == ((), False)


def test_bios_renumbered_repair_writes_every_mapping_with_the_new_lines(hw: dict[str, HostHardware]) -> None:
    old = mapped(hw["reference"])
    decision = decide(REPAIR, CONFIG_8, old, hw["reference-renumbered"])
    assert list(decision.lines) == RENUMBERED
    assert decision.refused is False
    new = mapped(hw["reference-renumbered"])
    assert [(r.mapping, r.old, r.new) for r in decision.repairs] == [
        (o.id, o.map, n.map) for o, n in zip(old, new, strict=True)
    ]


def test_bios_renumbered_check_mode_refuses_with_the_repair_it_would_make(
    hw: dict[str, HostHardware],
) -> None:
    decision = decide(
        replace(REPAIR, mode=Mode.CHECK), CONFIG_8, mapped(hw["reference"]), hw["reference-renumbered"]
    )
    assert decision.lines[0] == "pvegpu: gpu0 pve1: 0000:41:00 group 14 -> 0000:21:00 group 16 (renumbered)"
    assert decision.lines[-1] == (
        "pvegpu: VM 100 not started: vm.self_heal is check, so nothing is written; to repair, run: "
        "pyinfra inventory.py deploy/rebuild_vm.py"
    )
    assert (len(decision.lines), decision.repairs, decision.refused) == (9, (), True)


def test_error_missing_gpu_refuses_naming_the_gpu_and_the_fix(hw: dict[str, HostHardware]) -> None:
    decision = decide(REPAIR, CONFIG_8, mapped(hw["reference"]), hw["reference-missing-gpu"])
    missing = "7 GPUs found for 8 mappings of pve1: a card is missing"
    assert (
        decision.lines[3]
        == f"pvegpu: gpu3 pve1: 0000:71:00 group 23: no device there now; {missing}, not repaired"
    )
    assert decision.lines[-1] == (
        "pvegpu: VM 100 not started: the GPUs of pve1 changed, not only their numbers; check the hardware, "
        f"then run: {FIX_COMMAND}"
    )
    assert (decision.repairs, decision.refused) == ((), True)


HELD = "is a renumbering, but gpu3 of pve1 is not pvegpu's, not repaired"


@pytest.mark.parametrize(
    ("description", "found"), [(None, "no pvegpu mark"), ("pvegpu-owner: other", "pvegpu-owner: other")]
)
def test_error_unmarked_drifted_mapping_is_not_repaired_and_the_start_refused(
    hw: dict[str, HostHardware], description: str | None, found: str
) -> None:
    old = [replace(m, description=description) if m.id == "gpu3" else m for m in mapped(hw["reference"])]
    decision = decide(REPAIR, CONFIG_8, old, hw["reference-renumbered"])
    assert list(decision.lines) == [
        f"pvegpu: gpu0 pve1: 0000:41:00 group 14 -> 0000:21:00 group 16 {HELD}",
        f"pvegpu: gpu1 pve1: 0000:51:00 group 17 -> 0000:31:00 group 19 {HELD}",
        f"pvegpu: gpu2 pve1: 0000:61:00 group 20 -> 0000:41:00 group 22 {HELD}",
        "pvegpu: gpu3 pve1: 0000:71:00 group 23 -> 0000:51:00 group 25 is a renumbering, but mapping gpu3 is "
        f"not pvegpu's ({found}; mapping.adopt: true adopts it), not repaired",
        f"pvegpu: gpu4 pve1: 0000:c1:00 group 29 -> 0000:a1:00 group 31 {HELD}",
        f"pvegpu: gpu5 pve1: 0000:d1:00 group 32 -> 0000:b1:00 group 34 {HELD}",
        f"pvegpu: gpu6 pve1: 0000:e1:00 group 35 -> 0000:c1:00 group 37 {HELD}",
        f"pvegpu: gpu7 pve1: 0000:f1:00 group 38 -> 0000:d1:00 group 40 {HELD}",
        "pvegpu: VM 100 not started: pvegpu repairs only its own mappings, and gpu3 lacks its mark; to let "
        "pvegpu repair it, set mapping.adopt: true, then run: pyinfra inventory.py deploy/rebuild_vm.py",
    ]
    assert (decision.repairs, decision.refused) == ((), True)


def test_unmarked_mappings_still_valid_start_with_nothing_written(hw: dict[str, HostHardware]) -> None:
    """The mark is asked of a repair only: valid mappings without it are Proxmox's to check, as before."""
    old = [replace(m, description=None) for m in mapped(hw["reference"])]
    decision = decide(REPAIR, CONFIG_8, old, hw["reference"])
    assert decision == decide(REPAIR, CONFIG_8, mapped(hw["reference"]), hw["reference"])
    assert (decision.repairs, decision.refused) == ((), False)


def test_vm_without_pvegpu_mappings_is_left_to_proxmox(hw: dict[str, HostHardware]) -> None:
    decision = decide(REPAIR, "hostpci0: 0000:41:00\n", mapped(hw["reference"]), hw["reference-missing-gpu"])
    assert (decision.lines, decision.refused) == (
        ("pvegpu: VM 100 maps no gpu<N> mapping: nothing to check",),
        False,
    )


def test_error_vm_mapping_absent_from_pci_cfg(hw: dict[str, HostHardware]) -> None:
    decision = decide(REPAIR, "hostpci0: mapping=gpu8\n", mapped(hw["reference"]), hw["reference"])
    assert decision.lines == (f"pvegpu: VM 100: no mapping gpu8 in pci.cfg; run: {FIX_COMMAND}",)
    assert decision.refused is True


# --- the zipapp, run by the node's python3 ------------------------------------------------------------------

PVESH = """#!/bin/sh
printf '%s\\n' "$*" >> "$(dirname "$0")/calls"
if [ -e "$(dirname "$0")/fail" ]; then
  echo "update hardware mapping failed: detected modified configuration - file changed by other user?" \
    "Try again." >&2
  exit 255
fi
"""


@pytest.fixture(scope="module")
def zipapp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("hook") / "pvegpu-hook.pyz"
    path.write_bytes(build().data)
    return path


def node_root(tmp: Path, hw: HostHardware, config: str = CONFIG_8, unmarked: str = "") -> tuple[Path, Path]:
    """A /etc/pve with VM 100 and this machine's node name in pci.cfg (each mapping marked, but `unmarked`),
    and a recording pvesh."""
    node = os.uname().nodename.split(".")[0]
    (tmp / "etc/pve/qemu-server").mkdir(parents=True)
    (tmp / "etc/pve/mapping").mkdir(parents=True)
    (tmp / "etc/pve/qemu-server/100.conf").write_text(config)
    (tmp / "etc/pve/mapping/pci.cfg").write_text(render_pci_cfg(mapped(hw, node, unmarked)))
    pvesh = tmp / "bin/pvesh"
    pvesh.parent.mkdir()
    pvesh.write_text(PVESH)
    pvesh.chmod(0o755)
    return tmp, pvesh


def run_hook(
    zipapp: Path, root: Path, pvesh: Path, sysfs: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    argv = [PYTHON, str(zipapp), "--pve-root", str(root), "--sysfs-root", str(sysfs), "--pvesh", str(pvesh)]
    argv += ["--owner", OWNER]
    return subprocess.run([*argv, *args], capture_output=True, text=True, check=False, timeout=60)


def test_zipapp_other_phases_exit_zero_silently(zipapp: Path, tmp_path: Path) -> None:
    done = run_hook(zipapp, tmp_path, tmp_path / "pvesh", tmp_path, "100", "post-start")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_zipapp_repairs_through_pvesh_with_the_files_digest(
    zipapp: Path, trees: dict[str, Path], hw: dict[str, HostHardware], tmp_path: Path
) -> None:
    root, pvesh = node_root(tmp_path, hw["reference"])
    cfg = root / "etc/pve/mapping/pci.cfg"
    digest = hashlib.sha1(cfg.read_bytes()).hexdigest()
    done = run_hook(zipapp, root, pvesh, trees["reference-renumbered"], "100", "pre-start")
    node = os.uname().nodename.split(".")[0]
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [line.replace(" pve1: ", f" {node}: ") for line in RENUMBERED]
    new = mapped(hw["reference-renumbered"], node)
    assert (tmp_path / "bin/calls").read_text().splitlines() == [
        f"set /cluster/mapping/pci/{m.id} --map {m.map[0]} --digest {digest}" for m in new
    ]


def test_error_zipapp_does_not_repair_an_unmarked_mapping(
    zipapp: Path, trees: dict[str, Path], hw: dict[str, HostHardware], tmp_path: Path
) -> None:
    root, pvesh = node_root(tmp_path, hw["reference"], unmarked="gpu5")
    done = run_hook(zipapp, root, pvesh, trees["reference-renumbered"], "100", "pre-start")
    node = os.uname().nodename.split(".")[0]
    assert (done.returncode, done.stderr) == (1, "")
    assert done.stdout.splitlines()[5] == (
        f"pvegpu: gpu5 {node}: 0000:d1:00 group 32 -> 0000:b1:00 group 34 is a renumbering, but mapping gpu5 "
        "is not pvegpu's (no pvegpu mark; mapping.adopt: true adopts it), not repaired"
    )
    assert done.stdout.splitlines()[-1] == (
        "pvegpu: VM 100 not started: pvegpu repairs only its own mappings, and gpu5 lacks its mark; to let "
        "pvegpu repair it, set mapping.adopt: true, then run: pyinfra inventory.py deploy/rebuild_vm.py"
    )
    assert not (tmp_path / "bin/calls").exists()


def test_error_zipapp_concurrent_edit_is_not_overwritten(
    zipapp: Path, trees: dict[str, Path], hw: dict[str, HostHardware], tmp_path: Path
) -> None:
    root, pvesh = node_root(tmp_path, hw["reference"])
    (tmp_path / "bin/fail").write_text("")
    done = run_hook(zipapp, root, pvesh, trees["reference-renumbered"], "100", "pre-start")
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1] == (
        "pvegpu: VM 100 not started: gpu0 not repaired: pvesh set /cluster/mapping/pci/gpu0: update "
        "hardware mapping failed: detected modified configuration - file changed by other user? Try again.; "
        "nothing was overwritten, the next start decides again"
    )


def test_zipapp_unreadable_hardware_leaves_the_start_to_proxmox(
    zipapp: Path, hw: dict[str, HostHardware], tmp_path: Path
) -> None:
    root, pvesh = node_root(tmp_path, hw["reference"])
    done = run_hook(zipapp, root, pvesh, tmp_path / "no-sys", "100", "pre-start")
    assert done.returncode == 0
    assert done.stdout == (
        f"pvegpu: VM 100: nothing checked (hardware command failed (exit 1): pvegpu: sysfs root "
        f"{tmp_path / 'no-sys'} is not a readable directory); Proxmox's own check decides\n"
    )
    assert not (tmp_path / "bin/calls").exists()


# --- the bundle --------------------------------------------------------------------------------------------


def test_bundle_holds_the_hooks_stdlib_only_modules_and_is_deterministic() -> None:
    """The list a run bundles is what the hook imports (a new import fails here until HOOK_MODULES has it)."""
    assert modules() == HOOK_MODULES
    assert "pvegpu.plan.heal" in HOOK_MODULES
    packages = {"pvegpu", "pvegpu.facts", "pvegpu.hook", "pvegpu.models", "pvegpu.plan"}
    files = [
        name.replace(".", "/") + ("/__init__.py" if name in packages else ".py") for name in HOOK_MODULES
    ]
    assert zipfile.ZipFile(io.BytesIO(build().data)).namelist() == sorted(["__main__.py", *files])
    assert build().sha256 == build().sha256


def test_error_bundle_refuses_a_module_that_needs_a_third_party_package() -> None:
    with pytest.raises(BundleError) as error:
        modules("pvegpu.models.vm")
    assert str(error.value) == "pvegpu.models.vm imports pydantic, which the node's python3 does not have"


def test_wrapper_names_the_version_and_the_bundle_it_runs_once_its_sha256_matches() -> None:
    bundle = Bundle(b"zip", "ab" * 32, "0.1.0")
    assert wrapper(bundle, mode="check", prefix="gpu", owner="dc-1", sysfs_root="/opt/sys") == (
        "#!/bin/sh\n"
        "# pvegpu 0.1.0 pre-start hookscript, written by pvegpu (a run rewrites it).\n"
        f"# bundle {BUNDLE_PATH} sha256 {'ab' * 32}\n"
        '[ "$2" = pre-start ] || exit 0\n'
        f"sum=$(sha256sum 2>/dev/null < {BUNDLE_PATH}) || sum=\n"
        f'if [ "${{sum%% *}}" != {"ab" * 32} ]; then\n'
        f'  line="pvegpu: VM $1: {BUNDLE_PATH} is not the hook pvegpu 0.1.0 installed (sha256 '
        "abababababab), so it is not run; the start goes on without pvegpu's repair and Proxmox's own "
        'mapping check decides; a pvegpu run on the node reinstalls it"\n'
        '  echo "$line"\n'
        '  logger -t pvegpu-hook -- "$line" 2>/dev/null || :\n'
        "  exit 0\n"
        "fi\n"
        f"exec /usr/bin/python3 {BUNDLE_PATH} --mode check --prefix gpu --owner dc-1 --sysfs-root /opt/sys "
        '"$@"\n'
    )


def run_wrapper(tmp: Path, data: bytes | None, phase: str = "pre-start") -> subprocess.CompletedProcess[str]:
    """The wrapper of the real bundle, run by sh as Proxmox runs it, with the file at its bundle path holding
    `data` (None: no file) and a `logger` that records its arguments (the journal)."""
    bundle = build()
    bundle_path = tmp / "lib/pvegpu-hook.pyz"
    bundle_path.parent.mkdir(parents=True, exist_ok=True)
    if data is not None:
        bundle_path.write_bytes(data)
    script = tmp / "pvegpu-hook"
    script.write_text(
        wrapper(
            bundle,
            mode="repair",
            prefix="gpu",
            owner=OWNER,
            sysfs_root=str(tmp / "no-sys"),
            bundle_path=str(bundle_path),
            python=PYTHON,
        )
    )
    script.chmod(0o755)
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "logger").write_text('#!/bin/sh\nprintf \'%s\\n\' "$*" >> "$(dirname "$0")/journal"\n')
    (bin_dir / "logger").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return subprocess.run(
        ["/bin/sh", str(script), "100", phase],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env=env,
    )


def mismatch(tmp: Path) -> str:
    return (
        f"pvegpu: VM 100: {tmp / 'lib/pvegpu-hook.pyz'} is not the hook pvegpu {build().version} installed "
        f"(sha256 {build().sha256[:12]}), so it is not run; the start goes on without pvegpu's repair and "
        "Proxmox's own mapping check decides; a pvegpu run on the node reinstalls it"
    )


def test_error_wrapper_does_not_run_a_bundle_of_other_bytes_and_the_start_goes_on(tmp_path: Path) -> None:
    done = run_wrapper(tmp_path, build().data + b"#")
    assert (done.returncode, done.stdout, done.stderr) == (0, mismatch(tmp_path) + "\n", "")
    assert (tmp_path / "bin/journal").read_text() == f"-t pvegpu-hook -- {mismatch(tmp_path)}\n"


def test_error_wrapper_with_the_bundle_missing_lets_the_start_go_on(tmp_path: Path) -> None:
    done = run_wrapper(tmp_path, None)
    assert (done.returncode, done.stdout, done.stderr) == (0, mismatch(tmp_path) + "\n", "")
    assert (tmp_path / "bin/journal").read_text() == f"-t pvegpu-hook -- {mismatch(tmp_path)}\n"


def test_wrapper_runs_the_bundle_whose_sha256_matches(tmp_path: Path) -> None:
    done = run_wrapper(tmp_path, build().data)
    assert done.returncode == 0
    assert done.stdout.startswith("pvegpu: VM 100: nothing checked (")  # the bundle ran: no /etc/pve here
    assert not (tmp_path / "bin/journal").exists()


def test_wrapper_other_phases_exit_zero_silently_without_reading_the_bundle(tmp_path: Path) -> None:
    done = run_wrapper(tmp_path, None, "post-stop")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_error_unexpected_exception_lets_the_start_go_on_with_one_journal_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    journal: list[tuple[int, str]] = []

    def broken(*_args: object, **_kwargs: object) -> int:
        raise RuntimeError("first line\n  second line")

    monkeypatch.setattr(pre_start_module, "pre_start", broken)
    monkeypatch.setattr(syslog, "openlog", lambda ident: journal.append((-1, ident)))
    monkeypatch.setattr(syslog, "syslog", lambda priority, line: journal.append((priority, line)))
    assert main_module.main(["--mode", "repair", "100", "pre-start"]) == 0
    line = (
        "pvegpu: VM 100: the hook failed (RuntimeError: first line; second line); the start goes on without "
        "pvegpu's repair and Proxmox's own mapping check decides"
    )
    assert capsys.readouterr().out == line + "\n"
    assert journal == [(-1, "pvegpu-hook"), (syslog.LOG_WARNING, line)]


# --- the install operation ---------------------------------------------------------------------------------


HOOK = "/var/lib/vz/snippets/pvegpu-hook"


def install(sums: dict[str, str | None], bundle: Bundle, text: str) -> tuple[list[object], list[str]]:
    """hook_installed on a node whose state read found `sums` (path -> sha256; None: no such file)."""
    found = {path: sha256 for path, sha256 in sums.items() if sha256 is not None}
    return run_op(  # type: ignore[return-value]
        hook_installed,
        {NodeRead: node_state(files_sha256=found)},
        bundle=bundle,
        wrapper_path=HOOK,
        wrapper=text,
    )


def test_noop_hook_installed_when_both_files_match() -> None:
    bundle = Bundle(b"zip", hashlib.sha256(b"zip").hexdigest(), "0.1.0")
    text = wrapper(bundle, mode="repair", prefix="gpu", owner=OWNER, sysfs_root="/sys")
    sums: dict[str, str | None] = {
        BUNDLE_PATH: bundle.sha256,
        HOOK: hashlib.sha256(text.encode()).hexdigest(),
    }
    assert install(sums, bundle, text) == (
        [],
        [f"pvegpu 0.1.0 hook is installed: {HOOK}, {BUNDLE_PATH} ({bundle.sha256[:12]})"],
    )


def test_create_hook_uploads_the_bundle_staged_and_writes_the_wrapper_0755() -> None:
    bundle = Bundle(b"zip", hashlib.sha256(b"zip").hexdigest(), "0.1.0")
    text = wrapper(bundle, mode="repair", prefix="gpu", owner=OWNER, sysfs_root="/sys")
    commands, noops = install({BUNDLE_PATH: None, HOOK: None}, bundle, text)
    assert noops == []
    assert commands[:3] == [
        "mkdir -p /var/lib/vz/snippets /usr/local/lib/pvegpu",
        '[ -n "$(find /var/lib/vz/snippets -maxdepth 0 -type d -user 0 ! -perm /022)" ] || { echo \'pvegpu: '
        "/var/lib/vz/snippets must be owned by root and not writable by group or others to hold the "
        "pre-start hookscript, so nothing was written; run: chown root:root /var/lib/vz/snippets && chmod "
        "go-w /var/lib/vz/snippets' >&2 ; exit 1 ; }",
        '[ -n "$(find /usr/local/lib/pvegpu -maxdepth 0 -type d -user 0 ! -perm /022)" ] || { echo \'pvegpu: '
        "/usr/local/lib/pvegpu must be owned by root and not writable by group or others to hold the "
        "pre-start hookscript, so nothing was written; run: chown root:root /usr/local/lib/pvegpu && chmod "
        "go-w /usr/local/lib/pvegpu' >&2 ; exit 1 ; }",
    ]
    del commands[:2]
    upload = commands[1]
    assert isinstance(upload, FileUploadCommand)
    assert isinstance(upload.src, io.BytesIO)
    assert (upload.src.getvalue(), upload.dest) == (
        b"zip",
        "/usr/local/lib/pvegpu/.pvegpu-hook.pyz.pvegpu-new",
    )
    staged = "/usr/local/lib/pvegpu/.pvegpu-hook.pyz.pvegpu-new"
    assert commands[2] == (
        f"{{ chmod 0644 {staged} && chown root:root {staged} && sync {staged} && printf '%s  %s\n' "
        f"{bundle.sha256} {staged} | sha256sum --check --status && mv -f {staged} {BUNDLE_PATH} && sync "
        f"/usr/local/lib/pvegpu ; }} || {{ rm -f {staged} ; echo 'pvegpu: could not write {BUNDLE_PATH} "
        "(left unchanged)' >&2 ; exit 1 ; }"
    )
    assert "chmod 0755 /var/lib/vz/snippets/.pvegpu-hook.pvegpu-new" in str(commands[3])
    assert len(commands) == 4


def test_error_directory_check_refuses_a_directory_others_can_write(tmp_path: Path) -> None:
    directory = tmp_path / "snippets"
    directory.mkdir()
    check = directory_check(str(directory)).get_raw_value()
    directory.chmod(0o755)
    ok = subprocess.run(["/bin/sh", "-c", check], capture_output=True, text=True, check=False)
    directory.chmod(0o777)
    wide = subprocess.run(["/bin/sh", "-c", check], capture_output=True, text=True, check=False)
    assert (ok.returncode, ok.stderr) == (0, "") if os.geteuid() == 0 else ok.returncode == 1
    assert (wide.returncode, wide.stderr) == (
        1,
        f"pvegpu: {directory} must be owned by root and not writable by group or others to hold the "
        f"pre-start hookscript, so nothing was written; run: chown root:root {directory} && chmod go-w "
        f"{directory}\n",
    )


# --- the snippets storage ----------------------------------------------------------------------------------


def storage(kind: str, *, shared: bool = False) -> StorageConfig:
    return StorageConfig("store", ("snippets",), "/mnt/pve/store", "d" * 40, type=kind, shared=shared)


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (storage("nfs"), "type nfs, shared by every node that mounts it"),
        (storage("cephfs", shared=True), "type cephfs, shared by every node that mounts it"),
        (storage("dir", shared=True), "type dir, marked shared 1"),
    ],
)
def test_error_shared_snippets_storage_is_refused_naming_it(config: StorageConfig, why: str) -> None:
    assert shared_storage_refusal(config) == (
        f"vm.snippets_storage store is shared ({why}): pvegpu's pre-start hookscript runs as root on every "
        "VM start, so it goes only to node-local storage; set vm.snippets_storage to a local dir storage "
        "(local) or vm.self_heal: off"
    )


def test_local_snippets_storage_is_accepted() -> None:
    assert (shared_storage_refusal(storage("dir")), shared_storage_refusal(storage("btrfs"))) == (None, None)


def test_error_self_heal_role_refuses_a_shared_storage_before_any_operation() -> None:
    api = SimpleNamespace(storage=lambda _storage: storage("cifs"))
    node = NodeSpec.model_validate(NODE_DATA["node"])
    with ctx_host.use(FakeHost({})), pytest.raises(OperationError) as error:
        self_heal(api, node, VmSpec(vmid=100, snippets_storage="store"), OWNER)  # type: ignore[arg-type]
    assert str(error.value) == (
        "pve1: vm.snippets_storage store is shared (type cifs, shared by every node that mounts it): "
        "pvegpu's pre-start hookscript runs as root on every VM start, so it goes only to node-local "
        "storage; set vm.snippets_storage to a local dir storage (local) or vm.self_heal: off"
    )


# --- the VM's hookscript key -------------------------------------------------------------------------------


def test_vm_config_names_the_hook_unless_self_heal_is_off() -> None:
    spec = VmSpec(vmid=100)
    assert vm_config(spec, ["gpu0"], None)["hookscript"] == "local:snippets/pvegpu-hook"
    assert "hookscript" not in vm_config(spec.model_copy(update={"self_heal": "off"}), ["gpu0"], None)


def test_self_heal_off_deletes_only_pvegpus_hookscript() -> None:
    spec = VmSpec(vmid=100, self_heal="off")
    config = vm_config(spec, ["gpu0"], None)
    ours = diff_vm(config, create_keys(spec), {**config, "hookscript": "local:snippets/pvegpu-hook"}, "gpu")
    theirs = diff_vm(config, create_keys(spec), {**config, "hookscript": "local:snippets/backup.sh"}, "gpu")
    assert ("hookscript" in ours.delete, "hookscript" in theirs.delete) == (True, False)


# --- the hook's gauges (pvegpu_hook.prom) ------------------------------------------------------------------


def gauge_lines(textfiles: Path) -> list[str]:
    """The hook's textfile without HELP/TYPE lines, its time replaced by `T`."""
    lines = (textfiles / "pvegpu_hook.prom").read_text().splitlines()
    return [
        line.rsplit(" ", 1)[0] + " T" if line.startswith("pvegpu_hook_last_run") else line
        for line in lines
        if not line.startswith("#")
    ]


def start_with_gauges(
    zipapp: Path, tmp_path: Path, hw: HostHardware, sysfs: Path, unmarked: str = "", *, racing: bool = False
) -> tuple[int, Path, str]:
    """The hook's pre-start on a node of `hw`'s mappings (`unmarked`: one without pvegpu's mark; `racing`:
    pvesh refuses the write as a concurrent edit) whose live tree is `sysfs`, with a textfile directory:
    (exit status, that directory, `node="..",vmid="100"`)."""
    root, pvesh = node_root(tmp_path, hw, unmarked=unmarked)
    if racing:
        (tmp_path / "bin/fail").write_text("")
    textfiles = tmp_path / "textfile"
    textfiles.mkdir()
    done = run_hook(zipapp, root, pvesh, sysfs, "--textfile-dir", str(textfiles), "100", "pre-start")
    assert done.stderr == ""
    return done.returncode, textfiles, f'node="{os.uname().nodename.split(".")[0]}",vmid="100"'


def test_zipapp_repair_leaves_its_gauges_with_the_new_addresses(
    zipapp: Path, trees: dict[str, Path], hw: dict[str, HostHardware], tmp_path: Path
) -> None:
    before = int(time.time())
    code, textfiles, vm = start_with_gauges(zipapp, tmp_path, hw["reference"], trees["reference-renumbered"])
    assert code == 0
    new = ["21", "31", "41", "51", "a1", "b1", "c1", "d1"]
    assert gauge_lines(textfiles) == [
        f"pvegpu_hook_last_run_timestamp_seconds{{{vm}}} T",
        f"pvegpu_hook_start_allowed{{{vm}}} 1",
        f'pvegpu_hook_result{{{vm},result="repaired"}} 1',
        *(
            f'pvegpu_hook_mapping_healthy{{{vm},mapping="gpu{n}",path="0000:{bus}:00",status="repaired"}} 1'
            for n, bus in enumerate(new)
        ),
    ]
    text = (textfiles / "pvegpu_hook.prom").read_text()
    stamp = next(line for line in text.splitlines() if line.startswith("pvegpu_hook_last_run"))
    assert before <= int(stamp.split()[1]) <= int(time.time())
    assert sorted(p.name for p in textfiles.iterdir()) == ["pvegpu_hook.prom"]  # no temporary file left


def test_zipapp_refused_start_gauges_name_the_unmarked_mapping(
    zipapp: Path, trees: dict[str, Path], hw: dict[str, HostHardware], tmp_path: Path
) -> None:
    code, textfiles, vm = start_with_gauges(
        zipapp, tmp_path, hw["reference"], trees["reference-renumbered"], unmarked="gpu5"
    )
    assert code == 1
    lines = gauge_lines(textfiles)
    assert lines[1:3] == [
        f"pvegpu_hook_start_allowed{{{vm}}} 0",
        f'pvegpu_hook_result{{{vm},result="refused"}} 1',
    ]
    assert (lines[3], lines[8]) == (
        # held: another GPU's refusal refuses every repair of the node
        f'pvegpu_hook_mapping_healthy{{{vm},mapping="gpu0",path="0000:41:00",status="refused"}} 0',
        f'pvegpu_hook_mapping_healthy{{{vm},mapping="gpu5",path="0000:d1:00",status="refused"}} 0',
    )


def test_zipapp_concurrent_edit_leaves_the_drifted_mappings_unhealthy(
    zipapp: Path, trees: dict[str, Path], hw: dict[str, HostHardware], tmp_path: Path
) -> None:
    code, textfiles, vm = start_with_gauges(
        zipapp, tmp_path, hw["reference"], trees["reference-renumbered"], racing=True
    )
    lines = gauge_lines(textfiles)
    assert (code, lines[2]) == (1, f'pvegpu_hook_result{{{vm},result="refused"}} 1')
    # Not written: the old address, not healthy.
    assert (
        lines[3]
        == f'pvegpu_hook_mapping_healthy{{{vm},mapping="gpu0",path="0000:41:00",status="repaired"}} 0'
    )


def test_zipapp_unreadable_hardware_gauges_say_unchecked(
    zipapp: Path, hw: dict[str, HostHardware], tmp_path: Path
) -> None:
    code, textfiles, vm = start_with_gauges(zipapp, tmp_path, hw["reference"], tmp_path / "no-sys")
    assert (code, gauge_lines(textfiles)) == (
        0,
        [
            f"pvegpu_hook_last_run_timestamp_seconds{{{vm}}} T",
            f"pvegpu_hook_start_allowed{{{vm}}} 1",
            f'pvegpu_hook_result{{{vm},result="unchecked"}} 1',
        ],
    )


def test_zipapp_without_the_exporters_directory_writes_no_gauges(
    zipapp: Path, trees: dict[str, Path], hw: dict[str, HostHardware], tmp_path: Path
) -> None:
    root, pvesh = node_root(tmp_path, hw["reference"])
    missing = tmp_path / "no-exporter"
    done = run_hook(
        zipapp, root, pvesh, trees["reference-renumbered"], "--textfile-dir", str(missing), "100", "pre-start"
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert not missing.exists()


def test_error_unexpected_exception_still_leaves_a_failed_gauge(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*_args: object, **_kwargs: object) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(pre_start_module, "pre_start", broken)
    monkeypatch.setattr(syslog, "syslog", lambda *_args: None)
    assert main_module.main(["--textfile-dir", str(tmp_path), "100", "pre-start"]) == 0
    capsys.readouterr()
    node = os.uname().nodename.split(".")[0]
    assert gauge_lines(tmp_path)[1:] == [
        f'pvegpu_hook_start_allowed{{node="{node}",vmid="100"}} 1',
        f'pvegpu_hook_result{{node="{node}",vmid="100",result="failed"}} 1',
    ]


def test_error_gauges_that_cannot_be_written_say_so_and_the_start_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "pvegpu_hook.prom").mkdir()  # a rename over a directory fails
    pre_start_module.write_gauges(tmp_path / "pvegpu_hook.prom", REPAIR, "valid")
    assert capsys.readouterr().out.startswith(
        f"pvegpu: VM 100: gauges not written to {tmp_path / 'pvegpu_hook.prom'}: "
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pvegpu_hook.prom"]
