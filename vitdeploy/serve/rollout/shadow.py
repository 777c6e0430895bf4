"""Shadow traffic of a rollout, in the replicas: the live version copies a request it answered to the candidate,
the candidate answers the copy to the live replica only, and the pair goes to the rollout registry.

The proxy's guard tags the requests to copy (routes.py, :data:`~.routes.SHADOW_HEADER`:
the candidate's application and how long it is given); the gRPC routing tags an inference the same way, in its
metadata (serve/kserve_grpc.py). After the live replica has its answer, it sends the
images it read (their encoded bytes: the candidate decodes them with its own preprocessing) to the candidate's
:meth:`ShadowMixin.shadow` through a Ray Serve handle, on a task of its own: the client's answer never waits for
the copy, and a candidate that is slow, stopped or crashed costs the client nothing. Each outcome - both
answers' rows (logits or embeddings) and the time each version spent on them (decoding, batching, the model
call), or why the candidate gave none - is recorded in the registry, where `vitdeploy rollout` judges them.
At most :data:`MAX_PENDING` copies wait for the candidate per replica: beyond that a request is not copied.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Optional

import numpy as np

from ...base.errors import first_line
from ..protocol import INPUT
from .registry import registry_actor
from .routes import SHADOW_HEADER, Shadow, parse_shadow

log = logging.getLogger(__name__)

MAX_PENDING = 16


class ShadowMixin:
    """The deployment's shadow side (mixed into :class:`~vitdeploy.serve.ray_app.ViTClassifier`, which provides
    ``name``, ``predictor`` and ``_classify``)."""

    name: str
    predictor: Any

    def _init_shadow(self) -> None:
        self._shadow_pending: set[asyncio.Task] = set()
        self._shadow_handles: dict[str, Any] = {}  # candidate application -> its Ray Serve handle
        self._registry: Any = None
        self._shadow_full = ""  # the candidate whose copies were once too many to wait for (said once)

    # ---------------------------------------------------------------- the candidate's side

    async def shadow(self, blobs: list[bytes]) -> dict[str, Any]:
        """A live replica's copy (through a handle, never a client's request): the rows this version gives the
        images, the ns it spent on them, its backend; ``errors``: {index: reason} of images it refused."""
        start = time.perf_counter_ns()
        names = [f"{INPUT}[{i}]" for i in range(len(blobs))]
        rows, errors, _ = await self._classify(list(zip(names, blobs)))
        took = time.perf_counter_ns() - start
        good = [r for r in rows if r is not None]
        return {
            "rows": np.stack(good) if len(good) == len(rows) else None,
            "errors": {int(i): str(e) for i, e in errors.items()},
            "ns": took,
            "backend": self.predictor.backend_name,
        }

    # ---------------------------------------------------------------- the live version's side

    def copy_to_candidate(self, headers: Any, blobs: list[bytes], rows: list[Optional[np.ndarray]], ns: int) -> None:
        """When the guard tagged this request, copy the images this replica answered (``rows``; ``ns`` spent on
        them) to the candidate, on a task of its own; returns at once."""
        target = parse_shadow(headers.get(SHADOW_HEADER), self.name)
        pending = self._shadow_pending
        good = [i for i, row in enumerate(rows) if row is not None]
        if target is None or not good:
            return
        if len(pending) >= MAX_PENDING:  # said once a rollout: the candidate is slower than the traffic
            if self._shadow_full != target.app:
                self._shadow_full = target.app
                log.warning("%d shadow copies wait for %s: requests beyond are not copied", len(pending), target.app)
            return
        live = np.stack([rows[i] for i in good])
        task = asyncio.get_running_loop().create_task(self._send_copy(target, [blobs[i] for i in good], live, ns))
        pending.add(task)
        task.add_done_callback(pending.discard)

    async def _send_copy(self, target: Shadow, blobs: list[bytes], live: np.ndarray, ns: int) -> None:
        sample: dict[str, Any] = {"live": live, "live_ns": ns, "live_backend": self.predictor.backend_name}
        try:
            handle = await self._handle(target.app)
            answer = await asyncio.wait_for(_result(handle.shadow.remote(blobs)), target.timeout_s)
        except asyncio.TimeoutError:
            sample["error"] = f"no answer to a shadowed request within {target.timeout_s:g} s"
        except Exception as exc:  # noqa: BLE001 - whatever the candidate raised: it failed the request
            sample["error"] = f"a shadowed request failed: {first_line(exc)}"
        else:
            sample.update(candidate=answer["rows"], candidate_ns=answer["ns"], backend=answer["backend"])
            if answer["errors"]:
                first = min(answer["errors"])
                sample["error"] = f"refused an image the live version answered: {answer['errors'][first]}"
        await self._record(target, sample)

    async def _handle(self, app: str) -> Any:
        handles = self._shadow_handles
        if app not in handles:
            from ray import serve

            loop = asyncio.get_running_loop()
            handles[app] = await loop.run_in_executor(None, serve.get_app_handle, app)
        return handles[app]

    async def _record(self, target: Shadow, sample: dict[str, Any]) -> None:
        try:
            if self._registry is None:
                self._registry = await asyncio.get_running_loop().run_in_executor(None, registry_actor)
            if self._registry is not None:
                await self._registry.record.remote(self.name, target.version, sample)
        except Exception as exc:  # noqa: BLE001 - the registry gone: the rollout that asked for copies is over
            self._registry = None
            log.warning("a shadow copy's outcome was not recorded: %s", first_line(exc))


async def _result(response: Any) -> Any:
    """A Ray Serve DeploymentResponse awaited; cancelled (the candidate told) when the wait is cut short."""
    try:
        return await response
    except asyncio.CancelledError:
        response.cancel()
        raise


__all__ = ["MAX_PENDING", "ShadowMixin"]
