"""A reverse proxy on 127.0.0.1 in front of the S3 (moto) or GCS (emulator) test server that misbehaves on purpose.

Each request is sorted into a kind by its method and path (list, get, put, delete); a plan of rules, seeded so a run
can be repeated, decides which requests get a fault instead of (or on top of) the server's answer:

    slowdown  503 with the store's own throttling body (S3 <Code>SlowDown</Code>, GCS JSON 503)
    throttle  429
    error     500 (S3 InternalError, GCS JSON 500)
    reset     the request is forwarded, the answer's headers and half its body are sent, then the connection is
              reset (RST): the server did the work, the client saw the connection die
    stall     the answer is held for `stall_s` seconds before it is sent

A rule applies, after letting `skip` matching requests through, to the next `next_n` of them, or to each with
probability `rate`. The proxy counts, per
kind, the requests it saw, forwarded and faulted. Standard library only: it is test infrastructure.
"""
from __future__ import annotations

import http.client
import json
import random
import re
import socket
import struct
import threading
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

KINDS = ("list", "get", "put", "delete")
FAULTS = ("slowdown", "throttle", "error", "reset", "stall")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection", "te", "upgrade"}


@dataclass
class Rule:
    kind: str  # one of KINDS, or "*" for every request
    fault: str  # one of FAULTS
    rate: float = 0.0  # probability per matching request
    next_n: int = 0  # or: the next N matching requests (taken first)
    skip: int = 0  # matching requests let through before the rule starts
    path: str | None = None  # a regex the request's path must match (one document, say)
    stall_s: float = 30.0

    def __post_init__(self):
        assert self.kind in (*KINDS, "*") and self.fault in FAULTS, (self.kind, self.fault)


def request_kind(style: str, method: str, path: str) -> str:
    """list / get / put / delete for an S3 (path-style) or GCS (JSON API) request."""
    if method == "DELETE":
        return "delete"
    if method in ("PUT", "POST", "PATCH"):
        return "put"  # uploads, multipart parts and completion, resumable chunks, compose, copy, rewrite
    route, _, query = path.partition("?")
    if style == "gcs":
        return "get" if "/o/" in route else "list"
    is_object = len([p for p in route.split("/") if p]) >= 2
    return "get" if is_object and "list-type" not in query else "list"


def fault_body(style: str, fault: str) -> tuple[int, str, bytes]:
    status = {"slowdown": 503, "throttle": 429, "error": 500}[fault]
    if style == "s3":
        code = {503: "SlowDown", 429: "TooManyRequests", 500: "InternalError"}[status]
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                f"<Message>injected by fault_proxy</Message><RequestId>fault</RequestId></Error>")
        return status, "application/xml", body.encode()
    reason = {503: "backendError", 429: "rateLimitExceeded", 500: "internalError"}[status]
    body = {"error": {"code": status, "message": "injected by fault_proxy", "errors": [{"reason": reason}]}}
    return status, "application/json", json.dumps(body).encode()


@dataclass
class FaultProxy:
    upstream: str  # http://host:port
    style: str  # "s3" or "gcs": the shape of error bodies and of paths
    rules: list[Rule] = field(default_factory=list)
    seed: int = 0
    seen: Counter = field(default_factory=Counter)  # kind -> requests received
    forwarded: Counter = field(default_factory=Counter)  # kind -> requests passed to the server
    injected: Counter = field(default_factory=Counter)  # (kind, fault) -> faults
    log: list = field(default_factory=list)  # (kind, method, path, fault or None) in arrival order

    def __post_init__(self):
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        u = urlsplit(self.upstream)
        self._up = (u.hostname, u.port)
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_port}"

    def set_rules(self, *rules: Rule) -> None:
        with self._lock:
            self.rules = list(rules)

    def reset_counts(self) -> None:
        with self._lock:
            self.seen.clear(), self.forwarded.clear(), self.injected.clear(), self.log.clear()

    def faults(self) -> int:
        return sum(self.injected.values())

    def close(self) -> None:
        self._stop.set()  # releases stalled answers
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _decide(self, method: str, path: str) -> tuple[str, Rule | None]:
        kind = request_kind(self.style, method, path)
        with self._lock:
            self.seen[kind] += 1
            chosen = None
            for rule in self.rules:
                if rule.kind not in ("*", kind) or (rule.path and not re.search(rule.path, path)):
                    continue
                if rule.skip > 0:
                    rule.skip -= 1
                    continue
                if rule.next_n > 0:
                    rule.next_n -= 1
                    chosen = rule
                    break
                if rule.rate and self._rng.random() < rule.rate:
                    chosen = rule
                    break
            if chosen:
                self.injected[(kind, chosen.fault)] += 1
            if not chosen or chosen.fault in ("reset", "stall"):
                self.forwarded[kind] += 1
            self.log.append((kind, method, path, chosen.fault if chosen else None))
        return kind, chosen


class _Handler(BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"  # keep-alive, as the clients expect

    def log_message(self, *args):
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self.owner._up, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            if body or self.command in ("PUT", "POST", "PATCH"):
                headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP_BY_HOP], data
        finally:
            conn.close()

    def _send(self, status: int, headers: list[tuple[str, str]], data: bytes, cut: bool = False) -> None:
        self.send_response_only(status)
        has_length = False
        for k, v in headers:
            if k.lower() == "content-length":
                if self.command == "HEAD":  # the object's size, with no body
                    has_length = True
                    self.send_header(k, v)
                continue
            self.send_header(k, v)
        if not has_length:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data[: len(data) // 2] if cut else data)
        self.wfile.flush()
        if cut:  # an RST, not a FIN: the client sees "connection reset" mid-body
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True

    def _handle(self):
        body = self._body()
        _, rule = self.owner._decide(self.command, self.path)
        if rule and rule.fault in ("slowdown", "throttle", "error"):
            status, ctype, data = fault_body(self.owner.style, rule.fault)
            self._send(status, [("Content-Type", ctype)], data)
            return
        status, headers, data = self._forward(body)
        if rule and rule.fault == "stall":
            if self.owner._stop.wait(rule.stall_s):
                self.close_connection = True
                return
        try:
            self._send(status, headers, data, cut=bool(rule and rule.fault == "reset"))
        except OSError:  # the client gave up on a stalled answer
            self.close_connection = True

    do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _handle
