"""Fetch one pinned revision of a Hugging Face repository into a directory and prove it complete.

Run by `pvegpu-model-fetch.service` (`python main.py CONFIG`), with `huggingface_hub` (the version pvegpu
pins) and nothing of pvegpu: this file is uploaded alone. CONFIG is the JSON pvegpu writes: `repo`,
`revision` (null: `main`), `dir`, `endpoint` (null: the hub's default, or `HF_ENDPOINT`), `workers`.
The token, when there is one, is the file `HF_TOKEN_PATH` names (systemd's credential): never an argument.

Why not `snapshot_download`: huggingface_hub 1.33 downloads each file into a process-unique temporary file
that it deletes on failure (file_download.py `_download_to_tmp_and_move`), so a download cut mid-file
starts that file again from byte 0 (a 5 GB shard of GLM-5), and a file in place is trusted by its metadata,
never re-checked. Here each file goes to `<dir>/.pvegpu/partial/<path>.part`, resumed from its size by the
library's own `http_get` (an HTTP Range request), checked, then renamed into place: a file at its path has
been verified.

Complete means: every file the revision's tree lists, at its size, with the LFS sha256 the hub lists (the
git blob id for the small files). Each check is recorded in `<dir>/.pvegpu/model.json` with the file's size
and mtime, so a later run hashes only a file that changed (and fetches it again when it no longer matches).
The revision is resolved once: the record's commit stays until `revision` changes (a branch is not
followed). Free space is checked before the first byte. `<dir>/.pvegpu/status.json` says where it stands
(`state` running|verified|failed, `done`/`total` bytes, `message`), rewritten every second.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_url
from huggingface_hub.file_download import http_get
from huggingface_hub.hf_api import RepoFile
from huggingface_hub.utils._headers import build_hf_headers
from huggingface_hub.utils.sha import git_hash, sha_fileobj

RECORD = ".pvegpu/model.json"
STATUS = ".pvegpu/status.json"
PARTIAL = ".pvegpu/partial"
_COMMIT = 40


class RefusedError(Exception):
    """The fetch cannot start (free space): the message is the operator's line."""


@dataclass(frozen=True)
class Expected:
    """One file of the revision as the hub lists it."""

    path: str
    size: int
    sha256: str | None  # LFS files
    blob_id: str  # git's blob id (sha1), the check of a small file


def size_text(count: float) -> str:
    """Decimal units, three significant digits: 429 GB, 312 GB, 1.05 MB."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if count < 999.5 or unit == "TB":
            break
        count /= 1000
    return f"{count:.0f} {unit}" if count >= 99.5 or unit == "B" else f"{count:.3g} {unit}"


def digest_matches(path: Path, expected: Expected) -> bool:
    """The file's content is the revision's: sha256 for an LFS file, git's blob sha1 for a small one (the
    library's own hashes)."""
    with path.open("rb") as data:
        if expected.sha256 is not None:
            return sha_fileobj(data).hex() == expected.sha256
        return git_hash(data.read()) == expected.blob_id


class Status:
    """`status.json`, written whole and renamed (a reader never sees half of it)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()

    def write(self, **fields: Any) -> None:
        with self.lock:
            temporary = self.path.with_name(self.path.name + ".tmp")
            temporary.write_text(json.dumps({**fields, "time": time.time()}) + "\n")
            temporary.replace(self.path)


class Record:
    """`model.json`: the verified files of one commit, each with the size and mtime it had when checked."""

    def __init__(self, path: Path, config: dict[str, Any]) -> None:
        self.path = path
        self.lock = threading.Lock()
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            saved = {}
        same = saved.get("repo") == config["repo"] and saved.get("revision") == config["revision"]
        self.commit: str | None = saved.get("commit") if same else None
        self.files: dict[str, dict[str, Any]] = saved.get("files", {}) if same else {}
        self.repo, self.revision = config["repo"], config["revision"]

    def trusted(self, target: Path, expected: Expected) -> bool:
        """Checked before and unchanged since (same digest listed, same size and mtime)."""
        entry = self.files.get(expected.path)
        if entry is None or not target.is_file():
            return False
        stat = target.stat()
        return entry == _entry(expected, stat.st_size, stat.st_mtime_ns)

    def verified(self, target: Path, expected: Expected) -> None:
        stat = target.stat()
        with self.lock:
            self.files[expected.path] = _entry(expected, stat.st_size, stat.st_mtime_ns)
            self.save()

    def forget(self, path: str) -> None:
        with self.lock:
            self.files.pop(path, None)

    def save(self, complete: bool = False) -> None:
        saved = {
            "repo": self.repo,
            "revision": self.revision,
            "commit": self.commit,
            "complete": complete,
            "files": self.files,
        }
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(json.dumps(saved, indent=1, sort_keys=True) + "\n")
        temporary.replace(self.path)


def _entry(expected: Expected, size: int, mtime_ns: int) -> dict[str, Any]:
    return {"size": size, "mtime_ns": mtime_ns, "sha256": expected.sha256, "blob_id": expected.blob_id}


def listing(api: HfApi, repo: str, commit: str) -> list[Expected]:
    """Every file of the commit's tree, as the hub lists it."""
    return [
        Expected(entry.path, entry.size, entry.lfs.sha256 if entry.lfs else None, entry.blob_id)
        for entry in api.list_repo_tree(repo, recursive=True, revision=commit)
        if isinstance(entry, RepoFile)
    ]


