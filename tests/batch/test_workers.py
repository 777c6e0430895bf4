"""What runs on Ray's workers, without Ray: a decoding task gives the pixels `predict` gives, bad images as
messages, on a thread below the worker's priority that leaves the worker's own threads as they were."""

from __future__ import annotations

import dataclasses
import os
import threading

import numpy as np
import pytest

from vitdeploy.base.preprocess_spec import PreprocessSpec
from vitdeploy.batch.workers import DecodeSpec, decode_batch, decoder
from vitdeploy.demo import IMAGES_DIR
from vitdeploy.runtime.preprocess import Preprocessor

linux_only = pytest.mark.skipif(not hasattr(os, "setpriority"), reason="per-thread niceness is Linux's")


def _niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_a_decoding_task_gives_predicts_pixels_at_any_priority_and_one_message_per_bad_image():
    spec = DecodeSpec(PreprocessSpec(height=32, width=32), max_pixels=10_000_000, nice=0)
    files = sorted(p for p in IMAGES_DIR.iterdir() if p.suffix in (".png", ".jpg"))[:3]
    blobs = [f.read_bytes() for f in files] + [b"hello, not an image"]
    batch = {"bytes": np.array(blobs, dtype=object), "path": np.array([str(f) for f in files] + ["bad.png"])}
    expected = np.stack([Preprocessor(spec.preprocess, max_pixels=spec.max_pixels)(b) for b in blobs[:3]])
    for nice in (0, 5):
        out = decode_batch(batch, dataclasses.replace(spec, nice=nice))
        np.testing.assert_array_equal(out["pixels"][:3], expected)  # bit for bit, whatever thread decoded
        assert list(out["error"][:3]) == ["", "", ""] and "not a recognised image" in out["error"][3]
        assert not out["pixels"][3].any()


@linux_only
def test_decoding_runs_below_the_worker_and_leaves_the_workers_threads_alone():
    before = _niceness()
    assert decoder(0) is None  # decode_nice 0: inline, at the worker's own priority
    seen = decoder(3).submit(_niceness).result()
    assert seen == min(19, before + 3) and _niceness() == before
    assert decoder(3) is decoder(3)  # one decoding thread per worker process and setting, reused across tasks
