#!/usr/bin/python3
"""pveproxy: the pvegpu lab's STAND-IN for Proxmox VE's HTTPS API server. This is NOT Proxmox.

Runs inside a lab Proxmox node (Debian's python3, stdlib only; lab/pve/api_setup.py installs and starts
it) and serves `https://<node>:8006/api2/json/...` with the node's certificate (/etc/pve/local/pve-ssl.pem
and .key), the routes, parameters and handlers of the pvesh stand-in (the package pvelib: `api.call_api`),
as the caller the `Authorization: PVEAPIToken=<user>@<realm>!<name>=<secret>` header names (pve-http-server
AnyEvent.pm and Formatter.pm extract_auth_value, pve-manager HTTPServer.pm auth_handler,
pve-access-control AccessControl.pm verify_token):

- success: 200 `{"data": <result>}` (null for calls without a result); a task's UPID once its worker has
  run (the task status is then `stopped` with its exit status), the UPID's user being the token id;
- no ticket and no token: `401 No ticket`; a token that does not verify (unknown user or token, disabled,
  expired, wrong secret): `401 Authentication failed!`, both after 3 s, as pveproxy delays them; the reason
  verify_token gave (e.g. `invalid token value!`) goes to this server's log, as pveproxy's `authentication
  failure: ...`;
- a permission check: `403 Permission check failed (<path>, <priv>)`; parameters: `400 Parameter
  verification failed.` with `{"data": null, "errors": {<param>: <message>}}`; a handler's die: 500 with its
  first line as the reason (the JSON formatter's `message` holds the whole text); a path without a handler:
  `501 Method '<METHOD> <path>' not implemented`; outside /api2/json: `501 no such uri`;
- a parameter the endpoint does not define: 400, `property is not defined in schema and the schema does not
  allow additional properties`.

One process per connection (forked, as pveproxy's workers serve requests), and one request per
connection (`Connection: close`), so that a task's UPID names a process that has ended once its call
answered. Not modelled: tickets, CSRF tokens, cookies, compression, the other formatters (extjs, html),
proxying to other nodes, spice/vnc/websockets, the 3 s delay's exact timer (from the request's start).
"""

from __future__ import annotations

import http.server
import json
import os
import re
import socketserver
import ssl
import sys
import time
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING or __package__:
    from lab.pve import access
    from lab.pve.pvelib.api import call_api, find_route
    from lab.pve.pvelib.errors import DieError, ParamError
    from lab.pve.pvelib.rest import CMDS, Endpoint, schema_of
    from lab.pve.pvelib.settings import load_settings
else:  # a script (the node's /usr/lib/pvegpu-lab/): its siblings and the package pvelib
    import access
    from pvelib.api import call_api, find_route
    from pvelib.errors import DieError, ParamError
    from pvelib.rest import CMDS, Endpoint, schema_of
    from pvelib.settings import load_settings

PORT = 8006
BASE = "/api2/json"
CERT = "/etc/pve/local/pve-ssl.pem"
KEY = "/etc/pve/local/pve-ssl.key"
UNAUTHORIZED_DELAY_S = 3.0
METHOD_CMDS = {method: cmd for cmd, method in CMDS.items()}
UNDEFINED = "property is not defined in schema and the schema does not allow additional properties"


def extract_auth_value(header: str | None, key: str) -> str | None:
    """Formatter.pm extract_auth_value: `<key>=<value>` (or `<key> <value>`) up to a `;`, URI-unescaped."""
    if not header:
        return None
    match = re.search(rf"(?:^|\s){re.escape(key)}(?:=| )([^;]*)", header)
    return urllib.parse.unquote(match.group(1)) if match and match.group(1) else None


