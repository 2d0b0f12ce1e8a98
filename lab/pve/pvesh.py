#!/usr/bin/python3
"""pvesh: the pvegpu lab's STAND-IN for Proxmox VE's `pvesh`. This is NOT Proxmox.

Installed into lab Proxmox nodes as /usr/bin/pvesh (Debian's python3, stdlib only). It answers the API calls
pvegpu makes, the way `pvesh` does (shared/knowledge/proxmox-api-behaviour.md is the spec). This module is
pvesh's command line (PVE::CLI::pvesh: Getopt over the endpoint's schema, the output formats); the API it
calls is the package pvelib beside it (lab/pve/pvelib/__init__.py says which module holds what):

    pvesh <get|set|create|delete> <api_path> [--opt value]... [--output-format json|json-pretty]

- success: compact JSON with sorted keys + "\\n" on stdout (nothing for calls that return null); handler
  output (qemu PUT's `update VM ...`, task output) comes first;
- async calls (VM create, destroy, start, stop, shutdown) run to completion, then print their UPID; a
  failed task prints its error on stderr and still exits 0; `GET /nodes/{node}/tasks/{upid}/status` reads
  the log, which the worker writes as it runs: a worker killed mid-way (pvesh killed) leaves a log without a
  `TASK ...` line, its status is then `stopped` with exitstatus `unexpected status`, as in Proxmox;
  `GET /nodes/{node}/tasks` lists the tasks (newest first; `vmid`, `typefilter`, `source`, `limit`);
- a VM/CT create writes the stub config `lock: create` before its worker runs, and the worker replaces it
  with the final config; every write and start refuses a locked guest (`VM is locked (create)`) until the
  lock is removed (`qm unlock <vmid>` / `pct unlock <vmid>` on a real node; in the lab: `pvesh set
  .../config --delete lock --skiplock 1`); `DELETE /nodes/{node}/qemu/{vmid}` (task `qmdestroy`:
  `skiplock`, `purge`, `destroy-unreferenced-disks`) destroys a VM and its volumes (`destroy_qemu`;
  without `purge`, a VM in /etc/pve/ha/resources.cfg or /etc/pve/replication.cfg is refused);
- what holds a guest: `GET /cluster/ha/resources` and `/cluster/ha/status/current` (ha.py; Sys.Audit on
  `/`), `GET /cluster/replication` (replication.cfg; the jobs of guests the user has VM.Audit on), `GET
  /cluster/backup` (the vzdump jobs of /etc/pve/jobs.cfg; Sys.Audit on `/`);
- errors: `400 Parameter verification failed.` + one `<param>: <msg>` line each + the usage line; plain
  `die` texts; `Unknown option: <name>`; `No '<cmd>' handler defined for '<path>'` (exit 1); else exit 255.
- storage (pve-storage): `GET /storage` (`type`), `GET /storage/{storage}` (with `digest`), `PUT
  /storage/{storage}` (`content`, `disable`, `delete`, `digest`; answers `{"storage","type"}`; errors
  prefixed `update storage failed: `; a content type the plugin lacks is dropped with a stderr warning),
  `GET /nodes/{node}/storage/{storage}/content` (`content`, `vmid`: `{volid, format, size, ctime, content,
  vmid?, used?}` sorted by volid), `DELETE /nodes/{node}/storage/{storage}/content/{volume}` (task
  `imgdel`: a volid, slashes and all, or a volname of `{storage}`; Datastore.Allocate), `POST
  /nodes/{node}/storage/{storage}/download-url` (task `download`, id the file name: `url`, `content`
  iso|vztmpl|import, `filename`, `checksum` + `checksum-algorithm`,
  `compression`, `verify-certificates`; fetched with urllib; a file already there with the right checksum
  is kept, "no need to download");
- volumes: a data file per volume: dir storages under their `path` (images/<vmid>/vm-<vmid>-disk-<N>.<fmt>,
  import/, snippets/, template/iso, template/cache; volids `local:<vmid>/<name>`, `local:import/<file>`),
  other storages <root>/var/lib/pvegpu-lab/volumes/<storage>/<name> (volids `<storage>:vm-<vmid>-disk-<N>`);
  a plain allocation is an empty file, `<storage>:0,import-from=<volid>` copies the source (size: a qcow2
  header's virtual size, else the file's), `<storage>:cloudinit` makes `vm-<vmid>-cloudinit`;
  `PUT /nodes/{node}/qemu/{vmid}/resize` (task `resize`: `disk`, `size` `<N>[KMGT]` or `+<N>[KMGT]`)
  rewrites `size=` (the stand-in's volume size is the `size=` its config records);
- cloud-init keys (citype, ciuser, cipassword (masked on GET), sshkeys (URL-encoded, each line a key),
  ipconfigN, nameserver, searchdomain, ciupgrade, cicustom) with qemu-server's schema checks; a VM start
  with a `vm-<vmid>-cloudinit` drive reads every cicustom volume (Cloudinit.pm's errors) and hands the lab
  hypervisor the user-data (the `user` snippet, else Proxmox's generated user-data);
- VM start request to the lab hypervisor: {"action": "start", "vmid", "name", "machine" (conf or
  "pc"), "bios" (conf or "seabios"), "mac" (net0's), "devices", "disk": null | {"key", "volume", "path"
  (data file, a path on the node)}, "cloud_init": null | {"user_data", "ipconfig0", "hostname", "mac"
  (net0's)}, "config" (the VM's config as started: the hypervisor builds QEMU's command line from it)};
  each device: {"hostpci", "pcie", "functions", "vendors", "classes" (each function's sysfs values)}; an
  answer's `"guest": null` (nothing boots) still leaves the VM running; a refusal's `log` lines (QEMU's
  stderr) go to the task log before its `start failed: <error>`;
- guest agent (`agent` must be set, the VM running, the agent "running": the hypervisor's
  <root>/var/lib/pvegpu-lab/agent/<vmid>.json): `GET .../agent/network-get-interfaces` answers that file;
  `GET .../agent/get-fsinfo` (answers `{"result": <result>}`), `GET .../agent/file-read` (`file`, `count`,
  `decode`, `offset`), `POST .../agent/file-write` (`file`, `content`, `encode`; the hypervisor gets the
  decoded content), `POST .../agent/exec` (`command` repeated, `input-data`), `GET .../agent/exec-status`
  (`pid`) are asked of the hypervisor as {"action": "agent", "vmid", "command", "params"}; the latter four
  answer its `result` as is; its `error` fails the call with `Agent error: <error>`.

State lives in Proxmox's file formats under the configured root: /etc/pve/mapping/pci.cfg,
/etc/pve/storage.cfg (when absent: what the installer writes, `local` dir + `local-lvm` lvmthin),
/etc/pve/qemu-server/<vmid>.conf, /etc/pve/lxc/<ctid>.conf, /var/log/pve/tasks/. PCI hardware is read from
the configured sysfs root. A VM start runs the VM's `hookscript` (`pre-start`, validated like
check_hookscript, its output in the task log, a non-zero exit refusing the start), then checks every mapped
path against that sysfs like Proxmox does, then asks the lab hypervisor (lab/pve/hypervisor.py, outside
the node) to bring the guest lab host up (it first has real QEMU parse the command line qemu-server would
build: lab/pve/qemu_check.py; a refusal fails the start); a CT start checks every `devN` device node, then
asks it to bring the container lab host up. Stops ask it to stop them.

Permissions: a call is made by `Call.rpcenv.user` (access.py's RpcEnv): root@pam under pvesh (every check
passes), the API token under the pveproxy stand-in (`call_api`). Each endpoint's `permissions` clause
(`PERMISSIONS`) is checked before its parameters; the handlers check what qemu-server, pve-container,
pve-storage and pve-manager check inside (`check_vm_modify_config_perm`: keys outside its lists, e.g.
`hookscript`, `args`, `hugepages`, `affinity`, `lock`, are root@pam's only on create, update and delete;
`check_hostpci_perm`: `host=` root's only, `mapping=` Mapping.Use; `skiplock` root's only; storage and
volume access; a CT's `devN` and `hookscript` root's only; other users' tasks need Sys.Audit); each accepted
guest config write is logged (`<user> <METHOD> <path> <keys>`) in /var/log/pvegpu-lab/api-writes.log. The
UPID's user is the caller (a token: `user@realm!name`; its task status splits it into `user` and
`tokenid`). `GET /access/permissions` answers as pve-access-control does.

Settings: JSON file $PVEGPU_LAB_PVE_CONFIG (default /etc/pvegpu-lab/pve.json), keys: node (required),
sysfs_root ("/sys"), root ("/": prefix of every state path), hypervisor_dir (null: VMs only change state),
hypervisor_timeout_s (180), version ("9.0.3"), release ("9.0"). The storages are storage.cfg's.

Not modelled: other endpoints and options (e.g. VM create's `start`, `pool`; unpacking a CT's template: the
container lab host is a Debian root, whatever `ostemplate` says), pools and their permissions, proxying
to other nodes, HA beyond its two reads, legacy backup jobs (vzdump.cron), hotplug (a running VM keeps
every change but name/description/onboot/tags/protection pending), PCI vendor/device names, output formats
other than json/json-pretty (the default prints json-pretty), a real QEMU process (a running VM is a
placeholder process in the node, argv `/usr/bin/kvm ... -id <vmid> -pidfile /var/run/qemu-server/<vmid>.pid`
over python3, that wrote its bare PID to that pidfile and lives while the file names it: what qemu-server's
`check_running` reads); storage: other storage types' volumes
(LVM, ZFS: files under /var/lib/pvegpu-lab/volumes), `nodes` restrictions, backups in content listings,
creating/deleting storages, download-url's image check (`qemu-img info` on an `import` file) and its
`zst`/`lzo` decompression; import-from: `qemu-img convert` (the data file is copied as is), another VM's
disk in use; cloud-init: building the cloud-init ISO (the hypervisor gets the texts), network-config and
meta-data, `cipassword` hashing; agent commands other than those above.
"""

