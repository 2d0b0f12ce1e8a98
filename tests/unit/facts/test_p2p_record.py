"""The P2P probe's record (pvegpu/models/p2p.py): its text as pvegpu writes it on the guest, and the parser
that reads it back (pvegpu/facts/p2p_record.py), None for anything pvegpu did not write."""

from __future__ import annotations

import json

from pvegpu.facts.p2p_record import parse_record
from pvegpu.models.p2p import Identity, Record

IDENTITY = Identity("580.95.05", "6.12.0-1-amd64", "hostpci0=mapping=gpu0,pcie=1; -set x")
SUMMARY = "all-reduce latency 3.0 us with P2P vs 13.0 us with SHM, bus bandwidth 40.0 GB/s vs 20.0 GB/s"


def test_record_round_trip() -> None:
    record = Record("probe", "p2p", IDENTITY, (), SUMMARY)
    assert parse_record(record.text()) == record
    assert json.loads(record.text())["identity"] == {
        "driver": "580.95.05",
        "kernel": "6.12.0-1-amd64",
        "devices": "hostpci0=mapping=gpu0,pcie=1; -set x",
    }
    failed = Record("probe", "shm", IDENTITY, ("GPU 0 <-> GPU 1: no peer access 0->1",), "")
    assert parse_record(failed.text()) == failed


def test_error_not_a_record_is_none() -> None:
    assert parse_record(None) is None
    assert parse_record("") is None
    assert parse_record('{"mode": "off"}') is None
    assert parse_record("not json") is None
    assert parse_record('["a list"]') is None
    assert parse_record(Record("probe", "p2p", IDENTITY).text().replace('"p2p"', '"nvlink"')) is None
