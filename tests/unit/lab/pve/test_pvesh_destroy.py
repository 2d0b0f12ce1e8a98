"""The pvesh stand-in's `DELETE /nodes/{node}/qemu/{vmid}` (qemu-server's API2/Qemu.pm destroy_vm and
QemuServer::destroy_vm: texts read from qemu-server 9.2.6): a killed create's leftovers, locked then
unlocked, destroyed with its volumes."""

from __future__ import annotations

import resource
import subprocess
import sys

from tests.unit.lab.pve.test_pvesh import PVESH, VM_ARGS, VM_DISKS, Pve, Result, pve  # noqa: F401

VOLUMES = "var/lib/pvegpu-lab/volumes/local-lvm"


def killed_create(installed: Pve) -> None:
    """A create whose worker dies mid-way (EFBIG past 100 bytes), leaving `lock: create` and volumes."""
    env = {"PVEGPU_LAB_PVE_CONFIG": str(installed.base / "pve.json"), "PATH": "/usr/bin:/bin"}
    subprocess.run(
        [sys.executable, str(PVESH), "create", "/nodes/pve1/qemu", *VM_ARGS, *VM_DISKS],
        check=False,
        capture_output=True,
        env=env,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100)),
    )


def test_destroy_of_a_locked_vm_fails_its_task_then_unlocked_it_goes_with_every_volume(pve: Pve) -> None:  # noqa: F811
    killed_create(pve)
    left = sorted(path.name for path in (pve.root / VOLUMES).iterdir())
    assert left  # the killed worker allocated before it died; its config names none of them
    destroy = ("delete", "/nodes/pve1/qemu/100", "--destroy-unreferenced-disks", "1", "--purge", "1")

    locked = pve(*destroy, "--output-format", "json")

    assert (locked.rc, locked.err) == (0, "VM is locked (create)\n")  # the task failed; pvesh exits 0
    upid = locked.out.strip().strip('"')
    assert pve.json("get", f"/nodes/pve1/tasks/{upid}/status")["exitstatus"] == "VM is locked (create)"
    assert pve.file("etc/pve/qemu-server/100.conf") == "lock: create\n"

    assert pve("set", "/nodes/pve1/qemu/100/config", "--delete", "lock", "--skiplock", "1").rc == 0
    done = pve(*destroy, "--output-format", "json")

    assert done.out.splitlines()[0] == "purging VM 100 from related configurations.."
    upid = done.out.splitlines()[1].strip('"')
    assert upid.split(":")[5:8] == ["qmdestroy", "100", "root@pam"]
    assert pve.json("get", f"/nodes/pve1/tasks/{upid}/status")["exitstatus"] == "OK"
    assert not (pve.root / "etc/pve/qemu-server/100.conf").exists()
    assert list((pve.root / VOLUMES).iterdir()) == []
    assert pve(*destroy) == Result(
        255, "", "Configuration file 'nodes/pve1/qemu-server/100.conf' does not exist\n"
    )


def test_destroy_without_unreferenced_disks_frees_only_the_volumes_the_config_names(pve: Pve) -> None:  # noqa: F811
    pve("create", "/nodes/pve1/qemu", *VM_ARGS, *VM_DISKS)
    (pve.root / VOLUMES / "vm-100-disk-7").write_bytes(b"")  # a volume no config names

    assert pve("delete", "/nodes/pve1/qemu/100").rc == 0

    assert sorted(path.name for path in (pve.root / VOLUMES).iterdir()) == ["vm-100-disk-7"]


def test_destroy_refuses_a_running_vm_before_its_task(pve: Pve) -> None:  # noqa: F811
    pve("create", "/nodes/pve1/qemu", *VM_ARGS, *VM_DISKS)
    assert pve("create", "/nodes/pve1/qemu/100/status/start").rc == 0

    assert pve("delete", "/nodes/pve1/qemu/100") == Result(255, "", "VM 100 is running - destroy failed\n")
    assert (pve.root / "etc/pve/qemu-server/100.conf").exists()
    assert pve("create", "/nodes/pve1/qemu/100/status/stop").rc == 0


def test_destroy_without_purge_refuses_an_ha_resource_and_a_replicated_vm_before_its_task(pve: Pve) -> None:  # noqa: F811
    pve("create", "/nodes/pve1/qemu", *VM_ARGS, *VM_DISKS)
    (pve.root / "etc/pve/ha").mkdir(parents=True, exist_ok=True)
    (pve.root / "etc/pve/ha/resources.cfg").write_text("vm: 100\n\tstate started\n")

    assert pve("delete", "/nodes/pve1/qemu/100") == Result(
        255, "", "unable to remove VM 100 - used in HA resources and purge parameter not set.\n"
    )
    (pve.root / "etc/pve/ha/resources.cfg").write_text("")
    (pve.root / "etc/pve/replication.cfg").write_text("local: 100-0\n\ttarget pve2\n")
    assert pve("delete", "/nodes/pve1/qemu/100") == Result(
        255, "", "There is a replication job '100-0' for guest '100' - Please remove that first.\n"
    )
    assert (pve.root / "etc/pve/qemu-server/100.conf").exists()


def test_delete_volume_frees_one_volume_in_an_imgdel_task(pve: Pve) -> None:  # noqa: F811
    killed_create(pve)
    left = sorted(path.name for path in (pve.root / VOLUMES).iterdir())
    volid = f"local-lvm:{left[0]}"

    done = pve("delete", f"/nodes/pve1/storage/local-lvm/content/{volid}", "--output-format", "json")

    assert done.out.splitlines()[0] == f"Removed volume '{volid}'"
    upid = done.out.splitlines()[1].strip('"')
    assert upid.split(":")[5:8] == ["imgdel", "100@local-lvm", "root@pam"]
    assert sorted(path.name for path in (pve.root / VOLUMES).iterdir()) == left[1:]
    assert pve("delete", f"/nodes/pve1/storage/local/content/{volid}").err.startswith(
        "400 Parameter verification failed.\nvolume: storage ID mismatch (local-lvm != local)\n"
    )
