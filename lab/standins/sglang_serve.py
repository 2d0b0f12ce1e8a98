"""STAND-IN `sglang` launcher (pvegpu lab): checks `sglang serve` argv, then serves a tiny OpenAI-style API.

Packaged by `lab.guest_payload` as the `sglang` command of a stand-in `sglang` wheel (version
`<pinned>+pvegpulab`) with the pinned SGLang's option table beside it (`options.json`, `deprecated.json`,
`values.json`: the same data as pvegpu/data/sglang). Runs in the guest's venv, standard library only.

The argv check follows SGLang's argparse parser and pvegpu's stricter rules (`pvegpu.plan.sglang.check_argv`;
tests/unit/lab/test_standins.py holds both to the same verdicts): unknown options, abbreviations, deprecated
options, an option twice, missing or bad values, missing required options exit 2 with
`sglang serve: error: <problem>` lines on stderr, like argparse (a value the option's JSON type refuses
with argparse's own text); an unknown `--speculative-algorithm` exits 1 with SGLang's start-up `ValueError`.
Then it serves on --host/--port:
`GET /health` and `GET /ready` (never need the key), `GET /v1/models`, `POST /v1/chat/completions`
(answers "STAND-IN reply to: <last user message>"), `GET /metrics` with --enable-metrics. `--config FILE`
is merged as SGLang merges it (`merge_config`). With --api-key (or `api-key:` in the config file),
everything else needs `Authorization: Bearer <key>` (401 otherwise), as SGLang does. As SGLang 0.5.23 does,
it logs `server_args={...}` (keys included) at INFO through the logger `sglang.srt.entrypoints.engine`,
with logging set up as `configure_logger` sets it (`SGLANG_LOGGING_CONFIG_PATH`'s dictConfig, else
`--log-level`), and `GET /server_info` answers the values, both keys and `launch_command` (the merged argv)
to whoever passes the `--api-key` check. It serves along SGLang's path, where pvegpu's launcher reaches in:
`main` (`sglang.cli.main:main`) calls `sglang.launch_server.run_server`, found at call time, which calls
`sglang.srt.entrypoints.http_server.launch_server`; `/server_info` answers what that module's
`redact_watermark_secrets` (found at each request) makes of the info, as SGLang's `server_info` does (the
real one blanks watermark keys only; the stand-in has none, so it returns the info as it is).
With `--nnodes` > 1 the ranks first meet at `--dist-init-addr` (`join_nodes`: rank 0 serves only once
every rank has joined); a rank >= 1 then serves only SGLang's health server (`health_handler`), as 0.5.23
does. With NCCL_DEBUG=INFO it logs the NCCL channel lines the real server would, with the transport the flags
imply (SHM with NCCL_P2P_DISABLE=1, P2P/CUMEM otherwise: it has no GPUs whose peer access it could ask),
so pvegpu's doctor has something to read.
"""

from __future__ import annotations

import importlib
import json
import logging
import logging.config
import math
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OPTIONS, DEPRECATED = HERE / "options.json", HERE / "deprecated.json"
VALUES = HERE / "values.json"
_INT = re.compile(r"-?\d+")
_HUMAN_INT = re.compile(r"\d+(\.\d+)?([kKmMgGtT]i?)?")
UNAUTHENTICATED = ("/health", "/ready", "/metrics")
STAND_IN_ACCEPT_LENGTH = 2.5


def load_table() -> tuple[str, list[dict[str, Any]], dict[str, str]]:
    dump = json.loads(OPTIONS.read_text())
    deprecated = json.loads(DEPRECATED.read_text())["deprecated"]
    return dump["sglang_version"], dump["options"], deprecated


def _fits(type_name: str | None, value: str) -> bool:
    if type_name == "int":
        return _INT.fullmatch(value) is not None
    if type_name == "human_readable_int":
        return _INT.fullmatch(value) is not None or _HUMAN_INT.fullmatch(value) is not None
    if type_name == "float":
        try:
            float(value)
        except ValueError:
            return False
    return True


