"""A running load whose every answer is counted: ``CountedLoad(url, model, images)`` starts client threads (HTTP
``POST /predict``, KServe v2 over HTTP, and over gRPC when a gRPC address is given; ``triton=True``: KServe v2
over HTTP with binary tensors instead, what a Triton reads), each sending the images in
turn, one per request, over its own keep-alive connection, until ``stop()``. Every answer is kept as an
``Answer``: the protocol, the status (200 / gRPC OK, or what failed), the top-1 label, the model version that
answered (the v2 protocols say it), when it was sent and when it came back (time.time(), as a rollout's window: a
request sent before a switch may come back after it, answered by the version before). ``wait_for(n)``
waits for n more answers (a count, never a clock: the deadline only guards against a hang)."""

from __future__ import annotations

import base64
import threading
import time
from dataclasses import dataclass
from typing import Optional

import httpx

HANG_GUARD_S = 120.0


@dataclass(frozen=True)
class Answer:
    protocol: str
    image: int
    status: str
    label: Optional[str]
    version: Optional[str]
    at: float
    text: str = ""
    sent: float = 0.0  # time.time() just before the request went out


class CountedLoad:
    def __init__(
        self,
        url: str,
        model: str,
        images: list[bytes],
        grpc: Optional[str] = None,
        clients: int = 2,
        token: Optional[str] = None,
        pause_s: float = 0.01,
        triton: bool = False,
    ) -> None:
        self.pause_s = pause_s
        self.url, self.model, self.images, self.grpc = url, model, images, grpc
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # triton: KServe v2 over HTTP with tritonclient's binary tensors (Triton reads a JSON BYTES element as the
        # string itself, not base64 as vitdeploy serve does) and no /predict
        kinds = [self._v2_http_binary] if triton else [self._predict, self._v2_http]
        kinds = kinds * clients + ([self._v2_grpc] if grpc else [])
        self._threads = [threading.Thread(target=k, args=(i,), daemon=True) for i, k in enumerate(kinds)]
        for t in self._threads:
            t.start()

    def _add(self, answer: Answer) -> None:
        with self._lock:
            self.answers.append(answer)

    def _next(self, k: int):
        i = k
        while not self._stop.is_set():
            yield i % len(self.images)
            i += 1
            time.sleep(self.pause_s)  # a steady load, not a flood: the suite shares the cores

    def _predict(self, k: int) -> None:
        with httpx.Client(timeout=120) as client:
            for i in self._next(k):
                sent = time.time()
                try:
                    r = client.post(
                        f"{self.url}/predict",
                        content=self.images[i],
                        headers={**self.headers, "content-type": "image/png"},
                    )
                except httpx.HTTPError as exc:
                    self._add(Answer("predict", i, "connection error", None, None, time.time(), repr(exc), sent))
                    continue
                label = r.json()[0]["label"] if r.status_code == 200 else None
                self._add(Answer("predict", i, str(r.status_code), label, None, time.time(), r.text[:300], sent))

    def _v2_http(self, k: int) -> None:
        with httpx.Client(timeout=120) as client:
            for i in self._next(k):
                sent = time.time()
                doc = {
                    "inputs": [
                        {"name": "IMAGES", "datatype": "BYTES", "shape": [1, 1], "data": [_b64(self.images[i])]}
                    ],
                    "outputs": [{"name": "TOPK_LABELS"}],
                }
                try:
                    r = client.post(f"{self.url}/v2/models/{self.model}/infer", json=doc, headers=self.headers)
                except httpx.HTTPError as exc:
                    self._add(Answer("v2-http", i, "connection error", None, None, time.time(), repr(exc), sent))
                    continue
                if r.status_code != 200:
                    self._add(Answer("v2-http", i, str(r.status_code), None, None, time.time(), r.text[:300], sent))
                    continue
                body = r.json()
                label = body["outputs"][0]["data"][0]
                self._add(Answer("v2-http", i, "200", label, body["model_version"], time.time(), "", sent))

    def _v2_http_binary(self, k: int) -> None:
        import numpy as np
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(self.url.split("://", 1)[-1], network_timeout=120)
        wanted = [httpclient.InferRequestedOutput("TOPK_LABELS", binary_data=True)]
        for i in self._next(k):
            sent = time.time()
            tensor = httpclient.InferInput("IMAGES", [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[self.images[i]]], dtype=np.object_), binary_data=True)
            try:
                result = client.infer(self.model, [tensor], outputs=wanted, headers=self.headers)
            except Exception as exc:  # noqa: BLE001 - any failure is an answer to count
                self._add(
                    Answer(
                        "v2-http",
                        i,
                        str(getattr(exc, "status", lambda: "error")()),
                        None,
                        None,
                        time.time(),
                        str(exc),
                        sent,
                    )
                )
                continue
            label = result.as_numpy("TOPK_LABELS")[0][0].decode()
            version = result.get_response()["model_version"]
            self._add(Answer("v2-http", i, "200", label, version, time.time(), "", sent))
        client.close()

    def _v2_grpc(self, k: int) -> None:
        import numpy as np
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(self.grpc)
        wanted = [grpcclient.InferRequestedOutput("TOPK_LABELS")]
        for i in self._next(k):
            sent = time.time()
            tensor = grpcclient.InferInput("IMAGES", [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[self.images[i]]], dtype=np.object_))
            try:
                result = client.infer(
                    self.model, [tensor], outputs=wanted, headers=self.headers or None, client_timeout=120
                )
            except grpcclient.InferenceServerException as exc:
                self._add(Answer("v2-grpc", i, str(exc.status()), None, None, time.time(), str(exc.message()), sent))
                continue
            label = result.as_numpy("TOPK_LABELS")[0][0].decode()
            version = result.get_response().model_version
            self._add(Answer("v2-grpc", i, "200", label, version, time.time(), "", sent))
        client.close()

    def count(self) -> int:
        with self._lock:
            return len(self.answers)

    def wait_for(self, more: int) -> None:
        """Until ``more`` answers beyond those counted now have come back."""
        target = self.count() + more
        deadline = time.monotonic() + HANG_GUARD_S
        while self.count() < target:
            assert time.monotonic() < deadline, f"only {self.count()} of {target} answers within {HANG_GUARD_S} s"
            time.sleep(0.02)

    def stop(self) -> list[Answer]:
        self._stop.set()
        for t in self._threads:
            t.join(HANG_GUARD_S)
        return list(self.answers)


def _b64(blob: bytes) -> str:
    return base64.b64encode(blob).decode()


def failures(answers: list[Answer]) -> list[Answer]:
    return [a for a in answers if a.status != "200"]


__all__ = ["Answer", "CountedLoad", "failures"]


def random_pngs(count: int, side: int = 40) -> list[bytes]:
    """``count`` PNG images of random pixels (seeds 0, 1, ...): the requests of the rollout tests' loads, the same
    bytes every run."""
    import io

    import numpy as np
    from PIL import Image

    out = []
    for seed in range(count):
        pixels = (np.random.default_rng(seed).random((side, side, 3)) * 255).astype("uint8")
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out
