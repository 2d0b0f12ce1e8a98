"""The stand-in's directory mappings (lab/pve/pvelib/api/cluster_mapping.py, mapping_dir.py,
sectionconfig.DIR_MAPPING), called through call_api as pvesh (root@pam) and pveproxy (the token) call it.

Expected texts were read in Proxmox's source: pve-manager 9.2.11 PVE/API2/Cluster/Mapping/Dir.pm and
Mapping.pm, pve-guest-common 6.0.2 src/PVE/Mapping/Dir.pm, pve-common 9.2.1 src/PVE/SectionConfig.pm
(write_config, check_config, delete_from_config) and PVE/Tools.pm assert_if_modified. Status codes: a DieError
is pveproxy's 500, a ParamError its 400, access.PermissionDenied its 403 (test_pveproxy.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from lab.pve import access, api_setup
from lab.pve.pvelib.errors import DieError, ParamError
from lab.pve.pvelib.sectionconfig import DIR_MAPPING, parse_mapping_cfg, write_mapping_cfg
from lab.pve.pvelib.settings import Settings
from pvegpu.facts import section_config
from tests.unit.lab.pve.test_access import TOKEN, Node

CFG = "etc/pve/mapping/directory.cfg"
MODELS = "node=pve1,path=/var/lib/pvegpu/models"
PEER = "node=pve2,path=/srv/models"
PATH_TEXT = (
    "invalid format - Value does not look like a valid absolute path."
    " These symbols are currently not allowed in path: ;,=()"
)


@pytest.fixture
def api(tmp_path: Path) -> Node:
    settings = Settings("pve1", tmp_path / "sys", tmp_path / "root", None, 1.0, "9.2.11", "9.2")
    api_setup.write_access(settings.root, "s3cret")
    (settings.root / "var/lib/pvegpu/models").mkdir(parents=True)
    (settings.root / "srv").mkdir()
    (settings.root / "srv/file").write_text("")
    return Node(settings)


def _file(api: Node) -> str:
    return (api.root / CFG).read_text()


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def test_create_writes_directory_cfg_as_write_config_and_reads_it_back(api: Node) -> None:
    api.call(
        "root@pam", "create", "/cluster/mapping/dir", id="models", map=[MODELS, PEER], description="store"
    )

    text = _file(api)
    assert text == f"models\n\tmap {MODELS}\n\tmap {PEER}\n\tdescription store\n\n"
    (section,) = section_config.read_sections(text, section_config.ID_HEADER)
    assert isinstance(section, section_config.Section)
    options, problems = section_config.properties(section, lambda _key, value: value, arrays=("map",))
    assert (section.header[1], options, problems) == (
        "models",
        {"map": [MODELS, PEER], "description": "store"},
        [],
    )
    parsed = parse_mapping_cfg(text, DIR_MAPPING)
    assert write_mapping_cfg(parsed, DIR_MAPPING) == text
    assert api.call("root@pam", "get", "/cluster/mapping/dir/models") == {
        "map": [MODELS, PEER],
        "type": "dir",
        "description": "store",
        "digest": _digest(text),
    }
    assert api.call("root@pam", "get", "/cluster/mapping") == [
        {"name": "dir"},
        {"name": "pci"},
        {"name": "usb"},
    ]


def test_list_checks_the_node_entry_as_the_index_does(api: Node) -> None:
    text = f"models\n\tmap {MODELS}\n\nfar\n\tmap {PEER}\n\ngone\n\tmap node=pve1,path=/srv/none\n\n"
    (api.root / CFG).parent.mkdir(parents=True)
    (api.root / CFG).write_text(text)

    listed = api.call("root@pam", "get", "/cluster/mapping/dir", check_node="pve1")

    digest = _digest(text)
    assert listed == [
        {"id": "models", "digest": digest, "map": [MODELS], "type": "dir", "checks": []},
        {
            "id": "far",
            "digest": digest,
            "map": [PEER],
            "type": "dir",
            "checks": [{"severity": "warning", "message": "No mapping for node pve1."}],
        },
        {
            "id": "gone",
            "digest": digest,
            "map": ["node=pve1,path=/srv/none"],
            "type": "dir",
            "checks": [
                {"severity": "error", "message": "Invalid configuration: Path /srv/none does not exist\n"}
            ],
        },
    ]


@pytest.mark.parametrize(
    ("maps", "text"),
    [
        pytest.param(["node=pve1,path=/srv/none"], "Path /srv/none does not exist\n", id="missing"),
        pytest.param(
            ["node=pve1,path=/srv/file"], "Path /srv/file exists, but is not a directory\n", id="file"
        ),
        pytest.param([PEER, PEER], "Node 'pve2' is specified 2 times.\n", id="node-twice"),
    ],
)
def test_error_create_refuses_a_bad_map_list_before_the_lock(api: Node, maps: list[str], text: str) -> None:
    with pytest.raises(DieError) as refused:
        api.call("root@pam", "create", "/cluster/mapping/dir", id="models", map=maps)
    assert refused.value.text == text  # assert_valid_map_list runs outside lock_dir_config: no prefix
    assert not (api.root / CFG).exists()


@pytest.mark.parametrize(
    ("entry", "errors"),
    [
        pytest.param("node=pve1,path=models", {"map[0].path": PATH_TEXT}, id="relative"),
        pytest.param("node=pve1,path=/(x)", {"map[0].path": PATH_TEXT}, id="bracket"),
        pytest.param(
            "path=/srv", {"map[0].node": "property is missing and it is not optional"}, id="no-node"
        ),
        pytest.param(
            "node=pve1,path=/srv,ro=1",
            {"map[0]": "invalid format - invalid key in comma-separated list property: ro"},
            id="unknown-key",
        ),
    ],
)
def test_error_create_refuses_a_map_entry_of_another_format(
    api: Node, entry: str, errors: dict[str, str]
) -> None:
    with pytest.raises(ParamError) as refused:
        api.call("root@pam", "create", "/cluster/mapping/dir", id="models", map=[entry])
    assert refused.value.errors == errors


def test_pve_verify_path_has_no_end_anchor(api: Node) -> None:
    """Dir.pm's regex checks the first character after `/` only, so `/srv(x)` is taken as upstream takes it
    (then refused because it does not exist)."""
    with pytest.raises(DieError) as refused:
        api.call("root@pam", "create", "/cluster/mapping/dir", id="models", map=["node=pve1,path=/srv(x)"])
    assert refused.value.text == "Path /srv(x) does not exist\n"


@pytest.mark.parametrize(
    ("kind", "map_entry", "word"),
    [("dir", MODELS, "directory"), ("pci", "node=pve1,path=0000:41:00.0,id=10de:2bb1", "hardware")],
)
def test_error_create_of_an_existing_id_names_the_kind(
    api: Node, kind: str, map_entry: str, word: str
) -> None:
    api.call("root@pam", "create", f"/cluster/mapping/{kind}", id="models", map=[map_entry])
    with pytest.raises(DieError) as refused:
        api.call("root@pam", "create", f"/cluster/mapping/{kind}", id="models", map=[map_entry])
    assert refused.value.text == f"create {word} mapping failed: {kind} ID 'models' already defined\n"


def test_update_needs_the_current_digest_and_refuses_as_section_config(api: Node) -> None:
    api.call("root@pam", "create", "/cluster/mapping/dir", id="models", map=[MODELS], description="store")
    before = _file(api)
    prefix = "update directory mapping failed: "
    one = "/cluster/mapping/dir/models"

    def refusal(path: str, **params: object) -> str:
        with pytest.raises(DieError) as refused:
            api.call("root@pam", "set", path, **params)
        return refused.value.text

    assert refusal(one, map=[PEER], digest=_digest("someone else's")) == (
        f"{prefix}detected modified configuration - file changed by other user? Try again.\n"
    )
    assert refusal("/cluster/mapping/dir/other", map=[PEER]) == f"{prefix}dir ID 'other' does not exist\n"
    assert refusal(one, description="d") == f"{prefix}missing value for required option 'map'\n"
    assert refusal(one, map=[PEER, PEER]) == f"{prefix}Node 'pve2' is specified 2 times.\n"
    assert refusal(one, map=[PEER], delete="map") == f"{prefix}unable to delete required option 'map'\n"
    assert refusal(one, map=[PEER], delete="mdev") == f"{prefix}no such option 'mdev'\n"
    assert refusal(one, map=[PEER], description="d", delete="description") == (
        f"{prefix}cannot set and delete property 'description' at the same time!\n"
    )
    assert _file(api) == before

    api.call("root@pam", "set", one, map=[MODELS, PEER], delete="description", digest=_digest(before))
    assert _file(api) == f"models\n\tmap {MODELS}\n\tmap {PEER}\n\n"
    api.call("root@pam", "delete", one)
    api.call("root@pam", "delete", one)  # an unknown id is no error
    assert _file(api) == ""


def test_error_token_needs_mapping_modify_and_sees_only_what_it_may(api: Node) -> None:
    cfg = api.root / "etc/pve/user.cfg"
    api.call("root@pam", "create", "/cluster/mapping/dir", id="models", map=[MODELS])
    cfg.write_text(cfg.read_text().replace("Mapping.Modify,", ""))

    refusals = []
    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("create", "/cluster/mapping/dir", {"id": "other", "map": [MODELS]}),
        ("set", "/cluster/mapping/dir/models", {"map": [MODELS]}),
        ("delete", "/cluster/mapping/dir/models", {}),
    ]
    for cmd, path, params in calls:
        with pytest.raises(access.PermissionDenied) as refused:
            api.call(TOKEN, cmd, path, **params)
        refusals.append((refused.value.code, refused.value.text))

    assert refusals == [
        (403, "Permission check failed (/mapping/dir, Mapping.Modify)\n"),
        (403, "Permission check failed (/mapping/dir/models, Mapping.Modify)\n"),
        (403, "Permission check failed (/mapping/dir, Mapping.Modify)\n"),
    ]
    assert [m["id"] for m in api.call(TOKEN, "get", "/cluster/mapping/dir")] == ["models"]
    cfg.write_text(cfg.read_text() + f"acl:1:/mapping/dir/models:{TOKEN}:NoAccess:\n")
    assert api.call(TOKEN, "get", "/cluster/mapping/dir") == []
    with pytest.raises(access.PermissionDenied) as hidden:
        api.call(TOKEN, "get", "/cluster/mapping/dir/models")
    assert hidden.value.text == "Permission check failed\n"  # the `or` of Use, Modify, Audit
