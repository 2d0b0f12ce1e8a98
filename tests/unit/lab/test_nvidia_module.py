"""The NVIDIA module in the lab: the stand-in kernel package's load/unload (lab/standins/nvidia_module.py) and
what the reboot stand-in (lab/boot_standins/reboot.py) does with the module at boot: drivers, the version
file, the device nodes. Run on generated sysfs trees (lab.fakesys) in temporary directories."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lab import fakesys
from lab.boot_standins import reboot
from lab.standins import nvidia_module

VERSION = "580.95.05"
TEXT = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
    "(pvegpu lab STAND-IN)\nGCC version:  none (pvegpu lab STAND-IN)\n"
)


def gpu_drivers(sysfs: Path) -> dict[str, str | None]:
    """NVIDIA function -> driver, from the tree's links."""
    found = {}
    for device in sorted((sysfs / "bus/pci/devices").iterdir()):
        if (device / "vendor").read_text().strip() == "0x10de":
            link = device / "driver"
            found[device.name] = Path(os.readlink(link)).name if link.is_symlink() else None
    return found


def tree(tmp_path: Path, driver: str) -> tuple[Path, list[str], list[str]]:
    """A reference tree with the cards on `driver`; (sysfs, display functions, audio functions)."""
    sysfs = tmp_path / "sys"
    manifest = fakesys.write_tree(sysfs, "reference", driver)
    functions = [f for gpu in manifest["gpus"] for f in gpu["functions"]]
    return sysfs, [f for f in functions if f.endswith(".0")], [f for f in functions if f.endswith(".1")]


def test_load_binds_driverless_displays_only_and_unload_releases_them(tmp_path: Path) -> None:
    sysfs, displays, audio = tree(tmp_path, "none")
    reboot.bind(sysfs, displays[0], "vfio-pci")  # another driver's: modprobe nvidia leaves it alone
    version_file = tmp_path / "proc/version"

    loaded = nvidia_module.load(sysfs, version_file, VERSION)

    assert loaded == displays[1:]
    assert version_file.read_text() == TEXT
    assert gpu_drivers(sysfs) == {
        **dict.fromkeys(audio),
        displays[0]: "vfio-pci",
        **dict.fromkeys(displays[1:], "nvidia"),
    }
    # The same links the reboot stand-in makes.
    link = sysfs / "bus/pci/devices" / displays[1] / "driver"
    assert os.readlink(link) == "../../../../bus/pci/drivers/nvidia"
    assert (sysfs / "bus/pci/drivers/nvidia" / displays[1]).resolve() == link.parent.resolve()

    assert nvidia_module.unload(sysfs, version_file) == displays[1:]
    assert not version_file.exists()
    assert gpu_drivers(sysfs) == {
        **dict.fromkeys(audio),
        displays[0]: "vfio-pci",
        **dict.fromkeys(displays[1:]),
    }


def test_module_main_reads_the_settings_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sysfs, displays, _ = tree(tmp_path, "none")
    env = tmp_path / "nvidia.env"
    env.write_text(f"# the lab's\nSYSFS_ROOT={sysfs}\nVERSION_FILE={tmp_path / 'v'}\n")

    assert nvidia_module.main(["load", VERSION], env) == 0
    assert nvidia_module.main(["reload"], env) == 2

    out, err = capsys.readouterr()
    assert out == f"nvidia-module (pvegpu lab STAND-IN): loaded {VERSION}; bound {','.join(displays)}\n"
    assert err == "usage: nvidia-module load VERSION | unload (pvegpu lab STAND-IN)\n"
    assert (tmp_path / "v").read_text() == TEXT


def test_reboot_writes_the_module_text_of_the_kernel_package() -> None:
    assert reboot.VERSION_TEXT == nvidia_module.VERSION_TEXT


@pytest.fixture
def no_vfio(monkeypatch: pytest.MonkeyPatch) -> None:
    """No vfio-pci configuration on the node (the test machine's own /etc is not read)."""
    monkeypatch.setattr(reboot, "vfio_selection", lambda: (set(), set(), False))


