"""Run lighteval 0.13 offline on a local model dir with local custom tasks, saving details.

Usage: python run_lighteval.py MODEL_DIR [TASKS]
Works around an offline bug: lighteval's Registry imports every built-in task module, and
lighteval/tasks/tasks/tiny_benchmarks.py does requests.get(raw.githubusercontent.com/...) at
import time (TinyCorpusAggregator.__init__ -> download()), which raises ConnectionError offline.
We stub requests.get with a 404 response so download() silently skips.
"""
import os, sys
os.environ.setdefault("HF_HUB_OFFLINE", "1"); os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1"); os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import requests
class _Offline404:
    status_code = 404
    content = b""
_real_get = requests.get
def _offline_get(url, *a, **k):
    if "tinyBenchmarks" in str(url):
        return _Offline404()
    return _real_get(url, *a, **k)
requests.get = _offline_get

# Workaround 2: the Registry also imports lighteval/tasks/tasks/mt_bench/main.py, whose judge metric
# calls HfApi().list_models(model_name=...) at import time -> TypeError with huggingface_hub 2.x
# (and a network call anyway). We only need our custom tasks, so skip importing the built-in task
# modules entirely (custom tasks are still loaded via --custom-tasks).
from lighteval.tasks.registry import Registry
if os.environ.get("LV_LOAD_BUILTIN_TASKS") != "1":
    Registry._load_from_files = staticmethod(lambda files, module_prefix: {})
    Registry._load_from_subdirs = staticmethod(lambda subdirs: {})

from lighteval.main_accelerate import accelerate

model_dir = sys.argv[1]
tasks = sys.argv[2] if len(sys.argv) > 2 else "probe_mc|0,probe_gen|0"
accelerate(
    model_args=f"model_name={model_dir},dtype=float32,batch_size=4",
    tasks=tasks,
    custom_tasks="/tmp/lighteval-probe/custom_tasks.py",
    output_dir="/tmp/lighteval-out",
    save_details=True,
)
