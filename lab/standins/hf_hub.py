"""pvegpu lab STAND-IN for the Hugging Face Hub's file API: what huggingface_hub 1.33 asks of it when pvegpu
fetches a model (pvegpu/fetch/main.py), served from a directory, stdlib only (it runs in a lab host with the
host's python3).

    python3 hf_hub.py --root DIR --port PORT [--token-file F] [--rate BYTES_PER_S] [--log F]

DIR holds `<org>/<name>/refs.json` ({"main": "<commit>"}) and `<org>/<name>/<commit>/<files>`. Routes, as
the hub answers them (huggingface_hub hf_api.py `model_info`, `list_repo_tree`; file_download.py
`get_hf_file_metadata`, `http_get`):

- `GET /api/models/<repo>/revision/<rev>`: `{"id", "sha", "siblings"}`;
- `GET /api/models/<repo>/tree/<rev>?recursive=...`: `[{"type": "file", "oid", "size", "path", "lfs"?}]`,
  `*.safetensors` as LFS files (`lfs.oid` the sha256, `oid` the git blob id of the pointer file);
- `HEAD|GET /<repo>/resolve/<rev>/<path>`: `X-Repo-Commit`, `ETag` (LFS: also `X-Linked-Etag` = sha256 and
  `X-Linked-Size`), `Content-Length`, `Accept-Ranges`; `Range: bytes=N-` answered 206 with `Content-Range`.
  LFS bodies go at `--rate` bytes a second (so a test can cut a download mid-file).

With `--token-file`, every request must carry `Authorization: Bearer <token>` (a gated repository): 401
otherwise. Each request is logged as a JSON line (method, path, range, status) to `--log`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

_LFS = (".safetensors", ".bin")
_RANGE = re.compile(r"bytes=(\d+)-$")


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def tree(files: Path) -> list[dict[str, Any]]:
    """The hub's recursive tree listing of one commit's directory."""
    entries = []
    for path in sorted(p for p in files.rglob("*") if p.is_file()):
        data = path.read_bytes()
        entry: dict[str, Any] = {
            "type": "file",
            "path": path.relative_to(files).as_posix(),
            "size": len(data),
        }
        if path.name.endswith(_LFS):
            sha256 = hashlib.sha256(data).hexdigest()
            pointer = lfs_pointer(sha256, len(data))
            entry["oid"] = git_blob_id(pointer)
            entry["lfs"] = {"oid": sha256, "size": len(data), "pointerSize": len(pointer)}
        else:
            entry["oid"] = git_blob_id(data)
        entries.append(entry)
    return entries


class Hub(BaseHTTPRequestHandler):
    root: Path
    token: str | None
    rate: int
    log_path: Path | None

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _log(self, status: int) -> None:
        if self.log_path is not None:
            line = {
                "method": self.command,
                "path": self.path,
                "range": self.headers.get("Range"),
                "status": status,
            }
            with self.log_path.open("a") as log:
                log.write(json.dumps(line) + "\n")

    def _answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self._log(status)
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, value: object, headers: dict[str, str] | None = None) -> None:
        self._answer(
            status, json.dumps(value).encode(), {"Content-Type": "application/json", **(headers or {})}
        )

    def _commit(self, repo: str, revision: str) -> str | None:
        refs = self.root / repo / "refs.json"
        if not refs.is_file():
            return None
        commit = json.loads(refs.read_text()).get(revision, revision)
        return commit if (self.root / repo / commit).is_dir() else None

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        if self.token is not None and self.headers.get("Authorization") != f"Bearer {self.token}":
            self._json(
                401, {"error": "Invalid credentials in Authorization header"}, {"X-Error-Code": "GatedRepo"}
            )
            return
        path = unquote(urlsplit(self.path).path)
        api = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if api:
            repo, kind, revision = api.groups()
            commit = self._commit(repo, revision)
            if commit is None:
                self._json(404, {"error": "Revision Not Found"}, {"X-Error-Code": "RevisionNotFound"})
                return
            entries = tree(self.root / repo / commit)
            if kind == "tree":
                self._json(200, entries)
            else:
                siblings = [{"rfilename": entry["path"]} for entry in entries]
                self._json(200, {"id": repo, "sha": commit, "siblings": siblings})
        elif resolve:
            self._file(*resolve.groups())
        else:
            self._json(404, {"error": "Repository Not Found"}, {"X-Error-Code": "RepoNotFound"})

    def _file(self, repo: str, revision: str, name: str) -> None:
        commit = self._commit(repo, revision)
        target = self.root / repo / commit / name if commit else None
        if target is None or not target.is_file():
            self._json(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
            return
        data = target.read_bytes()
        lfs = name.endswith(_LFS)
        sha256 = hashlib.sha256(data).hexdigest()
        etag = sha256 if lfs else git_blob_id(data)
        headers = {"X-Repo-Commit": commit or "", "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
        if lfs:
            headers |= {"X-Linked-Etag": f'"{sha256}"', "X-Linked-Size": str(len(data))}
        start, status = 0, 200
        wanted = _RANGE.fullmatch(self.headers.get("Range") or "")
        if wanted and self.command == "GET":
            start, status = int(wanted.group(1)), 206
            if start >= len(data):
                self._answer(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                return
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        self._log(status)
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "HEAD":
            return
        step = max(1, self.rate // 10) if lfs and self.rate else len(body) or 1
        try:
            for offset in range(0, len(body), step):
                self.wfile.write(body[offset : offset + step])
                self.wfile.flush()
                if lfs and self.rate:
                    time.sleep(step / self.rate)
        except (BrokenPipeError, ConnectionResetError):
            self._log(499)  # the client hung up mid-body (a killed fetch)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--token-file", type=Path)
    parser.add_argument("--rate", type=int, default=0)
    parser.add_argument("--log", type=Path)
    args = parser.parse_args(argv)
    Hub.root = args.root
    Hub.token = args.token_file.read_text().strip() if args.token_file else None
    Hub.rate = args.rate
    Hub.log_path = args.log
    ThreadingHTTPServer((args.address, args.port), Hub).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
