"""pvegpu.pyinfra_patches: the same results as the pyinfra functions they replace."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace

import pyinfra
import pytest
from pyinfra.api import arguments, util

from pvegpu import pyinfra_patches

_SOURCE = Path(__file__).read_text().splitlines()


def _line(text: str) -> int:
    """The number of this file's one line that ends with `text`."""
    (number,) = [n for n, line in enumerate(_SOURCE, start=1) if line.endswith(text)]
    return number


def _from_a_deploy(state: object) -> tuple[list[int], list[int]]:
    def role() -> tuple[list[int], list[int]]:
        return step()  # role

    def step() -> tuple[list[int], list[int]]:
        return pyinfra_patches.order_from_stack(state), util.get_operation_order_from_stack(state)  # type: ignore[arg-type]

    return role()  # deploy


@pytest.mark.parametrize("is_cli", [True, False])
@pytest.mark.parametrize("deploy_file", [__file__, "/no/such/deploy.py", None])
def test_the_order_is_pyinfras(
    monkeypatch: pytest.MonkeyPatch, is_cli: bool, deploy_file: str | None
) -> None:
    monkeypatch.setattr(pyinfra, "is_cli", is_cli)
    state = SimpleNamespace(current_deploy_filename=deploy_file, current_op_file_number=3)
    ours, theirs = _from_a_deploy(state)  # test
    assert ours == theirs
    lines = ours[1:] if is_cli else ours
    if is_cli:
        assert ours[0] == 3  # the deploy file's index
    calls = [_line("# test"), _line("# deploy"), _line("# role"), _line("# type: ignore[arg-type]")]
    if deploy_file is None:  # every frame that is not pyinfra's, ending with the calls in this file
        assert lines[-4:] == calls
    elif deploy_file == __file__:  # from the deploy file's first frame: this test's call
        assert lines == calls
    else:  # a deploy file not on the stack: pyinfra's search ends at its own frame, so no line
        assert lines == []


def test_the_global_arguments_are_pyinfras() -> None:
    theirs = pyinfra_patches._ORIGINAL_GLOBAL_ARGUMENTS()
    ours = pyinfra_patches.global_arguments()
    assert ours == theirs
    assert ("_sudo", bool) in ours
    ours.clear()  # a caller's list is its own
    assert pyinfra_patches.global_arguments() == theirs


def test_install_is_where_pyinfra_looks(monkeypatch: pytest.MonkeyPatch) -> None:
    operation = importlib.import_module("pyinfra.api.operation")
    facts = importlib.import_module("pyinfra.api.facts")
    monkeypatch.setattr(operation, "get_operation_order_from_stack", util.get_operation_order_from_stack)
    monkeypatch.setattr(arguments, "all_global_arguments", pyinfra_patches._ORIGINAL_GLOBAL_ARGUMENTS)
    monkeypatch.setattr(facts, "all_global_arguments", pyinfra_patches._ORIGINAL_GLOBAL_ARGUMENTS)
    pyinfra_patches.install()
    assert operation.get_operation_order_from_stack is pyinfra_patches.order_from_stack
    assert arguments.all_global_arguments is pyinfra_patches.global_arguments
    assert facts.all_global_arguments is pyinfra_patches.global_arguments
