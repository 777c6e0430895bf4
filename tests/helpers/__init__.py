"""Helpers shared by the test modules, imported as ``helpers.<module>`` (tests/ is on sys.path beside
tests/conftest.py). Not test modules: nothing here is collected, and the layout rules of
tests/test_architecture.py (tests/<room>/test_<module>.py) do not apply.

- ``tiny_export``: a complete tiny export directory, hand-made manifests (the ``tiny_artifacts`` fixture).
- ``bad_input``: tampering with an export, toy ONNX graphs, the CLI run without root's permission bypass.
- ``strict_tensorrt``: a strict stand-in for the ``tensorrt`` module, from the real bindings' signatures.
- ``library_reference``: timm and torchvision running their own models (a script for ``.venv-ref``).
- ``library_fidelity``: photos, the reference run and the comparisons of the library-fidelity tests.
- ``held``: overload made deterministic: the process that runs the model held (SIGSTOP) while requests arrive.
- ``thresholds``: validation thresholds the tests need (a gate no graph can pass).
- ``schedule``: the order the pytest-xdist workers are handed the files (the longest first).
"""
