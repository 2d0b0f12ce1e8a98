"""SGLang's keys: the host-side file rules (observed with `stat`/`grep -c`, never read), and the script that
turns systemd credentials into SGLang's `--config` YAML."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from lab import guest_payload
from lab.standins.sglang_serve import merge_config
from pvegpu.facts.secret_files import SecretFiles, parse_secret_files
from pvegpu.models.secret_file import SecretFile, SecretFileKind, secret_file_problems
from pvegpu.models.sglang import SglangSpec
from pvegpu.operations.render import render
from pvegpu.plan.sglang_service import key_file_problems, key_files

KEY = "k3y-Not/Printed+="
F = SecretFileKind.FILE


def observe(tmp_path: Path, files: dict[str, bytes | None], mode: int = 0o600) -> dict[str, SecretFile]:
    """The SecretFiles fact's real command run here on `files` (None: absent), parsed."""
    paths = []
    for name, content in files.items():
        path = tmp_path / name
        if content is not None:
            path.write_bytes(content)
            path.chmod(mode)
        paths.append(str(path))
    result = subprocess.run(
        ["sh", "-c", SecretFiles().command(paths)], capture_output=True, text=True, check=True
    )
    assert KEY not in result.stdout + result.stderr
    return parse_secret_files(result.stdout.splitlines())


def test_fact_reads_shape_not_content(tmp_path: Path) -> None:
    uid = os.getuid()
    files = observe(tmp_path, {"good": f"{KEY}\n".encode(), "gone": None, "it's two": b"a\nb"})
    assert files == {
        f"{tmp_path}/good": SecretFile(f"{tmp_path}/good", F, uid, 0o600, len(KEY) + 1, 1, 0, 0, 0),
        f"{tmp_path}/gone": SecretFile(f"{tmp_path}/gone", SecretFileKind.MISSING),
        f"{tmp_path}/it's two": SecretFile(f"{tmp_path}/it's two", F, uid, 0o600, 3, 2, 0, 0, 0),
    }
    (tmp_path / "link").symlink_to(tmp_path / "good")
    assert observe(tmp_path, {"link": None})[f"{tmp_path}/link"].kind is SecretFileKind.SYMLINK
    assert observe(tmp_path, {"": None})[str(tmp_path)].kind is SecretFileKind.SPECIAL


def test_fact_parse_error_names_the_line() -> None:
    with pytest.raises(ValueError, match=r"secret file state: unexpected line 'file 0 600\\t/k'"):
        parse_secret_files(["file 0 600\t/k"])


def file(**fields: int) -> SecretFile:
    values = {
        "uid": 0,
        "mode": 0o600,
        "size": 5,
        "lines": 1,
        "empty_lines": 0,
        "odd_lines": 0,
        "dash_lines": 0,
    }
    return SecretFile("/k", F, **{**values, **fields})


@pytest.mark.parametrize(
    ("observed", "problems"),
    [
        (file(), []),
        (file(mode=0o400), []),
        (SecretFile("/k", SecretFileKind.MISSING), ["f: /k does not exist on the host"]),
        (SecretFile("/k", SecretFileKind.SYMLINK), ["f: /k is a symbolic link; it must be a regular file"]),
        (SecretFile("/k", SecretFileKind.SPECIAL), ["f: /k is not a regular file"]),
        (file(uid=1000), ["f: /k is owned by uid 1000; it must be owned by root (chown root:root)"]),
        (file(mode=0o644),
         ["f: /k has mode 644: group or others may read it; it must be 0600 or stricter (chmod 600)"]),
        (file(size=0, lines=0),
         ["f: /k is empty: it must hold the secret (an empty API key lets every client in)"]),
        (file(size=1, empty_lines=1),
         ["f: /k is empty: it must hold the secret (an empty API key lets every client in)"]),
        (file(lines=2), ["f: /k holds 2 lines; it must hold one line: the secret"]),
        (file(odd_lines=1),
         ["f: /k holds characters other than visible ASCII (a space, tab, carriage return, control or "
          "non-ASCII character)"]),
        (file(dash_lines=1), ["f: /k starts with '-', which SGLang's option parser would read as an option"]),
        (file(uid=33, mode=0o664, size=0, lines=0),
         ["f: /k is owned by uid 33; it must be owned by root (chown root:root)",
          "f: /k has mode 664: group or others may read it; it must be 0600 or stricter (chmod 600)",
          "f: /k is empty: it must hold the secret (an empty API key lets every client in)"]),
    ],
)  # fmt: skip
def test_error_secret_file_rules(observed: SecretFile, problems: list[str]) -> None:
    assert list(secret_file_problems("f", observed, for_sglang=True)) == problems


