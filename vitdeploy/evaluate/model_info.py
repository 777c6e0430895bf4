"""`vitdeploy info MODEL` and `vitdeploy info -a EXPORT`: what would be exported, and where an export came from.

``model_lines``: the checkpoint a config (or ``MODEL``) names, fetched and loaded (a Hub name through
huggingface_hub's cache, which a later export reuses) but not exported: the architecture, parameters, FP32
size, the preprocessing with each value's origin and the library it mirrors, and the export's estimated
peak memory (``export/memory_budget.py``'s measured factors). ``export_lines``: an export's provenance as
its manifest records it (the Hub repo, the revision asked for, the commit, each file's sha256; the
preprocessing's library and version).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from ..base.config import PipelineConfig
from ..base.memory import human


def model_lines(cfg: PipelineConfig) -> list[str]:
    """What ``vitdeploy export`` of ``cfg`` would export, said before any export stage runs."""
    from ..export.effective import describe, resolve
    from ..export.memory_budget import estimate_peak, weight_bytes

    effective = resolve(cfg)
    model = effective.loaded.model
    params = sum(p.numel() for p in model.parameters())
    weights = weight_bytes(model)
    peak, stage, factor = estimate_peak(cfg, weights)
    lines = describe(effective, cfg)
    lines.insert(2, f"  {params:,} parameters, {human(weights)} of FP32 weights")
    lines.append(
        f"export: estimated peak memory {human(peak)} ({stage}: {factor:g}x the FP32 weights over what the process "
        "holds without them, measured; the stages pipeline.yaml enables)"
    )
    hub = effective.loaded.hub
    if hub is not None:
        lines.extend(hub_lines(hub.record()))
    return lines


def hub_lines(record: dict[str, Any]) -> Iterator[str]:
    """The Hub provenance (manifest ``model.source.hub``) as lines."""
    asked = record.get("revision") or "the default branch"
    yield f"hub: {record['repo_id']} from {record['endpoint']}, revision {asked} -> commit {record['commit']}"
    yield f"  reproduce: vitdeploy export {record['repo_id']}@{record['commit']}"
    for f in record.get("files", ()):
        yield f"  {f['path']:<34} sha256 {f['sha256']}  ({human(f['bytes'])})"


def export_lines(folder: Path) -> list[str]:
    """Where the export in ``folder`` came from, as its manifest says (read through the runtime's schema)."""
    from ..runtime.artifacts import Artifacts

    artifacts = Artifacts.open(folder, verify=False)
    schema, manifest = artifacts.schema, artifacts.manifest
    source = (manifest.get("model") or {}).get("source") or {}
    lines = [f"export: {artifacts.directory} ({schema.name or 'unnamed'}, created {schema.created or '?'})"]
    lines.append(f"model: {source.get('format', '?')} checkpoint {source.get('path', '?')}")
    hub = schema.hub
    if hub is not None:
        lines.extend(hub_lines(hub.model_dump()))
    reference = schema.preprocess_reference or {}
    if reference:
        how = reference.get("processor") or reference.get("transform") or ""
        lines.append(
            f"preprocess mirrors: {reference.get('library')} {reference.get('version') or '?'} {how}".rstrip()
        )
        for key in ("fast_processor", "fast_differs", "transparency", "overridden"):
            if reference.get(key):
                lines.append(f"  {key}: {reference[key]}")
    versions = {k: v for k, v in (schema.versions or {}).items() if v}
    lines.append("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    return lines
