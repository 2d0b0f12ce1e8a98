"""OpenSSH public key lines, checked as OpenSSH reads them: `<type> <base64 blob> [comment]`.

The blob must be valid base64 and start with its own type name (an SSH string: 4-byte big-endian length,
then the name), which must be the line's type: a key pasted with its type changed, cut short or with an
`authorized_keys` option in front is refused. DSA keys are refused (OpenSSH 9.8 dropped them). Pure.
"""

from __future__ import annotations

import base64
import binascii
import re

from pvegpu.models.fields import shown

KEY_TYPES = (
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
)
_LINE = re.compile(r"(?P<type>\S+) (?P<blob>[A-Za-z0-9+/]+={0,2})(?: (?P<comment>[^\r\n]*))?")
_LENGTH_BYTES = 4


def check_public_key(line: str) -> str:
    """`line` if it is one OpenSSH public key line (module docstring); ValueError saying what is wrong."""
    match = _LINE.fullmatch(line)
    if match is None:
        raise ValueError(
            f"{shown(line)} is not an OpenSSH public key line (`<type> <base64> [comment]` on one line, e.g. "
            "`ssh-ed25519 AAAAC3Nz... you@desk`)"
        )
    key_type = match["type"]
    if key_type not in KEY_TYPES:
        raise ValueError(f"key type {key_type!r} is not one of {', '.join(KEY_TYPES)}")
    try:
        blob = base64.b64decode(match["blob"], validate=True)
    except binascii.Error:
        raise ValueError(f"the {key_type} key's base64 does not decode (cut short or mistyped?)") from None
    length = int.from_bytes(blob[:_LENGTH_BYTES], "big")
    if len(blob) <= _LENGTH_BYTES + length:
        raise ValueError(f"the {key_type} key's data is cut short")
    embedded = blob[_LENGTH_BYTES : _LENGTH_BYTES + length].decode(errors="replace")
    if embedded != key_type:
        raise ValueError(f"the key's data is a {embedded!r} key, not {key_type}")
    return line
