"""A fault-injecting HTTP reverse proxy for the S3 API (in front of the moto server of tests/_s3.py).

No well-kept library fits (toxiproxy needs its Go server; none of the environment's packages injects S3 error
responses), so this is a small threaded proxy: it reads each request (Content-Length or chunked body), applies the
first matching :class:`Fault`, and otherwise forwards it to the upstream server and relays the response. Faults:

- ``500`` / ``503``: an S3 XML error ``InternalError`` / ``ServiceUnavailable`` with that status;
- ``slowdown``: 503 ``SlowDown`` (S3 throttling);
- ``reset``: the connection is reset (RST) without a response;
- ``latency``: the request is forwarded after ``seconds``;
- ``down``: the server stops: this request and every later one is reset until :meth:`FaultProxy.up`.

Every request is logged as (method, path, outcome) in :attr:`FaultProxy.log`, so tests count the retries seen.

    with FaultProxy(moto_endpoint) as proxy:
        proxy.add(Fault("503", method="PUT", path="shard=", times=2))
        store = Store("s3://bucket/runs", {"endpoint_url": proxy.url})
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

ERRORS = {
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "ServiceUnavailable", "Service is unable to handle request."),
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
}


@dataclass
class Fault:
    """One fault rule: applies to requests whose method and path match, ``times`` times (None: always)."""

    kind: str
    method: str | None = None
    path: str | None = None
    query: str | None = None
    times: int | None = 1
    seconds: float = 0.0

    def matches(self, method: str, path: str) -> bool:
        bare, _, query = unquote(path).partition("?")
        return (
            (self.times is None or self.times > 0)
            and (self.method is None or self.method == method)
            and (self.path is None or self.path in bare)
            and (self.query is None or self.query in query)
        )


class FaultProxy:
    """The proxy on a free 127.0.0.1 port; :attr:`url` is its endpoint URL."""

    def __init__(self, upstream: str):
        parsed = urlparse(upstream)
        self.upstream = (parsed.hostname, parsed.port)
        self.faults: list[Fault] = []
        self.log: list[tuple[str, str, str]] = []
        self.is_down = False
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = bytearray()
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return bytes(out)
                        out += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _reset(self) -> None:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
                self.close_connection = True

            def _handle(self) -> None:
                body = self._body()
                fault = proxy._take(self.command, self.path)
                outcome = fault.kind if fault else "forwarded"
                proxy._record(self.command, self.path, outcome)
                if fault is not None and fault.kind in ("reset", "down"):
                    return self._reset()
                if fault is not None and fault.kind in ERRORS:
                    status, code, message = ERRORS[fault.kind]
                    xml = (
                        f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}'
                        f"</Message><RequestId>fault</RequestId></Error>"
                    ).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(xml)))
                    self.end_headers()
                    self.wfile.write(xml)
                    return None
                if fault is not None and fault.kind == "latency":
                    time.sleep(fault.seconds)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "transfer-encoding"}
                headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=120)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    response = conn.getresponse()
                    data = response.read()
                finally:
                    conn.close()
                self.send_response(response.status, response.reason)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "content-length", "connection", "server", "date"):
                        self.send_header(key, value)
                length = response.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))  # HEAD: the object's size
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                return None

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address) -> None:  # a client that gave up (timeout): quiet
                pass

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _take(self, method: str, path: str) -> Fault | None:
        with self._lock:
            if self.is_down:
                return Fault("down", times=None)
            for fault in self.faults:
                if fault.matches(method, path):
                    if fault.times is not None:
                        fault.times -= 1
                    if fault.kind == "down":
                        self.is_down = True
                    return fault
        return None

    def _record(self, method: str, path: str, outcome: str) -> None:
        with self._lock:
            self.log.append((method, path, outcome))

    def add(self, *faults: Fault) -> FaultProxy:
        with self._lock:
            self.faults.extend(faults)
        return self

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()
            self.log.clear()

    def up(self) -> None:
        """The server is back: no more faults."""
        with self._lock:
            self.is_down = False
            self.faults.clear()

    def count(self, method: str, path: str, outcome: str | None = None) -> int:
        """Requests seen with ``method`` whose path contains ``path`` (and with that outcome)."""
        with self._lock:
            return sum(
                1 for m, p, o in self.log if m == method and path in unquote(p) and (outcome is None or o == outcome)
            )

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
