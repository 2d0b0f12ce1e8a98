"""A small typed interface to the Proxmox VE API, over proxmoxer 2.3.0.

Backends (`pvegpu.pve.https.connect_https`, `ssh_transport`, `connect_local`):

- `https`: proxmoxer's requests backend with an API token (`user@realm!name` + secret), in
  pvegpu/pve/https.py (so that the other backends never import requests). TLS is verified against the
  system CAs by default, or against `ca_file`; with `fingerprint` the certificate is pinned instead.
- `ssh`: proxmoxer's paramiko session runs `pvesh` on the node. The host key must already be known
  (system known_hosts or `known_hosts`): an unknown key is refused, never added. TCP_NODELAY is set on
  its socket (pvegpu/pve/nodelay.py). A connection that is gone (the node rebooted) is re-established before
  the next call.
- `local`: proxmoxer's local session runs `pvesh` on this node.

A token is never root@pam, and Proxmox lets only root@pam send some writes (pvegpu.models.pve_root_only:
`hookscript`, `args`, `hugepages`, `affinity`, `lock`, `skiplock`, raw `host=`, a CT's `devN`). `RootRouted`
sends those through root's `pvesh` on the node over SSH (`ssh_transport`) and every other call through the
token; `PveClient.acts_as` says which identity a call goes out as (a create's task runs as that user).

The command backends build the `pvesh` argv here rather than through proxmoxer's flattening, which sends a
list as ONE argument (`-map "['a', 'b']"`, an invalid mapping): every list value becomes a repeated option
(`--map A --map B`), booleans `1`/`0`. pvesh runs async calls to completion, prints worker output then the
UPID, and exits 0 even when the task failed (shared/knowledge/proxmox-api-behaviour.md §0.1): the task's
`exitstatus` is the only truth, so every UPID is waited for (`wait_task`).

Every API failure raises `PveError` carrying Proxmox's status and message verbatim and the endpoint it came
from (`PUT /cluster/mapping/pci/gpu0`); `PveError.line` says both in one line. An answer that is not the
API's (an HTML page, cut-off or unparsable JSON, JSON of the wrong shape) raises `PveResponseError` naming
the endpoint and the answer's first line. A connection lost under a sent call raises
`PveConnectionLostError`; a read (GET) is sent once more first, a write never (`resent_if_read`). A write
that returns nothing proves nothing: pvesh prints the handler's own lines there (`update VM 100: -cores 4`),
so callers read back what they wrote.

Modules: `errors`, `transport` (pvesh argv, RootRouted), `ssh`, `https`, `local`, `nodelay`, `client`
(`PveClient`), `answers` (its answer parsers), `host_client` (the per-host client of a run).
"""
