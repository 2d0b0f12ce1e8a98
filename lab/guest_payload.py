"""A lab VM guest's software sources: a signed local apt repository of STAND-IN NVIDIA packages and a
STAND-IN `sglang` wheel, built on the lab machine, cached, and copied into each guest's root.

What the guest role meets in the lab is what it meets on a real guest, minus the payload:

- `<guest>/srv/pvegpu-lab/apt/`: a flat apt repository (`deb [signed-by=...] file:/srv/pvegpu-lab/apt/ /`,
  the layout of NVIDIA's CUDA repositories), signed with a key made for the lab (InRelease, Release.gpg), so
  apt verifies it like NVIDIA's: no `[trusted=yes]`. It holds, for driver versions `DRIVER_VERSIONS`:
  `nvidia-open` (depends on the three below, same version), `nvidia-kernel-open-dkms` (its postinst "loads"
  the module: writes the version file the real module shows at /proc/driver/nvidia/version),
  `nvidia-driver-cuda` (the stand-in nvidia-smi, lab/standins/nvidia_smi.py), `nvidia-persistenced` (a real
  systemd unit running a stand-in daemon), plus `dkms`, `linux-headers-<this kernel>` and
  `cuda_keyring_1.1-1_all.deb` (the lab key at NVIDIA's keyring path). Every package says STAND-IN.
- `<guest>/srv/pvegpu-lab/wheels/`: `sglang-<pinned>+pvegpulab-py3-none-any.whl`, the stand-in launcher
  (lab/standins/sglang_serve.py) with the pinned option table, and the stand-in serving benchmark
  (lab/standins/sglang_bench.py) as `sglang.benchmark.serving`; `pip install --no-index --find-links` takes
  it for `sglang==<pinned>` (a local version label matches the public pin).
- `<guest>/etc/pvegpu-lab/nvidia.env`: where the stand-ins find the guest's fake sysfs and version file.

`up_guest(name)` starts an nspawn lab host shaped like a Proxmox Q35 guest of the reference node with its
8 GPUs passed through (lab.pve.guest), no driver bound, and installs the above.

    python -m lab.guest_payload NAME    # start a guest; then: pyinfra inventory/lab.py deploy/guest.py
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from lab import hosts, root
from lab.pve.guest import Passed, q35_guest
from lab.topologies import NVIDIA, TOPOLOGIES
from lab.topology import Topology, place

STANDINS = Path(__file__).with_name("standins")
OPTION_DATA = Path(__file__).resolve().parents[1] / "pvegpu/data/sglang"
SGLANG_VERSION = "0.5.23"  # the pinned SGLang (pvegpu.models.sglang_options.SGLANG_VERSION)
WHEEL_VERSION = f"{SGLANG_VERSION}+pvegpulab"
DRIVER_VERSIONS = ("580.95.05", "590.48.01")
KEYRING_DEB = "cuda-keyring_1.1-1_all.deb"
KEYRING = "/usr/share/keyrings/cuda-archive-keyring.gpg"

# Inside the guest.
APT_DIR = "/srv/pvegpu-lab/apt"
WHEEL_DIR = "/srv/pvegpu-lab/wheels"
REPOSITORY_URL = f"file:{APT_DIR}/"
SETTINGS = "/etc/pvegpu-lab/nvidia.env"
VERSION_FILE = "/opt/fakeproc/driver/nvidia/version"  # plays /proc/driver/nvidia/version (nspawn's is real)

_KERNEL_POSTINST = """#!/bin/sh
# pvegpu lab STAND-IN: "loads" the open kernel module by writing what /proc/driver/nvidia/version would say.
set -e
. {settings}
mkdir -p "$(dirname "$VERSION_FILE")"
printf 'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  %s\\n' \\
    '{version}' '(pvegpu lab STAND-IN)' > "$VERSION_FILE"
printf 'GCC version:  none (pvegpu lab STAND-IN)\\n' >> "$VERSION_FILE"
"""
_PERSISTENCED = """#!/bin/sh
# pvegpu lab STAND-IN for nvidia-persistenced: there is no GPU to keep initialised; it only stays up.
exec sleep infinity
"""
_PERSISTENCED_UNIT = """[Unit]
Description=NVIDIA Persistence Daemon (pvegpu lab STAND-IN)

[Service]
ExecStart=/usr/bin/nvidia-persistenced

