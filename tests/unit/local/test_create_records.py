"""pvegpu/local/create_records.py: a create's record is keyed by the inventory's cluster (and owner id), the
node and the vmid, as the guest keys are, so two inventories sharing one directory never share a record; an
earlier pvegpu's record (kept without the cluster) is moved into place on first use, never guessed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pvegpu.local.create_records import CreateLedger, CreateRecordError, ledger_beside
from pvegpu.plan.create_proof import CreateRecord

RECORD = CreateRecord(upid=None, sent=1721873091, nonce="5eed" * 8)
TEXT = f'{{"nonce": "{"5eed" * 8}", "sent": 1721873091, "upid": null}}\n'


def ledger(tmp_path: Path, cluster: str | None, owner: str | None = None, node: str = "pve1") -> CreateLedger:
    made = ledger_beside(tmp_path / "known_hosts", "root@pam", cluster=cluster, owner=owner, node=node)
    assert made is not None
    return made


def test_two_clusters_sharing_one_directory_never_share_a_record(tmp_path: Path) -> None:
    staging, prod = ledger(tmp_path, "staging"), ledger(tmp_path, "prod")

    staging.write("pve1", "qemu", 100, RECORD)

    assert prod.read("pve1", "qemu", 100) is None
    assert staging.read("pve1", "qemu", 100) == RECORD
    assert staging.path("pve1", "qemu", 100) == tmp_path / "guest-keys/staging/tasks/pve1-qemu-100.json"
    assert prod.path("pve1", "qemu", 100) == tmp_path / "guest-keys/prod/tasks/pve1-qemu-100.json"
    prod.forget("pve1", "qemu", 100)
    assert staging.path("pve1", "qemu", 100).read_text() == TEXT


@pytest.mark.parametrize(
    ("cluster", "owner", "node", "path"),
    [
        pytest.param(None, None, "pve1", "guest-keys/pve1/tasks/pve1-lxc-100.json", id="standalone"),
        pytest.param("lab", None, "pve1", "guest-keys/lab/tasks/pve1-lxc-100.json", id="cluster"),
        pytest.param("lab", "team-a", "pve1", "guest-keys/team-a@lab/tasks/pve1-lxc-100.json", id="owner"),
    ],
)
def test_record_path_is_the_guest_keys_scope(
    tmp_path: Path, cluster: str | None, owner: str | None, node: str, path: str
) -> None:
    assert ledger(tmp_path, cluster, owner, node).path("pve1", "lxc", 100) == tmp_path / path


def test_a_new_record_and_its_folders_are_private(tmp_path: Path) -> None:
    records = ledger(tmp_path, "lab")

    records.write("pve1", "qemu", 100, RECORD)

    modes = [(tmp_path / part).stat().st_mode & 0o777 for part in ("guest-keys", "guest-keys/lab")]
    assert [*modes, records.directory.stat().st_mode & 0o777] == [0o700, 0o700, 0o700]
    assert records.path("pve1", "qemu", 100).stat().st_mode & 0o777 == 0o600


def earlier_record(tmp_path: Path, text: str = TEXT) -> Path:
    """A record where an earlier pvegpu kept it: guest-keys/tasks/, without the cluster."""
    earlier = tmp_path / "guest-keys/tasks/pve1-qemu-100.json"
    earlier.parent.mkdir(parents=True)
    earlier.write_text(text)
    earlier.chmod(0o600)
    return earlier


def test_an_earlier_record_is_moved_into_the_clusters_folder_on_first_use(tmp_path: Path) -> None:
    earlier = earlier_record(tmp_path)
    records = ledger(tmp_path, "lab")

    assert records.read("pve1", "qemu", 100) == RECORD

    assert not earlier.exists()
    moved = records.path("pve1", "qemu", 100)
    assert (moved.read_text(), moved.stat().st_mode & 0o777) == (TEXT, 0o600)
    assert ledger(tmp_path, "other").read("pve1", "qemu", 100) is None  # moved: another inventory's no more


def test_an_earlier_copy_with_the_same_bytes_is_removed(tmp_path: Path) -> None:
    records = ledger(tmp_path, "lab")
    records.write("pve1", "qemu", 100, RECORD)
    earlier = earlier_record(tmp_path)

    records.forget("pve1", "qemu", 100)

    assert not earlier.exists()
    assert not records.path("pve1", "qemu", 100).exists()


@pytest.mark.parametrize(
    "use",
    [
        pytest.param(lambda records: records.read("pve1", "qemu", 100), id="read"),
        pytest.param(lambda records: records.write("pve1", "qemu", 100, RECORD), id="write"),
        pytest.param(lambda records: records.forget("pve1", "qemu", 100), id="forget"),
    ],
)
def test_error_an_earlier_record_that_differs_is_refused_and_both_are_kept(
    tmp_path: Path, use: Callable[[CreateLedger], object]
) -> None:
    records = ledger(tmp_path, "lab")
    records.write("pve1", "qemu", 100, RECORD)
    earlier = earlier_record(tmp_path, '{"nonce": null, "sent": 1721870000, "upid": null}\n')

    with pytest.raises(CreateRecordError) as error:
        use(records)

    assert str(error.value) == (
        f"{earlier} (an earlier pvegpu's record, kept without the cluster) and {tmp_path}/guest-keys/lab/"
        "tasks/pve1-qemu-100.json both exist and differ; keep the one whose nonce is on the guest's "
        "`pvegpu-create:` description line, delete the other, then run again"
    )
    assert records.path("pve1", "qemu", 100).read_text() == TEXT
    assert earlier.exists()