def request_params(endpoint: Endpoint, pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """Form or query pairs as the handlers take them: arrays as lists (the key repeated), a `*-list`
    joined with `,`, other repeats the first value. ParamError for a key the endpoint does not define."""
    raw: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for key, value in pairs:
        schema = schema_of(endpoint, key)
        if schema is None:
            errors.setdefault(key, UNDEFINED)
        elif schema.type == "array":
            raw.setdefault(key, []).append(value)
        elif key in raw and schema.list_format:
            raw[key] = f"{raw[key]},{value}"
        else:
            raw.setdefault(key, value)
    if errors:
        raise ParamError(errors)
    return raw


class ApiHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "pve-api-daemon/3.0"  # what pveproxy's Server header says
    timeout = 60

    def do_GET(self) -> None:
        self._api("GET")

    def do_POST(self) -> None:
        self._api("POST")

    def do_PUT(self) -> None:
        self._api("PUT")

    def do_DELETE(self) -> None:
        self._api("DELETE")

    def _api(self, method: str) -> None:
        url = urllib.parse.urlsplit(self.path)
        if not (url.path == BASE or url.path.startswith(f"{BASE}/")):
            self._send(501, "no such uri", None)
            return
        rel = url.path[len(BASE) :] or "/"
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        user = self._authenticate()
        if user is None:
            return
        cmd = METHOD_CMDS[method]
        found = find_route(cmd, rel)
        if found is None:
            self._send(501, f"Method '{method} {rel}' not implemented", None)
            return
        pairs = urllib.parse.parse_qsl(url.query, keep_blank_values=True)
        if method in ("POST", "PUT"):
            pairs += urllib.parse.parse_qsl(body, keep_blank_values=True)
        settings = load_settings()
        try:
            raw = request_params(found[0], pairs)
            result = call_api(settings, access.RpcEnv.load(settings.root, user), cmd, rel, raw)
        except access.PermissionDenied as error:
            self._fail(403, error.text)
        except ParamError as error:
            message = "Parameter verification failed."
            self._send(400, message, {"data": None, "errors": error.errors, "message": f"{message}\n"})
        except DieError as error:
            self._fail(500, error.text)
        else:
            self._send(200, "OK", {"data": None if found[0].returns_null else result})

    def _authenticate(self) -> str | None:
        """The caller's token id, or None after answering 401 (HTTPServer.pm auth_handler)."""
        api_token = extract_auth_value(self.headers.get("Authorization"), "PVEAPIToken")
        if api_token is None:
            reason = "No ticket"
        else:
            try:
                return access.verify_token(load_settings().root, api_token)
            except access.AuthenticationError as error:
                self.log_message("authentication failure: %s", error.text.rstrip("\n"))
                reason = "Authentication failed!"
        time.sleep(UNAUTHORIZED_DELAY_S)
        self._send(401, reason, None)
        return None

    def _fail(self, code: int, text: str) -> None:
        self._send(code, text.split("\n", 1)[0], {"data": None, "message": text})

    def _send(self, code: int, reason: str, payload: dict[str, Any] | None) -> None:
        data = b"" if payload is None else json.dumps(payload, sort_keys=True).encode()
        self.send_response(code, reason)
        if payload is not None:
            self.send_header("Content-Type", "application/json;charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True


class ApiServer(socketserver.ForkingMixIn, http.server.HTTPServer):
    allow_reuse_address = True


def serve(settings_root: Path, port: int = PORT) -> None:
    """Serve until killed, on every address of the node, with the node's certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(settings_root / CERT.lstrip("/"), settings_root / KEY.lstrip("/"))
    server = ApiServer(("0.0.0.0", port), ApiHandler)  # the node's API, on all its addresses
    # The TLS handshake happens in the forked child, on its first read: a slow client holds no one up.
    server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    sys.stderr.write(f"pveproxy (lab stand-in) listening on :{port}, pid {os.getpid()}\n")
    sys.stderr.flush()
    server.serve_forever()


def main(argv: list[str]) -> int:
    port = int(argv[0]) if argv else PORT
    serve(load_settings().root, port)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
