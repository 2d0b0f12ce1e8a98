"""How pvegpu reaches a node's Proxmox VE API: host data key `pve`.

    ("pve1", {"node": {...}, "pve": {"backend": "https", "token_id": "pvegpu@pve!deploy",
                                     "token_file": "/etc/pvegpu/pve-token"}})

Backends (pvegpu/pve/): `ssh` (default) runs `pvesh` on the node over SSH with the host's own pyinfra SSH
settings (`ssh_hostname`, `ssh_user`, `ssh_key`, `ssh_known_hosts_file`) unless given here; the host key
must be known. `https` uses an API token whose secret is read from `token_file` on the machine running
pyinfra (the secret-file rules of `pvegpu.models.secret_file`; never printed).
`local` runs `pvesh` on the machine running pyinfra (which must be the node).

A token is never root@pam, and Proxmox lets only root@pam write some keys (pvegpu.models.pve_root_only):
with `https`, `root_ssh` (default true) sends those writes through root's `pvesh` on the node over the same
SSH settings (as root, or another user with `sudo`: `root_ssh_problem`); `root_ssh: false` says there is no
such path, and every feature that needs one is refused at inventory validation
(pvegpu.models.root_only_features).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

from pvegpu.models.fields import AbsolutePath, matching
from pvegpu.models.pve_root_only import ROOT_USER

PVE_KEY = "pve"
_TOKEN_ID = re.compile(r"[^\s@!]+@[^\s@!]+![A-Za-z][A-Za-z0-9._-]*")
_FINGERPRINT = re.compile(r"[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){31}")
_CLUSTER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


class PveApiSpec(BaseModel):
    """The node's Proxmox API connection: host data key `pve`."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    backend: Literal["ssh", "https", "local"] = Field(
        default="ssh",
        description=(
            "`ssh`: pvesh on the node over SSH (root; host key checked); `https`: API token "
            "(TLS verified; root-only keys: `root_ssh`); `local`: pvesh on the machine running pyinfra."
        ),
    )
    hostname: str | None = Field(
        default=None, description="API / SSH address of the node; None: the host's `ssh_hostname`."
    )
    port: StrictInt | None = Field(
        default=None, ge=1, le=65535, description="API port (https: 8006) or SSH port; None: the default."
    )
    ssh_user: str | None = Field(
        default=None, description="SSH user for `ssh` and `root_ssh`; None: the host's `ssh_user`."
    )
    ssh_key: AbsolutePath | None = Field(
        default=None, description="SSH private key for `ssh` and `root_ssh`; None: the host's `ssh_key`."
    )
    known_hosts: AbsolutePath | None = Field(
        default=None,
        description="known_hosts file holding the node's SSH key; None: the host's `ssh_known_hosts_file`.",
    )
    sudo: bool = Field(
        default=False, description="Run pvesh through sudo (`ssh`/`local`/`root_ssh`, non-root user)."
    )
    root_ssh: bool = Field(
        default=True,
        description=(
            "`https`: write the keys only root@pam may set (`hookscript`, `args`, `hugepages`, `affinity`, "
            "unlocking, a CT's `devN`) through root's pvesh on the node over SSH (the host's SSH settings, "
            "as root or with `sudo`); false: no root path, and every feature needing one is refused."
        ),
    )
    token_id: Annotated[str, matching(_TOKEN_ID, "an API token id (user@realm!name)")] | None = Field(
        default=None, description="API token id `user@realm!name` (`https`)."
    )
    token_file: AbsolutePath | None = Field(
        default=None,
        description=(
            "File on the machine running pyinfra holding the API token secret (`https`): one line, a regular "
            "file owned by root or that user, mode 0600 or stricter; never printed."
        ),
    )
    ca_file: AbsolutePath | None = Field(
        default=None, description="CA bundle the node's certificate is verified against (`https`)."
    )
    fingerprint: Annotated[str, matching(_FINGERPRINT, "a SHA-256 fingerprint (AA:BB:...)")] | None = Field(
        default=None, description="Pin the node's certificate by SHA-256 fingerprint instead (`https`)."
    )
    cluster: Annotated[str, matching(_CLUSTER, "a cluster name (letters, digits, - and _)")] | None = Field(
        default=None,
        description=(
            "Cluster name: hosts with the same name share one set of PCI mappings (one `map` line per "
            "node); None: a standalone node."
        ),
    )
    owner: Annotated[str, matching(_CLUSTER, "an owner id (letters, digits, - and _)")] | None = Field(
        default=None,
        description=(
            "Id of this inventory in pvegpu's mark on what it creates (`pvegpu-owner: <id>` in a guest's and "
            "a mapping's description, with the guest tag `pvegpu`); None: `cluster`, else `node.name`. Two "
            "inventories that manage one cluster need different ids."
        ),
    )
    task_timeout_s: StrictInt = Field(
        default=300, ge=1, description="How long to wait for a Proxmox task (VM create/start) to finish."
    )

    @model_validator(mode="after")
    def _https_needs_a_token(self) -> PveApiSpec:
        if self.backend == "https" and (self.token_id is None or self.token_file is None):
            raise ValueError("the https backend needs token_id and token_file")
        return self

    @property
    def api_user(self) -> str:
        """Who the API acts as for what any identity may send: pvesh always runs as root@pam; a token acts
        as `user@realm!name`."""
        return self.token_id if self.backend == "https" and self.token_id else ROOT_USER

    @property
    def root_user(self) -> str | None:
        """Who writes what only root@pam may: root@pam (pvesh, or a token with `root_ssh`); None when there
        is no root path (`https` with `root_ssh: false`)."""
        return None if self.backend == "https" and not self.root_ssh else ROOT_USER


ROOT_PATH_WAY_OUT = "let pvegpu reach the node as root over SSH (pve.root_ssh: true)"


def root_ssh_problem(spec: PveApiSpec, host_ssh_user: object) -> str | None:
    """`pve.root_ssh: ...` when the SSH user that would run root's pvesh (`pve.ssh_user`, else the host's
    `ssh_user`, else root) is not root and `pve.sudo` is off: pvesh refuses any other user. None: fine."""
    user = spec.ssh_user or host_ssh_user or "root"
    if spec.backend != "https" or not spec.root_ssh or user == "root" or spec.sudo:
        return None
    return (
        f"pve.root_ssh: the keys only root@pam may set are written by root's pvesh over SSH, and the SSH "
        f"user is {user}: set pve.sudo: true (or pve.ssh_user: root), or pve.root_ssh: false"
    )
