"""The pinned SGLang's option table: what `sglang serve` accepts, as data kept in the repository.

`pvegpu/data/sglang/` holds the table dumped from SGLang's own argparse parser and the deprecated options
read from its `--help` (README there: provenance). Loading is a package-resource read, cached: no host, no
network, so a generated argv is checked before pvegpu connects anywhere.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

# The SGLang release pvegpu installs and whose option table it checks argv against.
SGLANG_VERSION = "0.5.23"


@dataclass(frozen=True)
class SglangOption:
    """One argparse action of `sglang serve`.

    `names` are its option strings, canonical first (`--tp-size`, `--tensor-parallel-size`); `nargs` is
    argparse's (None: one value, 0: a flag, "+"/"*"/"?"); `type` argparse's type name (`int`, `float`,
    `str`, `human_readable_int`, ...); `deprecated` the help sentence when SGLang marks it deprecated.
    """

    names: tuple[str, ...]
    dest: str
    takes_value: bool
    nargs: int | str | None
    choices: tuple[str, ...] | None
    type: str | None
    required: bool
    deprecated: str | None


@dataclass(frozen=True)
class OptionTable:
    """Every option of one SGLang version, looked up by exact option string."""

    version: str
    options: tuple[SglangOption, ...]

    def by_name(self) -> dict[str, SglangOption]:
        return {name: option for option in self.options for name in option.names}

    def option(self, name: str) -> SglangOption:
        """The option whose strings include `name` exactly; KeyError otherwise (no prefix matching)."""
        return self.by_name()[name]


@cache
def load_option_table(version: str = SGLANG_VERSION) -> OptionTable:
    """The option table of `version` from the package data; FileNotFoundError when none is shipped."""
    folder = resources.files("pvegpu").joinpath("data", "sglang")
    dump = json.loads(folder.joinpath(f"sglang_{version}_options.json").read_text())
    deprecated = json.loads(folder.joinpath(f"sglang_{version}_deprecated.json").read_text())["deprecated"]
    options = tuple(
        SglangOption(
            names=tuple(record["option_strings"]),
            dest=record["dest"],
            takes_value=record["takes_value"],
            nargs=record["nargs"],
            choices=tuple(record["choices"]) if record["choices"] is not None else None,
            type=record["type"],
            required=record["required"],
            deprecated=next((deprecated[n] for n in record["option_strings"] if n in deprecated), None),
        )
        for record in dump["options"]
    )
    return OptionTable(version=dump["sglang_version"], options=options)