def _unknown(name: str, by_name: dict[str, dict[str, Any]], version: str) -> str:
    canonical = sorted({by_name[n]["option_strings"][0] for n in by_name if n.startswith(name)})
    if len(canonical) > 1:
        return f"{name} is ambiguous: it abbreviates {', '.join(canonical)}"
    if canonical:
        return f"{name} abbreviates {canonical[0]}: use the full option name"
    return f"{name} is not an option of sglang serve {version}"


def _skip(argv: list[str], index: int) -> int:
    while index < len(argv) and not argv[index].startswith("--"):
        index += 1
    return index


def _words(option: dict[str, Any], argv: list[str], index: int, inline: str | None) -> tuple[list[str], int]:
    if inline is not None:
        return [inline], index
    if option["nargs"] in ("+", "*"):
        end = _skip(argv, index)
        return argv[index:end], end
    if index < len(argv) and not argv[index].startswith("--"):
        return [argv[index]], index + 1
    return [], index


def _value_problems(name: str, option: dict[str, Any], words: list[str]) -> list[str]:
    if not words:
        return [] if option["nargs"] in ("?", "*") else [f"{name} expects a value"]
    problems = []
    for word in words:
        if option["choices"] is not None and word not in option["choices"]:
            problems.append(f"{name}: {word!r} is not a choice")
        elif (problem := _json_refusal(option["type"], word)) is not None:
            problems.append(f"argument {name}: {problem}")
        elif not _fits(option["type"], word):
            problems.append(f"{name}: {word!r} is not a valid {option['type']}")
    return problems


def _json_refusal(type_name: str | None, word: str) -> str | None:
    """argparse's text when the option's type refuses `word`: json.loads's ValueError becomes `invalid loads
    value`, SGLang's json_list_type (orjson: no NaN, Infinity or number beyond a double) raises its own."""
    try:
        if type_name == "loads":
            json.loads(word)
        elif type_name == "json_list_type":
            json.loads(word, parse_constant=_refuse, parse_float=_finite)
    except ValueError:
        if type_name == "loads":
            return f"invalid loads value: {word!r}"
        return f"Invalid JSON list: {word}. Please provide a valid JSON list."
    return None


def _refuse(name: str) -> float:
    raise ValueError(name)


def _finite(text: str) -> float:
    if not math.isfinite(number := float(text)):
        raise ValueError(text)
    return number


def speculative_refusal(values: dict[str, list[str]]) -> str | None:
    """SGLang 0.5.23's start-up refusal of an unknown `--speculative-algorithm` (`SpeculativeAlgorithm.
    from_string`, after upper-casing), or None."""
    words = values.get("speculative_algorithm")
    if not words:
        return None
    rules = json.loads(VALUES.read_text())
    if words[0].upper() in (*rules["speculative_algorithms"], *rules["speculative_aliases"]):
        return None
    return f"ValueError: Unknown speculative algorithm name: {words[0].upper()}"


# SGLang 0.5.23's MTP rules at start, with its texts: PP needs SGLANG_ENABLE_PP_SPEC (arg_groups/
# validation_hook.py; EnvBool's true words, srt/environ.py), and the draft is the checkpoint's own nextn layer
# (models/deepseek_common/deepseek_weight_loader.py `_initialize_nextn_conf`).
_TRUE = ("true", "1", "yes", "y")


def mtp_refusal(values: dict[str, list[str]], model_path: Path, env: Mapping[str, str]) -> str | None:
    """Why SGLang 0.5.23 would not start `--speculative-algorithm NEXTN`/`EAGLE` on this checkpoint."""
    words = values.get("speculative_algorithm")
    if not words or words[0].upper() not in ("NEXTN", "EAGLE"):
        return None
    if int(_one(values, "pp_size", "1")) > 1 and env.get("SGLANG_ENABLE_PP_SPEC", "").lower() not in _TRUE:
        return (
            "AssertionError: PP + speculative decoding (MTP) is only supported on prefill nodes "
            "(disaggregation-mode=prefill)"
        )
    return _draft_layer_refusal(model_path)


