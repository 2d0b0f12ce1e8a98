"""A pyinfra state on this machine (`@local`), to run facts the way a deploy does."""

from __future__ import annotations

from pyinfra.api.config import Config
from pyinfra.api.host import Host
from pyinfra.api.inventory import Inventory
from pyinfra.api.state import State


def local_state(*other_hosts: str) -> tuple[State, Host]:
    """(state, @local host), every host active as after connecting.

    Other hosts are never contacted; they keep pyinfra from stopping the run when @local fails ("No hosts
    remaining!"), so a test sees a per-host failure the way a multi-host deploy does.
    """
    inventory = Inventory((["@local", *other_hosts], {}))  # type: ignore[no-untyped-call]
    state = State(inventory, Config())  # type: ignore[no-untyped-call]
    for host in inventory:
        state.activate_host(host)
    return state, inventory.get_host("@local")
