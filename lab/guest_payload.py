"""The software sources of a lab host that runs the NVIDIA driver (a VM guest, a Proxmox lab node, an LXC
container host): a signed local apt repository of STAND-IN NVIDIA packages and a STAND-IN `sglang` wheel,
built on the lab machine, cached, and copied into the host's root.

What the roles meet in the lab is what they meet on a real host, minus the payload:

- `<host>/srv/pvegpu-lab/apt/`: a flat apt repository (`deb [signed-by=...] file:/srv/pvegpu-lab/apt/ /`,
  the layout of NVIDIA's CUDA repositories), signed with a key made for the lab (InRelease, Release.gpg), so
  apt verifies it like NVIDIA's: no `[trusted=yes]`. It holds, for each driver version V in
  `DRIVER_VERSIONS` (package version V-1):
  - `nvidia-open`: depends on the next three, same version;
  - `nvidia-kernel-open-dkms` (depends on dkms): the module. Its postinst "loads" it like `modprobe nvidia`
    and its prerm (remove) "unloads" it (lab/standins/nvidia_module.py, shipped as
    /usr/lib/pvegpu-lab/nvidia-module): load binds every driverless NVIDIA display function of the fake
    sysfs to `nvidia` and writes the version file the real module shows at /proc/driver/nvidia/version;
    unload releases them and removes it;
  - `nvidia-driver-cuda`: userspace only, the stand-in nvidia-smi (lab/standins/nvidia_smi.py) and an
    empty `libnvidia-ml.so.<version>` (the userspace version, as NVIDIA's library file names carry it); no
    dependency, so `--no-install-recommends` installs it alone (what a container gets);
  - `nvidia-persistenced`: a real systemd unit running a stand-in daemon;
  - `nvidia-modprobe`: the stand-in /usr/bin/nvidia-modprobe (lab/standins/nvidia_modprobe.py), which
    creates the /dev/nvidia* nodes.
  Plus `dkms`, `linux-headers-<this kernel>`, `proxmox-headers-<this kernel>`, `proxmox-default-headers`
  (depends on the latter; headers are empty, nothing is built) and `cuda_keyring_1.1-1_all.deb` (the lab
  key at NVIDIA's keyring path). Every package says STAND-IN.
- `<host>/srv/pvegpu-lab/wheels/`: `sglang-<pinned>+pvegpulab-py3-none-any.whl`, the stand-in launcher
  (lab/standins/sglang_serve.py) with the pinned option table, and the stand-in serving benchmark
  (lab/standins/sglang_bench.py) as `sglang.benchmark.serving`, and beside it the stand-in `torch`
  (lab/standins/torch_standin.py: what pvegpu's P2P probe uses; the real wheel pulls torch in);
  `pip install --no-index --find-links` takes it for `sglang==<pinned>` (a local version label matches the
  public pin); and the real wheels of the pinned huggingface_hub and what it needs (`hub_wheels`: downloaded
  once from PyPI into the lab cache), for pvegpu's hub venv (the model fetch).
- `<host>/srv/pvegpu-lab/models/GLM-5-NVFP4-MTP/`: a STAND-IN checkpoint, what pvegpu and SGLang read of
  one without its weights: the `config.json` of GLM-5 NVFP4 with its MTP layer (the keys SGLang 0.5.23 and
  pvegpu's recipe read) and a `model.safetensors.index.json` whose weight map names tensors of layers 0-78
  (78: the MTP layer); no shard files (the stand-in SGLang loads nothing).
- `<host>/etc/pvegpu-lab/nvidia.env`: where the stand-ins find the host's fake sysfs (`SYSFS_ROOT`, the
  host's `sysfs_root`) and the module version file (`VERSION_FILE`, `VERSION_FILE` below).

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
from lab.errors import LabError
from lab.pve.guest import Passed, q35_guest
from lab.topologies import NVIDIA, TOPOLOGIES
from lab.topology import Topology, place
from pvegpu.models.model_store import HF_HUB_VERSION

STANDINS = Path(__file__).with_name("standins")
OPTION_DATA = Path(__file__).resolve().parents[1] / "pvegpu/data/sglang"
SGLANG_VERSION = "0.5.23"  # the pinned SGLang (pvegpu.models.sglang_options.SGLANG_VERSION)
WHEEL_VERSION = f"{SGLANG_VERSION}+pvegpulab"
DRIVER_VERSIONS = ("580.95.05", "590.48.01")
KEYRING_DEB = "cuda-keyring_1.1-1_all.deb"
KEYRING = "/usr/share/keyrings/cuda-archive-keyring.gpg"

# Inside the host.
APT_DIR = "/srv/pvegpu-lab/apt"
WHEEL_DIR = "/srv/pvegpu-lab/wheels"
CHECKPOINT_DIR = "/srv/pvegpu-lab/models/GLM-5-NVFP4-MTP"
# GLM-5's shape where SGLang and pvegpu read it: 78 decoder layers, then the MTP layer as layer 78.
_CHECKPOINT_CONFIG = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
    "num_hidden_layers": 78,
    "num_nextn_predict_layers": 1,
    "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"},
    "pvegpu_lab": "STAND-IN checkpoint: configuration and weight index only, no weights",
}
REPOSITORY_URL = f"file:{APT_DIR}/"
SETTINGS = "/etc/pvegpu-lab/nvidia.env"
VERSION_FILE = "/opt/fakeproc/driver/nvidia/version"
NVML_DIR = "/usr/lib/x86_64-linux-gnu"  # plays /proc/driver/nvidia/version (nspawn's is real)

MODULE_TOOL = "/usr/lib/pvegpu-lab/nvidia-module"
_KERNEL_POSTINST = """#!/bin/sh
# pvegpu lab STAND-IN: "builds" the module for every installed kernel image, as dkms does for the kernels
# whose headers are installed (its tree: /var/lib/dkms/<module>/<version>/<kernel>/<arch>/module), then
# "loads" it, as `modprobe nvidia` would.
set -e
if [ "$1" = configure ]; then
    for image in /boot/vmlinuz-*; do
        [ -e "$image" ] || continue
        built="/var/lib/dkms/nvidia/{version}/${{image#/boot/vmlinuz-}}/x86_64/module"
        mkdir -p "$built" && : > "$built/nvidia.ko"
    done
    {tool} load {version}