def _draft_layer_refusal(model_path: Path) -> str | None:
    try:
        config = json.loads((model_path / "config.json").read_text())
    except (OSError, ValueError):
        return f"OSError: no config.json in {model_path} (pvegpu lab STAND-IN)"
    if "num_nextn_predict_layers" not in config:
        return "ValueError: num_nextn_predict_layers is not in the config"
    if config["num_nextn_predict_layers"] != 1:
        return "AssertionError: Only 1 nextn layer is supported"
    layer = config.get("num_hidden_layers")
    try:
        weight_map = json.loads((model_path / "model.safetensors.index.json").read_text())["weight_map"]
    except (OSError, ValueError, KeyError):
        weight_map = {}
    if any(name.startswith(f"model.layers.{layer}.") for name in weight_map):
        return None
    return (
        f"KeyError: model.layers.{layer} (the MTP draft layer) is not in the checkpoint's weight map "
        "(pvegpu lab STAND-IN)"
    )


def start_refusal(values: dict[str, list[str]], env: Mapping[str, str]) -> str | None:
    """What SGLang would print and exit 1 with at start, after its parser accepted the argv."""
    if (refusal := speculative_refusal(values)) is not None:
        return refusal
    model_path = _one(values, "model_path", "")
    if not Path(model_path).is_dir():
        return f"sglang serve: error: model path {model_path} is not a directory"
    return mtp_refusal(values, Path(model_path), env)


