"""`PveClient`: the API calls pvegpu makes, typed, over one transport (pvegpu/pve/transport.py)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from pvegpu.models.dir_mapping import DirMapping, DirMappingState
from pvegpu.models.pve import (
    BackupJob,
    GuestConfig,
    GuestInterface,
    MappingState,
    PciMapping,
    ReplicationJob,
    StorageConfig,
    StorageVolume,
    TaskStatus,
    VmStatus,
)
from pvegpu.pve.answers import (
    ShapeError,
    answer_dict,
    answer_list,
    answer_strings,
    backup_job,
    guest_config,
    mapping_params,
    mapping_state,
    replication_job,
    response_error,
    text_of,
    vm_status,
)
from pvegpu.pve.errors import PveError, PveResponseError, TaskFailedError, TaskTimeoutError, Unparsed
from pvegpu.pve.transport import Method, Params, Transport, acts_as
from pvegpu.run.wait import WaitTimeoutError, wait_until

UPID = re.compile(
    r"UPID:(?P<node>[a-zA-Z0-9.\-]+):[0-9A-Fa-f]{8}:[0-9A-Fa-f]{8,9}:[0-9A-Fa-f]{8}:[^:\s/]+:[^:\s/]*:[^:\s/]+:"
)

_T = TypeVar("_T")
# pve-storage (src/PVE/Storage/Plugin.pm, verify_path) takes any path of `/` and one character other than `;`,
# `(`, `)` ("fixme: exclude more shell meta characters?"); a storage's directory reaches commands on the node
# (snippets, the hookscript), so what a shell or a line-based read could take for syntax is refused.
_UNSAFE_PATH = re.compile(r"[\x00-\x1f\x7f`$\\\"']")


@dataclass(frozen=True)
class PveClient:
    """The API calls pvegpu makes. Paths and parameters are Proxmox's (proxmox-api-behaviour.md).

    Every PveError leaving a method carries the endpoint (`PveError.line`); an answer of the wrong kind
    raises PveResponseError. Writes that return nothing are not proof of anything: read back."""

    call: Transport

    def acts_as(self, method: Method, path: str, params: Params) -> str:
        """Who Proxmox sees sending `method path params` (`root@pam`, or the token id): the identity a
        create's task runs as (its UPID's user), and whether a root-only call can be sent at all."""
        return acts_as(self.call, method, path, params)

    def _call(self, method: Method, path: str, params: Params) -> object:
        try:
            return self.call(method, path, params)
        except PveError as error:
            error.endpoint = error.endpoint or f"{method} {path}"
            raise

    def _read(self, path: str, params: Params, parse: Callable[[object], _T]) -> _T:
        """`GET path`, its data parsed by `parse`; an answer `parse` cannot take is a PveResponseError."""
        data = self._call("GET", path, params)
        try:
            return parse(data)
        except ShapeError as shape:
            raise response_error(f"GET {path}", shape.expected, data) from None
        except KeyError as missing:
            raise response_error(f"GET {path}", f"an object with {missing.args[0]!r}", data) from None
        except (TypeError, ValueError) as error:
            raise response_error(f"GET {path}", f"Proxmox's format ({error})", data) from None

    def _write(self, method: Method, path: str, params: Params) -> None:
        """A call whose result is null: None, or under pvesh the handler's own lines (`Unparsed`)."""
        data = self._call(method, path, params)
        if data is not None and not isinstance(data, Unparsed):
            raise response_error(f"{method} {path}", "no data", data)

    def _task(self, method: Method, path: str, params: Params) -> str:
        """A call that starts a task: its UPID."""
        data = self._call(method, path, params)
        if not isinstance(data, str) or UPID.fullmatch(data) is None:
            raise response_error(f"{method} {path}", "a task id (UPID)", data)
        return data

    # -- access
    def permissions(self, path: str) -> frozenset[str]:
        """`GET /access/permissions?path=<path>`: the privileges the calling identity holds on `path`
        (pve-access-control API2/AccessControl.pm `permissions`; a privilege-separated token's answer is
        what the token itself may do). `{}` for a path it holds nothing on."""

        def parse(data: object) -> frozenset[str]:
            return frozenset(str(name) for name in answer_dict(answer_dict(data).get(path, {})))

        return self._read("/access/permissions", {"path": path}, parse)

    # -- cluster PCI mappings
    def mappings(self, check_node: str | None = None) -> tuple[MappingState, ...]:
        """`GET /cluster/mapping/pci`; with `check_node`, each mapping's checks for that node."""
        checked = check_node is not None
        return self._read(
            "/cluster/mapping/pci",
            {"check-node": check_node},
            lambda data: tuple(mapping_state(item, checked=checked) for item in answer_list(data)),
        )

    def mapping(self, mapping_id: str) -> MappingState | None:
        """`GET /cluster/mapping/pci/{id}`, None when Proxmox says `mapping '<id>' not found`."""
        return self._mapping_or_none(
            "pci",
            mapping_id,
            lambda data: mapping_state({**answer_dict(data), "id": mapping_id}, checked=False),
        )

    def _mapping_or_none(self, kind: str, mapping_id: str, parse: Callable[[object], _T]) -> _T | None:
        """`GET /cluster/mapping/{kind}/{id}` parsed, None when Proxmox says `mapping '<id>' not found`."""
        try:
            return self._read(f"/cluster/mapping/{kind}/{mapping_id}", {}, parse)
        except PveResponseError:
            raise
        except PveError as error:
            if error.message == f"mapping '{mapping_id}' not found":
                return None
            raise

    def create_mapping(self, mapping: PciMapping) -> None:
        """`POST /cluster/mapping/pci` (`pci ID '<id>' already defined` when it exists)."""
        self._write("POST", "/cluster/mapping/pci", {"id": mapping.id, **mapping_params(mapping)})

    def update_mapping(self, mapping: PciMapping, digest: str) -> None:
        """`PUT /cluster/mapping/pci/{id}` with the whole `map` and the `digest` of the GET it is based on:
        a concurrent edit fails with Proxmox's `detected modified configuration` error, nothing written."""
        params = {**mapping_params(mapping), "digest": digest}
        self._write("PUT", f"/cluster/mapping/pci/{mapping.id}", params)

    def delete_mapping(self, mapping_id: str) -> None:
        """`DELETE /cluster/mapping/pci/{id}` (a missing id is not an error)."""
        self._write("DELETE", f"/cluster/mapping/pci/{mapping_id}", {})

    # -- cluster directory mappings (pve-manager API2/Cluster/Mapping/Dir.pm)
    def dir_mapping(self, mapping_id: str) -> DirMappingState | None:
        """`GET /cluster/mapping/dir/{id}`, None when Proxmox says `mapping '<id>' not found`."""

        def parse(data: object) -> DirMappingState:
            values = answer_dict(data)
            description = values.get("description")
            mapping = DirMapping(
                mapping_id,
                tuple(answer_strings(values.get("map", []))),
                None if description is None else str(description),
            )
            return DirMappingState(mapping, text_of(values, "digest"))

        return self._mapping_or_none("dir", mapping_id, parse)

    def create_dir_mapping(self, mapping: DirMapping) -> None:
        """`POST /cluster/mapping/dir` (`create directory mapping failed: dir ID '<id>' already defined` when
        it exists; Mapping.Modify on /mapping/dir)."""
        params = {"id": mapping.id, "map": list(mapping.map), "description": mapping.description}
        self._write("POST", "/cluster/mapping/dir", params)

    def update_dir_mapping(self, mapping: DirMapping, digest: str) -> None:
        """`PUT /cluster/mapping/dir/{id}` with the whole `map` and the `digest` of the read it is based on
        (the whole directory.cfg's: a file changed since is refused; Mapping.Modify on /mapping/dir/{id})."""
        params = {"map": list(mapping.map), "description": mapping.description, "digest": digest}
        self._write("PUT", f"/cluster/mapping/dir/{mapping.id}", params)

    # -- what holds a guest: HA, replication, backup jobs
    def ha_resources(self) -> tuple[str, ...]:
        """`GET /cluster/ha/resources`: the sid of every configured HA resource (`vm:100`, `ct:101`),
        whatever its requested state (pve-ha-manager API2/HA/Resources.pm `index`; Sys.Audit on `/`)."""
        return self._read(
            "/cluster/ha/resources",
            {},
            lambda data: tuple(text_of(item, "sid") for item in answer_list(data)),
        )

    def replication_jobs(self) -> tuple[ReplicationJob, ...]:
        """`GET /cluster/replication`: the storage replication jobs of the guests the identity holds
        VM.Audit on (pve-manager API2/ReplicationConfig.pm `index`)."""
        return self._read(
            "/cluster/replication",
            {},
            lambda data: tuple(replication_job(item) for item in answer_list(data)),
        )

    def backup_jobs(self) -> tuple[BackupJob, ...]:
        """`GET /cluster/backup`: the vzdump backup jobs, in Proxmox's order (pve-manager API2/Backup.pm
        `index`; Sys.Audit on `/`)."""
        return self._read(
            "/cluster/backup", {}, lambda data: tuple(backup_job(item) for item in answer_list(data))
        )

    # -- qemu
    def create_vm(self, node: str, vmid: int, config: Params) -> str:
        """`POST /nodes/{node}/qemu`; returns the UPID (wait for it: creation runs as a task)."""
        return self._task("POST", f"/nodes/{node}/qemu", {"vmid": vmid, **config})

    def vm_config(self, node: str, vmid: int, current: bool = False) -> GuestConfig:
        """`GET …/qemu/{vmid}/config` with pending values applied (what the next cold start gets), plus its
        `digest`; `current`: the values in effect now, without the `[PENDING]` section (`current=1`)."""
        params: Params = {"current": True} if current else {}
        return self._read(f"/nodes/{node}/qemu/{vmid}/config", params, guest_config)

    def update_vm_config(
        self, node: str, vmid: int, values: Params, digest: str, delete: Sequence[str] = ()
    ) -> None:
        """`PUT …/qemu/{vmid}/config` (synchronous) with the GET's `digest`: a concurrent edit fails with
        `checksum mismatch (file change by other user?)`. `delete` removes keys."""
        params = {**values, "delete": ",".join(delete) or None, "digest": digest}
        self._write("PUT", f"/nodes/{node}/qemu/{vmid}/config", params)

    def unlock_vm(self, node: str, vmid: int, digest: str) -> None:
        """`PUT …/qemu/{vmid}/config` with `delete=lock`, `skiplock=1` and the GET's `digest`: what `qm
        unlock` does. Only root@pam may (`skiplock: Only root may use this option.`)."""
        params: Params = {"delete": "lock", "skiplock": True, "digest": digest}
        self._write("PUT", f"/nodes/{node}/qemu/{vmid}/config", params)

    def destroy_vm(self, node: str, vmid: int) -> str:
        """`DELETE /nodes/{node}/qemu/{vmid}` with neither `purge` nor `destroy-unreferenced-disks`: it frees
        only the volumes its config names that `vmid` owns (qemu-server QemuServer.pm destroy_vm; the
        caller frees the others it proves its own: `delete_volume`) and edits no backup, replication or HA
        entry; returns the UPID. Refused before a task (API2/Qemu.pm destroy_vm's early checks): a VM in HA
        (`unable to remove VM 100 - used in HA resources and purge parameter not set.`), one with a
        replication job (`There is a replication job '100-0' for guest '100' - Please remove that
        first.`), a running one (`VM 100 is running - destroy failed`); a locked one fails the task (`VM is
        locked (create)`). A backup job naming `vmid` is left as it is."""
        return self._task("DELETE", f"/nodes/{node}/qemu/{vmid}", {})

    def start_vm(self, node: str, vmid: int) -> str:
        """`POST …/status/start`; returns the UPID. A failed start (e.g. an invalid mapping) still returns
        one: `wait_task` raises with the task's exitstatus."""
        return self._task("POST", f"/nodes/{node}/qemu/{vmid}/status/start", {})

    def stop_vm(self, node: str, vmid: int) -> str:
        """`POST …/status/stop`; returns the UPID (stopping a stopped VM succeeds)."""
        return self._task("POST", f"/nodes/{node}/qemu/{vmid}/status/stop", {})

    def vm_status(self, node: str, vmid: int) -> VmStatus:
        """`GET …/qemu/{vmid}/status/current`."""
        return self._read(f"/nodes/{node}/qemu/{vmid}/status/current", {}, vm_status)

    def shutdown_vm(self, node: str, vmid: int, timeout_s: int) -> str:
        """`POST …/status/shutdown` (the guest OS shuts down cleanly) with `timeout`; returns the UPID (the
        task fails when the guest is still running after `timeout_s`)."""
        return self._task("POST", f"/nodes/{node}/qemu/{vmid}/status/shutdown", {"timeout": timeout_s})

    def agent_get(
        self, node: str, vmid: int, command: str, params: Params | None = None
    ) -> dict[str, object]:
        """`GET …/qemu/{vmid}/agent/{command}` (`get-fsinfo`, `file-read` with `file`): the answer object
        (`{"result": ...}`, file-read's `{"content": ...}`). A PveError while the agent does not answer
        (`QEMU guest agent is not running`) or the command fails in the guest."""
        return self._read(f"/nodes/{node}/qemu/{vmid}/agent/{command}", params or {}, answer_dict)

    def agent_file_read(self, node: str, vmid: int, path: str) -> str | None:
        """The text of `path` in the guest (`file-read`), None when the agent cannot read it (no agent, no
        file, not text)."""
        try:
            content = self.agent_get(node, vmid, "file-read", {"file": path}).get("content")
        except PveError:
            return None
        return content if isinstance(content, str) else None

    def agent_post(self, node: str, vmid: int, command: str, params: Params) -> object:
        """`POST …/qemu/{vmid}/agent/{command}` (`file-write` with `file`, `content`): its data, None for
        none (read back what was written)."""
        data = self._call("POST", f"/nodes/{node}/qemu/{vmid}/agent/{command}", params)
        return None if isinstance(data, Unparsed) else data

    # -- lxc
    def lxc_config(self, node: str, vmid: int) -> GuestConfig:
        """`GET …/lxc/{vmid}/config` (raw `lxc.*` lines under the key `lxc`), plus its `digest`."""
        return self._read(f"/nodes/{node}/lxc/{vmid}/config", {}, guest_config)

    def update_lxc_config(
        self, node: str, vmid: int, values: Params, digest: str, delete: Sequence[str] = ()
    ) -> None:
        """`PUT …/lxc/{vmid}/config` with the GET's `digest` (a concurrent edit: `detected modified
        configuration - file changed by other user? Try again.`). Raw `lxc.*` keys cannot be set here."""
        params = {**values, "delete": ",".join(delete) or None, "digest": digest}
        self._write("PUT", f"/nodes/{node}/lxc/{vmid}/config", params)

    def create_lxc(self, node: str, vmid: int, config: Params) -> str:
        """`POST /nodes/{node}/lxc`; returns the UPID (creation runs as a task)."""
        return self._task("POST", f"/nodes/{node}/lxc", {"vmid": vmid, **config})

    def start_lxc(self, node: str, vmid: int) -> str:
        """`POST …/lxc/{vmid}/status/start`; returns the UPID (`CT <vmid> already running` before one)."""
        return self._task("POST", f"/nodes/{node}/lxc/{vmid}/status/start", {})

    def stop_lxc(self, node: str, vmid: int) -> str:
        """`POST …/lxc/{vmid}/status/stop`; returns the UPID (`CT <vmid> not running` before one)."""
        return self._task("POST", f"/nodes/{node}/lxc/{vmid}/status/stop", {})

    def shutdown_lxc(self, node: str, vmid: int, timeout_s: int) -> str:
        """`POST …/lxc/{vmid}/status/shutdown` (a clean shutdown, lxc-stop(1)) with `timeout`; returns the
        UPID (`CT <vmid> not running` before one; the task fails when it still runs after `timeout_s`)."""
        return self._task("POST", f"/nodes/{node}/lxc/{vmid}/status/shutdown", {"timeout": timeout_s})

    def lxc_status(self, node: str, vmid: int) -> str:
        """`GET …/lxc/{vmid}/status/current`: `running` or `stopped`."""
        return self._read(
            f"/nodes/{node}/lxc/{vmid}/status/current", {}, lambda data: text_of(data, "status")
        )

    # -- storage (cloud images and cloud-init snippets)
    def storage(self, storage: str) -> StorageConfig:
        """`GET /storage/{storage}`: its content types, its directory (dir-like storages) and `digest`."""

        def parse(data: object) -> StorageConfig:
            values = answer_dict(data)
            path = values.get("path")
            if path is not None and _UNSAFE_PATH.search(str(path)):
                refused = PveError(
                    502,
                    f"storage {storage}: path {str(path)!r} holds a character pvegpu will not put in a "
                    "command",
                )
                refused.endpoint = f"GET /storage/{storage}"
                raise refused
            return StorageConfig(
                storage=storage,
                content=tuple(c for c in text_of(values, "content").split(",") if c),
                path=None if path is None else str(path),
                digest=text_of(values, "digest"),
                type=str(values.get("type", "")),
                shared=values.get("shared") in (1, "1", True),
            )

        return self._read(f"/storage/{storage}", {}, parse)

    def update_storage_content(self, storage: str, content: Sequence[str], digest: str) -> None:
        """`PUT /storage/{storage}` with `content` (the whole list) and the read's `digest`; Proxmox answers
        `{"storage": ..., "type": ...}` (read back: that proves nothing)."""
        self._call("PUT", f"/storage/{storage}", {"content": ",".join(content), "digest": digest})

    def storage_volumes(self, node: str, storage: str, content: str) -> tuple[str, ...]:
        """`GET /nodes/{node}/storage/{storage}/content?content=…`: the volume ids of that content type."""

        def parse(data: object) -> tuple[str, ...]:
            return tuple(text_of(item, "volid") for item in answer_list(data))

        path = f"/nodes/{node}/storage/{storage}/content"
        return self._read(path, {"content": content}, parse)

    def guest_volumes(self, node: str, storage: str, vmid: int) -> tuple[StorageVolume, ...]:
        """`GET /nodes/{node}/storage/{storage}/content?vmid=…`: the volumes guest `vmid` owns there, each
        with its `ctime` when the plugin reports one (pve-storage API2/Storage/Content.pm `index`: only the
        volumes the identity may access, Datastore.Allocate or Datastore.Audit with VM.Config.Disk)."""

        def parse(data: object) -> tuple[StorageVolume, ...]:
            found = []
            for item in answer_list(data):
                values = answer_dict(item)
                owner, ctime = values.get("vmid"), values.get("ctime")
                if owner is not None and not isinstance(owner, int):
                    raise ShapeError("an integer 'vmid'")
                if ctime is not None and not isinstance(ctime, int):
                    raise ShapeError("an integer 'ctime'")
                found.append(StorageVolume(text_of(values, "volid"), owner, ctime))
            return tuple(found)

        return self._read(f"/nodes/{node}/storage/{storage}/content", {"vmid": vmid}, parse)

    def delete_volume(self, node: str, storage: str, volid: str) -> str:
        """`DELETE /nodes/{node}/storage/{storage}/content/{volid}` (the volid whole: the content subclass
        takes the rest of the path, slashes included, pve-storage API2/Storage/Status.pm); returns the UPID
        of its `imgdel` task. Needs Datastore.Allocate on `/storage/{storage}`."""
        return self._task("DELETE", f"/nodes/{node}/storage/{storage}/content/{volid}", {})

    def download_url(self, node: str, storage: str, params: Params) -> str:
        """`POST /nodes/{node}/storage/{storage}/download-url`; returns the UPID (a checksum mismatch fails
        the task)."""
        return self._task("POST", f"/nodes/{node}/storage/{storage}/download-url", params)

    def resize_vm_disk(self, node: str, vmid: int, disk: str, size: str, digest: str) -> None:
        """`PUT …/qemu/{vmid}/resize` (`size` absolute, e.g. `32G`; Proxmox refuses to shrink)."""
        params = {"disk": disk, "size": size, "digest": digest}
        data = self._call("PUT", f"/nodes/{node}/qemu/{vmid}/resize", params)
        if data is not None and not isinstance(data, Unparsed) and not isinstance(data, str):
            raise response_error(f"PUT /nodes/{node}/qemu/{vmid}/resize", "no data or a task id", data)
        if isinstance(data, str) and UPID.fullmatch(data):
            self.wait_task(data, 600)

    def guest_addresses(self, node: str, vmid: int) -> tuple[GuestInterface, ...]:
        """`GET …/qemu/{vmid}/agent/network-get-interfaces`: each interface's name, MAC and addresses (a
        PveError while the guest agent is not running)."""

        def parse(data: object) -> tuple[GuestInterface, ...]:
            found = []
            for item in answer_list(answer_dict(data)["result"]):
                values = answer_dict(item)
                addresses = tuple(
                    f"{text_of(a, 'ip-address')}/{answer_dict(a).get('prefix', '')}"
                    for a in answer_list(values.get("ip-addresses", []))
                    if answer_dict(a).get("ip-address-type") == "ipv4"
                )
                mac = values.get("hardware-address")
                found.append(GuestInterface(text_of(values, "name"), str(mac or ""), addresses))
            return tuple(found)

        return self._read(f"/nodes/{node}/qemu/{vmid}/agent/network-get-interfaces", {}, parse)

    # -- tasks
    def task_status(self, upid: str) -> TaskStatus:
        """`GET /nodes/{node}/tasks/{upid}/status`, the node taken from the UPID."""

        def parse(data: object) -> TaskStatus:
            exitstatus = answer_dict(data).get("exitstatus")
            return TaskStatus(
                upid=upid,
                status=text_of(data, "status"),
                exitstatus=None if exitstatus is None else str(exitstatus),
            )

        return self._read(f"/nodes/{upid_node(upid)}/tasks/{upid}/status", {}, parse)

    def task_log(self, upid: str) -> tuple[str, ...]:
        """`GET /nodes/{node}/tasks/{upid}/log` with `limit=0` (every line): the task log's lines, in order
        (what the task printed: a failed VM start's QEMU error lines, then `TASK ERROR: ...`)."""

        def parse(data: object) -> tuple[str, ...]:
            return tuple(str(answer_dict(item).get("t", "")) for item in answer_list(data))

        return self._read(f"/nodes/{upid_node(upid)}/tasks/{upid}/log", {"start": 0, "limit": 0}, parse)

    def guest_tasks(self, node: str, vmid: int, limit: int = 10) -> tuple[TaskStatus, ...]:
        """`GET /nodes/{node}/tasks` of guest `vmid`, newest first: each one's status (`running`, or
        `stopped` with its exit status, e.g. `unexpected status` for a worker that was killed)."""

        def parse(data: object) -> tuple[TaskStatus, ...]:
            tasks = []
            for item in answer_list(data):
                values = answer_dict(item)
                ended = values.get("endtime") is not None
                tasks.append(
                    TaskStatus(
                        upid=text_of(values, "upid"),
                        status="stopped" if ended else "running",
                        exitstatus=text_of(values, "status") if ended else None,
                    )
                )
            return tuple(tasks)

        params: Params = {"vmid": vmid, "source": "all", "limit": limit}
        return self._read(f"/nodes/{node}/tasks", params, parse)

    def wait_task(
        self,
        upid: str,
        timeout: float,
        *,
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> TaskStatus:
        """Poll the task until it stops; return its status when it succeeded: `exitstatus` `OK` or
        `WARNINGS: N` (pve-common src/PVE/UPID.pm `status_is_error`: it logged warnings and did its job).

        Raises TaskFailedError with any other exitstatus and TaskTimeoutError when it is still running after
        `timeout` seconds.
        """
        ended: list[TaskStatus] = []

        def running() -> str | None:
            status = self.task_status(upid)
            if status.status != "stopped":
                return status.status
            ended.append(status)
            return None

        try:
            wait_until(
                running, timeout, f"task {upid} still running", interval_s=interval, clock=clock, sleep=sleep
            )
        except WaitTimeoutError:
            timed_out = TaskTimeoutError(upid, timeout)
            timed_out.endpoint = f"task {upid}"
            raise timed_out from None
        status = ended[0]
        if not status.ok:
            failed = TaskFailedError(upid, status.exitstatus or "task stopped without an exit status")
            failed.endpoint = f"task {upid}"
            raise failed
        return status


def upid_node(upid: str) -> str:
    """The node field of a UPID (`UPID:<node>:…`); ValueError when `upid` is not one."""
    match = UPID.fullmatch(upid)
    if match is None:
        raise ValueError(f"{upid!r} is not a Proxmox task id (UPID)")
    return match["node"]
