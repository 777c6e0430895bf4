"""`vitdeploy rollout`: a new export onto a running `vitdeploy serve`, beside the live version, then promoted or
rolled back by what it answers to live traffic.

    result = run_rollout(cfg, RolloutPlan("http://127.0.0.1:8000", Path("new-export"), address=...), options, print)
    print(result.line())   # "promoted v2 (...): ..." or "rolled back v2 (...): why"

Each step is bounded in time; a failure after the candidate exists removes it, never the live version:

0. the export's eager FP32 PyTorch answers on its validation images (``validation.images``) are computed first;
1. the server (server.py): `vitdeploy serve` with its proxy's guard, the serve token, the model;
2. the rollout registry on the server's Ray (serve/rollout/registry.py) gives the candidate its version, N+1, under
   this process's lease on the model (lease.py: renewed in the background during every phase; each step is
   recorded as the rollout's phase); what an abandoned rollout left is removed first;
3. the export is packed and kept in Ray's object store by the registry (replicas started later find it after
   this process is gone) and deployed as ``<name>@vN+1`` at ``/v2/models/<name>/versions/N+1``: one replica, with
   what CPU is free (serve/rollout/candidate.py), RUNNING within ``--start-timeout`` or the rollout fails;
4. faithful: its export's validation images are sent to its versioned route and its answers judged against the
   eager answers of step 0 with its backend's thresholds, as `validate --url` judges a server;
5. shadow: the next ``--shadow`` unversioned inferences are copied to it (clients get the live answers only);
   gate.py judges the answers as they come (errors, latency; agreement with the live version is measured, and
   gates with ``--min-agreement`` or ``--same-model``) and decides as soon as they prove a failure;
6. promote - the candidate grows to the live version's replica count (capacity.py: on a full cluster, with
   requests split by replica counts while the old version gives up a replica for each one it takes), unversioned
   requests move to it at the guards' next read; two reads later the old version is deleted: its replicas finish
   their in-flight requests, then stop - or roll back: the candidate is deleted.

The history entry is kept by the registry (`vitdeploy rollout --status`). Ctrl-C or SIGTERM before the swap rolls
back, after it the promotion stands; a process killed anywhere leaves its phase to the next rollout (lease.py).
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

from ...base.errors import BackendError, ConfigError, VitDeployError, first_line
from ...base.output_spec import EMBEDDING, LOGITS
from ...base.vocab import AUTO
from ...serve.rollout.registry import (
    DRAINING,
    LEASE_S,
    PROMOTED,
    PROMOTING,
    ROLLED_BACK,
    ROLLING_BACK,
    SHADOW,
    STARTING,
)
from ...serve.rollout.routes import ROUTING_TTL_S, version_app, version_route
from .faithful import check_faithful
from .gate import ShadowVerdict, judge_shadow, shadow_thresholds
from .hold import hold_point, no_hold
from .lease import Lease, abandoned_line, connect, converge, leave
from .server import Server, export_sha, find_server, served_sha, wait_reachable
from .status import summary

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
POLL_S = 0.2
REACHABLE_S = 30.0  # for the proxies' route tables to list a version that runs
REMOVE_EXTRA_S = 30.0  # beyond serve.graceful_shutdown_timeout_s, for a version to be gone
MAX_SHADOWED = 10_000  # a shadow given as a time copies every request for that long, at most this many


@dataclass(frozen=True)
class RolloutPlan:
    """What `vitdeploy rollout` was asked: the server, the new export, how long the candidate is shadowed."""

    url: str
    artifacts: Path
    backend: str = AUTO
    model: Optional[str] = None
    address: Optional[str] = None  # the server's Ray (the `Ray at ...` line of `vitdeploy serve`)
    shadow_requests: Optional[int] = 200  # the next N unversioned inferences are copied to the candidate
    shadow_seconds: Optional[float] = None  # or every one for this long (instead of a count)
    timeout_s: float = 600.0  # a count not reached within this long: not enough traffic to judge, rolled back
    start_timeout_s: float = 300.0
    max_slowdown: Optional[float] = None
    token: Optional[str] = field(default=None, repr=False)
    ca_bundle: Optional[str] = None  # what an HTTPS server's certificate is verified against (connection.py)
    min_agreement: Optional[float] = None  # gate on the top-1 agreement with the live version (an embedding: cosine)
    same_model: bool = False  # the candidate must answer as the live version does (a re-export of the same weights)
    lease_s: float = LEASE_S


@dataclass
class RolloutResult:
    """How a rollout ended: ``verdict`` PROMOTED or ROLLED_BACK, ``reason`` why, ``figures`` the gate's, and
    ``window``: the wall-clock (time.time()) span of the swap (traffic began to move - split, on a full cluster -
    to the end of the old version; or the rollback's start to the candidate gone)."""

    model: str
    version: int
    live: int
    sha: str
    verdict: str
    reason: str
    figures: dict[str, Any] = field(default_factory=dict)
    window: Optional[tuple[float, float]] = None
    failed_start: bool = False
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False  # Ctrl-C (or SIGTERM) ended it: rolled back before the swap, promoted after

    @property
    def promoted(self) -> bool:
        return self.verdict == PROMOTED

    def line(self) -> str:
        what = f"{self.verdict} {self.model} v{self.version} (export {self.sha[:12]})"
        if self.promoted:
            return f"{what}: {summary(self.figures)}; v{self.live} drained and stopped"
        return f"{what}: {self.reason}; v{self.live} kept serving, never stopped"

    def to_dict(self) -> dict[str, Any]:
        keys = ("model", "version", "live", "sha", "verdict", "reason", "figures", "window", "notes", "interrupted")
        return {k: getattr(self, k) for k in keys}


def run_rollout(cfg: Any, plan: RolloutPlan, options: Any, progress: Progress) -> RolloutResult:
    """Roll ``plan.artifacts`` out onto the server at ``plan.url`` (see the module's docstring)."""
    from ...runtime.artifacts import Artifacts
    from ..served_check import eager_answers

    # a bad export (or, with runtime.verify, one its key did not sign) is said before anything is touched
    artifacts = Artifacts.open(plan.artifacts, public_key=cfg.verify_key)
    hold = hold_point(progress=progress)  # the crash tests' hook (hold.py): a no-op unless its variable is set
    if plan.shadow_requests is None and not plan.shadow_seconds:
        raise ConfigError("--shadow: give a number of requests (300) or a time (2m)")
    server = find_server(plan.url, plan.model, plan.token, plan.ca_bundle)
    images = cfg.resolve(cfg.validation.images) if cfg.validation.images else None
    eager = eager_answers(artifacts, images, None, options, cfg.runtime.max_image_pixels)
    ray = connect(plan.address, progress)
    rollout = _Rollout(ray, cfg, plan, options, progress, artifacts, server, eager)
    rollout.hold = hold
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main else None  # Ray's own handler exits at once
    try:
        return rollout.run()
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM (a CI job cancelled, a pod stopped) ends a rollout as Ctrl-C does


class _Rollout:
    """One rollout's steps and what they share."""

    hold: Callable[..., None] = staticmethod(no_hold)  # the crash tests' hold point (hold.py): nothing by default

    def __init__(
        self,
        ray: Any,
        cfg: Any,
        plan: RolloutPlan,
        options: Any,
        progress: Progress,
        artifacts: Any,
        server: Server,
        eager: Any,
    ) -> None:
        self.ray, self.cfg, self.plan, self.options, self.progress = ray, cfg, plan, options, progress
        self.artifacts, self.server, self.model, self.eager = artifacts, server, server.model, eager
        self.sha = export_sha(artifacts)
        self.lease = Lease(ray, self.model, plan.lease_s)
        self.kind = EMBEDDING if artifacts.schema.is_embedding else LOGITS
        self.version = self.live = 0
        self.known = False
        self.notes: list[str] = []
        self.faithful: dict[str, Any] = {}
        self.deployed: tuple = ()  # the candidate's (spec, serve section, app, route, CPUs per replica)
        self.started = time.time()
        self.swapped: Optional[float] = None  # when unversioned requests moved to the candidate
        self.interrupted = False

    def run(self) -> RolloutResult:
        began = self.begin()  # nothing exists yet when it fails: nothing to undo
        self.lease.hold()
        try:
            return self._run(began)
        except BackendError:
            if self.lease.lost:
                leave(self.lease, self.version, self._remove_s(), self.progress)
            raise
        finally:
            self.lease.release()

    def _run(self, began: dict[str, Any]) -> RolloutResult:
        failed_start, window = False, None
        try:
            self.notes += converge(
                self.lease, began["remove"], self._remove_s(), self.progress, self._why(began), began.get("restore")
            )
            try:
                self.start()
            except VitDeployError as exc:
                if self.lease.lost:
                    raise
                failed_start = True
                verdict = ShadowVerdict(False, True, f"v{self.version} did not start: {first_line(exc)}")
            else:
                verdict = self.check_faithful() or self.shadow()
        except KeyboardInterrupt:
            verdict, self.interrupted = ShadowVerdict(False, True, "interrupted"), True
        except VitDeployError as exc:
            if self.lease.lost:
                raise
            verdict = ShadowVerdict(False, True, first_line(exc))
        except Exception as exc:  # noqa: BLE001 - whatever failed, the candidate goes and the live version stays
            verdict = ShadowVerdict(False, True, f"{type(exc).__name__}: {first_line(exc)}")
        figures = {**verdict.figures, "faithful": self.faithful} if self.faithful else verdict.figures
        if verdict.passed:
            try:
                window = self.promote()
            except KeyboardInterrupt:  # Ctrl-C: before the swap it rolls back; after, the promotion stands
                self.interrupted = True
                if self._live_now() != self.version:  # the registry's word (the swap may be done, its call not)
                    verdict = ShadowVerdict(False, True, "interrupted while promoting", verdict.figures)
                else:
                    window = (self.swapped or time.time(), time.time())
                    self.notes.append(f"interrupted while v{self.live} drained: {self._left(self.live)}")
        if not verdict.passed:
            self.progress(f"rolling back v{self.version}: {verdict.reason}")
            window = self.roll_back()
        verdict_word = PROMOTED if verdict.passed else ROLLED_BACK
        result = RolloutResult(
            self.model, self.version, self.live, self.sha, verdict_word, verdict.reason, figures, window, failed_start
        )
        result.notes, result.interrupted = self.notes, self.interrupted
        self.finish(result)
        return result

    # ---------------------------------------------------------------- steps

    def begin(self) -> dict[str, Any]:
        """The candidate's version number from the registry, under this process's lease; the versions an
        abandoned rollout left, to remove first."""
        from ...base.ray_private import serve_app_sources
        from ...serve.rollout.candidate import declarative_refusal, running_versions

        running = running_versions(self.model)
        if not running:
            raise BackendError(
                f"no application of model {self.model!r} runs on this Ray cluster: is --address the server's?"
            )
        refused = declarative_refusal(self.model, serve_app_sources())  # its config would put the old export back
        if refused:
            raise ConfigError(refused)
        live_sha = served_sha(self.server.metadata)
        candidate = {"sha": self.sha, "backend": self.plan.backend, "export": str(self.artifacts.directory)}
        self.known = self.model in self.lease.read("routing")  # the proxies route this model's versions already
        began = self.lease.call("begin", running, candidate, self.lease.lease_s)
        self.version, self.live = int(began["version"]), int(began["live"])
        if live_sha:
            self.notes.append(f"v{self.live} runs export {live_sha[:12]}")
        if live_sha == self.sha:
            self.notes.append(f"v{self.live} already runs this export")
        return began

    def _why(self, began: dict[str, Any]) -> str:
        return abandoned_line(began.get("abandoned"))

    def start(self) -> None:
        from ...runtime.artifact_transfer import pack
        from ...runtime.backends import shipped_roles
        from ...serve.ray_app import build_app
        from ...serve.rollout.candidate import candidate_cpus, free_cpus, start_version
        from ...serve.runner import ServeSettings, replica_spec

        sv = self.cfg.serve
        cpus, note = candidate_cpus(sv.num_cpus_per_replica, free_cpus(min(sv.num_cpus_per_replica, 1.0)))
        served = self.cfg.model_copy(
            update={"serve": sv.model_copy(update={"num_cpus_per_replica": cpus, "autoscaling": None})}
        )
        app, route = version_app(self.model, self.version), version_route(self.model, self.version)
        settings = ServeSettings(
            artifacts=self.artifacts.directory,
            backend=self.plan.backend,
            host=sv.host,
            port=sv.port,
            replicas=1,
            name=self.model,
            token_digest=self.server.token_digest,
        )
        bundle = pack(self.artifacts, shipped_roles(self.plan.backend, self.artifacts))
        (ref,) = self.lease.call("keep", app, bundle)
        # less CPU than asked: its threads follow what it got, whatever runtime.threads says
        options = replace(self.options, threads=max(1, math.ceil(cpus))) if note else self.options
        spec = replace(replica_spec(served, settings, options, ref, self.model), version=str(self.version))
        threads = spec.threads()[0]
        said = f" ({note})" if note else ""
        self.progress(
            f"starting v{self.version} beside live v{self.live}: {self.artifacts.directory} (export {self.sha[:12]}), "
            f"backend {self.plan.backend}, 1 replica, {cpus:g} CPU, {threads} thread(s){said} ..."
        )
        if note:
            self.notes.append(f"v{self.version} ran with 1 replica, {cpus:g} CPU, {threads} thread(s): {note}")
        self.deployed = (spec, served.serve, app, route, cpus)  # what a change of its replica count deploys again
        application = build_app(spec, served.serve, 1, version=self.sha[:16])
        if not self.known:  # every proxy reads the registry, which now lists the model, before a second
            # application of it appears: Ray's gRPC proxy cannot choose between two (serve/kserve_grpc.py does)
            time.sleep(2 * ROUTING_TTL_S)
        start_version(application, app, route, self.plan.start_timeout_s)
        self._at(STARTING)
        self.lease.call("ready", self.version)
        wait_reachable(self.server, route, REACHABLE_S)
        self.progress(f"v{self.version} answers at {self.server.url}{route}/...")

    def check_faithful(self) -> Optional[ShadowVerdict]:
        """The candidate against its own export (faithful.py); a failed verdict when it does not answer as it."""
        self.progress(
            f"checking v{self.version} against its export's eager answers ({len(self.eager.good)} images) ..."
        )
        self.faithful, failed = check_faithful(
            self.server, self.version, self.artifacts, self.eager, self.cfg, self.options
        )
        return failed

    def shadow(self) -> ShadowVerdict:
        budget = self.plan.shadow_requests or MAX_SHADOWED
        seconds = self.plan.shadow_seconds or self.plan.timeout_s
        timeout = float(self.cfg.serve.request_timeout_s)
        self.lease.call("start_shadow", budget, timeout, seconds)
        what = f"the next {budget} requests" if self.plan.shadow_requests else f"every request for {seconds:g} s"
        self.progress(f"shadowing {what} to v{self.version} (clients get v{self.live}'s answers) ...")
        self._at(SHADOW)
        deadline = time.monotonic() + seconds
        samples: list[dict[str, Any]] = []
        thresholds: dict[str, float] | None = None
        checked = 0.0
        gate = {"max_slowdown": self.plan.max_slowdown, "min_agreement": self.plan.min_agreement}
        while True:
            progress = self.lease.call("progress")
            if progress["count"] > len(samples):
                samples += self.lease.call("samples", len(samples))
            if thresholds is None and any(s.get("backend") for s in samples):
                thresholds = shadow_thresholds(samples, self.artifacts.manifest.get("validation"), self.cfg.validation)
            timed_out = time.monotonic() > deadline
            final = progress["count"] >= budget or timed_out
            if timed_out and self.plan.shadow_requests and progress["count"] < budget:
                reason = f"only {progress['count']} of {budget} requests were shadowed within {seconds:g} s"
                return ShadowVerdict(False, True, reason + ": not enough live traffic to judge it")
            verdict = judge_shadow(
                samples, thresholds or {}, self.kind, budget, final=final, same_model=self.plan.same_model, **gate
            )
            if verdict.decided:
                self.lease.call("stop_shadow")
                return verdict
            if time.monotonic() - checked > 1.0:
                checked = time.monotonic()
                self._check_alive()
            time.sleep(POLL_S)

    def promote(self) -> tuple[float, float]:
        from ...base.ray_private import serve_details
        from ...serve.rollout.candidate import free_cpus, remove_version, replica_count
        from .capacity import BOTH, OLD, Promotion, Scaler, in_place, live_autoscaling, room_for, scale_steps

        self.lease.call("phase", PROMOTING)
        old_app, app = version_app(self.model, self.live), version_app(self.model, self.version)
        live = max(replica_count(old_app), 1)
        details = serve_details()
        autoscaling = live_autoscaling(details, old_app)
        shrink = autoscaling is None and in_place(details, old_app)  # a full cluster: the old one steps down
        steps = scale_steps(live, room_for(free_cpus(), self.deployed[4]), shrink)
        scaler = Scaler(self._deploy, lambda: replica_count(app), self.plan.start_timeout_s)
        carry = Promotion(self.lease, self.model, self.live, self.version, scaler, self.progress, self.notes)
        # the guards stop tagging copies at their next read and the copies sent finish: the swap does not
        # run on cores the shadow still takes
        time.sleep(ROUTING_TTL_S + 0.5)
        moved = carry.grow([step.new for step in steps if step.serving == OLD][1:], 1)
        moved = carry.step_down([step for step in steps if step.serving == BOTH], moved, live)
        self._at(PROMOTING)
        start = carry.split_at or time.time()  # the swap began when requests began to move
        self.lease.call("promote", self.version)  # the phase is DRAINING from here
        self.swapped = start
        self.progress(
            f"promoting v{self.version} ({moved} of v{self.live}'s {live} replica(s)): unversioned requests move "
            f"to it; v{self.live} drains ..."
        )
        self._at(DRAINING)
        time.sleep(2 * ROUTING_TTL_S + 0.5)  # every guard has read the new routing: nothing new reaches the old one
        if not remove_version(old_app, self._remove_s()):
            self.notes.append(f"v{self.live} was still stopping after {self._remove_s():g} s")
        else:
            self.lease.call("drop", self.live)
        end = time.time()
        grown = carry.grow(list(range(moved + 1, live + 1)), moved)
        if autoscaling:
            self._deploy(grown, autoscaling)
        carry.capacity_notes(live, moved, grown, autoscaling)
        return start, end

    def _deploy(self, replicas: int, autoscaling: Optional[dict[str, Any]]) -> None:
        """The candidate's application deployed again with ``replicas`` (or the live version's ``autoscaling``),
        with its code version: Ray Serve changes its replica count in place."""
        from ...base.ray_private import run_nowait
        from ...base.serving_sections import AutoscalingSection
        from ...serve.ray_app import build_app
        from ...serve.rollout.candidate import LOGGING

        spec, sv, app, route, _ = self.deployed
        if autoscaling:
            keys = ("min_replicas", "max_replicas", "target_ongoing_requests")
            given = {k: autoscaling[k] for k in keys if autoscaling.get(k) is not None}  # else the section's own
            sv = sv.model_copy(update={"autoscaling": AutoscalingSection(**given)})
        run_nowait(build_app(spec, sv, replicas, version=self.sha[:16]), app, route, LOGGING, not autoscaling)

    def roll_back(self) -> tuple[float, float]:
        from ...serve.rollout.candidate import remove_version

        start = time.time()
        self.lease.call("phase", ROLLING_BACK)
        self.lease.call("stop_shadow")
        try:
            self._at(ROLLING_BACK)
            gone = remove_version(version_app(self.model, self.version), self._remove_s())
        except KeyboardInterrupt:  # Ctrl-C (again): the rollout ends, what is left is said
            self.interrupted = True
            self.notes.append(f"interrupted while v{self.version} was removed: {self._left(self.version)}")
            return start, time.time()
        if not gone:
            self.notes.append(f"v{self.version} was still stopping after {self._remove_s():g} s")
        else:
            self.lease.call("drop", self.version)
        return start, time.time()

    def finish(self, result: RolloutResult) -> None:
        entry = {
            "version": self.version,
            "sha": self.sha,
            "backend": (result.figures.get("backends") or {}).get("candidate") or self.plan.backend,
            "export": str(self.artifacts.directory),
            "verdict": result.verdict,
            "reason": result.reason,
            "figures": result.figures,
            "started": self.started,
            "ended": time.time(),
            "window": list(result.window) if result.window else None,
        }
        self.lease.call("finish", entry)

    # ---------------------------------------------------------------- helpers

    def _at(self, phase: str) -> None:
        self.hold(phase, version=self.version, live=self.live)

    def _live_now(self) -> int:
        return int(self.lease.read("status")["models"][self.model]["live"])

    def _left(self, version: int) -> str:
        return f"v{version} is removed by the next rollout or `vitdeploy rollout --status`"

    def _check_alive(self) -> None:
        """BackendError when the candidate's application failed (its replica crashed and could not be restarted)."""
        from ray import serve

        status = serve.status().applications.get(version_app(self.model, self.version))
        state = str(getattr(status, "status", "gone"))
        if status is None or state.endswith(("DEPLOY_FAILED", "UNHEALTHY")):
            raise BackendError(f"v{self.version} failed while shadowed ({state.rsplit('.', 1)[-1]})")

    def _remove_s(self) -> float:
        return float(self.cfg.serve.graceful_shutdown_timeout_s) + REMOVE_EXTRA_S


__all__ = ["RolloutPlan", "RolloutResult", "run_rollout"]