# (cards' driver before, host driver loads, display driver after, audio driver after, left vfio-pci)
BootCase = tuple[str, bool, str | None, str | None, bool]


@pytest.mark.usefixtures("no_vfio")
@pytest.mark.parametrize(
    "case",
    [
        ("none", True, "nvidia", None, False),
        ("nvidia", False, None, "snd_hda_intel", False),
        ("nvidia", True, "nvidia", "snd_hda_intel", False),
        ("vfio-pci", True, "nvidia", "snd_hda_intel", True),
        ("vfio-pci", False, None, "snd_hda_intel", True),
    ],
    ids=[
        "unbound-loads",
        "nvidia-not-loaded",
        "nvidia-loads",
        "vfio-released-loads",
        "vfio-released-no-driver",
    ],
)
def test_boot_drivers_for_the_nvidia_module(tmp_path: Path, case: BootCase) -> None:
    start, loads, display, audio_driver, released = case
    sysfs, displays, audio = tree(tmp_path, start)

    bound, freed = reboot.boot_drivers(sysfs, "BOOT_IMAGE=/vmlinuz iommu=pt", loads)

    assert gpu_drivers(sysfs) == {**dict.fromkeys(displays, display), **dict.fromkeys(audio, audio_driver)}
    expected = [
        f"{a}:{display or '-'}" if a in displays else f"{a}:{audio_driver}" for a in sorted(audio + displays)
    ]
    assert (bound, freed) == ([], expected if released else [])


@pytest.mark.parametrize(
    ("start", "loads", "version", "written"),
    [
        ("nvidia", True, VERSION, True),
        ("nvidia", False, VERSION, False),
        ("vfio-pci", True, VERSION, False),  # every GPU on vfio-pci: the module finds no device
        ("nvidia", True, None, False),  # an nvidia.ko dpkg does not know: no version to show
    ],
    ids=["loaded", "not-loading", "no-device", "no-version"],
)
def test_module_at_boot(tmp_path: Path, start: str, loads: bool, version: str | None, written: bool) -> None:
    sysfs, _, _ = tree(tmp_path, start)
    version_file = tmp_path / "fakeproc/driver/nvidia/version"
    version_file.parent.mkdir(parents=True)
    version_file.write_text("stale\n")

    result = reboot.module_at_boot(sysfs, loads, version, version_file)

    assert result == (VERSION if written else None)
    assert (version_file.read_text() if version_file.exists() else None) == (TEXT if written else None)


def test_fresh_device_nodes_and_the_settings_version_file(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    for name in ("nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-caps/nvidia-cap1", "null"):
        (dev / name).write_text("")
    env = tmp_path / "nvidia.env"

    reboot.fresh_device_nodes(dev)

    assert sorted(p.name for p in dev.iterdir()) == ["null"]
    assert reboot.version_file(env) == Path("/opt/fakeproc/driver/nvidia/version")  # no settings: the default
    env.write_text("# lab\nSYSFS_ROOT=/opt/fakesys\nVERSION_FILE=/opt/other/version\n")
    assert reboot.version_file(env) == Path("/opt/other/version")


@pytest.mark.parametrize(
    ("cmdline", "expected"),
    [
        ("BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet", "DMA-FQ"),
        ("BOOT_IMAGE=/vmlinuz amd_iommu=on iommu=pt", "identity"),
        ("BOOT_IMAGE=/vmlinuz iommu.passthrough=1", "identity"),
        ("BOOT_IMAGE=/vmlinuz iommu.strict=1", "DMA"),
    ],
)
def test_boot_sets_every_groups_default_domain_type(tmp_path: Path, cmdline: str, expected: str) -> None:
    fakesys.write_tree(tmp_path, "reference")
    reboot.boot_domain_types(tmp_path, cmdline)
    types = {path.read_text() for path in tmp_path.glob("kernel/iommu_groups/*/type")}
    assert types == {expected + "\n"}
