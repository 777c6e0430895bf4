"""`vitdeploy validate --url`: what the clients of a running server get, judged against eager PyTorch.

    check = check_served("artifacts/", "http://127.0.0.1:8000", protocol="v2-http", model="vit-demo-digits")
    print("\\n".join(format_served(check)))          # vitdeploy.client.served_report
    check.raise_for_failures()                        # exit 3 when refused or past the gate

0. A model whose metadata lists several versions (a `vitdeploy rollout` under way) is judged on its live one
   (who answers its unversioned statistics): every request names that version's route
   (``/v2/models/<m>/versions/K/...``, gRPC ``model_version``) and a note says which; one version: unchanged.
1. The model's configuration (``GET /v2/models/<m>/config``, gRPC ``ModelConfig``) says which export the server
   runs and on which backend (:data:`~vitdeploy.serve.protocol.EXPORT_SHA256`, ``EXPORT_BACKEND``): a server on
   another export than ``-a`` is refused at once, in one line naming both; the backend chooses the thresholds
   (``validation.fp32`` / ``fp16`` / ``int8``) unless ``--backend`` does. Behind a Triton ensemble, each step's
   preprocessing recipe is compared with the export's: an edited mean, std or resize filter is named.
2. Every validation image goes as its file's bytes, one per request, as a client sends it (:mod:`.clients`):
   ``POST /predict``, or KServe v2 ``IMAGES`` over HTTP or gRPC asking for ``LOGITS`` (an embedding model:
   ``EMBEDDINGS``). A few clients send at once; each answer belongs to its image whatever the batching.
3. The same images, preprocessed here with the export's recipe, go through eager FP32 PyTorch, and the answers
   are judged as `validate` judges a backend (:func:`vitdeploy.evaluate.drift.judge_backend`). ``/predict``
   answers the top-k scores only (the export's score function: softmax, or SigLIP's sigmoid): they are compared
   as log-probabilities (for softmax the logits up to a constant per image) with eager's; a class outside an
   answer's top-k is given the highest value it could have had (the answer's k-th), so each difference is a
   lower bound; no cosine is judged there.

An export for several sizes is checked at one size per run: its base size, or ``image_size`` (``--image-size``),
which every request asks of the server (``/predict?image_size=N``, v2 ``parameters.image_size``) and at which
the images are preprocessed for eager PyTorch; a size the export does not list is refused before any request.

Exit codes (the CLI's): 0 passed; 3 past the gate or refused (another export); 2 bad input (no token, an
unknown model, an export or image folder that is none); 4 the server does not answer.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..base.errors import ConfigError, InputError, ServerUnreachableError
from ..base.output_spec import EMBEDDING
from ..base.vocab import (
    BACKEND_KINDS,
    DRIFT_REPORT_NAME,
    EVALUATED_BACKENDS,
    EXPORT_BACKEND,
    EXPORT_SHA256,
    PRECISIONS,
)
from ..evaluate.drift import default_thresholds, eager_reference, validation_batch
from ..evaluate.drift_judge import accuracy, judge_backend
from ..evaluate.drift_report import BackendDrift, DriftReport, images_summary, reference_summary
from ..runtime.postprocess import log_probabilities
from ..serve.auth import TOKEN_ENV
from ..serve.outputs import EMBEDDINGS, LOGITS
from ..serve.protocol import model_name, served_export
from ..serve.triton.config import PREPROCESS_PARAM
from .protocols import CONNECTION_ERROR, OK, PREDICT, V2_GRPC, Target, live_version, model_document, open_client
from .served_report import SERVED, ServedCheck, save_served

log = logging.getLogger(__name__)

#: requests in flight at once (each client holds one connection)
CLIENTS = 4
_UNAUTHORIZED = ("401", "UNAUTHENTICATED")
_NOT_FOUND = ("404", "NOT_FOUND")


@dataclass
class ServerFacts:
    """What the server says about the model: the export and backend, and how its preprocessing differs."""

    sha256: str | None = None
    backend: str | None = None
    preprocess_differences: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------
# what the server says


def _refuse_status(status: str, what: str, target: Target) -> None:
    """The one-line error of a status that makes the check impossible (no server, no token, no model)."""
    if status == CONNECTION_ERROR:
        raise ServerUnreachableError(
            f"the server at {target.url} does not answer ({what}); is it running, and is {target.url} its "
            f"{'gRPC' if target.protocol == V2_GRPC else 'HTTP'} address?"
        )
    if status in _UNAUTHORIZED:
        fix = "the token sent is not the server's" if target.token else "no token was sent"
        raise ConfigError(
            f"the server at {target.url} wants its serve token ({fix}): set {TOKEN_ENV}, or serve.token_file "
            f"in -c, as for `vitdeploy serve`"
        )


def read_server_facts(target: Target, model: str, artifacts: Any) -> ServerFacts:
    """The export, backend and preprocessing the server states for ``model`` (its v2 configuration; of the
    version the target names, if any)."""
    status, doc = model_document(target, model, version=target.version)
    if status not in OK:
        _refuse_status(status, str(doc), target)
    if status in _NOT_FOUND and target.protocol != PREDICT:
        raise InputError(f"the server at {target.url} has no model {model!r} (--model): {doc}")
    if status not in OK:
        hint = f"; --model names the model it serves (not {model!r}?)" if status in _NOT_FOUND else ""
        return ServerFacts(notes=[f"its model configuration could not be read ({status}: {doc}){hint}"])
    stated = served_export(doc)
    facts = ServerFacts(stated.get(EXPORT_SHA256), stated.get(EXPORT_BACKEND))
    steps = ((doc.get("ensemble_scheduling") or {}).get("step") or []) if isinstance(doc, dict) else []
    for step in steps:
        name = step.get("model_name") if isinstance(step, dict) else None
        if name:
            facts.preprocess_differences += _preprocess_differences(target, name, artifacts)
    return facts


def _preprocess_differences(target: Target, model: str, artifacts: Any) -> list[str]:
    """How the preprocessing recipe Triton model ``model`` states (if any) differs from the export's."""
    status, doc = model_document(target, model)
    if status not in OK or not isinstance(doc, dict):
        return []
    value = ((doc.get("parameters") or {}).get(PREPROCESS_PARAM) or {}).get("string_value")
    if not value:
        return []
    try:
        served = json.loads(value)
    except ValueError:
        return [f"the preprocessing of model {model} is not readable JSON"]
    expected = json.loads(json.dumps(artifacts.preprocess.to_dict()))
    keys = sorted(set(served) | set(expected)) if isinstance(served, dict) else []
    diffs = [f"{k} {served.get(k)!r} (export {expected.get(k)!r})" for k in keys if served.get(k) != expected.get(k)]
    if diffs:
        return [f"the preprocessing of model {model} is not the export's: " + "; ".join(diffs)]
    return []


