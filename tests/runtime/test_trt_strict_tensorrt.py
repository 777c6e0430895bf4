"""The strict tensorrt stand-in refuses what the real bindings refuse (each leniency the fake once had).

Evidence for each rule: NVIDIA's pybind11 sources (python/src/infer/pyCore.cpp, parsers/pyOnnx.cpp,
10.13 and main = 11.x): classes are bound without ``py::dynamic_attr`` (no new attributes),
parameters have C++ types (``std::string const&`` model, ``Dims`` / tuple / list shapes, enums,
``size_t`` addresses), enqueueV3 refuses unspecified input shapes, and ``PyProgressMonitor::stepComplete``
returns false after catching an exception. These tests check the fake; they say nothing of TensorRT.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers.strict_tensorrt import StrictTrt

VERSIONS = ("10.13.3.9", "11.4.0.106")


def logger(fake):
    class Quiet(fake.ILogger):
        def __init__(self):
            super().__init__()
            self.errors = []

        def log(self, severity, msg):
            if severity <= fake.ILogger.Severity.ERROR:
                self.errors.append(msg)

    return Quiet()


def builder_config(fake):
    return fake.Builder(logger(fake)).create_builder_config()


def context(fake, strategy=None):
    engine = fake.make_engine(chw=(3, 8, 8), profile=(1, 2, 4))
    return (
        engine.create_execution_context() if strategy is None else engine.create_execution_context(strategy=strategy)
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_assigning_a_removed_or_misspelled_attribute_raises(version):
    config = builder_config(StrictTrt(version))
    with pytest.raises(AttributeError, match="max_workspace_size"):
        config.max_workspace_size = 1 << 30  # removed in TensorRT 10: set_memory_pool_limit(WORKSPACE, ...)
    with pytest.raises(AttributeError, match="builder_optimisation_level"):
        config.builder_optimisation_level = 3
    with pytest.raises(AttributeError, match="read-only"):
        config.num_optimization_profiles = 2
    config.builder_optimization_level = 2  # a real rw property still works
    assert config.builder_optimization_level == 2


def test_an_attribute_removed_in_11_is_refused_there_only():
    builder_config(StrictTrt("10.13.3.9")).int8_calibrator = None
    with pytest.raises(AttributeError, match="int8_calibrator"):
        builder_config(StrictTrt("11.4.0.106")).int8_calibrator = None


def test_python_subclasses_keep_their_own_attributes():
    fake = StrictTrt()

    class Monitor(fake.IProgressMonitor):
        def __init__(self):
            super().__init__()
            self.steps = {}  # a Python subclass of a pybind class has a __dict__

    Monitor().steps["x"] = 1


@pytest.mark.parametrize("version", VERSIONS)
def test_argument_types_are_checked_as_the_bindings_declare(version, tmp_path: Path):
    fake = StrictTrt(version)
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"onnx")
    builder = fake.Builder(logger(fake))
    parser = fake.OnnxParser(builder.create_network(), logger(fake))
    with pytest.raises(TypeError, match="model must be str"):
        parser.parse_from_file(onnx)  # std::string: a pathlib.Path is not converted
    assert parser.parse_from_file(str(onnx))
    ctx = context(fake)
    with pytest.raises(TypeError, match="shape must be a tuple or list"):
        ctx.set_input_shape("pixel_values", np.array([1, 3, 8, 8]))
    with pytest.raises(TypeError, match="shape must be a tuple or list"):
        ctx.set_input_shape("pixel_values", (1.0, 3, 8, 8))
    with pytest.raises(TypeError, match="strategy must be tensorrt.ExecutionContextAllocationStrategy"):
        fake.engine.create_execution_context(strategy=2)
    with pytest.raises(TypeError, match="memory must be int >= 0"):
        ctx.set_tensor_address("logits", -256)
    with pytest.raises(TypeError, match="pool_size must be int >= 0"):
        builder.create_builder_config().set_memory_pool_limit(fake.MemoryPoolType.WORKSPACE, -1)
    with pytest.raises(TypeError, match="enable must be bool"):
        builder.create_builder_config().set_preview_feature(fake.PreviewFeature.RUNTIME_ACTIVATION_RESIZE_10_10, "yes")


def test_execute_without_input_shape_fails_as_tensorrt_does():
    fake = StrictTrt()
    log = logger(fake)
    fake.Runtime(log)
    ctx = context(fake)
    for name in ("pixel_values", "logits"):
        ctx.set_tensor_address(name, 0x1000)
    assert ctx.execute_async_v3(0x5000) is False
    assert "inputShapesSpecified" in log.errors[-1]
    assert ctx.set_input_shape("pixel_values", (2, 3, 8, 8)) and ctx.execute_async_v3(0x5000) is True


def test_user_managed_context_needs_device_memory_for_the_current_shape():
    fake = StrictTrt()
    log = logger(fake)
    fake.Runtime(log)
    ctx = context(fake, fake.ExecutionContextAllocationStrategy.USER_MANAGED)
    for name in ("pixel_values", "logits"):
        ctx.set_tensor_address(name, 0x1000)
    ctx.set_input_shape("pixel_values", (1, 3, 8, 8))
    assert ctx.execute_async_v3(0x5000) is False and "USER_MANAGED" in log.errors[-1]
    ctx.set_device_memory(0x2000, ctx.update_device_memory_size_for_shapes())
    assert ctx.execute_async_v3(0x5000) is True
    ctx.set_input_shape("pixel_values", (4, 3, 8, 8))  # a larger batch: the memory given is too small now
    assert ctx.execute_async_v3(0x5000) is False


@pytest.mark.parametrize("raised", [ValueError("bug in the monitor"), KeyboardInterrupt()])
def test_an_exception_in_step_complete_cancels_the_build_like_the_trampoline(raised):
    fake = StrictTrt(build_steps=3)

    class Raising(fake.IProgressMonitor):
        def __init__(self):
            super().__init__()

        def phase_start(self, phase_name, parent_phase, num_steps):
            pass

        def step_complete(self, phase_name, step):
            raise raised

        def phase_finish(self, phase_name):
            pass

    builder = fake.Builder(logger(fake))
    config = builder.create_builder_config()
    config.progress_monitor = Raising()
    assert builder.build_serialized_network(builder.create_network(), config) is None
    assert fake.steps_run == [0] and fake.swallowed == [raised]
