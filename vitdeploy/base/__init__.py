"""The base layer every room may import: the configuration (``config``), the one error hierarchy
(``errors``), the vocabularies (``vocab``: backend names, artifact file names, ...), the
preprocessing contract (``preprocess_spec``), the ViT's fields (``vit_schema``), limits on untrusted
input (``limits``) and small helpers (lazy imports ``_deps``, atomic writes ``_files``, the strict
pydantic base ``_schema``, bounded YAML ``yaml_load``). Standard library, numpy and pydantic only:
no torch, no onnxruntime, no Ray."""
