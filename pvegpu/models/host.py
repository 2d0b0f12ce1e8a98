"""What an operator declares about the Proxmox host's boot state: host data key `pve_host` (HostSpec).

    ("pve1", {"node": {...}, "pve_host": {"allow_reboot": True, "extra_cmdline": ["pcie_aspm=off"]}})

The IOMMU tokens themselves are not declared: they follow from the node's profile and the CPU vendor
(`pvegpu.plan.cmdline`). Two kinds of bad input, two moments:
- what the data alone shows (unknown profile, malformed or repeated token, unknown field) fails when the
  inventory loads, before pyinfra connects (`exit_on_invalid`: `<host>: pve_host.extra_cmdline.0: ...`);
- what needs the host's facts (GPU ids that match no function, another number of GPUs, a group that cannot
  be passed, an unknown CPU vendor) fails while the role collects its operations, after connecting but
  before any operation runs on any host (`Operation error ...: <host>: node.gpus.ids: ...`).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

from pvegpu.models.fields import shown
from pvegpu.models.kernel_params import list_problems, refusal

# Not `host`: pyinfra's HostData keeps its Host object under that name, so `host.data.host` is not data.
HOST_KEY = "pve_host"

# `name` or `name=value`: what pvegpu can add to and remove from a command line as one whole word. No spaces,
# quotes or shell/GRUB metacharacters, so a token survives /etc/default/grub.d/*.cfg and /etc/kernel/cmdline.
CMDLINE_TOKEN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(=[A-Za-z0-9_.,:/+=@-]+)?")


def check_token(value: str) -> str:
    """Return `value` when it is a plain kernel parameter; ValueError naming it otherwise."""
    if not CMDLINE_TOKEN.fullmatch(value):
        raise ValueError(
            f"{shown(value)} is not a kernel parameter like name or name=value "
            "(letters, digits, _ . - in the name; no spaces or quotes)"
        )
    return value


def _check_allowed(token: str) -> str:
    reason = refusal(token)
    if reason is not None:
        raise ValueError(f"{token} is refused: {reason}")
    return token


def _check_list(tokens: tuple[str, ...]) -> tuple[str, ...]:
    problems = list_problems(tokens)
    if problems:
        raise ValueError("; ".join(problems))
    return tokens


class HostSpec(BaseModel):
    """The Proxmox host's kernel command line extras and reboot policy: host data key `pve_host`."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    allow_reboot: StrictBool = Field(
        default=False,
        description=(
            "Reboot the host when the running kernel lacks the boot state pvegpu wrote (command line tokens, "
            "GPU functions bound to vfio-pci), then wait and verify; also stop what runs on the node where a "
            "change needs it (the VM for a profile switch; a cold restart of the VM for the config changes "
            "Proxmox keeps pending while it runs). False: report what is pending and stop."
        ),
    )
    extra_cmdline: Annotated[
        tuple[Annotated[str, AfterValidator(check_token), AfterValidator(_check_allowed)], ...],
        AfterValidator(_check_list),
    ] = Field(
        default=(),
        description=(
            "Kernel parameters pvegpu adds after its own (e.g. `pcie_aspm=off`); one `name` or `name=value` "
            "each. Removing one here removes it from the host on the next run; tokens pvegpu did not add "
            "are never removed. Refused, with the reason: isolation breakers (`pcie_acs_override`, "
            "`*allow_unsafe_interrupts`), boot-critical parameters (`root=`, `init=`, `ro`, `rw`, ...), "
            "ones that undo pvegpu's own (`*iommu=off`, `vfio-pci.ids=`, blacklisting vfio or nvidia), "
            "a parameter twice with different values, and a line longer than the kernel's 2048 bytes."
        ),
    )
    allow_reboot_with_foreign_guests: StrictBool = Field(
        default=False,
        description=(
            "Let a reboot pvegpu triggers (the host's, and the driver's own on `lxc`/`baremetal`) go ahead "
            "while guests that are not pvegpu's (other than the inventory's `vm.vmid` / `lxc.vmid` carrying "
            "pvegpu's mark) run on the node or HA resources wanting `started` are placed on it: the reboot "
            "stops them. False: such a reboot is refused, naming each guest (vmid, name, type) and HA "
            "resource, before any host is changed. Needs `allow_reboot`."
        ),
    )
    reboot_timeout_s: StrictInt = Field(
        default=600,
        ge=30,
        description="Seconds to wait for the host to come back with the new boot state after a reboot.",
    )

    @model_validator(mode="after")
    def _foreign_needs_reboot(self) -> HostSpec:
        if self.allow_reboot_with_foreign_guests and not self.allow_reboot:
            raise ValueError(
                "allow_reboot_with_foreign_guests needs allow_reboot: true (no reboot without it)"
            )
        return self