def test_dash_only_matters_to_sglang_and_every_key_file_is_checked() -> None:
    assert secret_file_problems("f", file(dash_lines=1), for_sglang=False) == ()
    spec = SglangSpec(
        api_key_file="/a", admin_api_key_file="/b", model_repo="o/m", hf_token_file="/c", host="0.0.0.0"
    )
    observed = {"/a": file(), "/b": SecretFile("/b", SecretFileKind.MISSING), "/c": file(mode=0o640)}
    observed["/c"] = SecretFile("/c", F, 0, 0o640, 5, 1, 0, 0, 1)
    assert key_file_problems(spec, observed, fetches=True) == (
        "sglang.admin_api_key_file: /b does not exist on the host",
        "sglang.hf_token_file: /c has mode 640: group or others may read it; it must be 0600 or stricter "
        "(chmod 600)",
    )
    # The hub's token is the fetching host's alone: not asked of a host that reads its node's store.
    assert key_file_problems(spec, observed, fetches=False) == (
        "sglang.admin_api_key_file: /b does not exist on the host",
    )


def test_the_hub_token_is_read_where_the_model_may_be_fetched() -> None:
    spec = SglangSpec(model_repo="o/m", hf_token_file="/c")
    assert [path for _, path, _ in key_files(spec)] == ["/c"]
    assert [path for _, path, _ in key_files(spec.model_copy(update={"model_share": "virtiofs"}))] == ["/c"]
    assert key_files(spec.model_copy(update={"model_share": "bind"})) == ()
    assert key_files(spec.model_copy(update={"model_share": "local"})) == ()


def test_config_script_writes_the_yaml_sglang_reads(tmp_path: Path) -> None:
    """The rendered script, run as systemd runs it: the keys come back through SGLang's `--config` merge
    (the lab stand-in's copy of it) as `--api-key KEY`, and the file is 0600."""
    credentials, runtime = tmp_path / "credentials", tmp_path / "run"
    credentials.mkdir()
    runtime.mkdir()
    (credentials / "api-key").write_text(KEY + "\n")
    (credentials / "admin-api-key").write_text('adm"in\\')
    config = runtime / "secrets.yaml"
    script = render("sglang/sglang-secrets.py.j2", user="sglang", config=str(config),
                    options=["api-key", "admin-api-key"])  # fmt: skip
    assert KEY not in script
    subprocess.run(
        ["python3", "-c", script], env={**os.environ, "CREDENTIALS_DIRECTORY": str(credentials)}, check=True
    )
    assert config.read_text() == f'api-key: {json.dumps(KEY)}\nadmin-api-key: "adm\\"in\\\\"\n'
    assert config.stat().st_mode & 0o777 == 0o600
    assert merge_config(["--model-path", "/m", "--config", str(config), "--port", "1"]) == [
        "--api-key", KEY, "--admin-api-key", 'adm"in\\', "--model-path", "/m", "--port", "1",
    ]  # fmt: skip


LOGS = """
import logging, sys
from lab.standins.sglang_serve import configure_logging
configure_logging({})
logging.getLogger("sglang.srt.entrypoints.engine").info("server_args={'api_key': '%s'}" % sys.argv[1])
logging.getLogger("sglang.srt.entrypoints.engine").warning("engine warning")
logging.getLogger("sglang.srt.managers.scheduler").info("Load weight end")
"""


