#!/bin/bash
# Run lighteval 0.13 offline on both tiny models (via run_lighteval.py, which calls the same
# function as `lighteval accelerate` after stubbing the tinyBenchmarks download).
set -e
# NOTE: requires xxhash<4 in the venv (xxhash 4.x rejects str input used by lighteval DetailsLogger)
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
cd /tmp/lighteval-probe
for M in tiny-llama tiny-llama-perturbed; do
  /tmp/lv-venv/bin/python run_lighteval.py /tmp/lighteval-probe/models/$M "probe_mc|0,probe_gen|0"
done
