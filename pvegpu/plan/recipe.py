"""Which serving recipe a node gets, and what it adds to `sglang serve` and the service's environment. Pure.

`plan_recipe` resolves `sglang.recipe` (`auto`: the recipe whose architecture and quantization match the
checkpoint's `config.json`, or, before the weights are on the host, whose known checkpoints include
`sglang.model_repo`, on GPUs of its compute capability), then gives its options, its MoE runner for
`sglang.workload`, MTP speculative decoding where the checkpoint holds the MTP layer, and its environment.
The operator's own `extra_args` and `env` win over the recipe's: a recipe option or variable they set is left
out, and the env file says so. The options are checked with the rest of the argv (pvegpu.plan.sglang).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pvegpu.models.recipe import Checkpoint, Recipe, RecipeTable, load_recipes
from pvegpu.models.sglang import SGLANG_KEY, SglangSpec
from pvegpu.models.sglang_options import load_option_table
from pvegpu.plan.errors import PlanError
from pvegpu.plan.nccl import EnvSetting, setting_lines

# SGLang 0.5.23 refuses PP with speculative decoding at start unless this is set (srt/environ.py, default off;
# arg_groups/validation_hook.py), with this text.
PP_SPEC = "SGLANG_ENABLE_PP_SPEC"
PP_SPEC_REFUSAL = (
    "PP + speculative decoding (MTP) is only supported on prefill nodes (disaggregation-mode=prefill)"
)
_TRUE = ("true", "1", "yes", "y")  # 0.5.23's EnvBool


@dataclass(frozen=True)
class RecipeOption:
    """Options of one recipe value (`words`, in argv order) and why they are set."""

    words: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class RecipePlan:
    """The recipe in force (`name` None: none), its options and variables, what it
    left out and why (`omitted`), and `notes`: info lines for the run's output."""

    name: str | None
    options: tuple[RecipeOption, ...] = ()
    env: tuple[EnvSetting, ...] = ()
    omitted: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def argv(self) -> tuple[str, ...]:
        return tuple(word for option in self.options for word in option.words)

    def env_file_lines(self) -> tuple[str, ...]:
        """The recipe's block of the service's env file: its name, each variable after its source, then each
        option and each value left out with its reason."""
        if self.name is None:
            return ()
        lines = [f"# Recipe {self.name} (pvegpu/data/sglang/recipes.json)", *setting_lines(self.env)]
        lines += [f"# sglang {' '.join(option.words)}: {option.reason}" for option in self.options]
        lines += [f"# left out: {line}" for line in self.omitted]
        return tuple(lines)


def plan_recipe(
    spec: SglangSpec,
    checkpoint: Checkpoint | None,
    gpu_ids: Sequence[str],
    *,
    p2p: bool,
    table: RecipeTable | None = None,
) -> RecipePlan:
    """The recipe plan for `spec` serving `checkpoint` (None: no config.json in `spec.model_path` yet) on
    GPUs of PCI ids `gpu_ids`; `p2p`: whether the GPUs talk peer to peer (pvegpu.run.serving).

    Raises PlanError (`sglang.mtp: ...`) for MTP with `pp_size` > 1 without SGLang's opt-in."""
    table = table or load_recipes()
    if spec.recipe == "none":
        return RecipePlan(None)
    capabilities = {table.compute_capability(gpu) for gpu in gpu_ids}
    capability = next(iter(capabilities)) if len(capabilities) == 1 else None
    if spec.recipe != "auto":
        recipe = table.recipe(spec.recipe)
    else:
        found = _matching(table, checkpoint, spec.model_repo, capability)
        if isinstance(found, str):
            return RecipePlan(None, notes=(found,))
        recipe = found
    by_name = load_option_table().by_name()
    operators = {
        option.dest
        for option in (by_name.get(arg.partition("=")[0]) for arg in spec.extra_args)
        if option is not None
    }
    options: list[RecipeOption] = []
    omitted: list[str] = []

    def add(words: tuple[str, ...], reason: str) -> None:
        if by_name[words[0]].dest in operators:
            omitted.append(f"{words[0]}: {SGLANG_KEY}.extra_args sets it")
        else:
            options.append(RecipeOption(words, reason))

    for arg in recipe.args:
        if arg.needs_p2p and not p2p:
            omitted.append(f"{arg.option}: no P2P between the GPUs ({arg.source})")
        else:
            add(arg.argv(), arg.source)
    backend, why = recipe.moe_runner[spec.workload]
    add(("--moe-runner-backend", backend), f"workload {spec.workload}: {why}")
    notes: list[str] = []
    mtp = _mtp(recipe, spec, checkpoint)
    if isinstance(mtp, str):
        notes.append(mtp)
    elif mtp:
        for option, value in recipe.mtp_args:
            add((option, value), recipe.mtp_source)
    env = tuple(EnvSetting(v.name, v.value, v.source) for v in recipe.env if v.name not in spec.env)
    omitted += [f"{v.name}: {SGLANG_KEY}.env sets it" for v in recipe.env if v.name in spec.env]
    return RecipePlan(recipe.name, tuple(options), env, tuple(omitted), tuple(notes))


