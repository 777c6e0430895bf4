# Two set-up commands: `make demo` and `make test`. Both create .venv and install into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch is pinned: an unpinned torch pulls a multi-GB CUDA build on a CPU machine.
TORCH  := torch==2.13.0
STAMP  := $(VENV)/.installed
# Its own environment for the tritonserver of the nvidia-pytriton wheel (see the rule below).
TRITON_VENV  := .venv-triton
TRITON_STAMP := $(TRITON_VENV)/.installed

# Test-only reference environment: timm and torchvision run their own models and preprocessing here
# (tests/helpers/library_reference.py). They cannot live beside the CPU torch above: torchvision's
# wheel needs the CUDA build of torch, so pip resolves that build and its CUDA libraries (~5 GB,
# run on the CPU only). transformers is here too: with torchvision beside it, it runs both of its image
# processors (the PIL one vitdeploy mirrors, and the torchvision "fast" one, its default where torchvision is
# installed), compared in tests/model/test_checkpoints_processors.py; its models run in-process in .venv.
REF_VENV  := .venv-ref
REF_STAMP := $(REF_VENV)/.installed

.PHONY: demo test install clean bench reference-env triton-env

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[cpu,export,dev,serve,otel,batch,report,sign,openvino]" "$(TORCH)"
	touch $(STAMP)

$(REF_STAMP): Makefile
	$(PYTHON) -m venv $(REF_VENV)
	$(REF_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(REF_VENV)/bin/python -m pip install --quiet "timm>=1.0.20" torchvision safetensors pillow numpy "transformers>=5" "open-clip-torch>=3"
	touch $(REF_STAMP)

install: $(STAMP)

reference-env: $(REF_STAMP)

demo: $(STAMP)
	$(BIN)/vitdeploy export -c pipeline.yaml
	$(BIN)/vitdeploy predict vitdeploy/demo/images -a artifacts
	@echo "report: $(CURDIR)/artifacts/report.html (what to deploy; open it in a browser)"
	@echo "next: set model.checkpoint in pipeline.yaml to your ViT, then run"
	@echo "  $(BIN)/vitdeploy export -c pipeline.yaml && $(BIN)/vitdeploy predict path/to/your/images -a artifacts"
	@echo "  (or '. $(BIN)/activate' first, then plain 'vitdeploy ...')"

# The parallel phase prints its 20 slowest tests (their setup, call and teardown apart); its files are handed to
# the two workers longest first (tests/helpers/schedule.py).
test: $(STAMP) $(REF_STAMP) $(TRITON_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadfile -m "not serial and not isolated" --durations=20
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -m isolated
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -m serial

# Speed goals are checked here, by ratios measured side by side in one run (benchmarks/README.md).
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_preprocess.py
	$(BIN)/python benchmarks/bench_predictor_overhead.py
	$(BIN)/python benchmarks/bench_ort_speed.py
	$(BIN)/python benchmarks/bench_serve.py

clean:
	rm -rf $(VENV) $(REF_VENV) $(TRITON_VENV) artifacts .pytest_cache

# The tritonserver bundled in the nvidia-pytriton wheel (python backend only) runs the generated
# Triton repository in tests/serve/test_triton_server.py and benchmarks/bench_triton.py.
# It needs numpy < 2, so it gets its own environment: vitdeploy[cpu] from this checkout, no torch.
$(TRITON_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(TRITON_VENV)/bin/python -m pip install --quiet "numpy<2" "nvidia-pytriton==0.7.0" -e ".[cpu]"
	touch $(TRITON_STAMP)

triton-env: $(TRITON_STAMP)
