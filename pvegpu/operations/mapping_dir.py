"""`model_share_mapping`: the cluster directory mapping `pvegpu-models` maps this node to the model store, via
the API (pvegpu/plan/model_share.py decides).

Read while the operation is prepared: from the node's one state read (its /etc/pve/mapping/directory.cfg,
pvegpu/run/node_state.py) while nothing ran on the node since, so a no-op run sends no request; else, or
where the file holds something this reading does not model (a bad line in the mapping's section, the id
twice), `GET /cluster/mapping/dir/<id>`. Then, carried out while executing by an `api_command`:

- absent: `POST /cluster/mapping/dir` (`id`, `map` with this node's line, `description` with pvegpu's mark);
- this node's line missing or another path: `PUT /cluster/mapping/dir/<id>` with the whole `map` (other
  nodes' lines verbatim) and the digest of the read (the whole file's: a concurrent edit anywhere in it
  fails with Proxmox's `detected modified configuration` error and nothing is written);
- right: `host.noop`.

Every write is read back (`GET /cluster/mapping/dir/<id>`) and must hold what was sent. A mapping without any
`pvegpu-owner:` line is refused, never rewritten (`refuse_foreign_share`, which the VM role calls while
preparing, before anything of the run is written).
"""

from __future__ import annotations

import hashlib
from collections.abc import Generator

from pyinfra import logger
from pyinfra.api.command import FunctionCommand
from pyinfra.api.exceptions import OperationError
from pyinfra.api.operation import operation
from pyinfra.context import host

from pvegpu.facts import section_config
from pvegpu.models.dir_mapping import DIRECTORY_CFG, DirMapping, DirMappingState
from pvegpu.models.pve import CONFIG_ID
from pvegpu.operations.api_command import api_command, attempt, one_line_errors, what_came_back
from pvegpu.plan.model_share import DirAction, DirMappingChange, ModelShare, diff_dir_mapping, foreign_line
from pvegpu.pve.client import PveClient
from pvegpu.pve.errors import PveError
from pvegpu.run.node_state import unchanged_node_state


@operation()
@one_line_errors
def model_share_mapping(
    *, api: PveClient, share: ModelShare, node: str, owner: str
) -> Generator[FunctionCommand, None, None]:
    """Make directory mapping `share.id` map `node` to `share.path` (module docstring); `owner`: pvegpu's
    mark for a mapping it creates."""
    held = held_share(api, share.id)
    change = diff_dir_mapping(None if held is None else held.mapping, share, node, owner)
    if change.action is DirAction.FOREIGN:
        raise OperationError(foreign_line(share.id, node, change.mapping.description))
    if change.action is DirAction.UNCHANGED:
        host.noop(f"directory mapping {share.id} maps {node} to {share.path}")
        return
    logger.info(f"{host.print_prefix}{describe(change, node)}")
    if change.action is DirAction.CREATE:
        yield api_command(_create, api, change.mapping)
    else:
        assert held is not None  # an UPDATE is of a mapping read
        yield api_command(_update, api, change.mapping, held.digest)


def refuse_foreign_share(api: PveClient, share: ModelShare, node: str, owner: str) -> None:
    """OperationError with `foreign_line` when mapping `share.id` exists without pvegpu's mark (the VM role
    calls it while preparing, before anything of the run is written); a failed read passes: the operation
    reports it."""
    try:
        held = held_share(api, share.id)
    except OperationError:
        return
    if held is not None and diff_dir_mapping(held.mapping, share, node, owner).action is DirAction.FOREIGN:
        raise OperationError(foreign_line(share.id, node, held.mapping.description))


def held_share(api: PveClient, mapping_id: str) -> DirMappingState | None:
    """Mapping `mapping_id` as Proxmox holds it (None: absent): from the node's state read while it holds,
    else through the API (module docstring). OperationError for a failed read."""
    state = unchanged_node_state(host)
    if state is not None and DIRECTORY_CFG in state.pve_files:
        raw = state.pve_files[DIRECTORY_CFG]
        modelled, answer = (True, None) if raw is None else dir_cfg_mapping(raw, mapping_id)
        if modelled:
            return answer
    try:
        return api.dir_mapping(mapping_id)
    except PveError as error:
        raise OperationError(
            f"directory mapping {mapping_id} not read: {error.line}; nothing written"
        ) from None


def dir_cfg_mapping(raw: bytes, mapping_id: str) -> tuple[bool, DirMappingState | None]:
    """(modelled, answer): `GET /cluster/mapping/dir/<id>` computed from directory.cfg `raw` as
    pve-guest-common Mapping/Dir.pm reads it (a SectionConfig of bare-id sections, `map` repeated,
    `description`; the digest the sha1 of the file), None when no section has the id; not modelled
    (False) where Proxmox's answer could differ: the id twice, a line of its section that is not
    `map <text>` or one `description`, no `map`."""
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        return False, None
    sections = [
        item
        for item in section_config.read_sections(text, section_config.ID_HEADER)
        if isinstance(item, section_config.Section) and item.header[1] == mapping_id
    ]
    if not sections:
        return True, None
    if len(sections) > 1 or not CONFIG_ID.fullmatch(mapping_id):
        return False, None
    values, problems = section_config.properties(sections[0], _checked, arrays=("map",))
    if problems or not values.get("map"):
        return False, None
    mapping = DirMapping(mapping_id, tuple(values["map"]), values.get("description"))
    return True, DirMappingState(mapping, hashlib.sha1(raw).hexdigest())


def _checked(key: str, value: str | None) -> str:
    if key not in ("map", "description") or value is None:
        raise section_config.SectionValueError(f"not modelled: {key}")
    return value


def describe(change: DirMappingChange, node: str) -> str:
    """The line said before a write: `directory mapping pvegpu-models: create, pve1 -> /var/lib/...`."""
    mapping = change.mapping
    wanted = next(text for text in mapping.map if text.startswith(f"node={node},"))
    if change.action is DirAction.CREATE:
        return f"directory mapping {mapping.id}: create with {wanted} ({mapping.description})"
    before = [text for text in change.current or () if text not in mapping.map]
    was = f" (was {', '.join(before)})" if before else ""
    return f"directory mapping {mapping.id}: {wanted}{was}, other nodes' lines kept"


def _create(api: PveClient, mapping: DirMapping) -> None:
    endpoint = "POST /cluster/mapping/dir"
    failure = attempt(lambda: api.create_dir_mapping(mapping))
    _check(api, mapping, failure, endpoint, "created")


def _update(api: PveClient, mapping: DirMapping, digest: str) -> None:
    endpoint = f"PUT /cluster/mapping/dir/{mapping.id}"
    failure = attempt(lambda: api.update_dir_mapping(mapping, digest))
    _check(api, mapping, failure, endpoint, "updated")


def _check(api: PveClient, mapping: DirMapping, failure: PveError | None, endpoint: str, done: str) -> None:
    """Read the mapping back: it must hold what was sent; else OperationError with what came back."""
    said = what_came_back(failure, endpoint)
    try:
        now = api.dir_mapping(mapping.id)
    except PveError as error:
        raise OperationError(
            f"directory mapping {mapping.id}: {said}; reading it back failed: {error.line}; whether it was "
            f"{done} is unknown; run again"
        ) from None
    if now is not None and now.mapping == mapping:
        if failure is not None:
            logger.warning(
                f"{host.print_prefix}directory mapping {mapping.id}: {failure.line}; reading it back shows "
                "it as planned"
            )
        return
    held = "is absent" if now is None else f"holds {list(now.mapping.map)}"
    raise OperationError(f"directory mapping {mapping.id} not {done}: {said}; it {held}")