fi
"""
_KERNEL_PRERM = """#!/bin/sh
# pvegpu lab STAND-IN: "unloads" the open kernel module, as `modprobe -r nvidia` would, and drops its builds
# (as `dkms remove --all`).
set -e
if [ "$1" = remove ]; then
    {tool} unload
    rm -rf /var/lib/dkms/nvidia/{version}
fi
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


class PayloadError(LabError):
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
        {
            MODULE_TOOL: (0o755, (STANDINS / "nvidia_module.py").read_text()),
            "/DEBIAN/postinst": (0o755, _KERNEL_POSTINST.format(tool=MODULE_TOOL, version=driver)),
            "/DEBIAN/prerm": (0o755, _KERNEL_PRERM.format(tool=MODULE_TOOL, version=driver)),
        },
        Depends="dkms",
    )
    for name, description, files in (
        ("nvidia-driver-cuda", "NVIDIA driver CUDA userspace", {"/usr/bin/nvidia-smi": "nvidia_smi.py"}),
        ("nvidia-modprobe", "NVIDIA device file utility", {"/usr/bin/nvidia-modprobe": "nvidia_modprobe.py"}),
    ):
        contents: dict[str, tuple[int, str | bytes]] = {
            path: (0o755, (STANDINS / source).read_text()) for path, source in files.items()
        }
        if name == "nvidia-driver-cuda":
            # The userspace's version is its NVML library's file name, as the real package installs it.
            contents[f"{NVML_DIR}/libnvidia-ml.so.{driver}"] = (0o644, "pvegpu lab STAND-IN: no library\n")
        _deb(out, name, version, description, contents)
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


