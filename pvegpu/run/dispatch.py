"""Which roles a deploy entry point runs on the current host, by inventory group: written once.

`dispatch(entry, routes)` runs each route's roles, in order, when the host is in one of the route's groups
(a route is `(groups, roles)`);
a host in none of the entry point's groups is left alone with one info line saying which groups the entry
point acts on. Entry points (deploy/*.py) are then a docstring and a table of routes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyinfra import logger
from pyinfra.context import host

from pvegpu.run import pyinfra_patches

Route = tuple[tuple[str, ...], Sequence[Callable[[], object]]]

# At import, before the roles' modules: each fact class they define then takes pyinfra's global arguments
# from the patch (`FactBase.__init_subclass__` evaluates them), not evaluating them again.
pyinfra_patches.install()


def dispatch(entry: str, routes: Sequence[Route]) -> None:
    """Run the roles of every route whose groups the current host is in; else log that it is left alone.
    Operations take their order from `pvegpu.run.pyinfra_patches` (pyinfra's results, cheaper)."""
    pyinfra_patches.install()
    groups = set(host.groups)
    matched = [role for route_groups, roles in routes if groups & set(route_groups) for role in roles]
    if not matched:
        named = sorted({group for route_groups, _ in routes for group in route_groups})
        logger.info(f"{host.print_prefix}{entry} acts on {', '.join(named)}: not in any, left alone")
    for role in matched:
        role()