def check(argv: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """(problems, values by dest) for the words after `sglang serve`."""
    version, options, deprecated = load_table()
    by_name = {name: option for option in options for name in option["option_strings"]}
    problems: list[str] = []
    values: dict[str, list[str]] = {}
    index = 0
    while index < len(argv):
        token = argv[index]
        index += 1
        if not token.startswith("--"):
            problems.append(f"{token!r} is not an option (a value with no option before it)")
            continue
        name, has_inline, inline = token.partition("=")
        option = by_name.get(name)
        if option is None:
            problems.append(_unknown(name, by_name, version))
            index = _skip(argv, index)
            continue
        dest = option["dest"]
        if any(n in deprecated for n in option["option_strings"]):
            problems.append(f"{name} is deprecated in sglang {version}")
        if dest in values:
            problems.append(f"{name} is given twice")
        if not option["takes_value"]:
            if has_inline:
                problems.append(f"{name} takes no value")
            values[dest] = []
            continue
        words, index = _words(option, argv, index, inline if has_inline else None)
        problems.extend(_value_problems(name, option, words))
        values[dest] = words
    for option in options:
        if option["required"] and option["dest"] not in values:
            problems.append(f"{option['option_strings'][0]} is required")
    return problems, values


def _one(values: dict[str, list[str]], dest: str, default: str) -> str:
    return values[dest][0] if values.get(dest) else default


def log_nccl_channels(values: dict[str, list[str]]) -> None:
    """What NCCL_DEBUG=INFO would print about the transport between the tensor-parallel ranks."""
    if os.environ.get("NCCL_DEBUG") != "INFO":
        return
    ranks = int(_one(values, "tp_size", "1"))
    # NCCL's own switch (src/graph/paths.cc ncclGetLevel reads NCCL_P2P_DISABLE): no GPUs here to ask.
    via = "SHM/direct" if os.environ.get("NCCL_P2P_DISABLE") == "1" else "P2P/CUMEM/read"
    print("NCCL INFO NCCL version 2.30.7+cuda13.0 (pvegpu lab STAND-IN)", flush=True)
    topo_file = os.environ.get("NCCL_TOPO_FILE")
    if topo_file is not None:  # NCCL's ENV lines (src/graph/topo.cc, xml.cc)
        print(f"NCCL INFO NCCL_TOPO_FILE set by environment to {topo_file}", flush=True)
        if not os.path.isfile(topo_file):
            print(
                f"NCCL INFO Could not open XML topology file {topo_file} : No such file or directory",
                flush=True,
            )
    for rank in range(ranks if ranks > 1 else 0):
        peer = (rank + 1) % ranks
        channel = "00" if via.startswith("SHM") else "00/0"
        print(f"NCCL INFO Channel {channel} : {rank}[{rank}] -> {peer}[{peer}] via {via}", flush=True)


def configure_logging(values: dict[str, list[str]]) -> None:
    """SGLang 0.5.23 `utils/common.py configure_logger`: the JSON dictConfig `SGLANG_LOGGING_CONFIG_PATH`
    names, else `basicConfig` at `--log-level` (default `info`) with SGLang's format."""
    path = os.environ.get("SGLANG_LOGGING_CONFIG_PATH")
    if path:
        with open(path, encoding="utf-8") as file:
            logging.config.dictConfig(json.load(file))
        return
    level = getattr(logging, _one(values, "log_level", "info").upper())
    logging.basicConfig(
        level=level, format="[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S", force=True
    )


def server_info(values: dict[str, list[str]], merged: list[str]) -> dict[str, object]:
    """What SGLang 0.5.23 `/server_info` shows of this stand-in's values (`build_server_info`: the resolved
    fields, both keys among them, and `launch_command`, the argv after the `--config` merge)."""
    info: dict[str, object] = {dest: words[0] if len(words) == 1 else words for dest, words in values.items()}
    info["api_key"] = _one(values, "api_key", "") or None
    info["admin_api_key"] = _one(values, "admin_api_key", "") or None
    info["launch_command"] = " ".join(merged)
    info["version"] = "pvegpu lab STAND-IN"
    # SGLang's scheduler states; with speculative decoding its average accept length (what
    # sglang.benchmark.serving records as `accept_length`). The stand-in drafts nothing: a fixed figure.
    speculative = values.get("speculative_algorithm")
    accept = STAND_IN_ACCEPT_LENGTH if speculative and speculative[0].upper() != "NONE" else None
    info["internal_states"] = [{"avg_spec_accept_length": accept}]
    return info


def make_handler(
    values: dict[str, list[str]],
    api_key: str | None,
    info: Callable[[], dict[str, object]] | None = None,
) -> type[BaseHTTPRequestHandler]:
    """The request handler; `info` gives `/server_info`'s answer at each request."""
    served = _one(values, "served_model_name", _one(values, "model_path", "model"))
    model_path = _one(values, "model_path", "")

    class Handler(BaseHTTPRequestHandler):
        server_version = "sglang-STAND-IN"

        def _send(self, status: int, body: object, content_type: str = "application/json") -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _authorized(self) -> bool:
            if api_key is None or self.path.startswith(UNAUTHENTICATED):
                return True
            if self.headers.get("Authorization") == f"Bearer {api_key}":
                return True
            self._send(401, {"error": "Unauthorized (pvegpu lab STAND-IN)"})
            return False

        def do_GET(self) -> None:
            if not self._authorized():
                return
            if self.path in ("/health", "/ready"):
                self._send(200, "", "text/plain")
            elif self.path == "/v1/models":
                model = {"id": served, "object": "model", "owned_by": "sglang STAND-IN", "root": model_path}
                self._send(200, {"object": "list", "data": [model]})
            elif self.path in ("/server_info", "/get_server_info"):
                self._send(200, {} if info is None else info())
            elif self.path == "/metrics" and "enable_metrics" in values:
                self._send(200, "# pvegpu lab STAND-IN\nsglang_stand_in 1\n", "text/plain")
            else:
                self._send(404, {"error": f"{self.path} not found"})

        def do_POST(self) -> None:
            if not self._authorized():
                return
            if self.path != "/v1/chat/completions":
                self._send(404, {"error": f"{self.path} not found"})
                return
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            messages = request.get("messages") or [{}]
            reply = f"STAND-IN reply to: {messages[-1].get('content', '')}"
            words = len(reply.split())
            self._send(
                200,
                {
                    "id": "chatcmpl-standin",
                    "object": "chat.completion",
                    "model": served,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": reply},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": words, "total_tokens": words + 1},
                },
            )

        def log_message(self, format: str, *args: Any) -> None:
            print(f"sglang STAND-IN: {format % args}", flush=True)

    return Handler


