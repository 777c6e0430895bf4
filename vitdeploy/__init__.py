"""vitdeploy: a PyTorch Vision Transformer to a validated ONNX model, an FP16 TensorRT engine and
one runtime that serves every backend with the same preprocessing.

The Python API (docs/api.md), what the ``vitdeploy export`` and ``vitdeploy predict`` commands call::

    import vitdeploy

    result = vitdeploy.export("google/vit-base-patch16-224", "out/", config={"export": {"int8": {"enabled": False}}})
    print(result.manifest.validation["validate-onnx"]["passed"])
    with vitdeploy.Predictor.open("out/") as predictor:
        print(predictor.predict("cat.jpg")[0].label)

``import vitdeploy`` stays light: ``export`` and ``Predictor`` import the export (torch) and the runtime (ONNX
Runtime) on first use.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

from .base.version import __version__

#: Module paths of the previous release, kept for one release as deprecated aliases of their new home
#: (``import vitdeploy.errors`` still works, with a DeprecationWarning naming the new path).
MOVED_MODULES = {
    **{
        f"vitdeploy.{m}": f"vitdeploy.base.{m}"
        for m in ("config", "errors", "vocab", "preprocess_spec", "vit_schema", "limits", "yaml_load")
    },
    **{
        f"vitdeploy.serve.triton_{m}": f"vitdeploy.serve.triton.{m}"
        for m in ("config", "local", "models", "readme", "repo", "versions")
    },
    "vitdeploy.runtime.backends.trt_logging": "vitdeploy.runtime.backends.trt.log",
    "vitdeploy.runtime.backends.trt_metadata": "vitdeploy.runtime.backends.trt.metadata",
    "vitdeploy.runtime.artifact_bundle": "vitdeploy.runtime.artifact_transfer",
    # checkpoint formats: one place per format (model/formats/)
    "vitdeploy.model.readers": "vitdeploy.model.formats",
    **{f"vitdeploy.model.readers.{m}": f"vitdeploy.model.formats.{m}" for m in ("base", "resolve", "vitdeploy")},
    **{f"vitdeploy.model.readers.{f}": f"vitdeploy.model.formats.{f}" for f in ("hf", "timm", "torchvision")},
    **{f"vitdeploy.model.convert_{f}": f"vitdeploy.model.formats.{f}.convert" for f in ("hf", "timm", "torchvision")},
    # the client side of a running deployment (client/), apart from the tuner; rollout's server side (serve/rollout/)
    "vitdeploy.tune.clients": "vitdeploy.client.protocols",
    **{
        f"vitdeploy.tune.{m}": f"vitdeploy.client.{m}" for m in ("loadgen", "loadtest", "server_stats", "served_check")
    },
    "vitdeploy.tune.rollout": "vitdeploy.client.rollout.driver",
    "vitdeploy.tune.rollout_server": "vitdeploy.client.rollout.server",
    "vitdeploy.evaluate.served_report": "vitdeploy.client.served_report",
    "vitdeploy.evaluate.rollout_gate": "vitdeploy.client.rollout.gate",
    **{f"vitdeploy.serve.{m}": f"vitdeploy.serve.rollout.{m}" for m in ("shadow", "candidate")},
}


class _MovedModule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old module path and loads the module from its new home (the same module object)."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - the importlib protocol
        if fullname not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):  # noqa: ANN001
        return None

    def exec_module(self, module):  # noqa: ANN001
        new = MOVED_MODULES[module.__name__]
        warnings.warn(
            f"{module.__name__} moved to {new}; the old path goes away in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        sys.modules[module.__name__] = importlib.import_module(new)  # importlib returns what sys.modules holds


# First, so that an old subpackage path (vitdeploy.model.readers.hf) is this alias, not a second copy of
# the module the path finder would load from the new package's folder.
sys.meta_path.insert(0, _MovedModule())


def __getattr__(name: str):  # noqa: ANN202 - the module protocol (PEP 562): the API, imported on first use
    if name == "export":
        import vitdeploy.export as package  # the package is the function: vitdeploy.export(model, output_dir)

        return package
    if name == "Predictor":
        from .runtime.predictor import Predictor

        return Predictor
    raise AttributeError(f"module 'vitdeploy' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = ["MOVED_MODULES", "Predictor", "__version__", "export"]
