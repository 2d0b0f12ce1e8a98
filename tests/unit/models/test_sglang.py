"""The `sglang` spec: defaults, validation against the pinned option table, the README table rows."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pvegpu.inventory.tables import spec_table_markdown
from pvegpu.inventory.validate import ROLE_SPECS, validate_inventory
from pvegpu.models.errors import InventoryError
from pvegpu.models.sglang import SGLANG_KEY, SglangSpec, is_loopback
from pvegpu.models.sglang_options import SGLANG_VERSION, load_option_table

NODE = {"name": "pve1", "gpus": {"ids": ["10de:2bb1"], "count": 8}}


def problems(sglang: dict[str, object]) -> list[str]:
    with pytest.raises(InventoryError) as caught:
        validate_inventory([("h", {"node": NODE, "sglang": sglang})])
    return list(caught.value.problems)


def test_registered_under_its_key() -> None:
    assert ROLE_SPECS[SGLANG_KEY] is SglangSpec


def test_defaults_serve_glm5_nvfp4_tp8_on_loopback() -> None:
    spec = SglangSpec()
    assert spec.model_dump() == {
        "model_path": "/models/GLM-5-NVFP4",
        "served_model_name": "glm-5",
        "tp_size": 8,
        "pp_size": 1,
        "quantization": "modelopt_fp4",
        "kv_cache_dtype": "bf16",
        "mem_fraction_static": 0.88,
        "context_length": 131072,
        "chunked_prefill_size": 8192,
        "cuda_graph_max_bs": None,
        "concurrency": 64,
        "recipe": "auto",
        "workload": "throughput",
        "mtp": True,
        "reasoning_parser": "glm45",
        "tool_call_parser": "glm47",
        "trust_remote_code": False,
        "api_key_file": None,
        "admin_api_key_file": None,
        "host": "127.0.0.1",
        "port": 30000,
        "enable_metrics": True,
        "nnodes": 1,
        "node_rank": 0,
        "dist_init_addr": None,
        "extra_args": (),
        "env": {},
        "user": "sglang",
        "venv": "/opt/sglang/venv",
        "pip_args": (),
        "model_repo": None,
        "model_revision": None,
        "hf_endpoint": None,
        "hf_token_file": None,
        "model_share": None,
        "start_timeout_s": 1200,
    }


def test_defaults_are_choices_of_the_pinned_sglang() -> None:
    table = load_option_table()
    spec = SglangSpec()
    assert spec.quantization in (table.option("--quantization").choices or ())
    assert spec.kv_cache_dtype in (table.option("--kv-cache-dtype").choices or ())
    assert spec.reasoning_parser in (table.option("--reasoning-parser").choices or ())
    assert spec.tool_call_parser in (table.option("--tool-call-parser").choices or ())


def test_option_table_is_the_pinned_version_with_its_deprecations() -> None:
    table = load_option_table()
    assert (SGLANG_VERSION, table.version, len(table.options)) == ("0.5.23", "0.5.23", 532)
    assert table.option("--tensor-parallel-size").names == ("--tp-size", "--tensor-parallel-size")
    assert sorted(n for o in table.options if o.deprecated for n in o.names) == [
        "--disable-cuda-graph",
        "--disable-fast-image-processor",
        "--enable-dp-attention",
        "--enable-flashinfer-allreduce-fusion",
        "--grpc-mode",
        "--monokernel-backend",
    ]
    with pytest.raises(KeyError):
        table.option("--tp")  # no prefix matching


def test_listening_beyond_loopback_with_an_api_key() -> None:
    spec = SglangSpec(host="0.0.0.0", api_key_file="/etc/pvegpu/sglang.key")
    assert (spec.host, spec.api_key_file) == ("0.0.0.0", "/etc/pvegpu/sglang.key")


def test_metrics_are_served_only_where_the_api_is_loopback() -> None:
    """SGLang answers /metrics without the key: on by default on loopback, off beyond it, never on there."""
    assert SglangSpec().enable_metrics is True
    assert SglangSpec(host="::1", enable_metrics=True).enable_metrics is True
    assert SglangSpec(host="10.0.0.5", api_key_file="/k").enable_metrics is False
    assert SglangSpec(host="10.0.0.5", api_key_file="/k", enable_metrics=False).enable_metrics is False
    with pytest.raises(ValidationError) as raised:
        SglangSpec(host="0.0.0.0", api_key_file="/k", enable_metrics=True)
    assert [error["loc"] for error in raised.value.errors()] == [("enable_metrics",)]


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.3.0.1", True), ("::1", True), ("localhost", True), ("0.0.0.0", False),
     ("10.0.0.5", False), ("gpu-node", False)],
)  # fmt: skip
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_multi_node() -> None:
    spec = SglangSpec(nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:5000")
    assert (spec.nnodes, spec.node_rank, spec.dist_init_addr) == (2, 1, "10.0.0.1:5000")
    # Rank 0 listens where the others reach it: dist_init_addr's host, or every address.
    for host in ("10.0.0.1", "0.0.0.0"):
        leader = SglangSpec(nnodes=2, host=host, api_key_file="/k", dist_init_addr="10.0.0.1:5000")
        assert leader.host == host
    assert (
        SglangSpec(nnodes=2, host="fd00::1", api_key_file="/k", dist_init_addr="[fd00::1]:5000").node_rank
        == 0
    )


@pytest.mark.parametrize(
    ("sglang", "expected"),
    [
        ({"host": "0.0.0.0"},
         "h: sglang.host: '0.0.0.0' is not a loopback address: "
         "listening beyond this host needs api_key_file"),
        ({"host": "a b"}, "h: sglang.host: 'a b' is not a host name or IP address"),
        ({"nnodes": 2}, "h: sglang.dist_init_addr: is required when nnodes is 2 (host:port of rank 0)"),
        ({"nnodes": 2, "node_rank": 2, "dist_init_addr": "10.0.0.1:5000"},
         "h: sglang.node_rank: must be below nnodes (2) (got 2)"),
        ({"dist_init_addr": "10.0.0.1:5000"},
         "h: sglang.dist_init_addr: is only used when nnodes is more than 1"),
        ({"nnodes": 2, "dist_init_addr": "nohost"}, "h: sglang.dist_init_addr: 'nohost' is not host:port"),
        ({"nnodes": 2, "dist_init_addr": "10.0.0.1:5000"},
         "h: sglang: host '127.0.0.1': rank 0 of 2 nodes must listen where the other ranks reach its "
         "/health: on dist_init_addr's host 10.0.0.1 or 0.0.0.0 / ::"),
        ({"nnodes": 2, "dist_init_addr": "[fd00::1]:5000", "host": "fd00::2", "api_key_file": "/k"},
         "h: sglang: host 'fd00::2': rank 0 of 2 nodes must listen where the other ranks reach its "
         "/health: on dist_init_addr's host [fd00::1] or 0.0.0.0 / ::"),
        ({"env": {"A B": "1"}}, "h: sglang.env: 'A B' is not an environment variable name"),
        ({"env": {"NCCL_ALGO": "$X"}},
         "h: sglang.env: NCCL_ALGO: '$X' may not hold whitespace, control characters, quotes, backslashes "
         "or $"),
        ({"env": {"NCCL_ALGO": "Ring\x07"}},
         "h: sglang.env: NCCL_ALGO: 'Ring\\x07' may not hold whitespace, control characters, quotes, "
         "backslashes or $"),
        ({"served_model_name": "glm-5\nExecStartPre=/bin/sh -c id"},
         "h: sglang.served_model_name: 'glm-5\\nExecStartPre=/bin/sh -c id' holds a control character "
         "('\\n'), which pvegpu will not write into a unit file or a command"),
        ({"model_path": "/models/glm\r"},
         "h: sglang.model_path: '/models/glm\\r' holds a control character ('\\r'), which pvegpu will not "
         "write into a unit file or a command"),
        ({"venv": "/opt/sglang/venv\x00"},
         "h: sglang.venv: '/opt/sglang/venv\\x00' holds a control character ('\\x00'), which pvegpu will "
         "not write into a unit file or a command"),
        ({"api_key_file": "/etc/pvegpu/key\n"},
         "h: sglang.api_key_file: '/etc/pvegpu/key\\n' holds a control character ('\\n'), which pvegpu "
         "will not write into a unit file or a command"),
        ({"extra_args": ["--watchdog-timeout\t1200"]},
         "h: sglang.extra_args: '--watchdog-timeout\\t1200' is not a command-line argument"),
        ({"pip_args": ["--index-url\nhttp://evil"]},
         "h: sglang.pip_args: '--index-url\\nhttp://evil' is not a command-line argument"),
        ({"chunked_prefill_size": 0},
         "h: sglang.chunked_prefill_size: must be -1 (no chunking) or at least 1 (got 0)"),
        ({"tp_size": 0}, "h: sglang.tp_size: must be at least 1 (got 0)"),
        ({"model_path": "models/glm"}, "h: sglang.model_path: must be an absolute path (got 'models/glm')"),
        ({"extra_args": [""]}, "h: sglang.extra_args: '' is not a command-line argument"),
        ({"tp": 8}, "h: sglang.tp: unknown field (did you mean 'mtp'?)"),
    ],
)  # fmt: skip
def test_error_field_named(sglang: dict[str, object], expected: str) -> None:
    assert problems(sglang) == [expected]


def test_error_invalid_choice_names_the_flag_and_the_choices() -> None:
    choices = ", ".join(load_option_table().option("--kv-cache-dtype").choices or ())
    assert choices == "auto, bf16, bfloat16, fp4_mx_block16, fp8_e4m3, fp8_e5m2, mxfp8, nvfp4"
    assert problems({"kv_cache_dtype": "fp8"}) == [
        "h: sglang.kv_cache_dtype: 'fp8' is not a choice of --kv-cache-dtype in sglang 0.5.23 "
        f"(choose from {choices})"
    ]
    # `nvfp4` is the name people try; SGLang's choice is modelopt_fp4 (knowledge file, section 1.1).
    assert problems({"quantization": "nvfp4"})[0].startswith(
        "h: sglang.quantization: 'nvfp4' is not a choice of --quantization in sglang 0.5.23 "
        "(choose from auto-round,"
    )


def test_readme_rows_come_from_the_descriptions() -> None:
    rows = spec_table_markdown(SglangSpec, SGLANG_KEY).splitlines()
    assert len(rows) == 2 + len(SglangSpec.model_fields)
    assert rows[2] == (
        "| `sglang.model_path` | string | `/models/GLM-5-NVFP4` | "
        "Absolute path of the model directory on the serving host (`--model-path`). |"
    )
    assert rows[8].startswith("| `sglang.mem_fraction_static` | number | `0.88` | ")
    assert rows[-10].startswith("| `sglang.env` | mapping of string to string | `{}` | ")
    assert rows[-2].startswith(
        "| `sglang.model_share` | one of `virtiofs`, `bind`, `local` or `None` | `None` | "
    )
    assert rows[-1].startswith("| `sglang.start_timeout_s` | integer | `1200` | ")
    assert all(info.description for info in SglangSpec.model_fields.values())


def test_model_revision_and_endpoint_need_a_repository_and_a_clean_value() -> None:
    assert problems({"model_revision": "v1"}) == [
        "h: sglang.model_revision: applies to `model_repo`, which is not set"
    ]
    assert problems({"model_repo": "a/b", "model_revision": "main..x", "hf_endpoint": "ftp://mirror"}) == [
        "h: sglang.model_revision: String should match pattern '^[A-Za-z0-9]+([._/-][A-Za-z0-9]+)*$' "
        "(got 'main..x')",
        "h: sglang.hf_endpoint: String should match pattern '^https?://[A-Za-z0-9.:\\[\\]-]+"
        "(/[A-Za-z0-9._~/-]*)?$' (got 'ftp://mirror')",
    ]
