"""Which Triton container can run a TensorRT plan: the release whose TensorRT equals the builder's.

A serialized TensorRT engine only deserializes with the TensorRT version that built it, so the
``<name>_trt`` model needs the Triton release that ships exactly that TensorRT. The table below maps
each ``nvcr.io/nvidia/tritonserver:<release>-py3`` container to its Triton server version and the
TensorRT inside it, as checked on 2026-11-23 against the sources named in the comment above the
table (not NVIDIA's release notes first-hand: see there); only rows with evidence for both versions
are listed. Releases not listed are unknown to this vitdeploy version, and
:func:`triton_releases_for` then returns nothing rather than guess; the generated README then points
at NVIDIA's support matrix instead.
"""

from __future__ import annotations

from typing import Any

# Sources, checked 2026-11-23:
# - Triton version <-> container release: NVIDIA's own repository, build.py at each release tag
#   (TRITON_VERSION_MAP / DEFAULT_TRITON_VERSION_MAP, "triton_container_version"),
#   https://github.com/triton-inference-server/server/blob/v2.69.0/build.py (tags v2.46.0 .. v2.69.0;
#   v2.54.0 via branch r25.01).
# - TensorRT in the -py3 container: the "NVIDIA Triton Inference Server Container Versions" table of
#   NVIDIA's release notes, https://docs.nvidia.com/deeplearning/triton-inference-server/release-notes/
#   (rel-26-04.html and later). That table could not be read first-hand here (the search tools return
#   only the opening of those pages); the TensorRT column below is taken from a public copy of it,
#   https://github.com/X-Square-Robot/Qwen3TTS-Streaming/blob/110361cec9ff77cf4ab8552196764f421f45bc95/scripts/bash/ngc_matrix.conf
#   ("tensorrt_version ... reported by the generic Triton container release notes", updated 2026-07-08).
#   Re-check against NVIDIA's page or `dpkg -l | grep libnvinfer` in the container when possible.
# - Left out for want of evidence: 24.12 (that copy says TensorRT 10.6.0.26, the same as 24.11, while
#   https://docs.twcloud.ai/en/docs/concepts-tutorials/twcc/ccs/concepts/images/triton-inference-server/
#   lists 10.7.0.23 for its 24.12 trtllm-python-py3 image: unresolved), 25.07 (Triton 2.59.1, no
#   TensorRT version found), 26.06 and later (no TensorRT version found). No Triton release with
#   TensorRT 11.x was found.
# NVIDIA's user-guide "Release Compatibility Matrix" lists TensorRT for the -trtllm-python-py3 images
# only; those often differ from the -py3 image of the same release and are not used here.

#: container release -> (Triton server version, TensorRT version in the -py3 container).
TRITON_RELEASES: dict[str, tuple[str, str]] = {
    "24.05": ("2.46.0", "10.0.1.6"),
    "24.06": ("2.47.0", "10.1.0.27"),
    "24.07": ("2.48.0", "10.2.0.19"),
    "24.08": ("2.49.0", "10.3.0.26"),
    "24.09": ("2.50.0", "10.4.0.26"),
    "24.10": ("2.51.0", "10.5.0.18"),
    "24.11": ("2.52.0", "10.6.0.26"),
    "25.01": ("2.54.0", "10.8.0.43"),
    "25.02": ("2.55.0", "10.8.0.43"),
    "25.03": ("2.56.0", "10.9.0.34"),
    "25.04": ("2.57.0", "10.9.0.34"),
    "25.05": ("2.58.0", "10.10.0.31"),
    "25.06": ("2.59.0", "10.11.0.33"),
    "25.08": ("2.60.0", "10.13.2.6"),
    "25.09": ("2.61.0", "10.13.3.9"),
    "25.10": ("2.62.0", "10.13.3.9"),
    "25.11": ("2.63.0", "10.14.1.48"),
    "25.12": ("2.64.0", "10.14.1.48"),
    "26.01": ("2.65.0", "10.14.1.48"),
    "26.02": ("2.66.0", "10.15.1.29"),
    "26.03": ("2.67.0", "10.16.0.72"),
    "26.04": ("2.68.0", "10.16.1.11"),
    "26.05": ("2.69.0", "10.16.1.11"),
}
SUPPORT_MATRIX_URL = "https://docs.nvidia.com/deeplearning/frameworks/support-matrix/index.html"
IMAGE = "nvcr.io/nvidia/tritonserver"


def _release_key(version: str) -> tuple[int, ...]:
    """ "10.13.3.9" -> (10, 13, 3): engines match on major.minor.patch (the build number aside)."""
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


def container_release(engine: dict[str, Any] | None) -> tuple[str, list[str]]:
    """(the container release to run the repository in, the README lines explaining the choice)."""
    if engine is None:
        tag = latest_release()
        return tag, [
            "No TensorRT engine was built by `vitdeploy export`, so this repository has no `_trt` model and no",
            "TensorRT version to match: any recent Triton release serves it (the onnxruntime and python",
            f"backends ship in the `-py3` images). The command below uses {tag}, the newest release this",
            "vitdeploy version knows.",
        ]
    trt = str(engine.get("tensorrt_version"))
    releases = triton_releases_for(trt)
    where = (
        f"built with TensorRT {trt} on {engine.get('gpu_name')} (compute capability "
        f"{engine.get('compute_capability')}), recorded in `model.engine.json`."
    )
    if releases:
        return releases[-1], [
            f"The `_trt` model's plan was {where} A plan deserializes only with the TensorRT",
            f"that built it: run Triton release {' or '.join(releases)} (TensorRT {trt}), on a GPU of the same",
            "compute capability.",
        ]
    tag = latest_release()
    return tag, [
        f"The `_trt` model's plan was {where} This vitdeploy version does not know which Triton",
        f"release ships TensorRT {trt}: look it up in NVIDIA's support matrix ({SUPPORT_MATRIX_URL})",
        f"and use that release instead of {tag} below, or rebuild the engine with the TensorRT of your Triton",
        "(`vitdeploy export` inside that container). Until then load the ensemble over `_onnx`.",
    ]


__all__ = [
    "IMAGE",
    "SUPPORT_MATRIX_URL",
    "TRITON_RELEASES",
    "container_release",
    "latest_release",
    "triton_releases_for",
]
