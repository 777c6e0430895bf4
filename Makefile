# Two set-up commands: `make demo` and `make test`. Both create .venv and install into it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch is pinned: an unpinned torch pulls a multi-GB CUDA build on a CPU machine.
TORCH  := torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: demo test install clean bench

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[cpu,export,dev,serve]" "$(TORCH)"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/vitdeploy export -c pipeline.yaml
	$(BIN)/vitdeploy predict vitdeploy/demo/images -a artifacts

test: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadfile

# Speed goals are checked here, by ratios measured side by side in one run (benchmarks/README.md).
bench: $(STAMP)
	$(BIN)/python benchmarks/bench_preprocess.py
	$(BIN)/python benchmarks/bench_predictor_overhead.py
	$(BIN)/python benchmarks/bench_ort_speed.py
	$(BIN)/python benchmarks/bench_serve.py

clean:
	rm -rf $(VENV) artifacts .pytest_cache
