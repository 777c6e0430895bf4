"""The NVIDIA Triton model repository for an export: ``repo`` writes it (models, configs from
``config``, the python models' code in ``models``, the repository's README from ``readme``), ``package``
makes it self-contained (a wheel of this vitdeploy, pinned requirements, a Dockerfile), ``versions``
maps Triton releases to their TensorRT and Python, and ``local`` runs the tritonserver bundled in
``nvidia-pytriton`` for tests and benchmarks."""
