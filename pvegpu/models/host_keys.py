"""SSH host key checking as a host's inventory data sets it: a warning for each host that turns it off.

pyinfra's `ssh_strict_host_key_checking` is `yes` (a key not in `ssh_known_hosts_file` is refused: what
pvegpu's shipped inventories set), `accept-new` (pyinfra's default when unset, trust on first use: the first
key a host shows is recorded, an impostor's included), or `no`/`off` (any key is accepted). Warned, not
refused: an operator may have reasons, but should see which hosts run without the check. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

SETTING = "ssh_strict_host_key_checking"
_WHY = {
    "no": "pyinfra connects to whatever key the host shows, an impostor's included",
    "off": "pyinfra connects to whatever key the host shows, an impostor's included",
    "accept-new": "pyinfra trusts and records whatever key the host shows first (trust on first use)",
}


def host_key_warnings(hosts: Sequence[str | tuple[str, object]]) -> list[str]:
    """One `warning: <host>: ssh_strict_host_key_checking ...` line per host whose data turns host key
    checking off (`no`, `off`, `accept-new`), in input order; bare names and other data are left alone."""
    warnings = []
    for entry in hosts:
        if isinstance(entry, str) or not isinstance(entry[1], Mapping):
            continue
        name, value = entry[0], entry[1].get(SETTING)
        if isinstance(value, str) and value in _WHY:
            warnings.append(
                f"warning: {name}: {SETTING} is {value!r}: {_WHY[value]}; set it to 'yes' and record the "
                "host's key in its ssh_known_hosts_file (README, Security)"
            )
    return warnings
