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
    `str`, `human_readable_int`, ...); `action` argparse's action class name (`LoRAPathAction`: SGLang's
    own parsing of each value); `deprecated` the help sentence when SGLang marks it deprecated.
    """

    names: tuple[str, ...]
    dest: str
    takes_value: bool
    nargs: int | str | None
    choices: tuple[str, ...] | None
    type: str | None
    required: bool
    action: str
    deprecated: str | None


@dataclass(frozen=True)
class ValueRules:
    """`speculative_algorithms`: the upper-case names `--speculative-algorithm` takes, aliases included;
    `cuda_graph_config_keys`: phase -> the keys `--cuda-graph-config` allows in it;
    `cuda_graph_retired_backends`: backends it refuses; `json_at_start`: option dest -> `loads` (json.loads)
    or `orjson`, for string options SGLang parses as JSON when it starts."""

    speculative_algorithms: tuple[str, ...]
    cuda_graph_config_keys: dict[str, tuple[str, ...]]
    cuda_graph_retired_backends: tuple[str, ...]
    json_at_start: dict[str, str]


@dataclass(frozen=True)
class OptionTable:
    """Every option of one SGLang version, looked up by exact option string.

    `values` are the checks SGLang makes of values its parser takes as plain strings (the data file
    `sglang_<version>_values.json`, README there): speculative algorithms, `--cuda-graph-config` keys,
    options parsed as JSON at start.
    """

    version: str
    options: tuple[SglangOption, ...]
    values: ValueRules

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
    rules = json.loads(folder.joinpath(f"sglang_{version}_values.json").read_text())
    options = tuple(
        SglangOption(
            names=tuple(record["option_strings"]),
            dest=record["dest"],
            takes_value=record["takes_value"],
            nargs=record["nargs"],
            choices=tuple(record["choices"]) if record["choices"] is not None else None,
            type=record["type"],
            required=record["required"],
            action=record["action"],
            deprecated=next((deprecated[n] for n in record["option_strings"] if n in deprecated), None),
        )
        for record in dump["options"]
    )
    values = ValueRules(
        speculative_algorithms=(*rules["speculative_algorithms"], *rules["speculative_aliases"]),
        cuda_graph_config_keys={
            phase: tuple(keys) for phase, keys in rules["cuda_graph_config_keys"].items()
        },
        cuda_graph_retired_backends=tuple(rules["cuda_graph_retired_backends"]),
        json_at_start=rules["json_at_start"],
    )
    return OptionTable(version=dump["sglang_version"], options=options, values=values)
