"""The stand-in's errors, as Proxmox raises them (PVE::Exception): a plain `die`, a 400 parameter exception,
Getopt's refusals."""

from __future__ import annotations


class DieError(Exception):
    """A plain Perl `die "text\\n"`: printed as is, HTTP 500 over the API."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class ParamError(Exception):
    """A 400 parameter exception: one message per parameter."""

    def __init__(self, errors: dict[str, str]) -> None:
        super().__init__(errors)
        self.errors = errors


class OptionError(Exception):
    """Getopt refused an option (unknown, repeated, missing value): `Unknown option: <name>` etc."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(lines)
        self.lines = lines
