"""`vitdeploy rollout`: a new export onto a running `vitdeploy serve`, beside the live version, then promoted or
rolled back by what it answers to live traffic.

    result = run_rollout(cfg, RolloutPlan("http://127.0.0.1:8000", Path("new-export"), address=...), options, print)
    print(result.line())   # "promoted v2 (...): ..." or "rolled back v2 (...): why"

Each step is bounded in time; a failure at any step after the candidate exists removes it, and the live version
never stops before a candidate has passed:

1. the server (tune/rollout_server.py): `vitdeploy serve` with its proxy's guard, the serve token, the model;
2. the rollout registry on the server's Ray (serve/rollout_state.py) gives the candidate its version, N+1;
3. the export is packed and kept in Ray's object store by the registry (replicas started later find it after
   this process is gone) and deployed as ``<name>@vN+1`` at ``/v2/models/<name>/versions/N+1``: one replica, with
   what CPU is free (serve/candidate.py), RUNNING within ``--start-timeout`` or the rollout fails;
4. shadow: the next ``--shadow`` unversioned inferences are copied to it (clients get the live answers only);
   evaluate/rollout_gate.py judges the answers as they come and decides as soon as they prove a failure;
5. promote - unversioned requests move to it at the guards' next refresh; two refreshes later the old version
   is deleted: its replicas finish their in-flight requests, then stop - or roll back: the candidate is deleted.

The history entry (version, export sha, verdict, reason, figures) is kept by the registry
(`vitdeploy rollout --status`).
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Optional

from ..base import ray_loopback
from ..base._deps import require
from ..base.errors import BackendError, ConfigError, VitDeployError, first_line
from ..base.output_spec import EMBEDDING, LOGITS
from ..base.vocab import AUTO
from ..evaluate.rollout_gate import ShadowVerdict, backend_thresholds, gate_thresholds, judge_shadow
from ..serve.rollout_state import ROUTING_TTL_S, registry_actor, version_app, version_route
from .rollout_server import Server, export_sha, find_server, served_sha, wait_reachable

log = logging.getLogger(__name__)

Progress = Callable[[str], None]
PROMOTED, ROLLED_BACK = "promoted", "rolled back"
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


@dataclass
class RolloutResult:
    """How a rollout ended: ``verdict`` PROMOTED or ROLLED_BACK, ``reason`` why, ``figures`` the gate's, and
    ``window``: the wall-clock (time.time()) span of the swap (traffic moved to the end of the old version; or the
    rollback's start to the candidate gone)."""

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

    @property
    def promoted(self) -> bool:
        return self.verdict == PROMOTED

    def line(self) -> str:
        what = f"{self.verdict} {self.model} v{self.version} (export {self.sha[:12]})"
        if self.promoted:
            return f"{what}: {summary(self.figures)}; v{self.live} drained and stopped"
        return f"{what}: {self.reason}; v{self.live} kept serving, never stopped"

    def to_dict(self) -> dict[str, Any]:
        keys = ("model", "version", "live", "sha", "verdict", "reason", "figures", "window", "notes")
        return {k: getattr(self, k) for k in keys}


def summary(figures: dict[str, Any]) -> str:
    """The gate's figures in one clause: requests, agreement, largest difference, latencies."""
    parts = [f"{figures.get('requests', 0)} shadowed requests"]
    metrics = figures.get("metrics") or {}
    if "top1_agreement" in metrics:
        parts.append(f"top-1 agreement {metrics['top1_agreement']:.1%}")
    if "cosine" in metrics and "top1_agreement" not in metrics:
        parts.append(f"lowest cosine {metrics['cosine']:.6f}")
    if "max_abs_diff" in metrics:
        parts.append(f"max |diff| {metrics['max_abs_diff']:.3g}")
    lat = figures.get("latency_ms") or {}
    if lat.get("live") and lat.get("candidate"):
        parts.append(f"p50 {lat['candidate']['p50']:.1f} ms (live {lat['live']['p50']:.1f} ms)")
    return ", ".join(parts)


def connect(address: Optional[str]) -> Any:
    """This process on the server's Ray (already connected: as it is)."""
    ray = require("ray", "vitdeploy rollout (pip install 'vitdeploy[serve]')")
    require("ray.serve", "vitdeploy rollout (pip install 'vitdeploy[serve]')")
    if not log.isEnabledFor(logging.INFO):  # Ray Serve's own INFO lines repeat what progress() says
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise ConfigError(
            "--address: the server's Ray cluster is needed (the address in the `Ray at ...` line `vitdeploy serve` "
            "printed, or RAY_ADDRESS)"
        )
    ray_loopback.for_address(address)  # the server's Ray on loopback is joined there
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)  # the server shows them
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise BackendError(f"cannot join the Ray cluster at {address}: {first_line(exc)}; check --address") from None
    return ray


