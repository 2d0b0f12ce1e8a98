"""Regenerate the README's inventory variable tables from the role specs' field descriptions.

    .venv/bin/python scripts/readme_tables.py          # rewrite README.md in place
    .venv/bin/python scripts/readme_tables.py --check  # exit 1 if README.md is out of date

Each role key in `ROLE_SPECS` has one table between `<!-- spec-table:KEY:start -->` and
`<!-- spec-table:KEY:end -->`; the API token's `pveum` recipe and privilege table (from
`pvegpu.models.pve_privileges`) sit between `<!-- pveum-recipe:start -->` and `<!-- pveum-recipe:end -->`.
tests/unit/test_docs.py runs the check.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pvegpu.inventory.tables import spec_table_markdown  # noqa: E402
from pvegpu.inventory.validate import ROLE_SPECS  # noqa: E402
from pvegpu.models.pve_privileges import ACL_PATH, PVE_PRIVILEGES, ROLE_NAME, privilege_names  # noqa: E402

README = REPO / "README.md"
_BLOCK = re.compile(r"(<!-- spec-table:([a-z_]+):start -->\n).*?(<!-- spec-table:\2:end -->)", re.DOTALL)


_RECIPE = re.compile(r"(<!-- pveum-recipe:start -->\n).*?(<!-- pveum-recipe:end -->)", re.DOTALL)
TOKEN_USER, TOKEN_NAME = "pvegpu@pve", "deploy"  # inventory.py's pve.token_id: pvegpu@pve!deploy


def render(text: str) -> str:
    """`text` with every table block regenerated; raises KeyError for a block of an unknown key."""
    text = _BLOCK.sub(
        lambda m: m.group(1) + spec_table_markdown(ROLE_SPECS[m.group(2)], m.group(2)) + m.group(3), text
    )
    return _RECIPE.sub(lambda m: m.group(1) + pveum_recipe() + m.group(2), text)


def pveum_recipe() -> str:
    """The least-privilege role, user, privilege-separated token and ACLs, then the privilege table."""
    token = f"{TOKEN_USER}!{TOKEN_NAME}"
    lines = [
        "```",
        f'pveum role add {ROLE_NAME} --privs "{",".join(privilege_names())}"',
        f'pveum user add {TOKEN_USER} --comment "pvegpu deploys"',
        f"pveum acl modify {ACL_PATH} --users {TOKEN_USER} --roles {ROLE_NAME}",
        f"pveum user token add {TOKEN_USER} {TOKEN_NAME} --privsep 1 --output-format json"
        '   # prints the secret once: "value"',
        f"pveum acl modify {ACL_PATH} --tokens '{token}' --roles {ROLE_NAME}",
        "# on the machine running pyinfra: the secret in pve.token_file, one line, 0600",
        "(umask 077 && mkdir -p /etc/pvegpu && echo '<value>' > /etc/pvegpu/pve-token)",
        "```",
        "",
        "A privilege-separated token may do what both it and its user may (hence both ACLs); "
        f"`--propagate` is on by default, so the grant on `{ACL_PATH}` covers every path below.",
        "",
        "| privilege | checked on | why pvegpu needs it |",
        "|---|---|---|",
        *(f"| `{p.name}` | `{p.path}` | {p.why} |" for p in PVE_PRIVILEGES),
    ]
    return "\n".join(lines) + "\n"


def keys_in(text: str) -> list[str]:
    return [match.group(2) for match in _BLOCK.finditer(text)]


def main() -> int:
    text = README.read_text()
    fresh = render(text)
    if "--check" in sys.argv[1:]:
        return 0 if fresh == text else 1
    README.write_text(fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
