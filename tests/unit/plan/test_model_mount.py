"""The VM guest's mount unit of the node's store: systemd's unit name for a path (as `systemd-escape --path
--suffix=mount` prints it, systemd 252)."""

from __future__ import annotations

import pytest

from pvegpu.plan.model_mount import mount_unit_name


@pytest.mark.parametrize(
    ("path", "unit"),
    [
        # `systemd-escape --path --suffix=mount <path>` on Debian 12 (systemd 252), each
        ("/srv/models/GLM-5-NVFP4-MTP", "srv-models-GLM\\x2d5\\x2dNVFP4\\x2dMTP.mount"),
        ("/var/lib/pvegpu/models/.x y/", "var-lib-pvegpu-models-.x\\x20y.mount"),
        ("/.hidden/a_b:c", "\\x2ehidden-a_b:c.mount"),
        ("//srv//models/", "srv-models.mount"),
        ("/srv/mödel", "srv-m\\xc3\\xb6del.mount"),
        ("/", "-.mount"),
    ],
)
def test_mount_unit_names_are_systemds(path: str, unit: str) -> None:
    assert mount_unit_name(path) == unit
