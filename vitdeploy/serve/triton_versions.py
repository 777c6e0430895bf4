"""Which Triton container can run a TensorRT plan: the release whose TensorRT equals the builder's.

A serialized TensorRT engine only deserializes with the TensorRT version that built it, so the
``<name>_trt`` model needs the Triton release that ships exactly that TensorRT. The table below is
data copied from NVIDIA's Triton release notes ("NVIDIA Triton Inference Server Container
Versions": container, Triton version, TensorRT version); releases not listed here are unknown to
this vitdeploy version, and :func:`triton_releases_for` then returns nothing rather than guess.
"""

from __future__ import annotations

#: container release -> (Triton server version, TensorRT version in the container).
TRITON_RELEASES: dict[str, tuple[str, str]] = {
    "24.05": ("2.46.0", "10.0.1.6"),
    "24.06": ("2.47.0", "10.1.0.27"),
    "24.07": ("2.48.0", "10.2.0.19"),
    "24.08": ("2.49.0", "10.3.0.26"),
    "24.09": ("2.50.0", "10.4.0.26"),
    "24.10": ("2.51.0", "10.5.0.18"),
    "24.11": ("2.52.0", "10.6.0.26"),
    "24.12": ("2.53.0", "10.7.0.23"),
    "25.01": ("2.54.0", "10.8.0.43"),
    "25.02": ("2.55.0", "10.8.0.43"),
    "25.03": ("2.56.0", "10.9.0.34"),
    "25.04": ("2.57.0", "10.9.0.34"),
    "25.05": ("2.58.0", "10.10.0.31"),
    "25.06": ("2.59.0", "10.11.0.33"),
    "25.08": ("2.60.0", "10.13.2.6"),
    "25.09": ("2.61.0", "10.13.3.9"),
    "25.10": ("2.62.0", "10.13.3.9"),
}
SUPPORT_MATRIX_URL = "https://docs.nvidia.com/deeplearning/frameworks/support-matrix/index.html"
IMAGE = "nvcr.io/nvidia/tritonserver"


def _release_key(version: str) -> tuple[int, ...]:
    """"10.13.3.9" -> (10, 13, 3): engines match on major.minor.patch (the build number aside)."""
    parts = []
    for piece in str(version).strip().split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else -1)
    return tuple(parts)


def triton_releases_for(tensorrt_version: str) -> list[str]:
    """Container releases (oldest first) whose TensorRT equals ``tensorrt_version`` (major.minor.patch);
    empty when this table knows none."""
    want = _release_key(tensorrt_version)
    return sorted(r for r, (_, trt) in TRITON_RELEASES.items() if _release_key(trt) == want)


def latest_release() -> str:
    return max(TRITON_RELEASES)


__all__ = ["IMAGE", "SUPPORT_MATRIX_URL", "TRITON_RELEASES", "latest_release", "triton_releases_for"]