def choose_backend(given: str | None, said: str | None, why: Sequence[str] = ()) -> tuple[str, str]:
    """(the backend whose thresholds judge, "--backend" or "server"); ConfigError when neither names one
    (``why``: what kept the server from saying)."""
    if given:
        if given not in EVALUATED_BACKENDS:
            raise ConfigError(f"--backend {given!r}: expected one of {', '.join(EVALUATED_BACKENDS)}")
        return given, "--backend"
    if said in BACKEND_KINDS:
        return str(said), "server"
    stated = f"says it runs {said!r}, a backend vitdeploy does not know" if said else "does not say which backend"
    because = f" ({'; '.join(why)})" if why else f" (no {EXPORT_BACKEND} in its model configuration)"
    raise ConfigError(
        f"the server {stated}{because}; pass --backend ({', '.join(EVALUATED_BACKENDS)}) to choose the "
        f"thresholds that judge it"
    )


# ------------------------------------------------------------------------------------------------
# the answers


def ask(target: Target, blobs: Sequence[bytes], clients: int = CLIENTS) -> list[tuple[str, Any]]:
    """Each image sent in its own request by one of ``clients`` clients: its (status, answer), in order."""
    stripes = [list(range(i, len(blobs), clients)) for i in range(min(clients, len(blobs)))]
    out: list[tuple[str, Any]] = [("", None)] * len(blobs)

    def run(rows: list[int]) -> None:
        client = open_client(target)
        try:
            for i in rows:
                out[i] = client.answer(blobs[i])
        finally:
            client.close()

    with ThreadPoolExecutor(max(1, len(stripes)), thread_name_prefix="vitdeploy-served") as pool:
        list(pool.map(run, stripes))
    return out


