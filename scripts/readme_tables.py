"""Regenerate the README's inventory variable tables from the role specs' field descriptions.

    .venv/bin/python scripts/readme_tables.py          # rewrite README.md in place
    .venv/bin/python scripts/readme_tables.py --check  # exit 1 if README.md is out of date

Each role key in `ROLE_SPECS` has one table between `<!-- spec-table:KEY:start -->` and
`<!-- spec-table:KEY:end -->`; tests/unit/test_docs.py runs the check.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pvegpu.models.inventory import ROLE_SPECS, spec_table_markdown  # noqa: E402

README = REPO / "README.md"
_BLOCK = re.compile(r"(<!-- spec-table:([a-z_]+):start -->\n).*?(<!-- spec-table:\2:end -->)", re.DOTALL)


def render(text: str) -> str:
    """`text` with every table block regenerated; raises KeyError for a block of an unknown key."""
    return _BLOCK.sub(
        lambda m: m.group(1) + spec_table_markdown(ROLE_SPECS[m.group(2)], m.group(2)) + m.group(3), text
    )


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