def _header_packages(out: Path) -> None:
    """Empty headers for the running kernel, Debian's and Proxmox's names (dkms would build against them)."""
    release = os.uname().release
    for name in (f"linux-headers-{release}", f"proxmox-headers-{release}"):
        _deb(out, name, "1+pvegpulab", f"Linux kernel headers for {release}", {})
    _deb(
        out,
        "proxmox-default-headers",
        "1+pvegpulab",
        "Default Proxmox kernel headers",
        {},
        Depends=f"proxmox-headers-{release}",
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
        _header_packages(repo)
        packages = _run("dpkg-scanpackages", "--multiversion", ".", "/dev/null", cwd=repo)
        (repo / "Packages").write_text(packages)
        (repo / "Packages.gz").write_bytes(gzip.compress(packages.encode(), mtime=0))
        (repo / "Release").write_text(_release(repo))
        _run(*gpg, "--clearsign", "-o", repo / "InRelease", repo / "Release", env=env)
        _run(*gpg, "-abs", "-o", repo / "Release.gpg", repo / "Release", env=env)
    wheel(wheels)
    checkpoint(out / "checkpoint")


def checkpoint(out: Path) -> None:
    """The STAND-IN checkpoint (module docstring) in `out`."""
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(_CHECKPOINT_CONFIG, indent=2) + "\n")
    layers = _CHECKPOINT_CONFIG["num_hidden_layers"]
    assert isinstance(layers, int)
    weight_map = {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}
    for layer in range(layers + 1):
        shard = f"model-0000{1 + (layer == layers)}-of-00002.safetensors"
        for tensor in (
            "input_layernorm.weight",
            "mlp.experts.0.down_proj.weight",
            "self_attn.q_a_proj.weight",
        ):
            weight_map[f"model.layers.{layer}.{tensor}"] = shard
    weight_map["model.layers.78.eh_proj.weight"] = "model-00002-of-00002.safetensors"
    weight_map["lm_head.weight"] = "model-00002-of-00002.safetensors"
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def wheel(out: Path) -> Path:
    """A pure-python wheel in `out`, its path: package `sglang` (the stand-in + option table), console
    script `sglang`, and the stand-in `torch` package."""
    dist = f"sglang-{WHEEL_VERSION}.dist-info"
    files = {
        "sglang/__init__.py": (
            f'"""pvegpu lab STAND-IN for SGLang {SGLANG_VERSION}."""\n__version__ = "{WHEEL_VERSION}"\n'
        ),
        # SGLang's layout where pvegpu's launcher (templates/sglang/sglang-secrets.py.j2) reaches into it:
        # `sglang.cli.main:main`, `sglang.launch_server.run_server`, `sglang.srt.entrypoints.http_server`.
        "sglang/cli/__init__.py": "",
        "sglang/cli/main.py": (STANDINS / "sglang_serve.py").read_text(),
        "sglang/launch_server.py": "from sglang.cli.main import run_server  # pvegpu lab STAND-IN\n",
        "sglang/srt/__init__.py": "",
        "sglang/srt/entrypoints/__init__.py": "",
        "sglang/srt/entrypoints/http_server.py": (
            "from sglang.cli.main import launch_server, redact_watermark_secrets  # pvegpu lab STAND-IN\n"
        ),
        "sglang/benchmark/__init__.py": '"""pvegpu lab STAND-IN for sglang.benchmark."""\n',
        "sglang/benchmark/serving.py": (STANDINS / "sglang_bench.py").read_text(),
        "torch/__init__.py": (STANDINS / "torch_standin.py").read_text(),
        "sglang/cli/options.json": (OPTION_DATA / f"sglang_{SGLANG_VERSION}_options.json").read_text(),
        "sglang/cli/deprecated.json": (OPTION_DATA / f"sglang_{SGLANG_VERSION}_deprecated.json").read_text(),
        "sglang/cli/values.json": (OPTION_DATA / f"sglang_{SGLANG_VERSION}_values.json").read_text(),
        f"{dist}/METADATA": (
            f"Metadata-Version: 2.1\nName: sglang\nVersion: {WHEEL_VERSION}\n"
            "Summary: pvegpu lab STAND-IN for SGLang (argv check + tiny OpenAI-style API; no model runs)\n"
        ),
        f"{dist}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: pvegpu-lab\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        f"{dist}/entry_points.txt": "[console_scripts]\nsglang = sglang.cli.main:main\n",
    }
    record = []
    for name, content in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(content.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(content.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    path = out / f"sglang-{WHEEL_VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in files.items():
            archive.writestr(zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0)), content)
    return path


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
    """Copy the payload into `host`'s root (any lab host: a guest, a Proxmox lab node, a container host) and
    write the stand-ins' settings: its own `sysfs_root`, and `VERSION_FILE`."""
    payload = ensure_payload()
    copies = (
        (payload / "apt", APT_DIR),
        (payload / "wheels", WHEEL_DIR),
        (payload / "checkpoint", CHECKPOINT_DIR),
    )
    for source, target in copies:
        shutil.copytree(source, host.root / target.lstrip("/"), dirs_exist_ok=True)
    # pvegpu's hub venv installs huggingface_hub from the same mirror.
    shutil.copytree(hub_wheels(), host.root / WHEEL_DIR.lstrip("/"), dirs_exist_ok=True)
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


def hub_wheels() -> Path:
    """huggingface_hub==HF_HUB_VERSION and what it needs, as wheels, downloaded once into the lab's cache."""
    path = root.cache_dir() / f"hub-wheels-{HF_HUB_VERSION}"
    if path.is_dir():
        return path
    partial = path.with_name(path.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    download = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
    result = subprocess.run(
        [*download, "--only-binary", ":all:", "--dest", str(partial), f"huggingface_hub=={HF_HUB_VERSION}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise LabError(f"lab: pip download huggingface_hub=={HF_HUB_VERSION} failed: {result.stderr.strip()}")
    partial.rename(path)
    return path