class Fetch:
    """One run: check what is there, refuse without the space, fetch the rest, record it."""

    def __init__(self, config: dict[str, Any], status: Status) -> None:
        self.config = config
        self.store = Path(config["dir"])
        self.partial = self.store / PARTIAL
        self.status = status
        self.api = HfApi(endpoint=config["endpoint"])
        self.record = Record(self.store / RECORD, config)
        self.total = 0
        self.done = 0  # bytes of files in place and verified
        self.active: set[Path] = set()
        self.lock = threading.Lock()

    def run(self) -> None:
        self.status.write(state="running", phase="listing", done=0, total=0)
        revision = self.config["revision"] or "main"
        commit = self.record.commit
        if commit is None:
            resolved = revision if len(revision) == _COMMIT and _hex(revision) else None
            commit = resolved or self.api.repo_info(self.config["repo"], revision=revision).sha
            if commit is None:
                raise RuntimeError(f"the hub gave no commit for revision {revision}")
            self.record.commit = commit
        files = listing(self.api, self.config["repo"], commit)
        self.total = sum(expected.size for expected in files)
        todo = self._check(files)
        self._refuse_without_space(todo)
        stop = threading.Event()
        reporter = threading.Thread(target=self._report, args=(stop,), daemon=True)
        reporter.start()
        try:
            with ThreadPoolExecutor(max(1, int(self.config["workers"]))) as pool:
                for _ in pool.map(lambda expected: self._fetch(commit, expected), todo):
                    pass
        finally:
            stop.set()
            reporter.join()
        self.record.save(complete=True)
        shutil.rmtree(self.partial, ignore_errors=True)
        message = f"{self.config['repo']}@{commit}: {len(files)} files, {size_text(self.total)}, verified"
        self.status.write(state="verified", done=self.total, total=self.total, message=message)

    def _check(self, files: list[Expected]) -> list[Expected]:
        """The files to fetch: absent, of another size, or whose digest no longer matches (removed here)."""
        self.status.write(state="running", phase="checking", done=0, total=self.total)
        todo = []
        for expected in files:
            target = self.store / expected.path
            if self.record.trusted(target, expected) or (
                target.is_file()
                and target.stat().st_size == expected.size
                and digest_matches(target, expected)
            ):
                self.record.verified(target, expected)
                self.done += expected.size
                self.status.write(state="running", phase="checking", done=self.done, total=self.total)
                continue
            if target.exists():
                print(f"{expected.path}: not the revision's content, fetched again", flush=True)
                target.unlink()
            self.record.forget(expected.path)
            todo.append(expected)
        return todo

    def _refuse_without_space(self, todo: list[Expected]) -> None:
        needed = sum(max(0, expected.size - _size(self._part(expected))) for expected in todo)
        self.store.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.store).free
        if needed > free:
            raise RefusedError(f"model: needs {size_text(needed)} on {self.store}, {size_text(free)} free")

    def _part(self, expected: Expected) -> Path:
        return self.partial / f"{expected.path}.part"

    def _fetch(self, commit: str, expected: Expected) -> None:
        target, part = self.store / expected.path, self._part(expected)
        part.parent.mkdir(parents=True, exist_ok=True)
        url = hf_hub_url(
            self.config["repo"], expected.path, revision=commit, endpoint=self.config["endpoint"]
        )
        location = get_hf_file_metadata(url, endpoint=self.config["endpoint"]).location
        with self.lock:
            self.active.add(part)
        try:
            with part.open("r+b" if part.exists() else "wb") as data:
                data.seek(0, os.SEEK_END)
                if data.tell() > expected.size:
                    data.seek(0)
                    data.truncate()
                if data.tell() < expected.size or expected.size == 0:
                    http_get(
                        location,
                        data,
                        resume_size=data.tell(),
                        headers=build_hf_headers(),
                        expected_size=expected.size,
                        displayed_filename=expected.path,
                    )
        finally:
            with self.lock:
                self.active.discard(part)
        if part.stat().st_size != expected.size or not digest_matches(part, expected):
            part.unlink()
            raise RuntimeError(f"{expected.path}: the download does not match the hub's size and digest")
        target.parent.mkdir(parents=True, exist_ok=True)
        part.replace(target)
        self.record.verified(target, expected)
        with self.lock:
            self.done += expected.size

    def _report(self, stop: threading.Event) -> None:
        while not stop.wait(1.0):
            with self.lock:
                done = self.done + sum(_size(part) for part in self.active)
            self.status.write(state="running", phase="downloading", done=done, total=self.total)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _hex(text: str) -> bool:
    return all(char in "0123456789abcdef" for char in text)


def main(argv: list[str], out: Callable[[str], None] = print) -> int:
    """`main.py CONFIG`: 0 verified, 2 refused (free space), 1 any other failure (the status says it)."""
    config = json.loads(Path(argv[1]).read_text())
    store = Path(config["dir"])
    (store / ".pvegpu").mkdir(parents=True, exist_ok=True)
    status = Status(store / STATUS)
    try:
        Fetch(config, status).run()
    except RefusedError as refused:
        status.write(state="failed", message=str(refused), done=0, total=0)
        out(str(refused))
        return 2
    except Exception as error:  # the operator's line; the journal keeps the traceback
        message = f"{type(error).__name__}: {error}"
        status.write(state="failed", message=message, done=0, total=0)
        raise
    out(json.loads((store / STATUS).read_text())["message"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