def _row(answer: Any, protocol: str, embedding: bool, reference_row: np.ndarray) -> np.ndarray:
    """One answer -> its row beside ``reference_row`` (logits, an embedding, or log-probabilities of /predict).
    KeyError, ValueError or TypeError when the answer is not the model's."""
    if protocol != PREDICT:
        row = np.asarray(answer[EMBEDDINGS if embedding else LOGITS], dtype=np.float64).reshape(-1)
    elif embedding:
        row = np.asarray(answer["embedding"], dtype=np.float64).reshape(-1)
    else:  # the top-k scores: log-probabilities, the others at most the k-th
        scores = {int(t["index"]): float(t["score"]) for t in answer["top_k"]}
        floor = np.log(max(min(scores.values()), 1e-300))
        row = np.minimum(reference_row, floor)
        for index, score in scores.items():
            row[index] = np.log(max(score, 1e-300))
    if row.shape != reference_row.shape:
        raise ValueError(f"{row.size} values, the model's answer has {reference_row.size}")
    return row


def _collect(
    answers: Sequence[tuple[str, Any]], names: Sequence[str], protocol: str, embedding: bool, reference: np.ndarray
) -> tuple[list[int], np.ndarray, list[dict[str, str]]]:
    """(the rows answered, their rows, {path, status, error} of each image without an answer)."""
    good, rows, failed = [], [], []
    for i, (status, answer) in enumerate(answers):
        if status in OK and isinstance(answer, dict) and "error" in answer:  # /predict's record of a refused image
            status, answer = "refused", answer["error"]
        if status not in OK:
            failed.append({"path": names[i], "status": status, "error": str(answer)})
            continue
        try:
            rows.append(_row(answer, protocol, embedding, reference[i]))
        except (KeyError, ValueError, TypeError) as exc:
            failed.append({"path": names[i], "status": "unreadable answer", "error": str(exc)})
            continue
        good.append(i)
    return good, (np.stack(rows) if rows else np.zeros((0, reference.shape[1]))), failed


def _nothing_answered(target: Target, failed: list[dict[str, str]]) -> None:
    """A one-line error when no image got an answer for one reason every client would hit."""
    statuses = {f["status"] for f in failed}
    if len(statuses) != 1:
        return
    (status,) = statuses
    _refuse_status(status, failed[0]["error"], target)
    if status in _NOT_FOUND:
        hint = "--protocol v2-http or v2-grpc with --model" if target.protocol == PREDICT else "--model"
        raise InputError(
            f"the server at {target.url} answers {status} to every request ({failed[0]['error']}); {hint}"
        )


# ------------------------------------------------------------------------------------------------
# the reference


@dataclass
class EagerAnswers:
    """The export's eager FP32 PyTorch answers on the validation images (computed once: a rollout computes them
    before its candidate starts). ``differences``: how the manifest's preprocessing differs from the recipe the
    export's weights were written with (its model.json), which eager PyTorch is given."""

    vset: Any
    good: list[int]
    errors: dict
    true_index: list
    unknown: list
    reference: np.ndarray
    seconds: float
    describe: str
    differences: list[str] = field(default_factory=list)


def weights_recipe(artifacts: Any) -> tuple[Any, list[str]]:
    """The preprocessing the export's weights were written with (its model.json's), and how the manifest's
    differs from it (empty: the same; (None, []) for an export without model.json, or one that states none)."""
    from ..base.preprocess_spec import PreprocessSpec
    from ..runtime.manifest_schema import read_json_bounded

    if not artifacts.has("weights-config"):
        return None, []
    stated = (read_json_bounded(artifacts.path("weights-config"), "model config") or {}).get("preprocess")
    if not isinstance(stated, dict):
        return None, []
    recipe = PreprocessSpec.from_dict(stated)
    theirs, ours = recipe.to_dict(), artifacts.preprocess.to_dict()
    diffs = [f"{k} {ours.get(k)!r} (weights {theirs.get(k)!r})" for k in sorted(ours) if ours.get(k) != theirs.get(k)]
    if diffs:
        diffs = ["the manifest's preprocessing is not the one its weights were exported with: " + "; ".join(diffs)]
    return recipe, diffs


