"""`parse_nccl_conf` (pvegpu/facts/nccl_conf.py) reads a conf file as NCCL's `setEnvFile` does."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pvegpu.facts.nccl_conf import parse_nccl_conf
from pvegpu.models.nccl import ConfSetting


def test_lines_as_nccl_reads_them() -> None:
    text = (
        "# NCCL_P2P_LEVEL=SYS\nNCCL_DEBUG=INFO\n\nNCCL_ALGO\n NCCL_PROTO = LL\r\nNCCL_X=a=b\nNCCL_DEBUG=WARN"
    )
    assert parse_nccl_conf(text) == (
        ConfSetting(2, "NCCL_DEBUG", "INFO"),
        ConfSetting(5, " NCCL_PROTO ", " LL\r"),
        ConfSetting(6, "NCCL_X", "a=b"),
        ConfSetting(7, "NCCL_DEBUG", "WARN"),
    )


def test_name_and_value_are_cut_to_nccls_buffers() -> None:
    (setting,) = parse_nccl_conf(f"{'N' * 1500}={'v' * 1500}\n")
    assert (len(setting.name), len(setting.value)) == (1023, 1023)


names = st.from_regex(r"[A-Z][A-Z0-9_]{0,40}", fullmatch=True)
values = st.text(st.characters(exclude_characters="\n", exclude_categories=["Cs"]), max_size=60)


@given(st.lists(st.tuples(names, values), max_size=8))
def test_every_written_setting_is_read_back_in_order(pairs: list[tuple[str, str]]) -> None:
    text = "".join(f"# comment\n{name}={value}\n" for name, value in pairs)
    expected = tuple(ConfSetting(2 * index + 2, name, value) for index, (name, value) in enumerate(pairs))
    assert parse_nccl_conf(text) == expected