from __future__ import annotations

import json
import re
import sys
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING or __package__:
    from lab.pve import access
    from lab.pve.pvelib.api import call_api, find_route
    from lab.pve.pvelib.errors import DieError, OptionError, ParamError
    from lab.pve.pvelib.jsonschema import P, parse_boolean
    from lab.pve.pvelib.rest import CMDS, Endpoint, schema_of
    from lab.pve.pvelib.settings import load_settings
else:  # a script (/usr/bin/pvesh's launcher, the tests): access.py and the package pvelib lie beside it
    import access
    from pvelib.api import call_api, find_route
    from pvelib.errors import DieError, OptionError, ParamError
    from pvelib.jsonschema import P, parse_boolean
    from pvelib.rest import CMDS, Endpoint, schema_of
    from pvelib.settings import load_settings

HELP = """\
pvesh - the pvegpu lab's STAND-IN for Proxmox VE's pvesh (not Proxmox; see /usr/bin/pvesh's docstring)

USAGE: pvesh <get|set|create|delete> <api_path> [OPTIONS] [--output-format json|json-pretty]

Endpoints: /version, /access/permissions, /cluster/mapping, /cluster/mapping/{pci|dir}[/{id}],
/cluster/ha/resources,
/cluster/ha/status/current, /cluster/replication, /cluster/backup, /storage[/{storage}],
/nodes/{node}/qemu, /nodes/{node}/qemu/{vmid} (delete), /nodes/{node}/qemu/{vmid}/config,
/nodes/{node}/qemu/{vmid}/status/{current|start|stop|shutdown},
/nodes/{node}/qemu/{vmid}/resize,
/nodes/{node}/qemu/{vmid}/agent/{network-get-interfaces|get-fsinfo|file-read|file-write|exec|exec-status},
/nodes/{node}/storage/{storage}/{content|download-url},
/nodes/{node}/storage/{storage}/content/{volume} (delete),
/nodes/{node}/lxc[/{vmid}/config|/{vmid}/status/{current|start|stop}],
/nodes/{node}/tasks, /nodes/{node}/tasks/{upid}/status, /nodes/{node}/tasks/{upid}/log
"""


