"""The lab's STAND-IN Hugging Face hub: lab/standins/hf_hub.py serving one gated repository, `REPO`, whose
files are the lab's stand-in checkpoint (lab/guest_payload.py: config.json, the weight index) and its two
weight shards (deterministic bytes, LFS files with their sha256), on the lab side of a host's veth
(10.200.<index>.1:`PORT`, which only that host reaches), so the host fetches over its network as from the
real hub.

A Proxmox lab node's hypervisor (lab/pve/hypervisor.py) `provide`s one to the node itself while it runs (the
model fetched on the node: `node_endpoint`) and one to each VM guest it boots while the guest runs (the
guest reaches it at its own gateway: `endpoint`). `provide` writes the token file (`TOKEN_FILE`, root's, mode
0600) into the host's root and `<host state>/hub.json` (`{"repo", "token_file", "url"}`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

from lab import guest_payload, hosts
from lab.standins import hf_hub

REPO = "festr2/GLM-5-NVFP4-MTP"  # a repository the recipe table knows (MTP on)
PORT = 8091
TOKEN = "hf_pvegpulab_STANDIN_token"
# The index's shards (guest_payload.checkpoint). huggingface_hub's http_get writes 10 MiB at a time
# (constants.DOWNLOAD_CHUNK_SIZE), so a first shard of 24 MB can be cut with partial bytes on disk.
SHARDS = {"model-00001-of-00002.safetensors": 24_000_000, "model-00002-of-00002.safetensors": 300_000}
CHUNK = 10 * 1024 * 1024


def shard_bytes(name: str, size: int) -> bytes:
    """Deterministic bytes of one shard (a sha256 chain from its name)."""
    out, block = bytearray(), hashlib.sha256(name.encode()).digest()
    while len(out) < size:
        block = hashlib.sha256(block).digest()
        out += block * 32
    return bytes(out[:size])


def seed(hub_root: Path) -> tuple[str, dict[str, bytes]]:
    """`REPO` at one commit under `hub_root` (the stand-in's layout): the commit id and the files."""
    files: dict[str, bytes] = {}
    checkpoint = hub_root / ".checkpoint"
    shutil.rmtree(checkpoint, ignore_errors=True)
    guest_payload.checkpoint(checkpoint)
    for path in sorted(checkpoint.iterdir()):
        files[path.name] = path.read_bytes()
    shutil.rmtree(checkpoint)
    files |= {name: shard_bytes(name, size) for name, size in SHARDS.items()}
    commit = hashlib.sha1(b"".join(hashlib.sha256(data).digest() for data in files.values())).hexdigest()
    tree = hub_root / REPO / commit
    tree.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (tree / name).write_bytes(data)
    (hub_root / REPO / "refs.json").write_text(json.dumps({"main": commit}))
    return commit, files


class Hub:
    """A running stand-in hub for one lab host; `log()` reads the requests it answered."""

    def __init__(self, host: hosts.LabHost, hub_root: Path, rate: int = 0) -> None:
        self.commit, self.files = seed(hub_root)
        self.log_path = hub_root / "requests.jsonl"
        handler = type(
            "LabHub",
            (hf_hub.Hub,),
            {"root": hub_root, "token": TOKEN, "rate": rate, "log_path": self.log_path},
        )
        self.server = ThreadingHTTPServer((f"10.200.{host.index}.1", PORT), handler)
        self.server.daemon_threads = True
        self.url = f"http://10.200.{host.index}.1:{PORT}"
        threading.Thread(target=self.server.serve_forever, name="lab-hub", daemon=True).start()

    def set_rate(self, rate: int) -> None:
        self.server.RequestHandlerClass.rate = rate  # type: ignore[attr-defined]

    def log(self) -> list[dict[str, object]]:
        """The requests answered since the last call (the log is then emptied)."""
        if not self.log_path.exists():
            return []
        lines = self.log_path.read_text().splitlines()
        self.log_path.unlink()
        return [json.loads(line) for line in lines]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


TOKEN_FILE = "/root/hf-token"  # on the host, root's 0600 file, as an operator keeps the real token
RECORD = "hub.json"


def provide(host: hosts.LabHost) -> Hub:
    """A hub for `host` (a Proxmox lab node, or a VM guest the lab hypervisor boots): served at its gateway,
    the token file written into it, and `<state>/hub.json` saying where (the lab inventory reads it)."""
    token = host.root / TOKEN_FILE.lstrip("/")
    token.parent.mkdir(parents=True, exist_ok=True)
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    served = Hub(host, host.state_dir / "hub")
    record = {"url": served.url, "token_file": TOKEN_FILE, "repo": REPO}
    (host.state_dir / RECORD).write_text(json.dumps(record, sort_keys=True) + "\n")
    return served


def endpoint(gateway: str) -> str:
    """The hub's address as the host whose gateway is `gateway` reaches it."""
    return f"http://{gateway}:{PORT}"


def node_endpoint(node: hosts.LabHost) -> str:
    """The hub's address as Proxmox lab node `node` reaches the hub its lab hypervisor serves it: the
    node's own gateway."""
    return endpoint(f"10.200.{node.index}.1")
