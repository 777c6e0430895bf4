"""A candidate faithful to its own export: its answers to the export's validation images, sent to its versioned
route as a client sends them, judged against the export's eager FP32 answers with its backend's thresholds, as
`validate --url` judges a server (driver.py's step 4, before any live request is copied to it)."""

from __future__ import annotations

import numbers
from typing import Any, Optional

from .gate import ShadowVerdict, backend_thresholds


def check_faithful(
    server: Any, version: int, artifacts: Any, eager: Any, cfg: Any, options: Any
) -> tuple[dict[str, Any], Optional[ShadowVerdict]]:
    """Version ``version`` of ``server``'s model judged against ``eager`` (the export's eager answers): its
    figures, and a failed verdict when it is not faithful (None when it is)."""
    from ..protocols import V2_HTTP
    from ..served_check import check_served

    check = check_served(
        artifacts.directory,
        server.url,
        protocol=V2_HTTP,
        model=f"{server.model}/versions/{version}",
        token=server.token,
        ca_bundle=server.ca_bundle,
        thresholds=faithful_thresholds(server, version, artifacts, cfg),
        options=options,
        max_pixels=cfg.runtime.max_image_pixels,
        write_report=False,
        eager=eager,
    )
    row = check.drift.backends[0] if check.drift and check.drift.backends else None
    metrics = {k: float(v) for k, v in (row.metrics if row else {}).items() if isinstance(v, numbers.Real)}
    figures = {"images": len(eager.good), "status": check.status, "backend": check.backend, **metrics}
    if check.status == "passed":
        return figures, None
    why = check.reason or (row.failures[0] if row and row.failures else check.status)
    return figures, ShadowVerdict(False, True, f"v{version} is not faithful to its own export: {why}")


def faithful_thresholds(server: Any, version: int, artifacts: Any, cfg: Any) -> dict[str, dict[str, float]]:
    """The candidate's thresholds per precision: its export's own validation of the backend it runs (its
    metadata says which), else the config's ``validation.<precision>``."""
    from ...base.vocab import BACKEND_KINDS, EXPORT_BACKEND, PRECISIONS
    from ...serve.protocol import served_export
    from ..protocols import V2_HTTP, Target, model_document

    route = f"{server.model}/versions/{version}"
    target = Target(server.url, V2_HTTP, route, server.token, ca_bundle=server.ca_bundle)
    _, doc = model_document(target, route)
    backend = served_export(doc if isinstance(doc, dict) else {}).get(EXPORT_BACKEND)  # what it runs
    limits = {p: getattr(cfg.validation, p).model_dump() for p in PRECISIONS}
    if backend in BACKEND_KINDS:
        own = backend_thresholds(artifacts.manifest.get("validation"), backend, cfg.validation)
        limits[BACKEND_KINDS[backend].precision] = own
    return limits


__all__ = ["check_faithful", "faithful_thresholds"]
