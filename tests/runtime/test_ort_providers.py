"""ONNX Runtime GPU providers: what we hand to ONNX Runtime (pure functions, checked on CPU).

``provider_entries`` builds the (name, options) list from pipeline.yaml's runtime.providers: the
CUDA / TensorRT EPs get device_id from runtime.device, the TensorRT EP gets its engine and
timing caches beside the artifacts (or a writable fallback), the batch profile as explicit
shapes and FP16 for the FP16 graph; options from pipeline.yaml win. No GPU provider runs here:
this checks the options we build, not that ONNX Runtime's GPU providers accept them.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from vitdeploy.base.config import parse_config
from vitdeploy.base.errors import ConfigError
from vitdeploy.runtime.backends.ort import TRT_EP_CACHE, provider_entries, trt_ep_cache_dir

BATCH = {"min": 1, "opt": 8, "max": 32}


def entries(requested, device="cuda:1", fp16_graph=False, cache_dir=Path("/art/ort-trt-cache")):
    return dict(
        provider_entries(
            requested,
            device=device,
            input_name="pixel_values",
            chw=(3, 224, 224),
            batch=BATCH,
            fp16_graph=fp16_graph,
            cache_dir=cache_dir,
        )
    )


def test_device_index_goes_to_cuda_and_tensorrt_providers_only():
    got = entries(["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"], device="cuda:1")
    assert got["CUDAExecutionProvider"] == {"device_id": 1}
    assert got["TensorrtExecutionProvider"]["device_id"] == 1
    assert got["CPUExecutionProvider"] == {}
    assert entries(["CUDAExecutionProvider"], device="cuda")["CUDAExecutionProvider"] == {"device_id": 0}
    assert entries(["CUDAExecutionProvider"], device="cpu")["CUDAExecutionProvider"] == {"device_id": 0}


def test_tensorrt_ep_defaults_caches_profile_and_fp16_for_the_fp16_graph():
    trt = entries(["TensorrtExecutionProvider"], fp16_graph=True)["TensorrtExecutionProvider"]
    assert trt == {
        "device_id": 1,
        "trt_fp16_enable": True,
        "trt_engine_cache_enable": True,
        "trt_engine_cache_path": "/art/ort-trt-cache",
        "trt_timing_cache_enable": True,
        "trt_timing_cache_path": "/art/ort-trt-cache",
        "trt_profile_min_shapes": "pixel_values:1x3x224x224",
        "trt_profile_opt_shapes": "pixel_values:8x3x224x224",
        "trt_profile_max_shapes": "pixel_values:32x3x224x224",
    }
    fp32 = entries(["TensorrtExecutionProvider"], fp16_graph=False)["TensorrtExecutionProvider"]
    assert "trt_fp16_enable" not in fp32  # the FP32 "ort" graph stays FP32 unless asked


def test_options_from_pipeline_yaml_override_the_defaults():
    cfg = parse_config(
        {
            "runtime": {
                "device": "cuda:2",
                "providers": [
                    [
                        "TensorrtExecutionProvider",
                        {"trt_fp16_enable": True, "trt_engine_cache_path": "/fast/cache", "device_id": 3},
                    ],
                    "CUDAExecutionProvider",
                ],
            }
        }
    )
    got = entries(cfg.runtime.providers, device=cfg.runtime.device)
    assert got["TensorrtExecutionProvider"]["trt_fp16_enable"] is True
    assert got["TensorrtExecutionProvider"]["trt_engine_cache_path"] == "/fast/cache"
    assert got["TensorrtExecutionProvider"]["device_id"] == 3  # an explicit option wins
    assert got["CUDAExecutionProvider"] == {"device_id": 2}


@pytest.mark.parametrize("bad", [[["CUDAExecutionProvider"]], [["CUDAExecutionProvider", "device_id=1"]], [3]])
def test_malformed_provider_entries_are_config_errors_naming_the_key(bad):
    with pytest.raises(ConfigError, match="runtime.providers"):
        parse_config({"runtime": {"providers": bad}})


def test_trt_ep_cache_beside_the_artifacts_when_writable(tmp_path):
    assert trt_ep_cache_dir(tmp_path) == tmp_path.resolve() / TRT_EP_CACHE
    assert (tmp_path / TRT_EP_CACHE).is_dir()


def test_trt_ep_cache_falls_back_when_the_folder_cannot_be_created(tmp_path, monkeypatch):
    (tmp_path / TRT_EP_CACHE).write_text("a file where the cache folder should be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    got = trt_ep_cache_dir(tmp_path)
    assert got.parent == tmp_path / "cache" / "vitdeploy" / "ort-trt" and len(got.name) == 16


@pytest.mark.integration  # the demo export
def test_requested_provider_that_did_not_load_is_logged(demo_artifacts, monkeypatch, caplog):
    """A provider the onnxruntime build offers but the session did not load is named in a warning."""
    import onnxruntime as ort

    from vitdeploy.runtime.backends import ort as ort_backend
    from vitdeploy.runtime.backends.base import BackendOptions

    real = ort.InferenceSession

    class Session(real):  # the session loads CPU only, as when CUDA libraries are missing
        def __init__(self, path, sess_options=None, providers=None):
            super().__init__(path, sess_options=sess_options, providers=["CPUExecutionProvider"])

    monkeypatch.setattr(ort, "InferenceSession", Session)
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    with caplog.at_level(logging.WARNING, logger=ort_backend.__name__):
        backend = ort_backend.OrtBackend(
            demo_artifacts / "model.onnx",
            (3, 32, 32),
            None,
            BackendOptions(
                providers=(("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"),
                allow_cpu_fallback=True,
            ),
        )
    backend.close()
    assert any(
        "['CUDAExecutionProvider'] are in this onnxruntime build but did not load" in r.getMessage()
        for r in caplog.records
    )
