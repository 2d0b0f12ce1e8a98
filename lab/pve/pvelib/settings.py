"""The stand-in's settings (lab/pve/pvesh.py's docstring: $PVEGPU_LAB_PVE_CONFIG) and the local-node check."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import DieError

CONFIG_ENV = "PVEGPU_LAB_PVE_CONFIG"


DEFAULT_CONFIG = "/etc/pvegpu-lab/pve.json"


@dataclass(frozen=True)
class Settings:
    node: str
    sysfs_root: Path
    root: Path
    hypervisor_dir: Path | None
    hypervisor_timeout_s: float
    version: str
    release: str

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")


def load_settings() -> Settings:
    data = json.loads(Path(os.environ.get(CONFIG_ENV, DEFAULT_CONFIG)).read_text())
    hv = data.get("hypervisor_dir")
    return Settings(
        node=data["node"],
        sysfs_root=Path(data.get("sysfs_root", "/sys")),
        root=Path(data.get("root", "/")),
        hypervisor_dir=Path(hv) if hv else None,
        hypervisor_timeout_s=float(data.get("hypervisor_timeout_s", 180)),
        version=data.get("version", "9.0.3"),
        release=data.get("release", "9.0"),
    )


def local_node(settings: Settings, node: str) -> None:
    if node not in (settings.node, "localhost"):
        raise DieError(
            f"hostname lookup '{node}' failed - failed to get address info for: {node}: "
            "Name or service not known\n"
        )
