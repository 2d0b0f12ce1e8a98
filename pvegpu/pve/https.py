"""The `https` backend of `pvegpu.pve`: proxmoxer's requests backend with an API token (`connect_https`).

Kept apart from pvegpu.pve so that a run on the `ssh` or `local` backend never imports requests and urllib3
(~0.06 s of every run's start). TLS is verified against the system CAs by default, or against `ca_file`;
with `fingerprint` (the node's `AA:BB:…` SHA-256, as `pvenode cert info` prints it) the certificate is pinned
instead. There is no option to skip verification.

Proxies: a pinned session connects straight to the node and ignores the environment (`https_proxy`,
`ALL_PROXY`, `no_proxy`, `.netrc`: requests' `trust_env` is off), because requests builds a proxy's connection
pool without the adapter's pin, so a proxied call would be checked by nothing. With the system CAs or
`ca_file` the environment's proxy is used (a CONNECT tunnel) and the certificate is still verified end to end
through it; with the system CAs, requests' `REQUESTS_CA_BUNDLE` / `CURL_CA_BUNDLE` replace the system store.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from proxmoxer import ProxmoxAPI, ResourceException
from requests.adapters import HTTPAdapter
from requests.exceptions import RequestException
from urllib3.exceptions import ProtocolError

from pvegpu.pve.client import PveClient
from pvegpu.pve.errors import PveConnectionError, PveConnectionLostError, PveError, Unparsed
from pvegpu.pve.transport import Method, Params, Value, param_text, resent_if_read


class _PinnedAdapter(HTTPAdapter):
    """Accept exactly the certificate whose SHA-256 fingerprint is given (urllib3 checks it on connect)."""

    def __init__(self, fingerprint: str) -> None:
        self.fingerprint = fingerprint
        super().__init__()

    def init_poolmanager(self, connections: int, maxsize: int, block: bool = False, **kwargs: Any) -> None:
        kwargs["assert_fingerprint"] = self.fingerprint
        super().init_poolmanager(connections, maxsize, block, **kwargs)


@dataclass
class HttpsTransport:
    """Calls through proxmoxer's https backend (`api`), errors rewritten as PveError; Proxmox sees every
    call sent by the API token `token_id`."""

    api: Any = field(repr=False)
    token_id: str = ""

    def acts_as(self, method: Method, path: str, params: Params) -> str:  # noqa: ARG002  (one identity)
        return self.token_id

    def __call__(self, method: Method, path: str, params: Params) -> object:
        values = {key: _form(value) for key, value in params.items() if value is not None}
        call = getattr(self.api(path.lstrip("/")), method.lower())  # get/post/put/delete

        def send() -> object:
            try:
                return call(**values)
            except ResourceException as error:
                errors = error.errors if isinstance(error.errors, dict) else None
                raise PveError(int(error.status_code), str(error.content), errors) from None
            except RequestException as error:
                where = self.api._store["base_url"]
                # urllib3 reopens a kept-alive connection the server closed (a restart, a reboot) before
                # it sends; a connection reset or closed under a sent request is "aborted" (ProtocolError).
                if isinstance(error.args[0] if error.args else None, ProtocolError):
                    lost = f"{where}: connection lost after the call was sent: {error}"
                    raise PveConnectionLostError(lost) from None
                raise PveConnectionError(f"{where}: {error}") from None

        data = resent_if_read(method, send)
        # proxmoxer's JSON serializer answers a body that is not JSON with {"errors": <the body>}.
        if isinstance(data, dict) and set(data) == {"errors"} and isinstance(data["errors"], bytes | str):
            raw = data["errors"]
            return Unparsed(raw.decode(errors="replace") if isinstance(raw, bytes) else raw)
        return data


def _form(value: Value) -> str | list[str]:
    if isinstance(value, str | int | bool):
        return param_text(value)
    return [str(item) for item in value]  # requests sends a list as the key repeated: map=a&map=b


_FINGERPRINT = re.compile(r"[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){31}")


def connect_https(
    host: str,
    token_id: str,
    token_secret: str,
    *,
    port: int = 8006,
    ca_file: str | None = None,
    fingerprint: str | None = None,
    timeout: float = 30,
) -> PveClient:
    """A client for `https://host:port/api2/json` with the API token `token_id` (`user@realm!name`).

    TLS: verified against the system CAs, or `ca_file`; or, with `fingerprint` (SHA-256, `AA:BB:…`),
    only that certificate is accepted, over a direct connection (no proxy from the environment). Raises
    ValueError for a malformed token id or fingerprint.
    """
    user, sep, token_name = token_id.partition("!")
    if not sep or "@" not in user or not token_name:
        raise ValueError(f"API token id {token_id!r} is not user@realm!name")
    if fingerprint is not None and not _FINGERPRINT.fullmatch(fingerprint):
        raise ValueError(
            f"fingerprint {fingerprint!r} is not a SHA-256 fingerprint (32 colon-separated hex pairs)"
        )
    verify: bool | str = False if fingerprint is not None else (ca_file or True)
    api = ProxmoxAPI(  # type: ignore[no-untyped-call]
        host,
        backend="https",
        user=user,
        token_name=token_name,
        token_value=token_secret,
        port=port,
        verify_ssl=verify,
        timeout=timeout,
    )
    if fingerprint is not None:
        # CA checks are replaced by the pin, never dropped: urllib3 refuses any other certificate. requests
        # would send a proxied call through a pool built without the pin: pinned calls never take a proxy.
        session = api._store["session"]
        session.trust_env = False
        session.proxies.clear()
        session.mount("https://", _PinnedAdapter(fingerprint))
    return PveClient(HttpsTransport(api, token_id))