def eager_answers(
    artifacts: Any, images: Any, labels_file: Any, options: Any, max_pixels: int | None, size: int | None = None
) -> EagerAnswers:
    """Eager FP32 PyTorch on the validation images, preprocessed with the recipe the weights were exported
    with (at the base size; another ``size``: the manifest's)."""
    vset, batch, good, errors, true_index, unknown = validation_batch(
        artifacts, images, labels_file, max_pixels, size=size
    )
    recipe, differences = weights_recipe(artifacts) if size is None else (None, [])
    if differences:
        from ..runtime.images import MAX_IMAGE_PIXELS
        from ..runtime.preprocess import Preprocessor

        limit = MAX_IMAGE_PIXELS if max_pixels is None else max_pixels
        batch, _, _ = Preprocessor(recipe, max_pixels=limit).batch_tolerant([vset.paths[i] for i in good])
    reference, seconds, describe = eager_reference(artifacts, options, batch)
    # the pooled vector or the logits: what a server answers by default
    return EagerAnswers(vset, good, errors, true_index, unknown, reference[0], seconds, describe, differences)


# ------------------------------------------------------------------------------------------------
# the check


def _judge(
    target: Target,
    artifacts: Any,
    vset: Any,
    good: list[int],
    true_index: Sequence,
    reference: np.ndarray,
    tolerance: Mapping[str, float],
    precision: str,
) -> tuple[BackendDrift, list[dict[str, str]], float]:
    """Send the images, judge what came back: (the served row, the images without an answer, seconds)."""
    embedding = artifacts.schema.output.kind == EMBEDDING
    paths = [Path(vset.paths[i]) for i in good]
    names = [str(p) for p in paths]
    scores = artifacts.schema.output.scores
    compared = reference if embedding or target.protocol != PREDICT else log_probabilities(reference, scores)
    t0 = time.perf_counter()
    answers = ask(target, [p.read_bytes() for p in paths])
    seconds = time.perf_counter() - t0
    rows, candidate, failed = _collect(answers, names, target.protocol, embedding, compared)
    if not rows:
        _nothing_answered(target, failed)
        reason = f"no image got an answer (first: {failed[0]['status']}: {failed[0]['error']})"
        return BackendDrift(SERVED, "failed", precision, precision, failures=[reason], reason=reason), failed, seconds
    limits = dict(tolerance)
    if target.protocol == PREDICT and not embedding:
        limits.pop("min_cosine", None)  # the cosine of log-probabilities with filled-in tails means nothing
    row = judge_backend(
        SERVED,
        candidate,
        compared[rows],
        limits,
        names=[names[i] for i in rows],
        true_index=[true_index[i] for i in rows],
        classes=artifacts.labels,
        precision=precision,
        kind=artifacts.schema.output.kind,
        scores=scores,
    )
    if target.protocol == PREDICT and not embedding:
        row.metrics.pop("cosine", None)
        row.per_image.pop("cosine", None)
    if failed:
        row.failures.append(f"{len(failed)} of {len(paths)} image(s) got no answer (first: {failed[0]['error']})")
    return row, failed, seconds


def _limits(thresholds: Mapping[str, Any] | None) -> dict[str, dict[str, float]]:
    limits = default_thresholds()
    for key, value in (thresholds or {}).items():
        if key not in PRECISIONS:
            raise ConfigError(f"thresholds: unknown set {key!r}; expected one of {', '.join(PRECISIONS)}")
        data = value.model_dump() if hasattr(value, "model_dump") else dict(value)
        limits[key] = {str(k): float(v) for k, v in data.items()}
    return limits


