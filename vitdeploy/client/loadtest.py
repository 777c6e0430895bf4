"""``vitdeploy loadtest``: load levels against a server, the figures of each, and which were the client's limit.

    report = run_loadtest(LoadPlan(Target("http://127.0.0.1:8000", V2_HTTP, "vit"), images, concurrency=(1, 4, 16)))
    print("\\n".join(format_loadtest(report)))

A sweep runs each level in turn after a short warm-up (not counted): closed loop at each concurrency, or
open loop at each rate (see loadgen.py). Each level reads the server's statistics before and after
(server_stats.py). A level where the load generator used most of a core (its Python threads share one
interpreter lock) or most of a machine it shares with the server is flagged: there the client, not the
server, may have been the limit.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..base.errors import ConfigError
from ..evaluate.reliability import usable_cores
from ..serve.stage_timing import STAGES, TOTAL
from . import server_stats
from .loadgen import LevelResult, closed_loop, open_loop
from .protocols import Target, open_client

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff")
#: a client above this share of one core is near what its interpreter lock lets it do
CLIENT_CORE_LIMIT = 0.85
#: on a machine shared with the server, a client above this share of all the cores took what the server needed
SHARED_SHARE_LIMIT = 0.4

Progress = Callable[[str], None]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadPlan:
    target: Target
    images: Sequence[bytes]
    concurrency: tuple[int, ...] = ()
    rates: tuple[float, ...] = ()
    duration_s: Optional[float] = 20.0
    requests: Optional[int] = None
    poisson: bool = False
    warmup_s: float = 2.0
    connections: int = 64  # open loop: the most requests in flight at once

    def __post_init__(self) -> None:
        if bool(self.concurrency) == bool(self.rates):
            raise ConfigError("give either --concurrency or --rate (one list of levels), not both")
        if not self.images:
            raise ConfigError("no images to send")
        if not self.duration_s and not self.requests:
            raise ConfigError("give --duration or --requests")


@dataclass
class LoadReport:
    target: dict
    levels: list[LevelResult] = field(default_factory=list)
    cores: int = 1
    shared_machine: bool = False
    flags: dict[int, str] = field(default_factory=dict)  # level index -> why the client may have been the limit

    def to_dict(self) -> dict:
        return {
            "format": "vitdeploy-loadtest",
            "target": self.target,
            "cores": self.cores,
            "shared_machine": self.shared_machine,
            "levels": [{**lv.to_dict(), "client_limited": self.flags.get(i)} for i, lv in enumerate(self.levels)],
        }


def is_local(host: str) -> bool:
    """Whether ``host`` is this machine (loopback, or one of its own addresses)."""
    if host in ("localhost", ""):
        return True
    try:
        addr = ipaddress.ip_address(socket.gethostbyname(host))
    except (OSError, ValueError):
        return False
    if addr.is_loopback:
        return True
    try:
        own = {i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        own = set()
    return str(addr) in own


def client_limit(level: LevelResult, cores: int, shared: bool) -> Optional[str]:
    """Why the load generator, not the server, may have been the limit of ``level``, or None."""
    used = level.client_cores
    if used >= CLIENT_CORE_LIMIT:
        return f"the load generator used {used:.2f} cores (its threads share one interpreter: near its limit)"
    if shared and used >= SHARED_SHARE_LIMIT * cores:
        return f"the load generator used {used:.2f} of the {cores} cores it shares with the server"
    return None


def run_loadtest(plan: LoadPlan, progress: Progress = lambda _: None) -> LoadReport:
    target = plan.target
    factory = lambda: open_client(target)  # noqa: E731
    cores = usable_cores()
    shared = is_local(target.host)
    report = LoadReport(
        target={"url": target.url, "protocol": target.protocol, "model": target.model, "token": bool(target.token)},
        cores=cores,
        shared_machine=shared,
    )
    if plan.warmup_s > 0:
        warm = closed_loop(factory, plan.images, max(plan.concurrency or (1,)), duration_s=plan.warmup_s)
        if not warm.ok:
            status, n = next(iter(warm.errors.items()), ("no answer", 0))
            example = warm.examples.get(status, "")
            said = f": {example}" if example else ""
            raise ConfigError(f"{target.url}: no request of the warm-up was answered ({n} x {status}{said})")
    levels = [("concurrency", c) for c in plan.concurrency] + [("rate", r) for r in plan.rates]
    for mode, level in levels:
        before = server_stats.read(target)
        if mode == "concurrency":
            result = closed_loop(factory, plan.images, int(level), plan.duration_s, plan.requests)
        else:
            result = open_loop(
                factory, plan.images, float(level), plan.duration_s, plan.requests, plan.poisson, plan.connections
            )
        result.server = server_stats.delta(before, server_stats.read_settled(target, before, result.ok))
        report.levels.append(result)
        why = client_limit(result, cores, shared)
        if why:
            report.flags[len(report.levels) - 1] = why
        progress(_progress_line(result))
    return report


def save_loadtest(report: LoadReport, artifacts: Path) -> Optional[Path]:
    """``report`` as ``loadtest-report.json`` beside the export the server runs (the last one replaces the one
    before, as tune's tune-report.json does); `vitdeploy report` draws its stage split. None (with a warning)
    where that folder cannot be written."""
    import datetime as _dt

    from ..base._files import write_json_atomic
    from ..base.vocab import LOADTEST_REPORT_NAME

    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    try:
        return write_json_atomic(Path(artifacts) / LOADTEST_REPORT_NAME, {**report.to_dict(), "created": created})
    except OSError as exc:
        log.warning("loadtest result not saved in %s: %s", artifacts, exc)
        return None


def _progress_line(r: LevelResult) -> str:
    return (
        f"{r.mode} {r.level:g}: {r.throughput:.1f} req/s, p99 {r.percentile(99):.1f} ms, "
        f"{sum(r.errors.values())} error(s)"
    )


def format_loadtest(report: LoadReport) -> list[str]:
    """The table: one row per level, then the errors with one example each, the flags and the machine note."""
    t = report.target
    lines = [f"{t['url']} ({t['protocol']}{', model ' + t['model'] if t['model'] else ''})"]
    head = f"{'level':>10} {'sent':>7} {'req/s':>8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8} "
    head += f"{'errors':>7} {'client':>6}  server: batch queue/infer ms"
    lines += [head, "-" * len(head)]
    for i, r in enumerate(report.levels):
        name = f"{r.level:g}" + ("/s" if r.mode == "rate" else " c")
        s = r.server or {}
        server = (
            f"{s.get('mean_batch') or '-'} {_ms(s.get('queue_ms'))}/{_ms(s.get('compute_infer_ms'))}" if s else "-"
        )
        lines.append(
            f"{name:>10} {r.sent:>7} {r.throughput:>8.1f} {r.percentile(50):>8.1f} {r.percentile(90):>8.1f} "
            f"{r.percentile(99):>8.1f} {r.percentile(100):>8.1f} {sum(r.errors.values()):>7} "
            f"{r.client_cores:>6.2f}{' *' if i in report.flags else '  '} {server}"
        )
    lines += format_stage_split(report.levels)
    for i, r in enumerate(report.levels):
        for status, n in r.errors.items():
            example = r.examples.get(status, "")
            lines.append(f"  {r.level:g}: {n} x {status}" + (f": {example.splitlines()[0][:160]}" if example else ""))
    for i, why in report.flags.items():
        lines.append(f"  * {report.levels[i].level:g}: {why}: the client, not the server, may be the limit")
    if report.shared_machine:
        lines.append(
            f"client and server share this machine's {report.cores} cores: every figure includes the load "
            "generator's own CPU (client column, in cores)"
        )
    if any(r.mode == "rate" for r in report.levels):
        lines.append("open loop: each latency runs from when the request was due, so a server's queue shows in it")
    return lines


def format_stage_split(levels: Sequence[LevelResult]) -> list[str]:
    """The server's own split of each level's answered requests (its Server-Timing headers): mean ms per stage,
    the batch the model call shared, and how much of the client's mean latency the replica accounts for (the
    rest: network, the HTTP proxy, Ray's routing). [] when no answer carried the header (gRPC, Triton)."""
    if not any(r.stages for r in levels):
        return []
    names = (*STAGES, TOTAL)
    head = f"{'level':>10} " + " ".join(f"{n:>7}" for n in names) + f" {'batch':>6} {'replica':>8}"
    lines = ["server stage split (Server-Timing, mean ms per answered request):", head]
    for r in levels:
        name = f"{r.level:g}" + ("/s" if r.mode == "rate" else " c")
        if not r.stages:
            lines.append(f"{name:>10} -")
            continue
        client = sum(r.latencies_ms) / len(r.latencies_ms) if r.latencies_ms else 0.0
        share = f"{100 * r.stages.get(TOTAL, 0.0) / client:.0f}%" if client > 0 else "-"
        cells = " ".join(f"{r.stages.get(n, 0.0):>7.2f}" for n in names)
        lines.append(f"{name:>10} {cells} {r.stages.get('batch', 0.0):>6.1f} {share:>8}")
    lines.append("  replica: the replica's total as a share of the client's mean latency (the rest: network, proxy)")
    return lines


def _ms(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.1f}"


def load_images(folder: Optional[Path]) -> list[bytes]:
    """The image files of ``folder`` (sorted, not recursive), as bytes; the demo images when None."""
    if folder is None:
        from ..demo import IMAGES_DIR

        folder = IMAGES_DIR
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"--images {folder}: not a folder")
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise ConfigError(f"--images {folder}: no image files ({', '.join(IMAGE_SUFFIXES)})")
    return [p.read_bytes() for p in files]


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$")


def parse_duration(text: str, flag: str = "--duration") -> float:
    """``"20s"``, ``"2m"``, ``"500ms"``, ``"1h"`` or plain seconds -> seconds (> 0)."""
    match = _DURATION.match(str(text))
    if not match or float(match.group(1)) <= 0:
        raise ConfigError(f"{flag} {text!r}: expected a positive duration such as 20s, 2m, 500ms")
    scale = {"ms": 0.001, "s": 1, None: 1, "m": 60, "min": 60, "h": 3600}[match.group(2)]
    return float(match.group(1)) * scale


def parse_levels(text: str, flag: str, kind: type = int) -> tuple:
    try:
        levels = tuple(kind(v) for v in str(text).split(",") if v.strip())
    except ValueError:
        levels = ()
    if not levels or any(v <= 0 for v in levels):
        raise ConfigError(f"{flag} {text!r}: expected comma-separated positive numbers such as 1,4,16")
    return levels


__all__ = [
    "LoadPlan",
    "LoadReport",
    "run_loadtest",
    "save_loadtest",
    "format_loadtest",
    "format_stage_split",
    "client_limit",
    "is_local",
    "load_images",
    "parse_duration",
    "parse_levels",
]
