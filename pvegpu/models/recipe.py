"""Serving recipes as data (`pvegpu/data/sglang/recipes.json`, each value with its source) and the checkpoint
facts that choose one: the model's architecture, quantization and MTP layer (`Checkpoint`), the GPUs'
compute capability from their PCI device ids (`compute_capability`). Plain data; pvegpu.plan.recipe
chooses."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, Literal

Workload = Literal["latency", "throughput"]


@dataclass(frozen=True)
class RecipeArg:
    """One `sglang serve` option of a recipe (`value` None: a flag); `needs_p2p`: only where the GPUs talk
    P2P (the option shares buffers between them)."""

    option: str
    value: str | None
    needs_p2p: bool
    source: str

    def argv(self) -> tuple[str, ...]:
        return (self.option,) if self.value is None else (self.option, self.value)


@dataclass(frozen=True)
class RecipeEnv:
    """One variable of a recipe's environment."""

    name: str
    value: str
    source: str


@dataclass(frozen=True)
class Recipe:
    """A recipe of `recipes.json`: what checkpoint and GPUs it is for (`architectures`, `quant_algo`,
    `compute_capability`), the checkpoints it knows by repository (`mtp_by_repo`: whether each has the MTP
    layer), its options, environment, MoE runner per workload and MTP options."""

    name: str
    title: str
    source: str
    architectures: tuple[str, ...]
    quant_algo: str
    compute_capability: str
    mtp_by_repo: dict[str, bool]
    args: tuple[RecipeArg, ...]
    env: tuple[RecipeEnv, ...]
    moe_runner: dict[str, tuple[str, str]]
    mtp_args: tuple[tuple[str, str], ...]
    mtp_source: str

    def mtp_repos(self) -> tuple[str, ...]:
        """The repositories this recipe knows with the MTP layer."""
        return tuple(repo for repo, mtp in self.mtp_by_repo.items() if mtp)


@dataclass(frozen=True)
class GpuChip:
    """A chip's PCI device id range (NVIDIA's vendor id) and its CUDA compute capability."""

    first: int
    last: int
    chip: str
    compute_capability: str


@dataclass(frozen=True)
class RecipeTable:
    """`recipes.json`: the SGLang version it is for, the chip ranges, the recipes."""

    version: str
    chips: tuple[GpuChip, ...]
    recipes: tuple[Recipe, ...]

    def names(self) -> tuple[str, ...]:
        return tuple(recipe.name for recipe in self.recipes)

    def recipe(self, name: str) -> Recipe:
        return next(recipe for recipe in self.recipes if recipe.name == name)

    def compute_capability(self, device_id: str) -> str | None:
        """`10de:2bb1` -> `12.0` (None for a device id outside every known chip's range)."""
        vendor, _, device = device_id.partition(":")
        if vendor != "10de":
            return None
        number = int(device, 16)
        return next((c.compute_capability for c in self.chips if c.first <= number <= c.last), None)


def _recipe(raw: dict[str, Any]) -> Recipe:
    match = raw["match"]
    return Recipe(
        name=raw["name"],
        title=raw["title"],
        source=raw["source"],
        architectures=tuple(match["architectures"]),
        quant_algo=match["quant_algo"],
        compute_capability=match["compute_capability"],
        mtp_by_repo={c["repo"]: c["mtp"] for c in raw["checkpoints"]},
        args=tuple(
            RecipeArg(a["option"], a.get("value"), a.get("needs_p2p", False), a["source"])
            for a in raw["args"]
        ),
        env=tuple(RecipeEnv(e["name"], e["value"], e["source"]) for e in raw["env"]),
        moe_runner={w: (m["backend"], m["source"]) for w, m in raw["moe_runner"].items()},
        mtp_args=tuple((option, value) for option, value in raw["mtp"]["args"]),
        mtp_source=raw["mtp"]["source"],
    )


@cache
def load_recipes() -> RecipeTable:
    """The shipped recipe table (`pvegpu/data/sglang/recipes.json`)."""
    text = resources.files("pvegpu").joinpath("data", "sglang", "recipes.json").read_text()
    raw = json.loads(text)
    chips = tuple(
        GpuChip(int(c["first"], 16), int(c["last"], 16), c["chip"], c["compute_capability"])
        for c in raw["gpu_chips"]
    )
    return RecipeTable(raw["sglang_version"], chips, tuple(_recipe(r) for r in raw["recipes"]))


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint's `config.json` and weight index say: `architectures`, `quant_algo` (modelopt's,
    from `quantization_config`), `num_hidden_layers`, `num_nextn_predict_layers` (None: not in the config),
    and `layers`: the `model.layers.N` numbers of its weight map (None: no index read)."""

    path: str
    architectures: tuple[str, ...]
    quant_algo: str | None
    num_hidden_layers: int | None
    num_nextn_predict_layers: int | None
    layers: frozenset[int] | None

    @property
    def mtp_layer(self) -> int | None:
        """The MTP layer's number as SGLang 0.5.23 loads it (`model.layers.<num_hidden_layers>`,
        models/deepseek_common/deepseek_weight_loader.py), when the config declares one."""
        if not self.num_nextn_predict_layers or self.num_hidden_layers is None:
            return None
        return self.num_hidden_layers

    @property
    def has_mtp(self) -> bool:
        """The config declares exactly one MTP layer (0.5.23 asserts "Only 1 nextn layer is supported") and
        the weight map holds its tensors."""
        layer = self.mtp_layer
        return (
            layer is not None
            and self.num_nextn_predict_layers == 1
            and self.layers is not None
            and layer in self.layers
        )