def _matching(
    table: RecipeTable, checkpoint: Checkpoint | None, repo: str | None, capability: str | None
) -> Recipe | str:
    """The recipe `auto` picks, or the info line saying why there is none."""
    on_gpus = [recipe for recipe in table.recipes if recipe.compute_capability == capability]
    if checkpoint is None:
        by_repo = [recipe for recipe in on_gpus if repo in recipe.mtp_by_repo]
        if by_repo:
            return by_repo[0]
        return (
            f"{SGLANG_KEY}.recipe auto: no recipe yet: {SGLANG_KEY}.model_path has no config.json to choose "
            "by (the service gets the recipe once the weights are there)"
        )
    for recipe in on_gpus:
        if (
            set(recipe.architectures) & set(checkpoint.architectures)
            and recipe.quant_algo == checkpoint.quant_algo
        ):
            return recipe
    known = "; ".join(
        f"{r.name}: {'/'.join(r.architectures)} {r.quant_algo} on compute capability {r.compute_capability}"
        for r in table.recipes
    )
    return (
        f"{SGLANG_KEY}.recipe auto: no recipe for {'/'.join(checkpoint.architectures) or 'no architecture'} "
        f"{checkpoint.quant_algo or 'unquantized'} on compute capability {capability or 'unknown'} "
        f"({known}): serving with the fields and extra_args only"
    )


def _mtp(recipe: Recipe, spec: SglangSpec, checkpoint: Checkpoint | None) -> bool | str:
    """Whether the MTP options apply; a string: the info line saying why not."""
    if not spec.mtp or not recipe.mtp_args:
        return False
    if checkpoint is not None:
        has = checkpoint.has_mtp
        where = checkpoint.path
        if checkpoint.mtp_layer is None:
            missing = "no MTP layer (its config.json has no num_nextn_predict_layers)"
        elif checkpoint.layers is None:
            missing = "no weight index (model.safetensors.index.json) to find its MTP layer in"
        else:
            missing = f"no MTP layer (model.layers.{checkpoint.mtp_layer} is not in its weight index)"

    else:
        has = recipe.mtp_by_repo.get(spec.model_repo or "", False)
        where = str(spec.model_repo)
        missing = "no MTP layer"
    if not has:
        return (
            f"{SGLANG_KEY}.mtp: {where} has {missing}: serving without speculative decoding; "
            f"{', '.join(recipe.mtp_repos())} has it"
        )
    if spec.pp_size > 1 and spec.env.get(PP_SPEC, "").lower() not in _TRUE:
        raise PlanError(
            f"{SGLANG_KEY}.mtp: MTP with pp_size {spec.pp_size} needs SGLang 0.5.23's opt-in {PP_SPEC}=1 "
            f'(off by default; without it SGLang refuses to start: "{PP_SPEC_REFUSAL}"): set '
            f"{SGLANG_KEY}.env {PP_SPEC}: '1', or {SGLANG_KEY}.mtp: false"
        )
    return True
