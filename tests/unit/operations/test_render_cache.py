"""pvegpu.operations.render: compiled templates come from jinja2's bytecode cache, or compile without one."""

from __future__ import annotations

import pytest
from jinja2 import FileSystemBytecodeCache

from pvegpu.operations import render


def test_templates_render_the_same_from_the_cache() -> None:
    assert isinstance(render._ENV.bytecode_cache, FileSystemBytecodeCache)
    first = render.render("pve_host/grub-pvegpu.cfg.j2", tokens=["amd_iommu=on", "iommu=pt"])
    assert render._ENV.cache is not None
    render._ENV.cache.clear()  # jinja2's in-memory cache: the next load reads the bytecode cache
    assert render.render("pve_host/grub-pvegpu.cfg.j2", tokens=["amd_iommu=on", "iommu=pt"]) == first
    assert "amd_iommu=on iommu=pt" in first


def test_no_cache_where_jinja2_refuses_the_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> None:
        raise RuntimeError("The cache directory is not owned by the current user.")

    monkeypatch.setattr(render, "FileSystemBytecodeCache", refuse)
    assert render._bytecode_cache() is None