def merge_config(argv: list[str]) -> list[str]:
    """SGLang 0.5.23's `--config` merge (`ConfigArgumentMerger`): the word after the one `--config` names a
    `.yaml`/`.yml` file whose root mapping becomes `--key value` words placed before the command line's.
    STAND-IN: reads only the YAML pvegpu writes, `key: "JSON string"` lines; ValueError like SGLang's."""
    at = [index for index, word in enumerate(argv) if word == "--config"]
    if not at:
        return argv
    if len(at) > 1:
        raise ValueError("Multiple config files specified! Only one allowed.")
    if at[0] == len(argv) - 1:
        raise ValueError("No config file specified after --config flag!")
    path = Path(argv[at[0] + 1])
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(f"Config file must be YAML format, got: {path.suffix}")
    if not path.exists():
        raise ValueError(f"Config file not found: {path}")
    words: list[str] = []
    for line in path.read_text().splitlines():
        key, _, value = line.partition(": ")
        words += [f"--{key}", json.loads(value)]
    return words + argv[: at[0]] + argv[at[0] + 2 :]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] != "serve":
        print("usage: sglang serve [options]  (pvegpu lab STAND-IN)", file=sys.stderr)
        return 2
    try:
        merged = merge_config(argv[1:])
    except (ValueError, OSError) as error:
        print(f"sglang serve: error: {error}", file=sys.stderr)
        return 1
    problems, values = check(merged)
    if problems:
        for problem in problems:
            print(f"sglang serve: error: {problem}", file=sys.stderr)
        return 2
    if (refusal := start_refusal(values, os.environ)) is not None:
        print(refusal, file=sys.stderr)
        return 1
    server_args = ServerArgs(
        values, merged, _one(values, "api_key", "") or None, _one(values, "admin_api_key", "") or None
    )
    importlib.import_module("sglang.launch_server").run_server(server_args)
    return 0


@dataclass(frozen=True)
class ServerArgs:
    """What the stand-in's `run_server` gets: the values by dest, the merged argv and both keys, by the
    names SGLang's `ServerArgs` gives them."""

    values: dict[str, list[str]]
    merged: list[str]
    api_key: str | None
    admin_api_key: str | None


def run_server(server_args: ServerArgs) -> None:
    """SGLang 0.5.23 `sglang.launch_server.run_server`, HTTP mode: `http_server.launch_server`."""
    importlib.import_module("sglang.srt.entrypoints.http_server").launch_server(server_args)


def redact_watermark_secrets(value: dict[str, object]) -> dict[str, object]:
    """SGLang's blanking of the watermark keys in `/server_info`; the stand-in has no watermark."""
    return value


def launch_server(server_args: ServerArgs) -> None:
    """SGLang's `http_server.launch_server`: logs `server_args=`, then serves."""
    values = server_args.values
    host, port = _one(values, "host", "127.0.0.1"), int(_one(values, "port", "30000"))
    info = server_info(values, server_args.merged)
    configure_logging(values)
    resolved = {name: value for name, value in info.items() if name not in ("launch_command", "version")}
    logging.getLogger("sglang.srt.entrypoints.engine").info(f"server_args={resolved}")
    nnodes, rank = int(_one(values, "nnodes", "1")), int(_one(values, "node_rank", "0"))
    if nnodes > 1:
        join_nodes(_one(values, "dist_init_addr", ""), nnodes, rank)
    log_nccl_channels(values)
    if rank >= 1:
        print(f"sglang STAND-IN (pvegpu lab): node_rank {rank} health server on {host}:{port}", flush=True)
        _Server((host, port), health_handler("enable_metrics" in values)).serve_forever()
        return
    model_path = _one(values, "model_path", "")
    print(f"sglang STAND-IN (pvegpu lab): serving {model_path} on {host}:{port}", flush=True)
    http_server = importlib.import_module("sglang.srt.entrypoints.http_server")

    def answer() -> dict[str, object]:  # SGLang's `server_info`: `redact_watermark_secrets({...})`
        answered: dict[str, object] = http_server.redact_watermark_secrets(dict(info))
        return answered

    server = _Server((host, port), make_handler(values, server_args.api_key, answer))
    server.serve_forever()


