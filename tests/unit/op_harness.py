"""Run a pvegpu operation's generator with faked facts: facts in -> exact commands (or noop sentences) out.

The operation body (`op._inner`) runs with pyinfra's `host` context bound to a `FakeHost` whose `get_fact`
answers from a dict keyed by fact class; nothing connects anywhere. A node's one state read
(pvegpu/run/node_state.py) is answered by `{NodeRead: node_state(...)}`: the real captured lab sample with the
fields a test sets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

from pyinfra.api.command import FunctionCommand, StringCommand
from pyinfra.context import ctx_host

from pvegpu.facts.node_read import NodeState, parse_node_state
from tests.unit.fuzz_targets import fixture

NODE_DATA = {"node": {"name": "pve1", "gpus": {"ids": ["10de:2bb1"], "count": 8}}}


def node_state(**fields: Any) -> NodeState:
    """The lab node's captured state read (tests/unit/fixtures/node_state_lab_node.txt) with `fields` set."""
    return dataclasses.replace(parse_node_state(fixture("node_state_lab_node.txt")), **fields)


class FakeState:
    """What pvegpu's per-run caches use of pyinfra's State: `config.DIFF` and each host's (no) operations."""

    def __init__(self, host: object, *, diff: bool) -> None:
        self.config = SimpleNamespace(DIFF=diff)  # pyinfra's `--diff`
        self.ops: dict[object, dict[str, object]] = {host: {}}


class FakeHost:
    name = "pve1"
    print_prefix = "[pve1] "

    def __init__(self, facts: Mapping[Any, object], *, diff: bool = False) -> None:
        self.facts = facts
        self.noops: list[str] = []
        self.logged: list[str] = []
        self.data = NODE_DATA
        self.state = FakeState(self, diff=diff)

    def log(self, message: str, _log_func: object = None) -> None:
        self.logged.append(message)

    def get_fact(self, fact: type, *_args: object, **_kwargs: Any) -> object:
        return self.facts[fact]

    def noop(self, description: str) -> None:
        self.noops.append(description)


def run_op(
    op: Callable[..., Any], facts: Mapping[Any, object], **kwargs: Any
) -> tuple[list[str | FunctionCommand], list[str]]:
    """(commands, noop sentences); StringCommands as the raw shell line they run."""
    fake = FakeHost(facts)
    with ctx_host.use(fake):
        commands = list(op._inner(**kwargs))  # type: ignore[attr-defined]
    shown = [c.get_raw_value() if isinstance(c, StringCommand) else c for c in commands]
    return shown, fake.noops
