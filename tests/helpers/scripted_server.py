"""A KServe-v2-shaped HTTP server whose every answer the test decides: for the load generator's tests.

``ScriptedServer(delay_s=0.02, fail_every=0)`` answers ``POST /predict`` and ``POST /v2/models/<m>/infer`` after
``delay_s``; every ``fail_every``-th request (1-based) gets a 503 with a JSON body instead; while ``gate`` is
cleared every request waits until the test sets it (a stall the test makes, not one it hopes for);
``GET /v2/models/<m>/stats`` counts what it answered in Triton's format. ``requests`` lists each request's
(path, headers, body length). ``answer(method, path, body) -> (status, JSON document) or None``: what the test
answers instead (None: the script above). ``server_timing``: a ``Server-Timing`` value sent with every 200.
``stats_lag_s``: the statistics count a success only that long after it was answered
(as Triton records an ensemble's success after its response has left). ``certs`` (helpers.certs): it serves HTTPS
with that certificate (``url`` is then ``https://127.0.0.1:<port>``).
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional

Answer = Callable[[str, str, bytes], Optional[tuple[int, object]]]


class ScriptedServer:
    def __init__(
        self,
        delay_s: float = 0.0,
        fail_every: int = 0,
        answer: Answer | None = None,
        server_timing: str | None = None,
        stats_lag_s: float = 0.0,
        certs: object = None,
    ) -> None:
        self.delay_s, self.fail_every, self.answer = delay_s, fail_every, answer
        self.server_timing, self.stats_lag_s = server_timing, stats_lag_s
        self.answered_at: list[float] = []
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()
        self.requests: list[tuple[str, dict, int]] = []
        self.ok = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _send(self, status: int, doc: object) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if status == 200 and server.server_timing:
                    self.send_header("Server-Timing", server.server_timing)
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(length)
                decided = server.answer("POST", self.path, body) if server.answer else None
                if decided is not None:
                    self._send(*decided)
                    return
                with server.lock:
                    server.requests.append((self.path, dict(self.headers), length))
                    n = len(server.requests)
                server.gate.wait()
                time.sleep(server.delay_s)
                if server.fail_every and n % server.fail_every == 0:
                    self._send(503, {"error": f"request {n} refused by the script"})
                    return
                with server.lock:
                    server.ok += 1
                    server.answered_at.append(time.monotonic())
                self._send(200, {"outputs": []})

            def do_GET(self) -> None:  # noqa: N802
                decided = server.answer("GET", self.path, b"") if server.answer else None
                if decided is not None:
                    self._send(*decided)
                    return
                if not self.path.endswith("/stats"):
                    self._send(404, {"error": "no such route"})
                    return
                with server.lock:
                    recorded = time.monotonic() - server.stats_lag_s
                    ok = sum(1 for t in server.answered_at if t <= recorded)
                stats = {
                    "success": {"count": ok, "ns": ok * 1_000_000},
                    "queue": {"count": ok, "ns": ok * 2_000_000},
                    "compute_infer": {"count": ok, "ns": ok * 5_000_000},
                }
                entry = {"name": "m", "inference_count": ok, "execution_count": ok // 2, "inference_stats": stats}
                self._send(200, {"model_stats": [entry]})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        scheme = "http"
        if certs is not None:  # the handshake is made on accept; a client that refuses the certificate is dropped
            tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            tls.load_cert_chain(certs.cert, certs.key)
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.gate.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "ScriptedServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
