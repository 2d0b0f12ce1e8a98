"""A Proxmox lab node's HTTPS API, set up the way an operator sets up a real node for pvegpu.

`install(host)` writes into the node's root:
- its certificate, /etc/pve/nodes/<name>/pve-ssl.pem and .key (self-signed RSA 2048, made with openssl as
  pve-cluster's pvecm updatecerts does; /etc/pve/local links to nodes/<name>, as pmxcfs shows it);
- /etc/pve/user.cfg: the user `pvegpu@pve`, its privilege-separated token `pvegpu@pve!deploy`, the role
  `PVEGPU` holding exactly pvegpu's privileges (pvegpu.models.pve_privileges) and both granted the role on
  `/` (propagating), in pve-access-control's write_user_config format;
- /etc/pve/priv/token.cfg: the token's secret (a UUID, as `pveum user token add` makes one), mode 0600;
and on the operator's side, in the host's state directory (lab.hosts), `pve-token` (the secret, one line,
mode 0600: the inventory's `token_file`) and `pve-api.json` (`{"port", "fingerprint", "token_id",
"token_file"}`: the certificate's SHA-256 fingerprint as `pvenode cert info` prints it, `AA:BB:...`).

`start(host)` runs the pveproxy stand-in (lab/pve/pveproxy.py) inside the node, detached, its log
/var/log/pvegpu-lab/pveproxy.log; it returns once port 8006 accepts connections. It runs in the node's
namespaces, so `lab down` ends it with the node's other processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import ssl
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from lab import hosts
from lab.errors import LabError
from pvegpu.models.pve_privileges import ACL_PATH, ROLE_NAME, privilege_names

PORT = 8006
USER_ID = "pvegpu@pve"
TOKEN_ID = f"{USER_ID}!deploy"
API_RECORD = "pve-api.json"
TOKEN_FILE = "pve-token"
PVEPROXY_LOG = "/var/log/pvegpu-lab/pveproxy.log"
STANDIN_DIR = "/usr/lib/pvegpu-lab"
_START_TIMEOUT_S = 30.0


def fingerprint_of(pem: str) -> str:
    """The SHA-256 fingerprint of a PEM certificate, `AA:BB:...` (what `pvenode cert info` prints)."""
    digest = hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest().upper()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def write_certificate(root: Path, node: str, address: str) -> str:
    """The node's self-signed certificate and key under `root` (module docstring); returns its fingerprint."""
    folder = root / "etc/pve/nodes" / node
    folder.mkdir(parents=True, exist_ok=True)
    local = root / "etc/pve/local"
    if not local.exists() and not local.is_symlink():
        local.symlink_to(f"nodes/{node}")
    key, cert = folder / "pve-ssl.key", folder / "pve-ssl.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", "3650"),
            *("-subj", f"/OU=PVE Cluster Node/O=Proxmox Virtual Environment/CN={node}.lab"),
            *("-addext", f"subjectAltName=IP:{address},DNS:{node}", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    key.chmod(0o600)
    return fingerprint_of(cert.read_text())


def user_cfg() -> str:
    """/etc/pve/user.cfg with the pvegpu user, token, role and ACLs, as write_user_config orders it."""
    privileges = ",".join(privilege_names())
    return (
        f"user:{USER_ID}:1:0::::pvegpu::\n"
        f"token:{TOKEN_ID}:0:1:pvegpu:\n"
        "user:root@pam:1:0:::root@localhost:::\n"
        "\n\n\n"
        f"role:{ROLE_NAME}:{privileges}:\n"
        "\n"
        f"acl:1:{ACL_PATH}:{USER_ID},{TOKEN_ID}:{ROLE_NAME}:\n"
    )


def write_access(root: Path, secret: str) -> None:
    """user.cfg and token.cfg under `root` (module docstring)."""
    (root / "etc/pve").mkdir(parents=True, exist_ok=True)
    (root / "etc/pve/user.cfg").write_text(user_cfg())
    private = root / "etc/pve/priv"
    private.mkdir(mode=0o700, parents=True, exist_ok=True)
    token_cfg = private / "token.cfg"
    token_cfg.write_text(f"{TOKEN_ID} {secret}\n")
    token_cfg.chmod(0o600)


def write_secret(path: Path, secret: str) -> None:
    """The operator's token file: created 0600 (never readable by others, not even for a moment)."""
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(f"{secret}\n")


def install(host: hosts.LabHost) -> dict[str, Any]:
    """Certificate, access config and token file for `host` (module docstring); returns its API record."""
    fingerprint = write_certificate(host.root, host.name, host.address)
    secret = str(uuid.uuid4())
    write_access(host.root, secret)
    token_file = host.state_dir / TOKEN_FILE
    write_secret(token_file, secret)
    api = {"port": PORT, "fingerprint": fingerprint, "token_id": TOKEN_ID, "token_file": str(token_file)}
    (host.state_dir / API_RECORD).write_text(json.dumps(api, indent=1, sort_keys=True) + "\n")
    return api


def record(host: hosts.LabHost) -> dict[str, Any] | None:
    """The API record `install` wrote for `host`, None when it has none."""
    path = host.state_dir / API_RECORD
    return dict(json.loads(path.read_text())) if path.is_file() else None


def start(host: hosts.LabHost) -> None:
    """Start the pveproxy stand-in inside `host` and wait until it accepts connections."""
    command = (
        f"mkdir -p {os.path.dirname(PVEPROXY_LOG)} && "
        f"setsid -f python3 {STANDIN_DIR}/pveproxy.py </dev/null >>{PVEPROXY_LOG} 2>&1"
    )
    done = subprocess.run(hosts.ssh_argv(host, command), check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise LabError(f"{host.name}: starting pveproxy: exit {done.returncode}: {done.stderr.strip()}")
    deadline = time.monotonic() + _START_TIMEOUT_S
    while True:
        try:
            with socket.create_connection((host.address, PORT), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                log = (host.root / PVEPROXY_LOG.lstrip("/")).read_text(errors="replace")[-2000:]
                raise LabError(f"{host.name}: pveproxy did not start; its log:\n{log}") from None
            time.sleep(0.05)