def _startup_log(env: dict[str, str]) -> list[str]:
    """What a start-up writes to stderr (the journal) with logging set up as SGLang's `configure_logger`."""
    result = subprocess.run(
        ["python3", "-c", LOGS, KEY],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    return [line.partition("] ")[2] for line in result.stderr.splitlines()]


def test_without_the_logging_config_sglang_logs_the_keys_at_start() -> None:
    assert _startup_log({}) == [f"server_args={{'api_key': '{KEY}'}}", "engine warning", "Load weight end"]


def test_config_script_writes_the_logging_config_that_hides_server_args(tmp_path: Path) -> None:
    credentials, runtime = tmp_path / "credentials", tmp_path / "run"
    credentials.mkdir()
    runtime.mkdir(mode=0o700)
    (credentials / "api-key").write_text(KEY + "\n")
    config = runtime / "secrets.yaml"
    script = render("sglang/sglang-secrets.py.j2", user="sglang", config=str(config), options=["api-key"])
    subprocess.run(
        ["python3", "-c", script], env={**os.environ, "CREDENTIALS_DIRECTORY": str(credentials)}, check=True
    )
    logging_config = runtime / "logging.json"
    assert sorted(p.name for p in runtime.iterdir()) == ["logging.json", "secrets.yaml"]
    assert json.loads(logging_config.read_text())["loggers"] == {
        "sglang.srt.entrypoints.engine": {"level": "WARNING"}
    }
    assert _startup_log({"SGLANG_LOGGING_CONFIG_PATH": str(logging_config)}) == [
        "engine warning",
        "Load weight end",
    ]


ADMIN_KEY = "adm1n-Not/Printed"
INFO = """
import json, sys, time, urllib.request
url, key = sys.argv[1], sys.argv[2]
for _ in range(100):
    try:
        request = urllib.request.Request(url + "/server_info", headers={"Authorization": "Bearer " + key})
        print(urllib.request.urlopen(request, timeout=5).read().decode())
        break
    except OSError:
        time.sleep(0.1)
"""


def _server_info(tmp_path: Path, via_script: bool) -> dict[str, object]:
    """`/server_info` of the lab's stand-in SGLang (its wheel's modules, laid out as SGLang's) started with
    both keys in the `--config` file, by pvegpu's script (`python SCRIPT serve ...`) or by `sglang serve`."""
    with zipfile.ZipFile(guest_payload.wheel(tmp_path)) as wheel:
        wheel.extractall(tmp_path / "site")
    (tmp_path / "model").mkdir()
    config = tmp_path / "secrets.yaml"
    config.write_text(f"api-key: {json.dumps(KEY)}\nadmin-api-key: {json.dumps(ADMIN_KEY)}\n")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = ["serve", "--model-path", str(tmp_path / "model"), "--port", str(port), "--config", str(config)]
    script = tmp_path / "sglang-secrets.py"
    script.write_text(render("sglang/sglang-secrets.py.j2", user="sglang", config=str(config), options=[]))
    command = [str(script)] if via_script else ["-m", "sglang.cli.main"]
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    with subprocess.Popen([sys.executable, *command, *argv], env=env, stderr=subprocess.DEVNULL) as server:
        try:
            answer = subprocess.run(
                [sys.executable, "-c", INFO, f"http://127.0.0.1:{port}", KEY],
                capture_output=True, text=True, check=True, timeout=30,
            )  # fmt: skip
        finally:
            server.kill()
    info: dict[str, object] = json.loads(answer.stdout)
    return info


def test_without_the_script_server_info_shows_both_keys_to_the_api_key(tmp_path: Path) -> None:
    info = _server_info(tmp_path, via_script=False)
    assert (info["api_key"], info["admin_api_key"]) == (KEY, ADMIN_KEY)
    assert f"--api-key {KEY} --admin-api-key {ADMIN_KEY}" in str(info["launch_command"])


def test_serving_through_the_script_blanks_the_keys_in_server_info(tmp_path: Path) -> None:
    info = _server_info(tmp_path, via_script=True)
    assert (info["api_key"], info["admin_api_key"]) == ("<redacted>", "<redacted>")
    words = str(info["launch_command"]).split()
    assert words[:5] == ["--api-key", "<redacted>", "--admin-api-key", "<redacted>", "--model-path"]
    assert KEY not in json.dumps(info)
    assert ADMIN_KEY not in json.dumps(info)


def test_script_does_not_start_an_sglang_it_cannot_keep_from_showing_the_keys(tmp_path: Path) -> None:
    with zipfile.ZipFile(guest_payload.wheel(tmp_path)) as wheel:
        wheel.extractall(tmp_path / "site")
    (tmp_path / "site/sglang/srt/entrypoints/http_server.py").write_text(
        "from sglang.cli.main import launch_server\n"
    )
    (tmp_path / "model").mkdir()
    script = tmp_path / "sglang-secrets.py"
    script.write_text(render("sglang/sglang-secrets.py.j2", user="sglang", config="/c.yaml", options=[]))
    done = subprocess.run(
        [sys.executable, str(script), "serve", "--model-path", str(tmp_path / "model"), "--api-key", KEY],
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site")}, capture_output=True, text=True, timeout=30,
        check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        "pvegpu: sglang.srt.entrypoints.http_server has no redact_watermark_secrets (another SGLang "
        "version?): /server_info would show the API keys; not started\n"
    )
