"""The lab's stand-ins (lab/standins): the stand-in sglang refuses the argv pvegpu's check refuses and serves
health, models and chat with SGLang's key rules; the stand-in nvidia-smi reports a fake sysfs's GPUs."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from lab import fakesys, guest_payload
from lab.standins import nvidia_smi, sglang_serve
from pvegpu.models.sglang import SglangSpec
from pvegpu.plan.sglang import check_argv, plan_sglang_argv

DEFAULT_ARGV = list(plan_sglang_argv(SglangSpec(), 8))
CASES = {
    "default": DEFAULT_ARGV,
    "unknown": [*DEFAULT_ARGV, "--enable-ep-moe"],
    "abbreviated": [*DEFAULT_ARGV, "--tp", "8"],
    "ambiguous": [*DEFAULT_ARGV, "--cuda-graph-max-bs", "8"],
    "deprecated": [*DEFAULT_ARGV, "--disable-cuda-graph"],
    "twice": [*DEFAULT_ARGV, "--port", "1"],
    "bad choice": [*DEFAULT_ARGV, "--kv-cache-dtype", "nvfp8"],
    "bad int": [*DEFAULT_ARGV, "--nnodes", "two"],
    "missing value": [*DEFAULT_ARGV, "--watchdog-timeout"],
    "missing required": ["--tp-size", "8"],
    "stray value": ["--model-path", "/m", "x"],
    "bad json": [*DEFAULT_ARGV, "--preferred-sampling-params", "{temperature: 0}"],
    "bad json list": [*DEFAULT_ARGV, "--forward-hooks", "[NaN]"],
}


@pytest.fixture(autouse=True)
def option_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in reads the table beside it in its wheel; here, pvegpu's copy of the same files."""
    data = Path(__file__).resolve().parents[3] / "pvegpu/data/sglang"
    monkeypatch.setattr(sglang_serve, "OPTIONS", data / "sglang_0.5.23_options.json")
    monkeypatch.setattr(sglang_serve, "DEPRECATED", data / "sglang_0.5.23_deprecated.json")
    monkeypatch.setattr(sglang_serve, "VALUES", data / "sglang_0.5.23_values.json")


@pytest.mark.parametrize("argv", CASES.values(), ids=CASES.keys())
def test_standin_refuses_what_pvegpu_refuses(argv: list[str]) -> None:
    problems, _ = sglang_serve.check(argv)
    assert len(problems) == len(check_argv(argv))
    assert bool(problems) == (argv != DEFAULT_ARGV)


def test_standin_exit_2_with_argparse_style_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert sglang_serve.main(["serve", *CASES["unknown"]]) == 2
    assert (
        capsys.readouterr().err
        == "sglang serve: error: --enable-ep-moe is not an option of sglang serve 0.5.23\n"
    )


def test_standin_json_types_refused_with_argparse_texts(capsys: pytest.CaptureFixture[str]) -> None:
    assert sglang_serve.main(["serve", *CASES["bad json"]]) == 2
    assert sglang_serve.main(["serve", *CASES["bad json list"]]) == 2
    assert capsys.readouterr().err == (
        "sglang serve: error: argument --preferred-sampling-params: invalid loads value: '{temperature: 0}'\n"
        "sglang serve: error: argument --forward-hooks: Invalid JSON list: [NaN]. Please provide a valid "
        "JSON list.\n"
    )


def test_standin_refuses_an_unknown_speculative_algorithm_at_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert sglang_serve.main(["serve", *DEFAULT_ARGV, "--speculative-algorithm", "mtp"]) == 1
    assert capsys.readouterr().err == "ValueError: Unknown speculative algorithm name: MTP\n"
    values = {"speculative_algorithm": ["nextn"]}
    assert sglang_serve.speculative_refusal(values) is None


@pytest.fixture
def server() -> Iterator[str]:
    _, values = sglang_serve.check(["--model-path", "/m", "--served-model-name", "glm-5", "--api-key", "k3y"])
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), sglang_serve.make_handler(values, "k3y"))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def get(url: str, key: str | None = None, body: object = None) -> tuple[int, str]:
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode())
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_standin_serves_with_sglangs_key_rules(server: str) -> None:
    assert get(f"{server}/health") == (200, "")
    assert get(f"{server}/v1/models")[0] == 401
    status, body = get(f"{server}/v1/models", "k3y")
    assert (status, json.loads(body)["data"][0]["id"]) == (200, "glm-5")
    status, body = get(
        f"{server}/v1/chat/completions", "k3y", {"messages": [{"role": "user", "content": "hi"}]}
    )
    assert json.loads(body)["choices"][0]["message"]["content"] == "STAND-IN reply to: hi"


