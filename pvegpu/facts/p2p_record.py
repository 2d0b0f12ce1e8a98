"""The P2P probe's record (`pvegpu.models.p2p.Record`) from its file's text. Pure; never raises."""

from __future__ import annotations

import json

from pvegpu.models.p2p import Identity, Record


def parse_record(text: str | None) -> Record | None:
    """The record from its file's text; None when absent or not a record pvegpu wrote."""
    if not text:
        return None
    try:
        data = json.loads(text)
        identity = Identity(**{key: str(data["identity"][key]) for key in ("driver", "kernel", "devices")})
        mode, verdict = data["mode"], data["verdict"]
        if mode not in ("probe", "on") or verdict not in ("p2p", "shm"):
            return None
        return Record(mode, verdict, identity, tuple(map(str, data["failures"])), str(data["summary"]))
    except (ValueError, KeyError, TypeError):
        return None
