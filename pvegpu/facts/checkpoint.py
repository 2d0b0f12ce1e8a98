"""A checkpoint as the serving host's one read shows it (`pvegpu.facts.host_read`: its `config.json` and
`hf_quant_config.json` as records, its weight index's layer numbers): `read_checkpoint` parses them into a
`pvegpu.models.recipe.Checkpoint`. Pure."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pvegpu.facts.parsing import ParseError
from pvegpu.models.recipe import Checkpoint

CONFIG = "config.json"
# ModelOpt's exports name the quantization here when config.json does not.
QUANT_CONFIG = "hf_quant_config.json"
WEIGHT_INDEX = "model.safetensors.index.json"


def checkpoint_records(model_path: str) -> tuple[str, str]:
    """The files of `model_path` the read takes whole: its config.json and hf_quant_config.json."""
    return (f"{model_path}/{CONFIG}", f"{model_path}/{QUANT_CONFIG}")


def read_checkpoint(
    model_path: str, records: Mapping[str, str | None], layers: frozenset[int] | None
) -> Checkpoint | None:
    """The checkpoint in `model_path` (None: it has no config.json yet). ParseError naming the file when a
    file is not the JSON object it must be."""
    config_path, quant_path = checkpoint_records(model_path)
    config = _object(config_path, records.get(config_path))
    if config is None:
        return None
    quant = _object(quant_path, records.get(quant_path)) or {}
    quant_algo = _dict(config.get("quantization_config")).get("quant_algo")
    if quant_algo is None:
        quant_algo = _dict(quant.get("quantization")).get("quant_algo")
    architectures = config.get("architectures") or []
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ParseError(f"{config_path}: architectures is not a list of names")
    return Checkpoint(
        path=model_path,
        architectures=tuple(architectures),
        quant_algo=quant_algo if isinstance(quant_algo, str) else None,
        num_hidden_layers=_int(config_path, config, "num_hidden_layers"),
        num_nextn_predict_layers=_int(config_path, config, "num_nextn_predict_layers"),
        layers=layers,
    )


def _object(path: str, text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as error:
        raise ParseError(f"{path}: not JSON ({error})") from None
    if not isinstance(value, dict):
        raise ParseError(f"{path}: not a JSON object")
    return value


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _int(path: str, config: dict[str, Any], key: str) -> int | None:
    value = config.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ParseError(f"{path}: {key} is {value!r}, not a count")
    return value
