"""Kernel parameters pvegpu must never write for an operator, and why (`pve_host.extra_cmdline`).

Pure data and checks, run when the inventory loads. Refused:
- isolation breakers: they fake or drop the IOMMU's protection between a passed-through GPU and the host;
- boot-critical parameters: the boot loader's own entry decides the root file system and init, and pvegpu's
  line is added to every entry;
- parameters that undo pvegpu's own (the IOMMU tokens of the profile, its vfio-pci binding, its drivers);
- the same parameter twice with different values (the kernel keeps one of them, silently);
- a list that cannot fit the kernel's command line buffer (the kernel cuts the rest, silently).

Parameter names compare as the kernel compares them: `-` and `_` are the same character (`parameq`).
"""

from __future__ import annotations

# x86 `COMMAND_LINE_SIZE` (arch/x86/include/asm/setup.h), the terminating NUL included.
COMMAND_LINE_SIZE = 2048
# The longest line pvegpu writes itself before the operator's extras (profile vm on Intel).
PVEGPU_OWN_LONGEST = "intel_iommu=on iommu=pt"

_ISOLATION = (
    "it fakes or removes the isolation between a passed-through device and the rest of the host; "
    "pvegpu never writes it"
)
_BOOT = (
    "it is boot-critical: the boot loader's entry sets how the host boots, and pvegpu's parameters "
    "are added to every entry"
)
_IOMMU_OFF = (
    "it turns off the IOMMU that VFIO passthrough needs; pvegpu sets <vendor>_iommu from node.profile"
)
_IOMMU_PT = "pvegpu sets iommu=pt itself in every profile; another value would override it"
_VFIO_IDS = (
    "pvegpu binds the GPUs to vfio-pci itself, from the live topology (/etc/modprobe.d/pvegpu-vfio.conf); "
    "ids on the command line bind every function with those ids, in every profile"
)
_BLACKLISTED = (
    "pvegpu binds the GPUs to vfio-pci (profile vm) or to nvidia (lxc, baremetal) itself; "
    "blacklisting the module undoes that"
)

# Refused whatever their value, by normalised name.
_REFUSED_NAMES = {
    "pcie_acs_override": _ISOLATION,
    "allow_unsafe_interrupts": _ISOLATION,
    "vfio.enable_unsafe_noiommu_mode": _ISOLATION,
    "vfio_pci.ids": _VFIO_IDS,
    "iommu.passthrough": _IOMMU_PT,
    **dict.fromkeys(
        (
            "root", "init", "rdinit", "ro", "rw", "rootfstype", "rootflags", "rootwait", "rootdelay",
            "initrd", "BOOT_IMAGE", "resume", "single", "emergency", "rescue", "systemd.unit", "rd.break",
        ),
        _BOOT,
    ),
}  # fmt: skip
_BLACKLISTS = ("module_blacklist", "modprobe.blacklist")
_PVEGPU_MODULES = ("vfio", "nvidia")
# Parameters the kernel (or a driver) reads more than once, each occurrence adding to the others.
_REPEATABLE = frozenset({"console", "earlycon", "hugepagesz", "hugepages", "memmap"})


def normalized_name(token: str) -> str:
    """The parameter name of `name` or `name=value`, with `-` read as `_` as the kernel does."""
    return token.partition("=")[0].replace("-", "_")


def refusal(token: str) -> str | None:  # noqa: PLR0911 (one return per rule reads as the rule table)
    """Why pvegpu refuses to write `token` (a plain `name` or `name=value`), or None when it may."""
    name, _, value = token.partition("=")
    name = normalized_name(name)
    words = value.split(",")
    if name in _REFUSED_NAMES:
        return _REFUSED_NAMES[name]
    if name.endswith(".allow_unsafe_interrupts"):
        return _ISOLATION
    if name == "intremap" and "off" in words:
        return "interrupt remapping off lets a passed-through device inject interrupts into the host; " + (
            "pvegpu never writes it"
        )
    if name in ("amd_iommu", "intel_iommu") and "off" in words:
        return _IOMMU_OFF
    if name == "iommu" and value != "pt":
        return _IOMMU_PT
    if name in _BLACKLISTS:
        modules = [word.replace("-", "_") for word in words]
        if any(module.startswith(_PVEGPU_MODULES) for module in modules):
            return _BLACKLISTED
    return None


def list_problems(tokens: tuple[str, ...]) -> list[str]:
    """Problems of the whole list: a parameter repeated (exactly, or with another value), and a length the
    kernel's command line cannot hold together with pvegpu's own parameters."""
    problems: list[str] = []
    spelled: dict[tuple[str, str], str] = {}  # (name, "=value" or "") -> the token as first listed
    first_of_name: dict[str, str] = {}
    for token in tokens:
        name, equals, value = token.partition("=")
        name = normalized_name(name)
        before = spelled.get((name, equals + value))
        if before is not None:
            problems.append(f"{token} is listed twice" + ("" if before == token else f" (as {before})"))
        elif name in first_of_name and name not in _REPEATABLE:
            problems.append(
                f"{token} contradicts {first_of_name[name]}: the kernel would keep only one of them, silently"
            )
        spelled.setdefault((name, equals + value), token)
        first_of_name.setdefault(name, token)
    length = len(" ".join((PVEGPU_OWN_LONGEST, *tokens)))
    if length >= COMMAND_LINE_SIZE:
        problems.append(
            f"{length} characters with pvegpu's own parameters, more than the kernel's command line holds "
            f"on x86 ({COMMAND_LINE_SIZE - 1}, COMMAND_LINE_SIZE {COMMAND_LINE_SIZE}), before the boot "
            "loader's own; the kernel would cut the rest, silently"
        )
    return problems