def check_served(
    artifacts_dir: Any,
    url: str,
    *,
    protocol: str = PREDICT,
    model: str | None = None,
    token: str | None = None,
    images: Any = None,
    labels_file: Any = None,
    backend: str | None = None,
    thresholds: Mapping[str, Any] | None = None,
    options: Any = None,
    max_pixels: int | None = None,
    report_path: Any = None,
    write_report: bool = True,
    image_size: int | None = None,
    ca_bundle: Any = None,
    eager: EagerAnswers | None = None,
) -> ServedCheck:
    """Judge the server at ``url`` against eager PyTorch on the export in ``artifacts_dir`` (the one it should
    run). Never raises for a failed gate or a refusal: inspect ``check.status`` or call
    ``check.raise_for_failures()``. ServerUnreachableError when nobody answers; ConfigError / InputError for a
    missing token, an unknown model, an unreadable image folder. ``thresholds``: {"fp32": ..., "fp16": ...,
    "int8": ...} (default: the config's defaults). The check lands in ``drift-report.json``'s ``served``
    section beside the export (or at ``report_path``) unless ``write_report`` is False. ``image_size``: the size
    asked of the server and judged (InputError naming the sizes that work when the export does not list it).
    ``ca_bundle``: the PEM file an HTTPS server's certificate is verified against (None: the system's trust store,
    client/connection.py). ``eager``: the export's eager answers, computed beforehand (:func:`eager_answers`)."""
    from ..runtime.artifacts import Artifacts
    from ..runtime.backends import BackendOptions

    artifacts = Artifacts.open(artifacts_dir)
    artifacts.preprocess_at(image_size)  # a size the export does not answer at: refused before any request
    embedding = artifacts.schema.output.kind == EMBEDDING
    name = model or model_name(artifacts.name)
    target = Target(
        url,
        protocol,
        model if protocol == PREDICT else name,
        token,
        (EMBEDDINGS if embedding else LOGITS,),
        image_size,
        ca_bundle,
    )
    pinned, said = live_version(target, name)  # during a rollout: the live version, named by every request
    target = dataclasses.replace(target, model=name, version=pinned) if pinned else target
    facts = read_server_facts(target, name, artifacts)
    check = ServedCheck(
        target.url, protocol, model or name, artifacts.manifest_sha256, facts.sha256, facts.backend, "", ""
    )
    check.notes += [said] if said else []
    check.image_size = image_size
    check.compared = "embedding" if embedding else ("scores" if protocol == PREDICT else "logits")
    if facts.sha256 and facts.sha256 != artifacts.manifest_sha256:
        check.status = "refused"
        check.reason = (
            f"refusing to certify {target.url}: it runs export {facts.sha256}, not {artifacts.manifest_sha256} "
            f"({artifacts.directory}); serve that export, or name the one it runs with -a"
        )
    else:
        check.backend, check.backend_source = choose_backend(backend, facts.backend, facts.notes)
        _run(
            check,
            target,
            artifacts,
            facts,
            images,
            labels_file,
            _limits(thresholds),
            options or BackendOptions(),
            max_pixels,
            eager,
        )
    if write_report:
        path = Path(report_path) if report_path else artifacts.directory / DRIFT_REPORT_NAME
        try:
            save_served(check, path, artifacts)
        except OSError as exc:
            log.warning("could not write the served check to %s: %s", path, exc)
    return check


def _run(
    check: ServedCheck,
    target: Target,
    artifacts: Any,
    facts: ServerFacts,
    images: Any,
    labels_file: Any,
    limits: dict[str, dict[str, float]],
    options: Any,
    max_pixels: int | None,
    eager: EagerAnswers | None = None,
) -> None:
    """The images sent and judged: fills ``check`` (its drift report, failed requests, notes, status)."""
    precision = BACKEND_KINDS[check.backend].precision
    if facts.backend and facts.backend != check.backend:
        check.notes.append(f"the server says it runs {facts.backend}; judged with --backend {check.backend}")
    if not facts.sha256:
        check.notes.append("the server does not say which export it runs: only its answers are judged")
    check.notes += facts.notes
    size = check.image_size
    eager = eager or eager_answers(artifacts, images, labels_file, options, max_pixels, size)
    vset, good, true_index, reference = eager.vset, eager.good, eager.true_index, eager.reference
    row, check.failed_requests, seconds = _judge(
        target, artifacts, vset, good, true_index, reference, limits[precision], precision
    )
    row.failures = eager.differences + row.failures + facts.preprocess_differences  # a changed recipe: the cause
    row.status = "failed" if row.failures else "passed"
    row.device, row.describe, row.seconds = target.url, f"{check.protocol} {target.url}", round(seconds, 4)
    sized = bool(artifacts.image_sizes)  # rows of an export for several sizes name the size judged
    row.image_size = (size or artifacts.input_shape[1]) if sized else None
    check.status = row.status
    check.drift = DriftReport(
        artifacts=str(artifacts.directory),
        model=artifacts.name,
        images=images_summary(vset, good, eager.errors, true_index, eager.unknown),
        reference=reference_summary(eager.describe, accuracy(reference, true_index), eager.seconds),
        thresholds=limits,
        backends=[row],
        created=check.created,
        image_sizes=[row.image_size] if row.image_size is not None else None,
    )


__all__ = [
    "CLIENTS",
    "EagerAnswers",
    "ServerFacts",
    "ask",
    "check_served",
    "choose_backend",
    "eager_answers",
    "read_server_facts",
    "weights_recipe",
]