[Install]
WantedBy=multi-user.target
"""


class PayloadError(RuntimeError):
    """Building the payload failed; the message holds the failing command and its output."""


def _run(*argv: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    command = [str(a) for a in argv]
    result = subprocess.run(command, check=False, capture_output=True, text=True, cwd=cwd, env=env)
    if result.returncode != 0:
        raise PayloadError(f"`{' '.join(command)}` failed ({result.returncode}): {result.stderr.strip()}")
    return result.stdout


def payload_key() -> str:
    """Hash of every input of the payload: the stand-ins, the option tables, this recipe, the kernel."""
    digest = hashlib.sha256(os.uname().release.encode())
    for path in (
        Path(__file__),
        *sorted(STANDINS.glob("*.py")),
        *sorted(OPTION_DATA.glob("*.json")),
    ):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:12]


def payload_path() -> Path:
    return root.cache_dir() / f"guest-payload-{payload_key()}"


def _deb(
    out: Path,
    name: str,
    version: str,
    description: str,
    files: dict[str, tuple[int, str | bytes]],
    **fields: str,
) -> None:
    """Build `out/<name>_<version>_all.deb` holding `files` (path -> (mode, content)); fields: Depends etc."""
    with tempfile.TemporaryDirectory() as scratch:
        staged = Path(scratch)
        for path, (mode, content) in files.items():
            target = staged / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content if isinstance(content, bytes) else content.encode())
            target.chmod(mode)
        control = {
            "Package": name,
            "Version": version,
            "Architecture": "all",
            "Maintainer": "pvegpu lab <lab@pvegpu.invalid>",
            **fields,
            "Description": f"{description} (pvegpu lab STAND-IN: no real driver inside)",
        }
        (staged / "DEBIAN").mkdir(exist_ok=True)
        (staged / "DEBIAN/control").write_text("".join(f"{k}: {v}\n" for k, v in control.items()))
        _run("dpkg-deb", "--root-owner-group", "-Zgzip", "-b", staged, out / f"{name}_{version}_all.deb")


def _driver_packages(out: Path, driver: str) -> None:
    version = f"{driver}-1"
    _deb(
        out,
        "nvidia-kernel-open-dkms",
        version,
        "NVIDIA open GPU kernel modules",
        {"/DEBIAN/postinst": (0o755, _KERNEL_POSTINST.format(settings=SETTINGS, version=driver))},
        Depends="dkms",
    )
    nvidia_smi = (STANDINS / "nvidia_smi.py").read_text()
    _deb(
        out,
        "nvidia-driver-cuda",
        version,
        "NVIDIA driver CUDA userspace",
        {"/usr/bin/nvidia-smi": (0o755, nvidia_smi)},
    )
    _deb(
        out,
        "nvidia-persistenced",
        version,
        "NVIDIA persistence daemon",
        {
            "/usr/bin/nvidia-persistenced": (0o755, _PERSISTENCED),
            "/lib/systemd/system/nvidia-persistenced.service": (0o644, _PERSISTENCED_UNIT),
        },
    )
    parts = ("nvidia-kernel-open-dkms", "nvidia-driver-cuda", "nvidia-persistenced")
    _deb(
        out,
        "nvidia-open",
        version,
        "NVIDIA driver, open kernel modules",
        {},
        Depends=", ".join(f"{p} (= {version})" for p in parts),
    )


def _release(repo: Path) -> str:
    lines = [
        "Origin: pvegpu-lab",
        "Label: pvegpu lab STAND-IN NVIDIA repository",
        "Date: Thu, 01 Jan 2026 00:00:00 UTC",
        "SHA256:",
    ]
    for name in ("Packages", "Packages.gz"):
        data = (repo / name).read_bytes()
        lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}")
    return "\n".join(lines) + "\n"


def _build(out: Path) -> None:
    repo, wheels = out / "apt", out / "wheels"
    repo.mkdir(parents=True)
    wheels.mkdir()
    with tempfile.TemporaryDirectory() as gnupg:
        env = {**os.environ, "GNUPGHOME": gnupg}
        gpg = ("gpg", "--batch", "--quiet", "--pinentry-mode", "loopback", "--passphrase", "")
        _run(
            *gpg,
            "--quick-gen-key",
            "pvegpu lab apt repository (STAND-IN)",
            "ed25519",
            "sign",
            "never",
            env=env,
        )
        keyring = repo / "cuda-archive-keyring.gpg"
        keyring.write_bytes(
            subprocess.run(["gpg", "--export"], env=env, check=True, capture_output=True).stdout
        )
        _deb(
            repo,
            "cuda-keyring",
            "1.1-1",
            "NVIDIA CUDA repository keyring",
            {KEYRING: (0o644, keyring.read_bytes())},
        )
        for driver in DRIVER_VERSIONS:
            _driver_packages(repo, driver)
        _deb(repo, "dkms", "3.0.10-8+pvegpulab", "Dynamic Kernel Module System", {})
        release = os.uname().release
        _deb(repo, f"linux-headers-{release}", "1+pvegpulab", f"Linux kernel headers for {release}", {})
        packages = _run("dpkg-scanpackages", "--multiversion", ".", "/dev/null", cwd=repo)
        (repo / "Packages").write_text(packages)
        (repo / "Packages.gz").write_bytes(gzip.compress(packages.encode(), mtime=0))
        (repo / "Release").write_text(_release(repo))
        _run(*gpg, "--clearsign", "-o", repo / "InRelease", repo / "Release", env=env)
        _run(*gpg, "-abs", "-o", repo / "Release.gpg", repo / "Release", env=env)
    _wheel(wheels)


def _wheel(out: Path) -> None:
    """A pure-python wheel: package `sglang` (the stand-in + option table), console script `sglang`."""
    dist = f"sglang-{WHEEL_VERSION}.dist-info"
    files = {
        "sglang/__init__.py": (
            f'"""pvegpu lab STAND-IN for SGLang {SGLANG_VERSION}."""\n__version__ = "{WHEEL_VERSION}"\n'
        ),
        "sglang/cli.py": (STANDINS / "sglang_serve.py").read_text(),
        "sglang/benchmark/__init__.py": '"""pvegpu lab STAND-IN for sglang.benchmark."""\n',
        "sglang/benchmark/serving.py": (STANDINS / "sglang_bench.py").read_text(),
        "sglang/options.json": (OPTION_DATA / f"sglang_{SGLANG_VERSION}_options.json").read_text(),
        "sglang/deprecated.json": (OPTION_DATA / f"sglang_{SGLANG_VERSION}_deprecated.json").read_text(),
        f"{dist}/METADATA": (
            f"Metadata-Version: 2.1\nName: sglang\nVersion: {WHEEL_VERSION}\n"
            "Summary: pvegpu lab STAND-IN for SGLang (argv check + tiny OpenAI-style API; no model runs)\n"
        ),
        f"{dist}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: pvegpu-lab\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        f"{dist}/entry_points.txt": "[console_scripts]\nsglang = sglang.cli:main\n",
    }
    record = []
    for name, content in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(content.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(content.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(out / f"sglang-{WHEEL_VERSION}-py3-none-any.whl", "w") as wheel:
        for name, content in files.items():
            wheel.writestr(zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0)), content)


def ensure_payload() -> Path:
    """The cached payload directory (`apt/`, `wheels/`), built when missing."""
    path = payload_path()
    if not path.is_dir():
        partial = path.with_name(path.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        _build(partial)
        partial.rename(path)
        for stale in root.cache_dir().glob("guest-payload-*"):
            if stale != path:
                shutil.rmtree(stale, ignore_errors=True)
    return path


def install(host: hosts.LabHost) -> None:
    """Copy the payload into `host`'s root and write the stand-ins' settings."""
    payload = ensure_payload()
    for source, target in ((payload / "apt", APT_DIR), (payload / "wheels", WHEEL_DIR)):
        shutil.copytree(source, host.root / target.lstrip("/"), dirs_exist_ok=True)
    settings = host.root / SETTINGS.lstrip("/")
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(
        "# pvegpu lab: where the STAND-IN NVIDIA packages find the fake sysfs and the module version file\n"
        f"SYSFS_ROOT={host.sysfs_root}\nVERSION_FILE={VERSION_FILE}\n"
    )


def up_guest(name: str, node_topology: str = "reference") -> hosts.LabHost:
    """Start nspawn lab host `name` as a Q35 guest (no driver bound) with the payload installed."""
    topology = q35_guest_of(name, node_topology)
    host = hosts.up(name, topology, "nspawn", driver="none")
    try:
        install(host)
    except BaseException:
        hosts.down(name)
        raise
    return host


def q35_guest_of(name: str, node_topology: str = "reference") -> Topology:
    """The Q35 guest of a VM on a `node_topology` node with every NVIDIA card passed (hostpci0..N)."""
    node = TOPOLOGIES[node_topology]
    slots: dict[str, list[str]] = {}
    for placed in place(node):
        if placed.function.vendor == NVIDIA:
            slots.setdefault(placed.slot_address, []).append(placed.address)
    passed = [Passed(index, tuple(functions)) for index, functions in enumerate(slots.values())]
    return q35_guest(name, node, passed)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m lab.guest_payload NAME")
    started = up_guest(sys.argv[1])
    print(json.dumps({"name": started.name, "address": started.address, "topology": started.topology}))
