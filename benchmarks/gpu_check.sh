#!/bin/bash
# The GPU check of RESULTS §17: on a machine with one CUDA GPU, from the repository root,
#
#     OUT=/tmp/gpu-check bash benchmarks/gpu_check.sh
#
# The same tiny runs of tests/ddp_train.py (a model built in code, synthetic probes: no download) on the CPU and on
# the GPU: the 1->0 penalty with robustness (transformers' Trainer), the KL anchor with robustness (TRL's SFTTrainer),
# sidecar scoring then `forgetwatch watch --device cuda`, and `forgetwatch interpolate` on each device; their figures
# side by side in $OUT/compare.json (benchmarks/gpu_check_compare.py); then the CPU multi-process tests
# (tests/run/test_distributed.py, tests/run/test_fsdp.py). Wheels in .whl/ are installed to /tmp/site first when present
# (a machine without the project's dependencies). About 3 minutes on an H200.
OUT=${OUT:-/tmp/gpu-check}; mkdir -p "$OUT"; export OUT
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled HF_HUB_OFFLINE=1
T0=$(date +%s)
[ -d .whl ] && { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3; }
export PYTHONPATH=/tmp/site:$PWD
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -c "import sys; from forgetwatch.cli import main; sys.exit(main())" "$@"\n' > /tmp/bin/forgetwatch && chmod +x /tmp/bin/forgetwatch
export PATH=/tmp/bin:$PATH
python3 -c "import torch, transformers, trl; print('torch', torch.__version__, torch.cuda.get_device_name(0), 'transformers', transformers.__version__, 'trl', trl.__version__)"
python3 - <<'PY'
import sys; sys.path.insert(0, "tests")
from conftest import build_model, build_tokenizer
tok = build_tokenizer(); m = build_model(tok, seed=0); m.save_pretrained("/tmp/base"); tok.save_pretrained("/tmp/base")
PY
run() { name=$1; shift; ( timeout 150 python3 tests/ddp_train.py /tmp/$name "$@" > $OUT/$name.log 2>&1; echo "$name rc $?" ) ; }
CUDA_VISIBLE_DEVICES= run cpu-penalty --model /tmp/base --penalty 1.0 --robustness 2 &
run gpu-penalty --model /tmp/base --penalty 1.0 --robustness 2 --cuda &
run gpu-anchor-sft --model /tmp/base --anchor 1.0 --sft --robustness 2 --cuda &
CUDA_VISIBLE_DEVICES= run cpu-anchor-sft --model /tmp/base --anchor 1.0 --sft --robustness 2 &
run gpu-sidecar --model /tmp/base --sidecar --robustness 2 --cuda &
wait
echo "runs done $(( $(date +%s) - T0 )) s"
timeout 120 forgetwatch watch /tmp/gpu-sidecar --once --device cuda > $OUT/watch.log 2>&1; echo "watch rc $?"; tail -5 $OUT/watch.log
for d in cpu gpu; do
  timeout 120 forgetwatch interpolate --model /tmp/$d-penalty/final --base-model /tmp/base --probes /tmp/$d-penalty/forgetwatch/probes.jsonl \
    --base /tmp/$d-penalty/forgetwatch/base.parquet --alphas 0:1:0.5 --device $([ $d = gpu ] && echo cuda || echo cpu) --json > $OUT/interp-$d.json 2> $OUT/interp-$d.err; echo "interpolate $d rc $?"
done
python3 benchmarks/gpu_check_compare.py
echo "compare done $(( $(date +%s) - T0 )) s"
timeout 200 python3 -m pytest -q -m "not slow" -n 14 -p no:cacheprovider tests/run/test_distributed.py tests/run/test_fsdp.py > $OUT/pytest.log 2>&1
echo "pytest rc $? at $(( $(date +%s) - T0 )) s"; tail -3 $OUT/pytest.log; grep -E "^(FAILED|ERROR)" $OUT/pytest.log | head
