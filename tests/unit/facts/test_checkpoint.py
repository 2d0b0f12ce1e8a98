"""A checkpoint's config.json and ModelOpt's hf_quant_config.json as the serving read returns them
(synthesized files with the keys SGLang 0.5.23 and ModelOpt's exports use)."""

from __future__ import annotations

import json

import pytest

from pvegpu.facts.checkpoint import checkpoint_records, read_checkpoint
from pvegpu.facts.parsing import ParseError
from pvegpu.models.recipe import Checkpoint

PATH = "/models/GLM-5-NVFP4"
CONFIG, QUANT = checkpoint_records(PATH)
GLM5 = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
    "num_hidden_layers": 78,
    "num_nextn_predict_layers": 1,
    "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"},
}


def test_config_with_quantization_and_mtp_layer() -> None:
    layers = frozenset(range(79))
    checkpoint = read_checkpoint(PATH, {CONFIG: json.dumps(GLM5), QUANT: None}, layers)
    assert checkpoint == Checkpoint(PATH, ("GlmMoeDsaForCausalLM",), "NVFP4", 78, 1, layers)
    assert (checkpoint.mtp_layer, checkpoint.has_mtp) == (78, True)
    assert CONFIG == "/models/GLM-5-NVFP4/config.json"
    assert QUANT == "/models/GLM-5-NVFP4/hf_quant_config.json"


def test_quantization_from_hf_quant_config_and_missing_layer() -> None:
    config = {k: v for k, v in GLM5.items() if k != "quantization_config"}
    quant = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}}
    checkpoint = read_checkpoint(
        PATH, {CONFIG: json.dumps(config), QUANT: json.dumps(quant)}, frozenset(range(78))
    )
    assert checkpoint is not None
    assert (checkpoint.quant_algo, checkpoint.has_mtp) == ("NVFP4", False)
    two = read_checkpoint(
        PATH, {CONFIG: json.dumps({**GLM5, "num_nextn_predict_layers": 2})}, frozenset(range(80))
    )
    assert two is not None
    assert not two.has_mtp  # 0.5.23: "Only 1 nextn layer is supported"


def test_no_config_no_checkpoint() -> None:
    assert read_checkpoint(PATH, {CONFIG: None, QUANT: None}, None) is None


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("{", "/models/GLM-5-NVFP4/config.json: not JSON (Expecting property name enclosed in double quotes: "
              "line 1 column 2 (char 1))"),
        ("[]", "/models/GLM-5-NVFP4/config.json: not a JSON object"),
        ('{"architectures": "Glm"}', "/models/GLM-5-NVFP4/config.json: architectures is not a list of names"),
        ('{"num_hidden_layers": true}',
         "/models/GLM-5-NVFP4/config.json: num_hidden_layers is True, not a count"),
    ],
)  # fmt: skip
def test_error_names_the_file(config: str, message: str) -> None:
    with pytest.raises(ParseError) as caught:
        read_checkpoint(PATH, {CONFIG: config}, None)
    assert str(caught.value) == message
