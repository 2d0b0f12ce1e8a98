"""What a Proxmox lab node's guests are given of the node's directories (lab/pve/shares.py): a VM start's
virtiofs binding plan (the node's directory, symlinks followed inside the node's root, at
/var/lib/pvegpu-lab/virtiofs/<dirid> in the guest), and a CT's bind mount points as pve-container mounts
them. The mounts themselves are the lab tier's (tests/lab/test_lab_shares.py).

Expected texts were read in Proxmox's source: pve-container 6.1.10 src/PVE/LXC.pm (__mountpoint_mount:
`directory '$volid' does not exist`; walk_tree_nofollow_fd: `symlink encountered at: $dir`, `$dir` the start
directory with `/<component>` appended, so `//...` from `/`; the CT's root /var/lib/lxc/<vmid>/rootfs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lab.pve import shares
from lab.pve.shares import Bind, ShareError, on_host, virtiofs_binds


@pytest.fixture
def node_root(tmp_path: Path) -> Path:
    root = tmp_path / "node"
    (root / "var/lib/pvegpu/models").mkdir(parents=True)
    (root / "data/cache").mkdir(parents=True)
    (root / "var/lib/models").symlink_to("/data/cache")  # absolute: the node's /data, not this machine's
    (root / "var/lib/relative").symlink_to("pvegpu/models")
    return root


def test_virtiofs_plan_binds_each_share_at_its_tag_in_index_order(node_root: Path) -> None:
    entries = [
        {"index": 3, "dirid": "cache", "path": "/var/lib/models"},
        {"index": 0, "dirid": "models", "path": "/var/lib/pvegpu/models"},
    ]
    assert virtiofs_binds(node_root, entries) == [
        Bind(node_root / "var/lib/pvegpu/models", "/var/lib/pvegpu-lab/virtiofs/models"),
        Bind(node_root / "data/cache", "/var/lib/pvegpu-lab/virtiofs/cache"),
    ]
    assert virtiofs_binds(node_root, []) == []


@pytest.mark.parametrize(
    ("path", "found"),
    [
        ("/var/lib/pvegpu/models", "var/lib/pvegpu/models"),
        ("/var/lib/models", "data/cache"),
        ("/var/lib/relative/", "var/lib/pvegpu/models"),
        ("/var/lib/models/../../var/./lib", "var/lib"),
        ("/../../etc", "etc"),
    ],
)
def test_on_host_follows_links_inside_the_hosts_root(node_root: Path, path: str, found: str) -> None:
    assert on_host(node_root, path) == node_root / found


def test_error_on_host_link_loop(node_root: Path) -> None:
    (node_root / "loop").symlink_to("/loop")
    with pytest.raises(ShareError) as refused:
        on_host(node_root, "/loop/x")
    assert str(refused.value) == "/loop/x: Too many levels of symbolic links"


def test_error_virtiofs_share_that_is_no_directory(node_root: Path, tmp_path: Path) -> None:
    guest_root = tmp_path / "guest"
    guest_root.mkdir()
    with pytest.raises(ShareError) as refused:
        shares.bind_virtiofs(guest_root, [Bind(node_root / "gone", "/var/lib/pvegpu-lab/virtiofs/gone")])
    assert str(refused.value) == (
        f"virtiofs: shared directory {node_root / 'gone'} is not a directory on the node"
    )


@pytest.fixture
def binds(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Path, Path, bool]]:
    made: list[tuple[Path, Path, bool]] = []
    monkeypatch.setattr(shares, "bind", lambda source, target, ro: made.append((source, target, ro)))
    return made


def test_mount_points_make_the_target_and_bind_each_source(
    node_root: Path, tmp_path: Path, binds: list[tuple[Path, Path, bool]]
) -> None:
    ct_root = tmp_path / "ct"
    (ct_root / "srv").mkdir(parents=True)
    mp = [
        {"key": "mp0", "source": "/var/lib/pvegpu/models", "target": "/srv/models/GLM", "ro": True},
        {"key": "mp1", "source": "/data/cache/", "target": "//cache", "ro": False},
    ]

    shares.mount_points(node_root, ct_root, 200, mp)

    assert binds == [
        (node_root / "var/lib/pvegpu/models", ct_root / "srv/models/GLM", True),
        (node_root / "data/cache", ct_root / "cache", False),
    ]
    assert [oct((ct_root / p).stat().st_mode & 0o7777) for p in ("srv/models", "srv/models/GLM")] == [
        "0o755",
        "0o755",
    ]


REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "source-missing": (
        {"source": "/var/lib/gone", "target": "/srv/x"},
        "directory '/var/lib/gone' does not exist",
    ),
    "source-through-a-link": (
        {"source": "/var/lib/models", "target": "/srv/x"},
        "symlink encountered at: //var/lib/models",
    ),
    "target-through-a-link": (
        {"source": "/var/lib/pvegpu/models", "target": "/run/x"},
        "symlink encountered at: /var/lib/lxc/200/rootfs/run",
    ),
    "target-through-a-file": (
        {"source": "/var/lib/pvegpu/models", "target": "/etc/hostname/x"},
        "symlink encountered at: /var/lib/lxc/200/rootfs/etc/hostname",
    ),
}


@pytest.mark.parametrize(("entry", "message"), REFUSED.values(), ids=REFUSED.keys())
def test_error_mount_point_refused_as_pve_container_refuses_it(
    node_root: Path, tmp_path: Path, binds: list[tuple[Path, Path, bool]], entry: dict[str, Any], message: str
) -> None:
    ct_root = tmp_path / "ct"
    (ct_root / "etc").mkdir(parents=True)
    (ct_root / "etc/hostname").write_text("llm\n")
    (ct_root / "run").symlink_to("/tmp")
    with pytest.raises(ShareError) as refused:
        shares.mount_points(node_root, ct_root, 200, [{"key": "mp0", "ro": True, **entry}])
    assert (str(refused.value), binds) == (message, [])
