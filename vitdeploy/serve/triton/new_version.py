"""`vitdeploy triton-repo --new-version`: a new export as the next version folder of every model of a
repository `triton-repo` wrote for the same model.

    REPO/<name>_preprocess/1/  2/      the live version stays as it is; the new one beside it
    REPO/<name>_ort_python/1/  2/      (every model: the steps, the inference models, the ensemble)
    REPO/<name>/config.pbtxt           now calls version 2 of each step and names the new export's sha256

A version folder shares its model's ``config.pbtxt`` (and ``labels.txt``) with the live version, so every
model's configuration must stay as it is: the same tensors, preprocessing, labels, K and settings. Only the
ensemble's changes (which step versions it calls, which export it names). Anything else is refused with one
line naming the file and the first line that would change, before anything is written. The step models
load every version folder they have (``config.VERSION_POLICY``); the new folders are moved in first and the
ensemble's ``config.pbtxt`` is replaced last, so a server that loads the steps before the ensemble (the
README's steps) answers from one export or the other, never a mix.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from ...base._files import write_bytes_atomic
from ...base.errors import ConfigError
from ...runtime.artifacts import Artifacts
from . import config as tc
from .readme import render_readme
from .repo import RepoResult, build_models, resolved

log = logging.getLogger(__name__)

CONFIG = "config.pbtxt"
#: the lines a new version may change: the ensemble's step versions and export parameters, the version policy
_MAY_CHANGE = ("model_version:", "parameters {", "version_policy:")


def _versions(model_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit() and int(p.name) > 0)


def _models(repo: Path) -> set[str]:
    return {p.name for p in repo.iterdir() if (p / CONFIG).is_file()}


def _contract(text: str, ensemble: bool) -> list[str]:
    """The lines of a config.pbtxt a new version must keep (the ensemble's step versions and parameters aside)."""
    lines = [line.rstrip() for line in text.splitlines()]
    return [
        line
        for line in lines
        if not (line.lstrip().startswith(_MAY_CHANGE) and (ensemble or "version_policy" in line))
    ]


def _first_change(old: list[str], new: list[str]) -> str:
    for i, (a, b) in enumerate(zip(old + [""] * len(new), new + [""] * len(old))):
        if a != b:
            at = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return f"line {i + 1}: {_around(a, at)!r} would become {_around(b, at)!r}"
    return "no line"


def _around(line: str, at: int, before: int = 40, after: int = 50) -> str:
    """The part of a (long) line around position ``at``, where it changes."""
    start = max(0, at - before)
    return ("..." if start else "") + line[start : at + after] + ("..." if len(line) > at + after else "")


def _check_name(repo: Path, name: str) -> None:
    if not repo.is_dir():
        raise ConfigError(
            f"{repo}: no Triton repository there; --new-version adds a version to one `vitdeploy triton-repo` "
            f"wrote (leave the flag out to write a new repository)"
        )
    if not (repo / name / CONFIG).is_file():
        ensembles = sorted(m for m in _models(repo) if 'platform: "ensemble"' in (repo / m / CONFIG).read_text())
        raise ConfigError(
            f"{repo} has no model {name!r} (the new export's name; the repository serves "
            f"{', '.join(map(repr, ensembles)) or 'no ensemble'}): a new version must be of the same model; "
            f"write a repository of its own for another model"
        )


def _check_contract(repo: Path, tmp: Path, models: list[str], ensemble: str) -> None:
    """ConfigError naming the first model whose configuration (or labels, or engine's TensorRT) would change."""
    have, want = _models(repo), set(models)
    if have != want:
        diff = [f"{m} missing" for m in sorted(want - have)] + [f"{m} not written by it" for m in sorted(have - want)]
        raise ConfigError(
            f"{repo}: the new export's models are not the repository's ({'; '.join(diff)}): its kind or its "
            f"engine differs from the live version's; write a repository of its own"
        )
    for model in sorted(models):
        old = (repo / model / CONFIG).read_text(encoding="utf-8")
        new = (tmp / model / CONFIG).read_text(encoding="utf-8")
        a, b = _contract(old, model == ensemble), _contract(new, model == ensemble)
        if a != b:
            raise ConfigError(
                f"{repo / model / CONFIG}: the new export needs another configuration ({_first_change(a, b)}); a "
                f"version shares its model's config.pbtxt, so inputs, outputs, preprocessing and settings must "
                f"stay: pass the settings the repository was written with, or write a repository of its own"
            )
        for shared in (tc.LABELS_FILE,):
            old_file, new_file = repo / model / shared, tmp / model / shared
            if old_file.is_file() != new_file.is_file() or (
                new_file.is_file() and old_file.read_bytes() != new_file.read_bytes()
            ):
                raise ConfigError(
                    f"{old_file}: the new export's labels differ from the live version's (a version shares its "
                    f"model's {shared}); write a repository of its own for a model with other labels"
                )


def _engine_release(engine: dict[str, Any] | None) -> str | None:
    return None if engine is None else str(engine.get("tensorrt_version"))


def add_version(
    artifacts_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    settings: tc.Settings,
    on_step: Callable[[str], None] | None = None,
) -> RepoResult:
    """Write the export in ``artifacts_dir`` as version N+1 of every model of the repository ``out`` (N: the
    highest version folder there); the ensemble's config.pbtxt then calls N+1. Nothing else is changed."""
    step = on_step or (lambda _msg: None)
    artifacts = Artifacts.open(artifacts_dir, public_key=settings.verify_key)
    repo = Path(out).expanduser().absolute()
    settings, facts, engine_meta = resolved(artifacts, settings)
    _check_name(repo, facts.name)
    names = tc.model_names(facts.name)
    previous = max(_versions(repo / facts.name), default=0)
    version = 1 + max((v for m in _models(repo) for v in _versions(repo / m)), default=0)
    tmp = Path(tempfile.mkdtemp(prefix=f".{repo.name}.v{version}.", suffix=".tmp", dir=repo.parent))
    placed: list[Path] = []
    live_config = (repo / names["ensemble"] / CONFIG).read_bytes()
    try:
        step(f"verifying and copying artifacts as version {version}")
        models = build_models(tmp, artifacts, facts, settings, engine_meta, version)
        _check_contract(repo, tmp, models, names["ensemble"])
        old_engine = repo / names["trt"] / "model.engine.json"
        if engine_meta is not None and old_engine.is_file():
            was = _engine_release(json.loads(old_engine.read_text(encoding="utf-8")))
            if was != _engine_release(engine_meta):
                raise ConfigError(
                    f"{old_engine}: the live engine was built with TensorRT {was}, the new one with "
                    f"{_engine_release(engine_meta)}; one Triton container runs one TensorRT: rebuild the engine "
                    f"with TensorRT {was} or write a repository of its own"
                )
        step(f"adding version {version} beside version {previous} (the ensemble's config last)")
        for model in sorted(models, key=lambda m: m == names["ensemble"]):  # the ensemble last
            target = repo / model / str(version)
            os.replace(tmp / model / str(version), target)
            placed.append(target)
            if model == names["ensemble"]:
                write_bytes_atomic(repo / model / CONFIG, (tmp / model / CONFIG).read_bytes())
            elif (repo / model / CONFIG).read_bytes() != (tmp / model / CONFIG).read_bytes():
                write_bytes_atomic(repo / model / CONFIG, (tmp / model / CONFIG).read_bytes())  # the policy line
        readme = render_readme(facts, settings, engine_meta, models, version=version, previous=previous)
        write_bytes_atomic(repo / "README.md", readme.encode("utf-8"))
    except BaseException:
        write_bytes_atomic(repo / names["ensemble"] / CONFIG, live_config)
        for path in placed:
            shutil.rmtree(path, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("added version %d of %s to %s (from %s)", version, facts.name, repo, artifacts.directory)
    return RepoResult(
        path=repo,
        name=facts.name,
        models=models,
        inference=settings.inference,
        onnx_precision=settings.onnx_precision,
        engine=engine_meta,
        version=version,
        previous=previous,
    )


__all__ = ["add_version"]
