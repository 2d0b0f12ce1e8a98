"""The lab pvesh stand-in's `GET /nodes/{node}/tasks/{upid}/log` (pve-manager API2/Tasks.pm read_task_log):
a failed start's lines as `{n, t}`, `start`/`limit` as Proxmox pages them (limit 0: all), and the same
refusals as the task's status."""

from __future__ import annotations

from tests.unit.lab.pve.test_pvesh import GPU0, UPID, VM_ARGS, Pve, Result, pve  # noqa: F401 - the fixture

ERROR = "PCI device mapping invalid (hardware probably changed): pci device '0000:42:00.0' not found "


def test_task_log_pages_the_failed_start_lines(pve: Pve) -> None:  # noqa: F811 - the fixture
    pve("create", "/cluster/mapping/pci", "--id", "gpu0", "--map", GPU0.replace("0000:41:00", "0000:42:00"))
    pve("create", "/nodes/pve1/qemu", *VM_ARGS, "--hostpci0", "mapping=gpu0,pcie=1")
    start = pve("create", "/nodes/pve1/qemu/100/status/start", "--output-format", "json")
    match = UPID.fullmatch(start.out.splitlines(keepends=True)[-1])
    assert match is not None, start
    path = f"/nodes/pve1/tasks/{match.group(1)}/log"

    everything = pve.json("get", path, "--limit", "0")
    assert everything[-1] == {"n": len(everything), "t": f"TASK ERROR: {ERROR}"}
    assert [line["n"] for line in everything] == list(range(1, len(everything) + 1))
    assert pve.json("get", path, "--start", str(len(everything) - 1), "--limit", "1") == everything[-1:]
    assert pve.json("get", path) == everything[:50]


def test_task_log_refuses_bad_and_unknown_upids(pve: Pve) -> None:  # noqa: F811 - the fixture
    usage = "pvesh get <api_path> [OPTIONS] [FORMAT_OPTIONS]\n"  # the route has parameters
    unknown = "UPID:pve1:00001234:00005678:6B0CA5E7:qmstart:100:root@pam:"
    assert pve("get", "/nodes/pve1/tasks/UPID:x/log") == Result(
        255, "", f"400 Parameter verification failed.\nupid: unable to parse worker upid\n{usage}"
    )
    assert pve("get", f"/nodes/pve1/tasks/{unknown}/log") == Result(
        255, "", f"400 Parameter verification failed.\nupid: no such task\n{usage}"
    )
