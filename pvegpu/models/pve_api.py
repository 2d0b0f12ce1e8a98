"""How pvegpu reaches a node's Proxmox VE API: host data key `pve`.

    ("pve1", {"node": {...}, "pve": {"backend": "https", "token_id": "pvegpu@pve!deploy",
                                     "token_file": "/etc/pvegpu/pve-token"}})

Backends (pvegpu/pve.py): `ssh` (default) runs `pvesh` on the node over SSH with the host's own pyinfra SSH
settings (`ssh_hostname`, `ssh_user`, `ssh_key`, `ssh_known_hosts_file`) unless given here; the host key
must be known. `https` uses an API token whose secret is read from `token_file` on the machine running
pyinfra (the secret-file rules of `pvegpu.models.secret_file`; never printed).
`local` runs `pvesh` on the machine running pyinfra (which must be the node).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

from pvegpu.models.fields import AbsolutePath, matching

PVE_KEY = "pve"
ROOT_USER = "root@pam"
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
            "(TLS verified); `local`: pvesh on the machine running pyinfra."
        ),
    )
    hostname: str | None = Field(
        default=None, description="API / SSH address of the node; None: the host's `ssh_hostname`."
    )
    port: StrictInt | None = Field(
        default=None, ge=1, le=65535, description="API port (https: 8006) or SSH port; None: the default."
    )
    ssh_user: str | None = Field(default=None, description="SSH user for `ssh`; None: the host's `ssh_user`.")
    ssh_key: AbsolutePath | None = Field(
        default=None, description="SSH private key for `ssh`; None: the host's `ssh_key`."
    )
    known_hosts: AbsolutePath | None = Field(
        default=None,
        description="known_hosts file holding the node's SSH key; None: the host's `ssh_known_hosts_file`.",
    )
    sudo: bool = Field(default=False, description="Run pvesh through sudo (`ssh`/`local`, non-root user).")
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
        """Who the API acts as: pvesh always runs as root@pam; a token acts as `user@realm!name`."""
        return self.token_id if self.backend == "https" and self.token_id else ROOT_USER