def run_rollout(cfg: Any, plan: RolloutPlan, options: Any, progress: Progress) -> RolloutResult:
    """Roll ``plan.artifacts`` out onto the server at ``plan.url`` (see the module's docstring)."""
    from ..runtime.artifacts import Artifacts

    artifacts = Artifacts.open(plan.artifacts)  # a bad export is said before anything is touched
    if plan.shadow_requests is None and not plan.shadow_seconds:
        raise ConfigError("--shadow: give a number of requests (300) or a time (2m)")
    server = find_server(plan.url, plan.model, plan.token)
    ray = connect(plan.address)
    return _Rollout(ray, cfg, plan, options, progress, artifacts, server).run()


class _Rollout:
    """One rollout's steps and what they share."""

    def __init__(
        self, ray: Any, cfg: Any, plan: RolloutPlan, options: Any, progress: Progress, artifacts: Any, server: Server
    ) -> None:
        self.ray, self.cfg, self.plan, self.options, self.progress = ray, cfg, plan, options, progress
        self.artifacts, self.server, self.model = artifacts, server, server.model
        self.sha = export_sha(artifacts)
        self.registry = registry_actor(create=True)
        self.kind = EMBEDDING if artifacts.schema.is_embedding else LOGITS
        self.version = self.live = 0
        self.known = False
        self.notes: list[str] = []
        self.started = time.time()

    def call(self, method: str, *args: Any) -> Any:
        """A registry method, its answer; a refusal is a BackendError."""
        answer = self.ray.get(getattr(self.registry, method).remote(*args))
        if isinstance(answer, dict) and answer.get("refused"):
            raise BackendError(answer["refused"])
        return answer

    def run(self) -> RolloutResult:
        abandoned = self.begin()  # nothing exists yet when it fails: nothing to undo
        failed_start, window = False, None
        try:
            self.clean(abandoned)
            try:
                self.start()
            except VitDeployError as exc:
                failed_start = True
                verdict = ShadowVerdict(False, True, f"v{self.version} did not start: {first_line(exc)}")
            else:
                verdict = self.shadow()
        except KeyboardInterrupt:
            verdict = ShadowVerdict(False, True, "interrupted")
        except VitDeployError as exc:
            verdict = ShadowVerdict(False, True, first_line(exc))
        except Exception as exc:  # noqa: BLE001 - whatever failed, the candidate goes and the live version stays
            verdict = ShadowVerdict(False, True, f"{type(exc).__name__}: {first_line(exc)}")
        if verdict.passed:
            window = self.promote()
        else:
            self.progress(f"rolling back v{self.version}: {verdict.reason}")
            window = self.roll_back()
        result = RolloutResult(
            self.model,
            self.version,
            self.live,
            self.sha,
            PROMOTED if verdict.passed else ROLLED_BACK,
            verdict.reason,
            verdict.figures,
            window,
            failed_start,
            self.notes,
        )
        self.finish(result)
        return result

    # ---------------------------------------------------------------- steps

    def begin(self) -> Optional[dict[str, Any]]:
        """The candidate's version number from the registry; the abandoned rollout to clean up, if any."""
        from ..serve.candidate import running_versions

        running = running_versions(self.model)
        if not running:
            raise BackendError(
                f"no application of model {self.model!r} runs on this Ray cluster: is --address the server's?"
            )
        live_sha = served_sha(self.server.metadata)
        backend = self.plan.backend
        candidate = {"sha": self.sha, "backend": backend, "export": str(self.artifacts.directory)}
        self.known = self.model in self.call("routing")  # the proxies route this model's versions already
        began = self.call("begin", self.model, running, candidate)
        self.version, self.live = int(began["version"]), int(began["live"])
        if live_sha:
            self.notes.append(f"v{self.live} runs export {live_sha[:12]}")
        if live_sha == self.sha:
            self.notes.append(f"v{self.live} already runs this export")
        return began.get("abandoned")

    def clean(self, abandoned: Optional[dict[str, Any]]) -> None:
        """A rollout whose process went away left a candidate: it goes first."""
        from ..serve.candidate import remove_version

        if abandoned:
            app = version_app(self.model, int(abandoned["version"]))
            self.progress(f"removing v{abandoned['version']}, left by a rollout that did not finish")
            remove_version(app, self._remove_s())
            self.call("drop", self.model, int(abandoned["version"]))

    def start(self) -> None:
        from ..runtime.artifact_transfer import pack
        from ..runtime.backends import shipped_roles
        from ..serve.candidate import candidate_cpus, free_cpus, start_version
        from ..serve.ray_app import build_app
        from ..serve.runner import ServeSettings, replica_spec

        sv = self.cfg.serve
        cpus, note = candidate_cpus(sv.num_cpus_per_replica, free_cpus())
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
        (ref,) = self.call("keep", app, bundle)
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
        application = build_app(spec, served.serve, 1, version=self.sha[:16])
        if not self.known:  # every proxy reads the registry, which now lists the model, before a second
            # application of it appears: Ray's gRPC proxy cannot choose between two (serve/kserve_grpc.py does)
            time.sleep(2 * ROUTING_TTL_S)
        start_version(application, app, route, self.plan.start_timeout_s)
        self.call("ready", self.model, self.version)
        wait_reachable(self.server, route, REACHABLE_S)
        self.progress(f"v{self.version} answers at {self.server.url}{route}/...")

    def shadow(self) -> ShadowVerdict:
        budget = self.plan.shadow_requests or MAX_SHADOWED
        seconds = self.plan.shadow_seconds or self.plan.timeout_s
        timeout = float(self.cfg.serve.request_timeout_s)
        self.call("start_shadow", self.model, budget, timeout, seconds)
        what = f"the next {budget} requests" if self.plan.shadow_requests else f"every request for {seconds:g} s"
        self.progress(f"shadowing {what} to v{self.version} (clients get v{self.live}'s answers) ...")
        deadline = time.monotonic() + seconds
        samples: list[dict[str, Any]] = []
        thresholds: dict[str, float] | None = None
        checked = 0.0
        while True:
            progress = self.call("progress", self.model)
            if progress["count"] > len(samples):
                samples += self.call("samples", self.model, len(samples))
            if thresholds is None and any(s.get("backend") for s in samples):
                thresholds = self._thresholds(samples)
            timed_out = time.monotonic() > deadline
            final = progress["count"] >= budget or timed_out
            if timed_out and self.plan.shadow_requests and progress["count"] < budget:
                reason = f"only {progress['count']} of {budget} requests were shadowed within {seconds:g} s"
                return ShadowVerdict(False, True, reason + ": not enough live traffic to judge it")
            verdict = judge_shadow(
                samples, thresholds or {}, self.kind, budget, final=final, max_slowdown=self.plan.max_slowdown
            )
            if verdict.decided:
                self.call("stop_shadow", self.model)
                return verdict
            if time.monotonic() - checked > 1.0:
                checked = time.monotonic()
                self._check_alive()
            time.sleep(POLL_S)

    def promote(self) -> tuple[float, float]:
        from ..serve.candidate import remove_version, replica_count

        replicas = replica_count(version_app(self.model, self.live))
        # the guards stop tagging copies at their next refresh and the copies sent finish: the swap does not
        # run on cores the shadow still takes
        time.sleep(ROUTING_TTL_S + 0.5)
        start = time.time()
        self.call("promote", self.model, self.version)
        self.progress(f"promoting v{self.version}: unversioned requests move to it; v{self.live} drains ...")
        time.sleep(2 * ROUTING_TTL_S + 0.5)  # every guard has read the new routing: nothing new reaches the old one
        if not remove_version(version_app(self.model, self.live), self._remove_s()):
            self.notes.append(f"v{self.live} was still stopping after {self._remove_s():g} s")
        self.call("drop", self.model, self.live)
        end = time.time()
        if replicas > 1:
            self.notes.append(f"v{self.version} serves with 1 replica (v{self.live} had {replicas}): scale it")
        return start, end

    def roll_back(self) -> tuple[float, float]:
        from ..serve.candidate import remove_version

        start = time.time()
        self.call("stop_shadow", self.model)
        if not remove_version(version_app(self.model, self.version), self._remove_s()):
            self.notes.append(f"v{self.version} was still stopping after {self._remove_s():g} s")
        self.call("drop", self.model, self.version)
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
        self.call("finish", self.model, entry)

    # ---------------------------------------------------------------- helpers

    def _thresholds(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        cand = next(s["backend"] for s in samples if s.get("backend"))
        live = next((s["live_backend"] for s in samples if s.get("live_backend")), None)
        validation = self.cfg.validation
        mine = backend_thresholds(self.artifacts.manifest.get("validation"), cand, validation)
        theirs = backend_thresholds(None, live, validation) if live else None
        return gate_thresholds(mine, theirs)

    def _check_alive(self) -> None:
        """BackendError when the candidate's application failed (its replica crashed and could not be restarted)."""
        from ray import serve

        status = serve.status().applications.get(version_app(self.model, self.version))
        state = str(getattr(status, "status", "gone"))
        if status is None or state.endswith(("DEPLOY_FAILED", "UNHEALTHY")):
            raise BackendError(f"v{self.version} failed while shadowed ({state.rsplit('.', 1)[-1]})")

    def _remove_s(self) -> float:
        return float(self.cfg.serve.graceful_shutdown_timeout_s) + REMOVE_EXTRA_S


# ------------------------------------------------------------------------------------------------ status


def rollout_status(address: Optional[str]) -> dict[str, Any]:
    """The registry's account: every model's versions and the rollouts' history ({} when none ever ran)."""
    ray = connect(address)
    registry = registry_actor()
    return ray.get(registry.status.remote()) if registry is not None else {"models": {}, "history": []}


def format_status(status: dict[str, Any], model: Optional[str] = None) -> list[str]:
    """`vitdeploy rollout --status` as lines: each model's live version and versions, then the history."""
    lines = []
    for name, state in sorted(status.get("models", {}).items()):
        if model and name != model:
            continue
        versions = ", ".join(f"v{n} {e['state']}" for n, e in state["versions"].items())
        lines.append(f"{name}: live v{state['live']} ({versions})")
    history = [h for h in status.get("history", []) if not model or h.get("model") == model]
    if not history:
        return lines + ["no rollout yet"]
    lines.append(f"{'model':<16} {'version':>7}  {'export':<12}  {'backend':<8}  {'when':<16}  verdict")
    for h in history:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(h.get("ended") or 0))
        sha = str(h.get("sha") or "?")[:12]
        line = f"{h['model']:<16} {'v' + str(h['version']):>7}  {sha:<12}  {str(h.get('backend')):<8}  {when:<16}  "
        figures = h.get("figures") or {}
        why = summary(figures) if h["verdict"] == PROMOTED else h.get("reason", "")
        lines.append(f"{line}{h['verdict']}: {why}")
    return lines


__all__ = ["PROMOTED", "ROLLED_BACK", "RolloutPlan", "RolloutResult", "format_status", "rollout_status", "run_rollout"]