FORMAT_OPTIONS = {"output-format", "noproxy", "human-readable", "noborder", "noheader", "quiet"}


def parse_options(argv: list[str], endpoint: Endpoint) -> tuple[dict[str, Any], str]:
    """Options -> raw values (strings; lists for arrays); returns (params, output format)."""
    raw: dict[str, Any] = {}
    output = "json-pretty"
    unknown: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        match = re.fullmatch(r"--?([^=]+?)(?:=(.*))?", arg, re.DOTALL)
        if not match or arg in ("-", "--"):
            raise OptionError([])
        name, inline = match.group(1), match.group(2)
        schema = schema_of(endpoint, name)
        if name in FORMAT_OPTIONS:
            value, i = _take(argv, i, inline, boolean=name != "output-format")
            if name == "output-format":
                output = value
            continue
        if schema is None:
            unknown.append(name)
            _, i = _take(argv, i, inline, boolean=True)
            continue
        value, i = _take(argv, i, inline, boolean=schema.type == "boolean")
        if schema.type == "boolean" and parse_boolean(value) is None:
            raise OptionError([])  # get_options runs parse_boolean itself
        if schema.type == "array":
            raw.setdefault(name, []).append(value)
        elif name in raw:
            if not schema.list_format:
                raise OptionError([f"Duplicate option: {name}"])
            raw[name] = f"{raw[name]},{value}"
        else:
            raw[name] = value
    if unknown:
        raise OptionError([f"Unknown option: {name}" for name in unknown])
    return raw, output