def join_nodes(dist_init_addr: str, nnodes: int, rank: int) -> None:
    """STAND-IN for torch.distributed's rendezvous at `dist_init_addr`: rank 0 listens on its port until
    every other rank has joined (and keeps listening, in a thread, for a rank that restarts); a rank >= 1
    connects, retrying as torch's TCPStore client does, until rank 0 takes it. Only then do the ranks serve,
    as SGLang's schedulers are ready only once the group is whole. Each rank's connection stays open: a rank
    that sees it close lost rank 0 (`_leave_with_rank_0`)."""
    host, _, port = dist_init_addr.rpartition(":")
    address = (host.strip("[]"), int(port))
    if rank == 0:
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        listener = socket.create_server(("", address[1]), family=family)
        joined: set[int] = set()
        members: list[socket.socket] = []
        whole = threading.Event()

        def accept() -> None:
            while True:
                peer, _ = listener.accept()
                peer.settimeout(5)
                word = peer.recv(16).decode(errors="replace").strip()
                if word.isdigit() and 0 < int(word) < nnodes:
                    joined.add(int(word))
                    peer.sendall(b"ok\n")
                    members.append(peer)
                else:
                    peer.close()
                if len(joined) == nnodes - 1:
                    whole.set()

        print(
            f"sglang STAND-IN (pvegpu lab): rank 0 waits for {nnodes - 1} ranks at {dist_init_addr}",
            flush=True,
        )
        threading.Thread(target=accept, daemon=True).start()
        whole.wait()
        return
    while True:
        try:
            connection = socket.create_connection(address, timeout=5)
            connection.sendall(f"{rank}\n".encode())
            if connection.recv(16).strip() == b"ok":
                print(
                    f"sglang STAND-IN (pvegpu lab): rank {rank} joined rank 0 at {dist_init_addr}", flush=True
                )
                threading.Thread(target=_leave_with_rank_0, args=(connection, rank), daemon=True).start()
                return
            connection.close()
        except OSError:
            pass
        time.sleep(0.5)


def _leave_with_rank_0(connection: socket.socket, rank: int) -> None:
    """A rank whose group lost rank 0 fails, as its NCCL communicator would (systemd then restarts it)."""
    connection.settimeout(None)
    try:
        while connection.recv(16):
            pass
    except OSError:
        pass
    print(f"sglang STAND-IN (pvegpu lab): rank {rank} lost rank 0; exiting", flush=True)
    os._exit(1)


def health_handler(enable_metrics: bool) -> type[BaseHTTPRequestHandler]:
    """SGLang 0.5.23's `launch_dummy_health_check_server` of a rank >= 1: `/ping`, `/health`,
    `/health_generate` answer 200 with no body, `/metrics` with --enable-metrics; nothing else (404)."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "sglang-STAND-IN"

        def do_GET(self) -> None:
            if self.path in ("/ping", "/health", "/health_generate"):
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = b"# pvegpu lab STAND-IN\nsglang_stand_in 1\n"
            status = 200 if self.path == "/metrics" and enable_metrics else 404
            if status == 404:
                body = b'{"detail":"Not Found"}'
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            print(f"sglang STAND-IN: {format % args}", flush=True)

    return Handler


class _Server(ThreadingHTTPServer):
    # The benchmark opens `--max-concurrency` connections at once (32 by default): the default listen
    # backlog of 5 resets the rest, where SGLang's uvicorn accepts them.
    request_queue_size = 128


if __name__ == "__main__":
    sys.exit(main())