def test_nvidia_smi_standin_lists_the_trees_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fakesys.write_tree(tmp_path / "sys", "reference")
    version = tmp_path / "version"
    settings = tmp_path / "nvidia.env"
    settings.write_text(f"SYSFS_ROOT={tmp_path / 'sys'}\nVERSION_FILE={version}\nNVML_DIR={tmp_path}\n")
    monkeypatch.setattr(nvidia_smi, "SETTINGS", settings)

    assert nvidia_smi.main([]) == 9  # no module loaded yet
    assert "couldn't communicate with the NVIDIA driver" in capsys.readouterr().out

    version.write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (x)\n"
    )
    assert nvidia_smi.main(["--query-gpu=index,pci.bus_id,driver_version", "--format=csv,noheader"]) == 0
    rows = capsys.readouterr().out.splitlines()
    buses = sorted(gpu["address"] for gpu in fakesys.manifest("reference")["gpus"])
    assert rows == [f"{i}, 0000{bus.upper()}.0, 580.95.05" for i, bus in enumerate(buses)]
    assert nvidia_smi.main(["--query-gpu=memory.total", "--format=csv"]) == 2
    assert capsys.readouterr().out == 'Field "memory.total" is not a valid field to query.\n\n'

    # Userspace of another build than the loaded module: NVML refuses, as the real tool does.
    (tmp_path / "libnvidia-ml.so.1").write_text("")
    (tmp_path / "libnvidia-ml.so.590.48.01").write_text("")
    assert nvidia_smi.main(["-L"]) == 18
    assert capsys.readouterr().out == (
        "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 590.48.01\n"
    )


def test_standin_ranks_meet_before_they_serve(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 returns from the rendezvous only once ranks 1 and 2 have joined; each follower once rank 0
    took it (it retries while rank 0 is not listening yet)."""
    left: list[int] = []
    monkeypatch.setattr(sglang_serve, "_leave_with_rank_0", lambda _, rank: left.append(rank))  # no os._exit
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    addr = f"127.0.0.1:{port}"
    done: dict[int, float] = {}

    def rank(number: int) -> None:
        sglang_serve.join_nodes(addr, 3, number)
        done[number] = time.monotonic()

    followers = [threading.Thread(target=rank, args=(number,), daemon=True) for number in (1, 2)]
    followers[0].start()
    time.sleep(0.7)  # rank 1 retries against nothing
    leader = threading.Thread(target=rank, args=(0,), daemon=True)
    leader.start()
    leader.join(3)
    assert sorted(done) == [1]  # rank 0 still waits for rank 2
    followers[1].start()
    for thread in (leader, followers[1]):
        thread.join(5)
    assert sorted(done) == [0, 1, 2]
    assert done[0] >= done[1]
    out = capsys.readouterr().out
    assert f"sglang STAND-IN (pvegpu lab): rank 0 waits for 2 ranks at {addr}\n" in out
    assert f"sglang STAND-IN (pvegpu lab): rank 2 joined rank 0 at {addr}\n" in out
    assert sorted(left) == [1, 2]  # each follower watches its connection to rank 0


@pytest.mark.parametrize("metrics", [False, True])
def test_standin_follower_serves_health_only(metrics: bool) -> None:
    """A rank >= 1 answers SGLang 0.5.23's health server routes and nothing of the API."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), sglang_serve.health_handler(metrics))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        answers = {path: get(url + path) for path in ("/health", "/ping", "/health_generate", "/v1/models")}
        metrics_answer = get(url + "/metrics")
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert answers == {
        "/health": (200, ""),
        "/ping": (200, ""),
        "/health_generate": (200, ""),
        "/v1/models": (404, '{"detail":"Not Found"}'),
    }
    assert metrics_answer == (
        (200, "# pvegpu lab STAND-IN\nsglang_stand_in 1\n") if metrics else (404, '{"detail":"Not Found"}')
    )


def test_stand_in_mtp_rules_of_0_5_23(tmp_path: Path) -> None:
    """NEXTN needs PP's opt-in and the checkpoint's one nextn layer in its weight map (SGLang 0.5.23's texts);
    the lab's stand-in checkpoint passes."""
    guest_payload.checkpoint(tmp_path / "glm5")
    nextn = {"speculative_algorithm": ["NEXTN"], "pp_size": ["1"]}
    assert sglang_serve.mtp_refusal(nextn, tmp_path / "glm5", {}) is None
    assert sglang_serve.mtp_refusal({"pp_size": ["2"]}, tmp_path / "glm5", {}) is None  # no MTP asked
    pp2 = {**nextn, "pp_size": ["2"]}
    assert sglang_serve.mtp_refusal(pp2, tmp_path / "glm5", {}) == (
        "AssertionError: PP + speculative decoding (MTP) is only supported on prefill nodes "
        "(disaggregation-mode=prefill)"
    )
    assert sglang_serve.mtp_refusal(pp2, tmp_path / "glm5", {"SGLANG_ENABLE_PP_SPEC": "True"}) is None
    config = json.loads((tmp_path / "glm5/config.json").read_text())
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({k: v for k, v in config.items() if "nextn" not in k}))
    assert (
        sglang_serve.mtp_refusal(nextn, bare, {})
        == "ValueError: num_nextn_predict_layers is not in the config"
    )
    (bare / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 2}))
    assert sglang_serve.mtp_refusal(nextn, bare, {}) == "AssertionError: Only 1 nextn layer is supported"
    (bare / "config.json").write_text(json.dumps(config))
    assert sglang_serve.mtp_refusal(nextn, bare, {}) == (
        "KeyError: model.layers.78 (the MTP draft layer) is not in the checkpoint's weight map (pvegpu lab "
        "STAND-IN)"
    )