def _take(argv: list[str], i: int, inline: str | None, *, boolean: bool) -> tuple[str, int]:
    if inline is not None:
        return inline, i + 1
    nxt = argv[i + 1] if i + 1 < len(argv) else None
    if nxt is None or (boolean and re.match(r"--?[A-Za-z]", nxt)):
        if boolean:
            return "1", i + 1
        raise OptionError([f"Option {argv[i].lstrip('-')} requires an argument"])
    return nxt, i + 2


def usage(cmd: str, endpoint: Endpoint) -> str:
    required = [f"--{k} {_type_text(p)}" for k, p in sorted(endpoint.params.items()) if not p.optional]
    has_optional = any(p.optional for p in endpoint.params.values()) or endpoint.extra is not None
    words = ["pvesh", cmd, "<api_path>", *required]
    if has_optional:
        words.append("[OPTIONS]")
    words.append("[FORMAT_OPTIONS]")
    return " ".join(words)


def _type_text(p: P) -> str:
    if p.enum:
        return f"<{' | '.join(p.enum)}>"
    if p.type == "integer" and p.minimum is not None and p.maximum is not None:
        return f"<integer> ({p.minimum} - {p.maximum})"
    return f"<{p.type}>"


def fail(text: str, code: int = 255) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.write(text)
    sys.stderr.flush()
    raise SystemExit(code)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(HELP)
        return 0
    cmd = argv[0]
    if cmd not in CMDS:
        fail(f"ERROR: unknown command 'pvesh {cmd}'\n{HELP}")
    if len(argv) < 2:
        fail(f"400 not enough arguments\npvesh {cmd} <api_path> [OPTIONS] [FORMAT_OPTIONS]\n")
    path = argv[1]
    found = find_route(cmd, path)
    if found is None:
        fail(f"No '{cmd}' handler defined for '{path}'\n", 1)
    endpoint = found[0]
    try:
        raw, output = parse_options(argv[2:], endpoint)
    except OptionError as error:
        fail(
            "".join(f"{line}\n" for line in error.lines)
            + "400 unable to parse option\n"
            + usage(cmd, endpoint)
            + "\n"
        )
    try:
        result = call_api(load_settings(), access.RpcEnv(), cmd, path, raw)
    except ParamError as error:
        lines = "".join(f"{k}: {v}\n" for k, v in sorted(error.errors.items()))
        fail(f"400 Parameter verification failed.\n{lines}{usage(cmd, endpoint)}\n")
    except (DieError, access.PermissionDenied) as error:
        fail(error.text)
    if endpoint.returns_null:
        return 0
    if output == "json-pretty":
        sys.stdout.write(json.dumps(result, sort_keys=True, indent=3, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write(json.dumps(result, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
