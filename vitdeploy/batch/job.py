"""`vitdeploy batch-predict`: a Ray Data job that classifies image collections (or embeds them), resumable.

    summary = run_batch(BatchSettings(inputs=["photos/"], artifacts="artifacts/", output="scores/"),
                        max_pixels=cfg.runtime.max_image_pixels, options=BackendOptions())

The pipeline is Ray Data's, end to end: ``read_binary_files`` reads the bytes, decoding tasks
(:func:`~.workers.decode_batch`) preprocess them, an actor pool of Predictors (:class:`~.workers.Infer`)
runs the model in batches of the export's ``opt`` and takes the top-k (an embedding export: keeps the
vectors); the driver writes the small result rows (:mod:`.output`). The artifacts travel to every node
through Ray's object store (:func:`~vitdeploy.runtime.artifact_transfer.pack`, put once), or each node
fetches an artifacts URI itself; each node unpacks them once into its cache, sha256-verified. Without
``address`` a local Ray is started for the job and stopped after it; an already-initialised Ray (a test,
a notebook) is used as it is.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..base._deps import require
from ..base.config import BatchSection
from ..base.errors import InputError, VitDeployError
from ..base.ray_join import init_ray
from ..base.ray_private import local_ray_options
from ..base.vocab import EMBEDDING_DTYPES
from ..runtime.backends import first_line, shipped_roles
from .inputs import Item, expand_inputs, is_uri, read_key
from .output import Output, row_schema
from .workers import BYTES_NAME, DecodeSpec, Infer, InferSpec, decode_batch

log = logging.getLogger(__name__)


class BatchSettings(BatchSection):
    """Everything `vitdeploy batch-predict` was asked for, after the command line overrode the config: pipeline.yaml's
    ``batch`` section (its fields, defaults and checks: the worker pool, the output's files) and what the job adds."""

    inputs: Sequence[str]
    artifacts: str
    output: str
    backend: str = "auto"
    top_k: int = 5
    resume: bool = False
    address: str | None = None
    progress_bars: bool = False
    verify_key: str | None = None  # runtime.verify.public_key: only an export that key signed (runtime/signature.py)


@dataclass
class BatchSummary:
    """What a job did: ``images`` rows written now, ``skipped`` inputs answered before, errors among each."""

    output: str
    images: int = 0
    errors: int = 0
    skipped: int = 0
    skipped_errors: int = 0
    wall_s: float = 0.0
    nodes: dict[str, int] = field(default_factory=dict)

    @property
    def images_per_s(self) -> float:
        return self.images / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def failed(self) -> int:
        """Inputs whose row in the output is an error (this run and earlier ones)."""
        return self.errors + self.skipped_errors

    def line(self) -> str:
        if self.images == 0 and self.skipped:
            return (
                f"nothing to do: all {self.skipped} inputs already answered in {self.output} "
                f"({self.skipped_errors} errors)"
            )
        done = f", {self.skipped} already answered" if self.skipped else ""
        return (
            f"{self.images} images, {self.errors} errors{done}, {self.images_per_s:.1f} images/s, "
            f"{self.wall_s:.1f} s wall -> {self.output}"
        )


def run_batch(
    settings: BatchSettings, *, options: Any, max_pixels: int, progress: Callable[[str], None] | None = None
) -> BatchSummary:
    """Run the job; returns its summary (``summary.failed`` > 0: some inputs could not be read)."""
    say = progress or (lambda line: None)
    start = time.perf_counter()
    artifacts = _open_artifacts(settings)  # a bad export is one clear error before Ray starts
    output = Output.at(settings.output, _rows_of(artifacts, settings))
    if output.exists() and not settings.resume:
        output.writer(resume=False)  # raises: exists, pass --resume
    answered = output.answered() if settings.resume else {}
    items = expand_inputs(settings.inputs)
    todo = [it for it in items if it.path not in answered]
    summary = BatchSummary(str(output.path), skipped=len(items) - len(todo))
    summary.skipped_errors = sum(answered[it.path] is not None for it in items if it.path in answered)
    if not todo:
        summary.wall_s = time.perf_counter() - start
        return summary
    bad = [it for it in todo if it.error is not None]
    good = [it for it in todo if it.error is None]
    embedding = artifacts.schema.is_embedding
    say(
        f"{len(todo)} inputs to answer"
        + (f" ({summary.skipped} already in {output.path})" if summary.skipped else "")
        + (f" with embeddings of {artifacts.schema.num_classes} {settings.embedding_dtype}" if embedding else "")
        + f": backend {settings.backend}, workers {settings.workers}, batches of "
        f"{settings.batch_size or artifacts.batch['opt']}, "
        + (f"Ray at {settings.address}" if settings.address else "a local Ray")
    )
    writer = output.writer(
        resume=settings.resume, rows_per_file=settings.rows_per_file, flush_seconds=settings.flush_seconds
    )
    try:
        if bad:
            writer.write(output.empty_rows([it.path for it in bad], [str(it.error) for it in bad]))
            summary.images += len(bad)
            summary.errors += len(bad)
        if good:
            _run_pipeline(settings, artifacts, good, writer, summary, options, max_pixels, say)
    except BaseException:
        writer.flush()  # the rows answered so far stay, beside the final name, for --resume
        raise
    writer.close()
    summary.wall_s = time.perf_counter() - start
    return summary


def _open_artifacts(settings: BatchSettings) -> Any:
    from ..runtime.artifacts import Artifacts
    from ..runtime.backends import ensure_known

    ensure_known(settings.backend)
    if is_uri(settings.artifacts):
        from ..runtime.artifact_transfer import fetch_uri

        if settings.verify_key is not None:
            from ..runtime.signature import verify_uri

            verify_uri(settings.artifacts, settings.verify_key)
        return fetch_uri(settings.artifacts, functools.partial(shipped_roles, settings.backend), settings.cache_dir)
    return Artifacts.open(settings.artifacts, public_key=settings.verify_key)


def _rows_of(artifacts: Any, settings: BatchSettings) -> Any:
    """The output's row schema: a classifier's top-k, or an embedding export's vectors (``embedding_dtype``; and
    their patch tokens with ``patch_tokens``: InputError when the export has none)."""
    if settings.patch_tokens and artifacts.schema.patch_shape is None:
        raise InputError(
            f"--patch-tokens (batch.patch_tokens): {artifacts.name} was exported without patch tokens; export it "
            "with model.output: embedding and model.patch_tokens: true, or drop the option"
        )
    if artifacts.schema.is_embedding:
        patches = artifacts.schema.patch_shape if settings.patch_tokens else None
        return row_schema(artifacts.schema.num_classes, settings.embedding_dtype, patches)
    if settings.embedding_dtype != EMBEDDING_DTYPES[0]:
        log.warning(
            "embedding dtype %s ignored: %s is a classifier (its rows hold labels and scores, no vectors)",
            settings.embedding_dtype,
            artifacts.name,
        )
    return row_schema()


def pool_size(settings: BatchSettings, *, local: bool, cores: int) -> tuple[int, float | None]:
    """(inference actors, logical CPUs for a Ray this job starts or None) for ``batch.workers``.

    "auto" on a Ray started here without GPUs: one actor per ``cpus_per_worker`` of the machine's cores, each
    with its own ONNX Runtime threads, and Ray gets ``decode_cpus`` more logical CPUs so the decoding tasks
    run beside them. Actors of one thread each beat one actor of every core's threads on one machine: a
    decoding task beside a multi-threaded model call holds one of its cores while the call's other threads
    wait (ViT-S/16 on 2 cores: 0.90-0.94x predict against 0.81-0.86x, benchmarks/bench_batch.py).
    "auto" on a cluster (``--address``, or a Ray this process already runs) or with GPUs: 1."""
    if settings.workers != "auto":
        return int(settings.workers), None
    if not local or settings.gpus_per_worker > 0:
        return 1, None
    workers = max(1, int(cores // max(1.0, settings.cpus_per_worker)))
    return workers, max(float(cores), workers * settings.cpus_per_worker + settings.decode_cpus)


def actor_options(options: Any, settings: BatchSettings) -> Any:
    """The BackendOptions of each inference actor: as many intra-op threads as the CPUs Ray gives it
    (``batch.cpus_per_worker``, whole CPUs), whatever ``runtime.threads`` says, since that is one predictor's
    figure: two actors of ``runtime.threads: 2`` each ran 4 threads on 2 cores (ViT-S/16 steady state 0.77-0.82x
    ``predict`` against 0.86-0.91x with one thread each, benchmarks/README.md). A fraction of a CPU keeps
    ``runtime.threads`` (or the library's default)."""
    if settings.cpus_per_worker < 1:
        return options
    threads = int(settings.cpus_per_worker)
    if options.threads is not None and options.threads != threads:
        log.info(
            "batch workers run %d intra-op thread(s) each (batch.cpus_per_worker %g), not runtime.threads %d "
            "(a predictor's): set batch.cpus_per_worker for more",
            threads,
            settings.cpus_per_worker,
            options.threads,
        )
    return dataclasses.replace(options, threads=threads)


def _connect(ray: Any, settings: BatchSettings) -> tuple[bool, BatchSettings]:
    """Start (or join) Ray unless this process already did: (True when this job must shut it down, the
    settings with ``workers`` resolved by :func:`pool_size` and ``address`` the cluster joined, None: its own)."""
    owned = not ray.is_initialized()
    # --address, else RAY_ADDRESS (set for a job that `ray job submit` runs on a cluster), else a Ray of its own:
    # "local", because Ray would join any Ray that happens to run on this machine (`ray start`, another job)
    address = settings.address or os.environ.get("RAY_ADDRESS") or None
    workers, cpus = pool_size(settings, local=owned and address is None, cores=os.cpu_count() or 1)
    if owned:
        init_ray(
            ray,
            address or "local",
            num_cpus=cpus,
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=False,
            **local_ray_options(None, loopback=address is None),  # a Ray of its own: every port on 127.0.0.1
        )
    return owned, settings.model_copy(update={"workers": workers, "address": address})


def _run_pipeline(
    settings: BatchSettings,
    artifacts: Any,
    items: list[Item],
    writer: Any,
    summary: BatchSummary,
    options: Any,
    max_pixels: int,
    say: Callable[[str], None],
) -> None:
    ray = require("ray", "vitdeploy batch-predict (pip install 'vitdeploy[batch]')")
    require("ray.data", "vitdeploy batch-predict (pip install 'vitdeploy[batch]')")
    auto = settings.workers == "auto"
    owned, settings = _connect(ray, settings)
    if auto:
        where = "this machine" if owned and not settings.address else "a cluster"
        say(f"workers auto: {settings.workers} on {where}")
    try:
        _check_resources(ray.cluster_resources(), settings, strict=owned)
        in_place = owned and settings.address is None
        dataset = _dataset(ray, settings, artifacts, items, options, max_pixels, in_place)
        shown = {read_key(it.read): it.path for it in items}
        seen: set[str] = set()
        try:
            for table in dataset.iter_batches(batch_format="pyarrow", batch_size=None):
                _collect(table, shown, seen, writer, summary)
        except VitDeployError:
            raise
        except Exception as exc:  # noqa: BLE001 - a worker's failure arrives wrapped by Ray
            raise _unwrap(exc) from None
        missing = [it.path for it in items if it.path not in seen]
        if missing:  # vanished between listing and reading
            writer.write(writer.output.empty_rows(missing, [f"{p}: no such file" for p in missing]))
            summary.images += len(missing)
            summary.errors += len(missing)
    finally:
        if owned:
            ray.shutdown()


def _check_resources(have: dict[str, float], settings: BatchSettings, *, strict: bool) -> None:
    """The actor pool must leave room for a read or decoding task, or the job waits forever. A ConfigError on a
    Ray started here; a warning on a cluster joined with --address (an autoscaler may add nodes)."""
    from ..base.errors import ConfigError

    cpus, gpus = have.get("CPU", 0.0), have.get("GPU", 0.0)
    need_cpu = settings.workers * settings.cpus_per_worker + settings.decode_cpus
    need_gpu = settings.workers * settings.gpus_per_worker
    problems = []
    if need_cpu > cpus:
        problems.append(
            f"{settings.workers} worker(s) x batch.cpus_per_worker {settings.cpus_per_worker:g} + "
            f"batch.decode_cpus {settings.decode_cpus:g} = {need_cpu:g} CPUs, the cluster has {cpus:g}"
        )
    if need_gpu > gpus:
        problems.append(
            f"{settings.workers} worker(s) x batch.gpus_per_worker {settings.gpus_per_worker:g} = "
            f"{need_gpu:g} GPUs, the cluster has {gpus:g}"
        )
    if not problems:
        return
    message = (
        "batch-predict cannot schedule its workers: "
        + "; ".join(problems)
        + "; lower --workers, batch.cpus_per_worker or batch.decode_cpus (fractions are fine), "
        "or run on a larger cluster (--address)"
    )
    if strict:
        raise ConfigError(message)
    log.warning("%s (waiting for the cluster to grow)", message)


def _dataset(
    ray: Any, settings: BatchSettings, artifacts: Any, items: list[Item], options: Any, max_pixels: int, in_place: bool
) -> Any:
    """The Ray Data pipeline: read bytes, decode in CPU tasks, infer in the actor pool. ``in_place``: the Ray is
    this job's own (every worker on this machine), so workers open the artifact folder where it lies; else the
    folder travels through the object store (or the workers fetch the URI)."""
    import ray.data as rd

    ctx = rd.DataContext.get_current()
    ctx.enable_progress_bars = settings.progress_bars
    batch_size = settings.batch_size or int(artifacts.batch["opt"])
    options = actor_options(options, settings)
    roles = shipped_roles(settings.backend, artifacts)
    if is_uri(settings.artifacts):
        source: tuple[str, Any] = ("uri", settings.artifacts)
    elif in_place:  # every worker runs on this machine: it opens the folder verified here, no copy
        digest = hashlib.sha256(artifacts.manifest_path.read_bytes()).hexdigest()
        source = ("folder", (str(artifacts.directory), digest, roles or artifacts.roles))
    else:
        from ..runtime.artifact_transfer import pack

        source = ("bundle", [ray.put(pack(artifacts, roles))])  # in a list: the actor fetches it
    by_scheme: dict[str, list[str]] = {}
    for it in items:
        by_scheme.setdefault(it.read.partition("://")[0] if is_uri(it.read) else "", []).append(it.read)
    # Reading bytes gets the decoding tasks' CPUs (Ray Data's default, 1, would deadlock beside a full actor pool).
    parts = [
        rd.read_binary_files(reads, include_paths=True, ignore_missing_paths=True, num_cpus=settings.decode_cpus)
        for reads in by_scheme.values()
    ]
    ds = parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]
    ds = ds.map_batches(
        decode_batch,
        fn_kwargs={"spec": DecodeSpec(artifacts.preprocess, max_pixels)},
        batch_size=batch_size,
        num_cpus=settings.decode_cpus,
        batch_format="numpy",
        compute=rd.TaskPoolStrategy(),
        memory=_decode_memory(batch_size, artifacts.input_shape),
    )
    spec = InferSpec(
        source,
        settings.backend,
        options,
        settings.top_k,
        settings.cache_dir,
        settings.embedding_dtype,
        settings.patch_tokens,
    )
    return ds.map_batches(
        Infer,
        fn_constructor_args=(spec,),
        batch_size=batch_size,
        batch_format="numpy",
        compute=rd.ActorPoolStrategy(size=settings.workers),
        num_cpus=settings.cpus_per_worker,
        num_gpus=settings.gpus_per_worker or None,
    )


def _decode_memory(batch_size: int, chw: Sequence[int]) -> int:
    """Bytes a decoding task holds: its pixels twice over plus room for the decoded images. Asking for it
    also keeps the tasks apart from the inference actors (Ray Data fuses operators with equal requests),
    so decoding scales with the cluster's CPUs while the actors only run the model."""
    c, h, w = (int(v) for v in chw)
    return 2 * batch_size * c * h * w * 4 + (64 << 20)


def _collect(table: Any, shown: dict[str, str], seen: set[str], writer: Any, summary: BatchSummary) -> None:
    """Rows from the workers: paths back to their spelling, ``<bytes>`` in messages to the path, then written."""
    pa = require("pyarrow", "batch-predict output")
    for node, count in Counter(table.column("node").to_pylist()).items():
        summary.nodes[node] = summary.nodes.get(node, 0) + count
    keys = table.column("path").to_pylist()
    paths = [shown.get(k, k) for k in keys]
    errors = [
        e if e is None or not e.startswith(BYTES_NAME) else p + e[len(BYTES_NAME) :]
        for p, e in zip(paths, table.column("error").to_pylist())
    ]
    keep = [i for i, p in enumerate(paths) if p not in seen]  # a retried block never gives a second row
    seen.update(paths)
    out = table.drop_columns(["node"]).set_column(0, "path", pa.array(paths, pa.string()))
    out = out.set_column(out.schema.get_field_index("error"), "error", pa.array(errors, pa.string()))
    if len(keep) != len(paths):
        out = out.take(keep)
    writer.write(out)
    summary.images += out.num_rows
    summary.errors += sum(errors[i] is not None for i in keep)


def _unwrap(exc: BaseException) -> VitDeployError:
    """The worker's own VitDeployError when there is one (one line, its exit code), else a BackendError."""
    from ..base.errors import BackendError

    seen = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        original = getattr(cur, "cause", None)
        if isinstance(original, VitDeployError) and type(original) is not type(cur):
            return type(original)(first_line(original))
        if isinstance(cur, VitDeployError) and not hasattr(cur, "cause"):
            return type(cur)(first_line(cur))
        cur = original if isinstance(original, BaseException) else cur.__cause__
    return BackendError(f"batch job failed on a Ray worker: {first_line(exc)}")


def batch_settings_from_config(
    cfg: Any, inputs: Sequence[str], *, artifacts: str | None, output: str, **overrides: Any
) -> BatchSettings:
    """The job's settings: pipeline.yaml's ``batch`` and ``runtime`` sections, then the command line's
    ``overrides`` (a None value keeps the config's)."""
    bt, rt = cfg.batch, cfg.runtime
    base = BatchSettings(
        **{**bt.model_dump(), "cache_dir": cfg.resolve(bt.cache_dir)},
        inputs=list(inputs),
        artifacts=artifacts or os.fspath(cfg.output_dir),
        output=output,
        backend=rt.backend,
        top_k=rt.top_k,
        verify_key=os.fspath(cfg.verify_key) if cfg.verify_key is not None else None,
    )
    return base.model_copy(update={k: v for k, v in overrides.items() if v is not None})


__all__ = ["BatchSettings", "BatchSummary", "actor_options", "batch_settings_from_config", "run_batch"]
