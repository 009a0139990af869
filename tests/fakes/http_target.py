#!/usr/bin/env python3
"""A small threaded HTTP server on 127.0.0.1 for fetch_url tests (stdlib only).

It counts every request per path (``server.counts``, ``server.requests``,
``server.total``; thread-safe) so tests can prove that a refused fetch made no
request at all.

In-process use::

    from tests.fakes.http_target import HttpTarget

    with HttpTarget() as server:
        server.route("/hello", body=b"hi", content_type="text/plain")
        server.redirect("/away", "http://localhost:%d/hello" % server.port)
        fetch(server.url + "/hello")
        assert server.counts["/hello"] == 1

Built-in routes (no set-up needed):

* ``/text``                      200 ``hello from http_target``
* ``/echo``                      200, JSON of the request's method, path and headers
* ``/binary``                    200 ``application/octet-stream`` with NUL bytes
* ``/status/N``                  status N with a short text body
* ``/redirect/N``                302 to ``/redirect/N-1``; ``/redirect/0`` answers 200
* ``/redirect-to?url=U[&status=S]``  redirect (302 or S) to the absolute URL U
* ``/big/N[?chunked=1][&gzip=1]``   N bytes generated on the fly in 64 KiB blocks
  (``gzip=1``: a gzip stream of N zero bytes, chunked); never held in memory
* ``/slow?chunks=N&delay=S``     N small chunks, S seconds apart
* ``/stall?seconds=S``           headers at once, then S seconds of silence

Standalone, for crash tests in other processes::

    python -m tests.fakes.http_target --port 0 --ready-file ready.txt --count-file counts.txt

The ready file receives the base URL (``http://127.0.0.1:PORT``) once listening;
the count file gets one line ``METHOD PATH`` per request (appended and flushed
as each request arrives).  SIGTERM / SIGINT stop it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

BLOCK = 64 * 1024


@dataclass
class Route:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class SeenRequest:
    method: str
    path: str  # without the query string
    target: str  # as sent (with the query string)
    headers: dict[str, str]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    target: HttpTarget


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib name
        pass

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        self.server.target._record(self)
        try:
            self.server.target._dispatch(self)
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError):
            self.close_connection = True

    do_HEAD = do_GET  # noqa: N815
    do_POST = do_GET  # noqa: N815

    # -- helpers used by routes -------------------------------------------------------

    def send_simple(
        self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8", **hdrs: str
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        for k, v in hdrs.items():
            self.send_header(k.replace("_", "-"), v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.close_connection = True

    def send_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")

    def end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")


class HttpTarget:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, count_file: str | None = None):
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.requests: list[SeenRequest] = []
        self.routes: dict[str, Route] = {}
        self.count_file = count_file
        self._server = _Server((host, port), _Handler)
        self._server.target = self
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url_for(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self.counts.values())

    def start(self) -> HttpTarget:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> HttpTarget:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- configuration ----------------------------------------------------------------

    def route(
        self,
        path: str,
        *,
        body: bytes | str = b"",
        status: int = 200,
        content_type: str = "text/plain; charset=utf-8",
        headers: dict[str, str] | None = None,
    ) -> None:
        data = body.encode() if isinstance(body, str) else body
        hdrs = {"Content-Type": content_type, **(headers or {})}
        with self._lock:
            self.routes[path] = Route(status=status, body=data, headers=hdrs)

    def redirect(self, path: str, location: str, status: int = 302) -> None:
        self.route(path, status=status, body=b"", headers={"Location": location})

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()
            self.requests.clear()

    # -- internals --------------------------------------------------------------------

    def _record(self, handler: _Handler) -> None:
        path = urlsplit(handler.path).path
        seen = SeenRequest(
            method=handler.command,
            path=path,
            target=handler.path,
            headers={k.lower(): v for k, v in handler.headers.items()},
        )
        with self._lock:
            self.counts[path] += 1
            self.requests.append(seen)
            if self.count_file:
                with open(self.count_file, "a", encoding="utf-8") as fh:
                    fh.write(f"{handler.command} {handler.path}\n")
                    fh.flush()

    def _dispatch(self, h: _Handler) -> None:
        parts = urlsplit(h.path)
        path = parts.path
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        with self._lock:
            route = self.routes.get(path)
        if route is not None:
            h.send_response(route.status)
            for k, v in route.headers.items():
                h.send_header(k, v)
            h.send_header("Content-Length", str(len(route.body)))
            h.send_header("Connection", "close")
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(route.body)
            h.close_connection = True
            return
        if path == "/text":
            h.send_simple(200, b"hello from http_target")
        elif path == "/echo":
            body = json.dumps(
                {
                    "method": h.command,
                    "path": h.path,
                    "headers": {k.lower(): v for k, v in h.headers.items()},
                }
            ).encode()
            h.send_simple(200, body, "application/json")
        elif path == "/binary":
            h.send_simple(200, bytes(range(256)) * 4, "application/octet-stream")
        elif path.startswith("/status/"):
            code = int(path.rsplit("/", 1)[1])
            h.send_simple(code, f"status {code}".encode())
        elif path.startswith("/redirect/"):
            n = int(path.rsplit("/", 1)[1])
            if n <= 0:
                h.send_simple(200, b"redirects done")
            else:
                h.send_simple(302, b"", Location=f"/redirect/{n - 1}")
        elif path == "/redirect-to":
            status = int(query.get("status", "302"))
            h.send_simple(status, b"", Location=query.get("url", "/text"))
        elif path.startswith("/big/"):
            self._big(h, int(path.rsplit("/", 1)[1]), query)
        elif path == "/slow":
            self._slow(h, int(query.get("chunks", "10")), float(query.get("delay", "0.2")))
        elif path == "/stall":
            h.send_response(200)
            h.send_header("Content-Type", "text/plain")
            h.send_header("Content-Length", "100")
            h.send_header("Connection", "close")
            h.end_headers()
            h.wfile.flush()
            time.sleep(float(query.get("seconds", "5")))
            h.close_connection = True
        else:
            h.send_simple(404, b"not found")

    @staticmethod
    def _big(h: _Handler, size: int, query: dict[str, str]) -> None:
        chunked = query.get("chunked") == "1" or query.get("gzip") == "1"
        h.send_response(200)
        h.send_header("Content-Type", query.get("type", "text/plain"))
        if query.get("gzip") == "1":
            h.send_header("Content-Encoding", "gzip")
        if chunked:
            h.send_header("Transfer-Encoding", "chunked")
        else:
            h.send_header("Content-Length", str(size))
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        if query.get("gzip") == "1":
            zeros = bytes(BLOCK)
            comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
            left = size
            while left > 0:
                piece = comp.compress(zeros[: min(BLOCK, left)])
                left -= min(BLOCK, left)
                if piece:
                    h.send_chunk(piece)
            h.send_chunk(comp.flush())
            h.end_chunks()
            return
        block = b"x" * BLOCK
        left = size
        while left > 0:
            piece = block[: min(BLOCK, left)]
            left -= len(piece)
            if chunked:
                h.send_chunk(piece)
            else:
                h.wfile.write(piece)
        if chunked:
            h.end_chunks()

    @staticmethod
    def _slow(h: _Handler, chunks: int, delay: float) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Transfer-Encoding", "chunked")
        h.send_header("Connection", "close")
        h.end_headers()
        h.close_connection = True
        for i in range(chunks):
            h.send_chunk(f"tick {i}\n".encode())
            h.wfile.flush()
            time.sleep(delay)
        h.end_chunks()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file", help="receives the base URL once listening")
    parser.add_argument("--count-file", help="one line 'METHOD PATH' appended per request")
    opts = parser.parse_args(argv)

    server = HttpTarget(opts.host, opts.port, count_file=opts.count_file)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server.start()
    url = f"http://{opts.host}:{server.port}"
    if opts.ready_file:
        ready = Path(opts.ready_file)
        tmp = ready.with_name(ready.name + ".tmp")
        tmp.write_text(url + "\n", encoding="utf-8")
        os.replace(tmp, ready)
    else:
        print(url, flush=True)
    try:
        while not stop.wait(0.2):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
