"""Malformed inventories an attacker or a careless operator writes: each stops with exit status 2 before
pyinfra connects, with exactly one `host: path: message` line per problem, and never prints a secret.

Most cases run the pure path inventory files call (`exit_on_invalid_guests`, which runs `exit_on_invalid`
first); a handful run the real pyinfra CLI on a generated inventory file (`deploy/doctor.py`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pvegpu.inventory.guests import exit_on_invalid_guests
from tests.unit.inventory_cli import doctor_with_inventory

REPO = Path(__file__).resolve().parents[3]
SECRET = "s3cr3t-DO-NOT-PRINT"
NODE = {"name": "pve1", "gpus": {"ids": ["10de:2bb1"], "count": 8}}

ISOLATION = (
    "it fakes or removes the isolation between a passed-through device and the rest of the host; "
    "pvegpu never writes it"
)
BOOT = (
    "it is boot-critical: the boot loader's entry sets how the host boots, and pvegpu's parameters "
    "are added to every entry"
)
IOMMU_OFF = "it turns off the IOMMU that VFIO passthrough needs; pvegpu sets <vendor>_iommu from node.profile"
IOMMU_PT = "pvegpu sets iommu=pt itself in every profile; another value would override it"
VFIO_IDS = (
    "pvegpu binds the GPUs to vfio-pci itself, from the live topology (/etc/modprobe.d/pvegpu-vfio.conf); "
    "ids on the command line bind every function with those ids, in every profile"
)
BLACKLISTED = (
    "pvegpu binds the GPUs to vfio-pci (profile vm) or to nvidia (lxc, baremetal) itself; "
    "blacklisting the module undoes that"
)
SECRET_TAIL = (
    "is refused: its value is a secret, which would be readable in the unit file and on SGLang's command line"
)
NO_P2P = "and passed-through GPUs have no P2P"
ROLE_KEYS = (
    "pvegpu reads only its role keys (node, pve_host, sglang, vm, driver, bench, pve, lxc, mapping, model)"
)


def cmdline(*tokens: str) -> dict[str, object]:
    return {"node": NODE, "pve_host": {"extra_cmdline": list(tokens)}}


def sglang(**fields: object) -> dict[str, object]:
    return {"node": NODE, "sglang": fields}


def extra(*args: str) -> dict[str, object]:
    return sglang(extra_args=list(args))


def refused(token: str, reason: str) -> str:
    return f"h: pve_host.extra_cmdline.0: {token} is refused: {reason}"


def secret(option: str, field: str, index: int = 0) -> str:
    return f"h: sglang.extra_args.{index}: {option} {SECRET_TAIL}; use {field}"


def p2p(option: str, why: str) -> str:
    return f"h: sglang.extra_args: {option} is refused in the vm profile: {why}, {NO_P2P}"


def near(key: str, role: str) -> str:
    return f"h: {key}: unknown key (did you mean {role!r}?); {ROLE_KEYS}"


LONG = [f"x{index}={'y' * 20}" for index in range(100)]

CASES: list[tuple[str, object, list[str]]] = [
    # Kernel parameters: isolation breakers.
    ("acs-override", cmdline("pcie_acs_override=downstream,multifunction"),
     [refused("pcie_acs_override=downstream,multifunction", ISOLATION)]),
    ("acs-override-dash", cmdline("pcie-acs-override=id:10de:2bb1"),
     [refused("pcie-acs-override=id:10de:2bb1", ISOLATION)]),
    ("unsafe-interrupts", cmdline("vfio_iommu_type1.allow_unsafe_interrupts=1"),
     [refused("vfio_iommu_type1.allow_unsafe_interrupts=1", ISOLATION)]),
    ("unsafe-interrupts-bare", cmdline("allow_unsafe_interrupts"),
     [refused("allow_unsafe_interrupts", ISOLATION)]),
    ("noiommu-mode", cmdline("vfio.enable_unsafe_noiommu_mode=1"),
     [refused("vfio.enable_unsafe_noiommu_mode=1", ISOLATION)]),
    ("intremap-off", cmdline("intremap=off"),
     [refused("intremap=off", "interrupt remapping off lets a passed-through device inject interrupts into "
              "the host; pvegpu never writes it")]),
    # Boot-critical.
    *((f"boot-{token}", cmdline(token), [refused(token, BOOT)])
      for token in ("root=/dev/sdz", "init=/bin/false", "ro", "rw", "rootfstype=xfs", "rdinit=/bin/sh",
                    "systemd.unit=rescue.target", "BOOT_IMAGE=/vmlinuz", "single", "resume=/dev/sda2")),
    # Undoing pvegpu's own.
    ("amd-iommu-off", cmdline("amd_iommu=off"), [refused("amd_iommu=off", IOMMU_OFF)]),
    ("intel-iommu-off", cmdline("intel_iommu=off"), [refused("intel_iommu=off", IOMMU_OFF)]),
    ("intel-iommu-sm-off", cmdline("intel_iommu=sm_on,off"), [refused("intel_iommu=sm_on,off", IOMMU_OFF)]),
    ("iommu-off", cmdline("iommu=off"), [refused("iommu=off", IOMMU_PT)]),
    ("iommu-soft", cmdline("iommu=soft"), [refused("iommu=soft", IOMMU_PT)]),
    ("iommu-passthrough", cmdline("iommu.passthrough=0"), [refused("iommu.passthrough=0", IOMMU_PT)]),
    ("vfio-ids-dash", cmdline("vfio-pci.ids=10de:2bb1,10de:22e8"),
     [refused("vfio-pci.ids=10de:2bb1,10de:22e8", VFIO_IDS)]),
    ("vfio-ids-underscore", cmdline("vfio_pci.ids=10de:2bb1"), [refused("vfio_pci.ids=10de:2bb1", VFIO_IDS)]),
    ("blacklist-vfio", cmdline("module_blacklist=vfio_pci"),
     [refused("module_blacklist=vfio_pci", BLACKLISTED)]),
    ("modprobe-blacklist-vfio", cmdline("modprobe.blacklist=nouveau,vfio-pci"),
     [refused("modprobe.blacklist=nouveau,vfio-pci", BLACKLISTED)]),
    ("blacklist-nvidia", cmdline("module_blacklist=nvidia"),
     [refused("module_blacklist=nvidia", BLACKLISTED)]),
    # Contradictions, repeats, length, shape.
    ("contradiction", cmdline("pcie_aspm=off", "pcie_aspm=on"),
     ["h: pve_host.extra_cmdline: pcie_aspm=on contradicts pcie_aspm=off: the kernel would keep only one of "
      "them, silently"]),
    ("contradiction-spelling", cmdline("pcie_aspm=off", "pcie-aspm=force"),
     ["h: pve_host.extra_cmdline: pcie-aspm=force contradicts pcie_aspm=off: the kernel would keep only one "
      "of them, silently"]),
    ("repeat-spelling", cmdline("pcie_aspm=off", "pcie-aspm=off"),
     ["h: pve_host.extra_cmdline: pcie-aspm=off is listed twice (as pcie_aspm=off)"]),
    ("repeat", cmdline("quiet", "quiet"), ["h: pve_host.extra_cmdline: quiet is listed twice"]),
    ("too-long", cmdline(*LONG),
     ["h: pve_host.extra_cmdline: 2513 characters with pvegpu's own parameters, more than the kernel's "
      "command line holds on x86 (2047, COMMAND_LINE_SIZE 2048), before the boot loader's own; the kernel "
      "would cut the rest, silently"]),
    ("shell-in-token", cmdline("a=$(reboot)"),
     ["h: pve_host.extra_cmdline.0: 'a=$(reboot)' is not a kernel parameter like name or name=value "
      "(letters, digits, _ . - in the name; no spaces or quotes)"]),
    ("cmdline-string", {"node": NODE, "pve_host": {"extra_cmdline": "iommu=pt"}},
     ["h: pve_host.extra_cmdline: must be a list (got 'iommu=pt')"]),
    # Secrets in extra_args, both forms: refused with the field to use, the value never shown.
    ("api-key", extra("--api-key", SECRET), [secret("--api-key", "sglang.api_key_file")]),
    ("api-key-equals", extra(f"--api-key={SECRET}"), [secret("--api-key", "sglang.api_key_file")]),
    ("api-key-late", extra("--watchdog-timeout", "1200", "--api-key", SECRET),
     [secret("--api-key", "sglang.api_key_file", 2)]),
    ("api-key-abbrev", extra(f"--api-k={SECRET}"),
     [f"h: sglang.extra_args.0: --api-k (an abbreviation of --api-key) {SECRET_TAIL}; "
      "use sglang.api_key_file"]),
    ("admin-key", extra("--admin-api-key", SECRET), [secret("--admin-api-key", "sglang.admin_api_key_file")]),
    ("admin-key-equals", extra(f"--admin-api-key={SECRET}"),
     [secret("--admin-api-key", "sglang.admin_api_key_file")]),
    ("ssl-password", extra("--ssl-keyfile-password", SECRET),
     [f"h: sglang.extra_args.0: --ssl-keyfile-password {SECRET_TAIL}; pvegpu has no field for it; use a TLS "
      "key without a password"]),
    ("ssl-password-equals", extra(f"--ssl-keyfile-password={SECRET}"),
     [f"h: sglang.extra_args.0: --ssl-keyfile-password {SECRET_TAIL}; pvegpu has no field for it; use a TLS "
      "key without a password"]),
    ("watermark-inline", extra('--watermark-config={"key":"' + SECRET + '"}'),
     ["h: sglang.extra_args.0: --watermark-config is refused as inline JSON: it holds the watermark keys; "
      "give the path of a file readable only by the service user"]),
    ("config", extra("--config", "/etc/x.yaml"),
     ["h: sglang.extra_args.0: --config is refused: pvegpu passes SGLang's one config file itself (the API "
      "keys from systemd credentials); give options here as arguments"]),
    # The vm profile's no-P2P rule.
    ("p2p-mscclpp", extra("--enable-mscclpp"),
     [p2p("--enable-mscclpp", "MSCCL++ all-reduce and all-gather exchange GPU buffers peer to peer")]),
    ("p2p-symm-mem", extra("--enable-symm-mem"),
     [p2p("--enable-symm-mem", "NCCL symmetric memory maps each GPU's buffers into its peers")]),
    ("p2p-torch-symm-mem", extra("--enable-torch-symm-mem"),
     [p2p("--enable-torch-symm-mem",
          "torch symmetric-memory all-reduce maps buffers across GPUs (CUDA IPC)")]),
    ("p2p-nvls", extra("--enable-nccl-nvls"),
     [p2p("--enable-nccl-nvls", "NVLink SHARP needs NVLink/NVSwitch between the GPUs")]),
    ("p2p-flashinfer-fusion", extra("--flashinfer-allreduce-fusion-backend", "mnnvl"),
     [p2p("--flashinfer-allreduce-fusion-backend",
          "FlashInfer's fused all-reduce shares IPC buffers between GPUs")]),
    ("p2p-custom-allreduce-back-on", extra("--disable-custom-all-reduce"),
     ["h: sglang.extra_args: --disable-custom-all-reduce is already set by the profile's plan"]),
    # Misspelled role keys.
    ("near-pve-host", {"node": NODE, "pve_hots": {"allow_reboot": True}}, [near("pve_hots", "pve_host")]),
    ("near-pve-host-dash", {"node": NODE, "pve-host": {}}, [near("pve-host", "pve_host")]),
    ("near-sglang", {"node": NODE, "sglnag": {}}, [near("sglnag", "sglang")]),
    ("near-vm", {"node": NODE, "vms": {}}, [near("vms", "vm")]),
    ("near-lxc", {"node": NODE, "lxcs": {}}, [near("lxcs", "lxc")]),
    ("near-driver", {"node": NODE, "drivers": {}}, [near("drivers", "driver")]),
    ("near-bench", {"node": NODE, "benchmark": {}}, [near("benchmark", "bench")]),
    ("near-node-case", {"node": NODE, "Node": {}}, [near("Node", "node")]),
    ("near-node-missing", {"nodes": NODE},
     ["h: node: is required (host data needs node = {'name': ..., 'gpus': ...})", near("nodes", "node")]),
    # Listening beyond loopback, key paths.
    ("public-without-key", sglang(host="0.0.0.0"),
     ["h: sglang.host: '0.0.0.0' is not a loopback address: listening beyond this host needs api_key_file"]),
    ("public-metrics", sglang(host="0.0.0.0", api_key_file="/k", enable_metrics=True),
     ["h: sglang.enable_metrics: SGLang answers /metrics without the API key, so with host '0.0.0.0' anyone "
      "who reaches the port reads it: set enable_metrics: false (the default there), or keep host on "
      "loopback and scrape on the host"]),
    ("relative-key", sglang(api_key_file="key"),
     ["h: sglang.api_key_file: must be an absolute path (got 'key')"]),
    ("relative-admin-key", sglang(admin_api_key_file="admin.key"),
     ["h: sglang.admin_api_key_file: must be an absolute path (got 'admin.key')"]),
    ("admin-key-alone", sglang(admin_api_key_file="/root/admin.key"),
     ["h: sglang.admin_api_key_file: needs api_key_file: without an API key SGLang answers /server_info, "
      "which shows the admin key, to anyone"]),
    ("logging-config-env", sglang(env={"SGLANG_LOGGING_CONFIG_PATH": "/tmp/l.json"}),
     ["h: sglang.env: SGLANG_LOGGING_CONFIG_PATH is set by pvegpu (pvegpu.plan.sglang_service); it may not "
      "be set here"]),
    ("relative-hf-token", sglang(hf_token_file="~/.hf"),
     ["h: sglang.hf_token_file: must be an absolute path (got '~/.hf')"]),
    ("key-inline", sglang(api_key=SECRET),
     ["h: sglang.api_key: unknown field (did you mean 'api_key_file'?)"]),
    # The node itself.
    ("profile", {"node": {**NODE, "profile": "kvm"}},
     ["h: node.profile: must be one of vm, lxc, baremetal (got 'kvm')"]),
    ("gpu-id", {"node": {**NODE, "gpus": {"ids": ["nvidia"]}}},
     ["h: node.gpus.ids.0: 'nvidia' is not a vendor:device id like 10de:2bb1"]),
    ("no-node", {"ssh_user": "root"},
     ["h: node: is required (host data needs node = {'name': ..., 'gpus': ...})"]),
    ("allow-reboot-string", {"node": NODE, "pve_host": {"allow_reboot": "yes"}},
     ["h: pve_host.allow_reboot: must be true or false (got 'yes')"]),
    # Several problems at once: one line each.
    ("several", {"node": NODE, "pve_host": {"extra_cmdline": ["iommu=off", "ro"]}, "sglnag": {}},
     [near("sglnag", "sglang"), refused("iommu=off", IOMMU_PT),
      f"h: pve_host.extra_cmdline.1: ro is refused: {BOOT}"]),
]  # fmt: skip


def test_at_least_sixty_cases() -> None:
    assert len(CASES) >= 60
    assert len({case_id for case_id, _, _ in CASES}) == len(CASES)


@pytest.mark.parametrize(("data", "lines"), [pytest.param(d, lines, id=i) for i, d, lines in CASES])
def test_error_inventory_refused_before_connecting(
    data: object, lines: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        exit_on_invalid_guests([("h", data)])
    out, err = capsys.readouterr()
    assert (caught.value.code, out) == (2, "")
    assert err.splitlines() == lines
    assert SECRET not in err


CLI_CASES = ["api-key-equals", "p2p-mscclpp", "several"]


@pytest.mark.parametrize("case_id", CLI_CASES)
def test_error_pyinfra_cli_exits_2_before_connecting(case_id: str, tmp_path: Path) -> None:
    """The real pyinfra CLI on a generated inventory: exit 2, our lines, no `Connecting to hosts`. The host
    name cannot resolve (.invalid), so a connection attempt could not go unnoticed."""
    [(data, lines)] = [(d, lines) for i, d, lines in CASES if i == case_id]
    host = "pve-nonexistent.invalid"
    result = doctor_with_inventory(
        tmp_path,
        "from pvegpu.inventory.guests import exit_on_invalid_guests\n"
        f"hosts = exit_on_invalid_guests([({host!r}, {data!r})])\n",
    )
    output = result.stdout + result.stderr
    assert (result.returncode, result.stdout) == (2, "")
    assert "Connecting to hosts" not in output
    assert SECRET not in output
    assert [line for line in result.stderr.splitlines() if not line.startswith("--> ")] == [
        line.replace("h: ", f"{host}: ", 1) for line in lines
    ]
