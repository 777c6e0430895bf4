"""vitdeploy's version, defined once (``vitdeploy.__version__`` re-exports it): the package's modules read it
from here, never from the package root, whose public API (``vitdeploy.export``, ``vitdeploy.Predictor``)
imports the export and the runtime on first use."""

__version__ = "0.1.0"
