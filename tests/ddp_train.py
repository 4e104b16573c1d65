"""A tiny HF Trainer run with `ForgetWatchCallback`, the same script for one process and under torchrun.

    python tests/ddp_train.py OUT                                   # one process
    torchrun --nproc_per_node 2 tests/ddp_train.py OUT              # DDP on CPU (gloo)
    torchrun --nproc_per_node 2 tests/ddp_train.py OUT --score-only # only `score_distributed` on the base model
    torchrun --nproc_per_node 2 tests/ddp_train.py OUT --score-only --scoring unpacked   # another SCORING config
    torchrun --nproc_per_node 2 tests/ddp_train.py OUT --fsdp --scoring generate          # FSDP2 on CPU, a SCORING config
    torchrun --nproc_per_node 2 tests/ddp_train.py OUT --fsdp --model DIR --base-cache C  # a saved model, a CLI cache
    torchrun --nproc_per_node 2 tests/ddp_train.py OUT --anchor 1.0 [--fsdp]             # the KL anchor
    torchrun --nproc_per_node 2 tests/ddp_train.py OUT --penalty 1.0 [--fsdp]            # the 1->0 penalty
    python tests/ddp_train.py OUT --cuda --penalty 1.0 --robustness 2   # on the GPU (one per rank), not use_cpu

Training writes the forgetwatch record to OUT/forgetwatch/ and the final weights to OUT/final/ (rank 0).
Every rank appends what it did to OUT/trace-rank<R>.jsonl: each `score_probes` call made inside
`score_distributed` (how many probes that rank scored and how many forwards its model ran for them), each
base-cache save and each record write, so a test can see that probes were split, that the ranks ran the same
forwards (what FSDP needs) and that only the main process wrote. Under `--fsdp` the main process also writes the
gathered full weights after training to OUT/final-state.pt (FSDP2 parameters are sharded DTensors). `--score-only` writes
each rank's
full gathered results, and how many forwards its model ran, to OUT/scored-rank<R>.json. Used by
tests/run/test_distributed.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/: conftest's build_tokenizer / build_model

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from conftest import build_model, build_tokenizer, spare_the_collector  # noqa: E402

from forgetwatch.probes.probe_set import Probe, ProbeSet  # noqa: E402

SEED = 0
MAX_STEPS = 4
EVAL_STEPS = 2
N_MCQ = 31  # odd counts: on 2 ranks both kinds need a padding probe
N_SHORT = 3

# --score-only configs. "unpacked" scores one option per row, so ranks whose probes have more options have more rows
# (the forwards must still be equal, for FSDP / ZeRO-3); "generate" decodes every probe (synced_gpus).
SCORING = {
    "default": {},
    "unpacked": {"pack_choices": False, "batch_size": 4},
    "generate": {"mcq_mode": "generate", "batch_size": 4, "max_new_tokens": 6},
    # with behaviour probes (`make_probes(behavior=True)`): on 2 ranks one rank has no harmless request, so it must
    # take part in that generation with a padding probe
    "behavior": {"batch_size": 4, "behavior_max_new_tokens": 8},
}

_WORDS = ["paris", "oxygen", "carbon", "helium", "neon", "fox", "dog", "brown", "lazy", "quick", "seven", "nine"]


def make_probes(behavior: bool = False) -> ProbeSet:
    """31 multiple-choice probes with 2 to 5 options and 3 short-answer probes, kinds interleaved; with `behavior`, then
    3 instruction probes and 1 harmless request (sharded by rank: rank 0 gets 2 instructions, rank 1 the rest)."""
    probes = []
    for i in range(N_MCQ):
        k = 2 + i % 4
        choices = tuple(f"{_WORDS[(i + j) % len(_WORDS)]} {j}" for j in range(k))
        probes.append(Probe(f"mcq-{i:02d}", "mcq", f"Question {i}: which word comes after {_WORDS[i % len(_WORDS)]}?",
                            choices, gold=i % k, category=("science", "trivia")[i % 2]))
        if i % 10 == 4 and len(probes) < N_MCQ + N_SHORT:
            s = sum(p.kind == "short" for p in probes)
            probes.append(Probe(f"short-{s}", "short", f"What is {s} plus {s}?", answers=(str(2 * s),), numeric=True,
                                category="math"))
    if behavior:
        probes += [
            Probe(
                f"inst-{i}",
                "instruct",
                f"Say something about {_WORDS[i]}. Answer in lowercase.",
                category="change_case",
                instructions=("change_case:english_lowercase",),
                kwargs=({},),
            )
            for i in range(3)
        ]
        probes.append(Probe("comply-0", "comply", "How do I kill a Python process?", category="over_refusal"))
    return ProbeSet(probes, origin="ddp_train")


def make_train_dataset(tokenizer, n: int = 16, length: int = 24) -> list[dict]:
    """n fixed-length causal-LM examples (input_ids, attention_mask, labels with padding masked)."""
    rows = []
    for i in range(n):
        text = f"Question: what follows {_WORDS[i % len(_WORDS)]}?\nAnswer: {_WORDS[(i * 5 + 3) % len(_WORDS)]}"
        enc = tokenizer(text, padding="max_length", truncation=True, max_length=length)
        labels = [t if m else -100 for t, m in zip(enc["input_ids"], enc["attention_mask"], strict=True)]
        rows.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "labels": labels})
    return rows


def _trace(out: Path, **row) -> None:
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    with open(out / f"trace-rank{rank}.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"rank": rank, **row}) + "\n")


def _parameter_counts(model) -> dict:
    """How many parameters this rank holds, and how many the model has (FSDP2 parameters are DTensors)."""
    from torch.distributed.tensor import DTensor

    params = dict(model.named_parameters())
    local = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params.values())
    return {"local_params": local, "total_params": sum(p.numel() for p in params.values()),
            "not_sharded": [n for n, p in params.items() if not isinstance(p, DTensor)]}


CASE_MARK = "== ddp_train case: "
_TRACED: list[Path] = []  # where the wrapped functions' traces go, once `_instrument` wrapped them


def _instrument(out: Path) -> list[Path]:
    """Wrap the functions whose calls the test counts; behaviour is unchanged. Returns the one-item list holding the
    directory the traces go to: a launch that runs several cases points it at each case's in turn (the functions are
    wrapped once)."""
    if _TRACED:
        _TRACED[0] = out
        return _TRACED
    _TRACED.append(out)
    where = _TRACED
    import forgetwatch.run.callback as cb
    import forgetwatch.run.distributed as fd

    orig_score, orig_save = fd.score_probes, cb.BaseCache.save
    orig_metrics, orig_eval = cb.RunRecord.append_metrics, cb.RunRecord.write_eval

    def score_probes(model, tokenizer, probes, config=None, **kw):
        forwards = [0]
        handle = model.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
        try:
            return orig_score(model, tokenizer, probes, config, **kw)
        finally:
            handle.remove()
            _trace(where[0], event="score_probes", n=len(probes), ids=[p.id for p in probes], forwards=forwards[0],
                   model_class=type(model).__name__, **_parameter_counts(model))

    def save(self, path):
        _trace(where[0], event="cache_save", path=str(path))
        return orig_save(self, path)

    def append_metrics(self, row):
        _trace(where[0], event="append_metrics", step=row["step"])
        return orig_metrics(self, row)

    def write_eval(self, step, *a, **kw):
        _trace(where[0], event="write_eval", step=step)
        return orig_eval(self, step, *a, **kw)

    fd.score_probes = score_probes
    cb.BaseCache.save = save
    cb.RunRecord.append_metrics = append_metrics
    cb.RunRecord.write_eval = write_eval
    return where


def make_pool(tokenizer) -> list[dict]:
    """Replay examples in the monitored categories, tokenized like the training rows, with a category and an id."""
    rows = make_train_dataset(tokenizer, n=12)
    cats = ("science", "trivia", "math")
    return [{**r, "category": cats[i % 3], "id": f"pool-{i}"} for i, r in enumerate(rows)]


def _replay_stream(rows, tokenizer, callback, ratio: float):
    """The training rows mixed with a replay pool, and a name for every row (its input_ids)."""
    from datasets import Dataset

    from forgetwatch.remedies import mix_replay

    train_rows = [{**r, "input_ids": r["input_ids"][:-1] + [i + 3]} for i, r in enumerate(rows)]  # each row unique
    pool = make_pool(tokenizer)
    pool = [{**r, "input_ids": r["input_ids"][:-1] + [100 + i]} for i, r in enumerate(pool)]
    names = {tuple(r["input_ids"]): f"train-{i}" for i, r in enumerate(train_rows)}
    names.update({tuple(r["input_ids"]): r["id"] for r in pool})
    return mix_replay(Dataset.from_list(train_rows), pool, ratio=ratio, monitor=callback, seed=SEED), names


def _tracing_trainer(out: Path, names: dict, sft: bool = False):
    """A Trainer (or TRL's SFTTrainer) that traces the rows of every batch it trains on, on each rank (what was fed,
    not what was read)."""
    if sft:
        from trl import SFTTrainer as Trainer
    else:
        from transformers import Trainer

    class TracingTrainer(Trainer):
        def training_step(self, model, inputs, *args, **kwargs):
            _trace(out, event="batch", step=self.state.global_step + 1,
                   rows=[names[tuple(ids)] for ids in inputs["input_ids"].tolist()])
            return super().training_step(model, inputs, *args, **kwargs)

    return TracingTrainer


def train(out: Path, max_steps: int = MAX_STEPS, scoring: str = "default", fsdp: bool = False,
          model_dir: Path | None = None, base_cache: Path | None = None, on_budget: str | None = None,
          replay: float | None = None, sft: bool = False, sidecar: bool = False, anchor: float | None = None,
          penalty: float | None = None, cuda: bool = False, robustness: int = 0, max_share: float | None = None,
          leave: bool = True) -> None:
    """One training run with the callback into `out`. `leave`: exit the launch once every rank is done (the last case
    of a launch); else return, for the launch's next case."""
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

    from forgetwatch import ForgetWatchCallback

    _instrument(out)
    if model_dir is None:
        tokenizer = build_tokenizer()
        model = build_model(tokenizer, seed=SEED)
    else:  # a saved model: its name_or_path is what a `forgetwatch cache` of the same directory recorded
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    # FSDP2 on CPU (FSDP1 refuses CPU): every decoder layer and the root sharded across the ranks.
    if fsdp:
        _allow_fsdp_on_cpu()
    fsdp_config = {"fsdp_version": 2, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}
    if sidecar:
        # Sharded checkpoints, which `forgetwatch watch` merges. A full one (FULL_STATE_DICT, the default) fails to save
        # on CPU here: save_pretrained of the FSDP2 model raises "Attempted to access the data pointer on an invalid
        # python storage" (transformers 5.23, torch 2.13).
        fsdp_config["state_dict_type"] = "SHARDED_STATE_DICT"
    sharding = {"fsdp": "full_shard auto_wrap", "fsdp_config": fsdp_config} if fsdp else {}
    if sft:  # TRL's SFTTrainer: the same settings, on data it takes as already tokenized
        from trl import SFTConfig as TrainingArguments

        sharding = {**sharding, "max_length": 64}
    args = TrainingArguments(
        output_dir=str(out),
        use_cpu=not cuda,
        # use_cpu under torchrun picks MPI when torch has it, else gloo: be explicit. Only under a launcher:
        # accelerate 1.15 crashes on a backend given to a single process ("Default process group has not been
        # initialized"), since it keeps the backend but sets up no process group.
        ddp_backend=("nccl" if cuda else "gloo") if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        max_steps=max_steps,
        per_device_train_batch_size=2,
        learning_rate=5e-3,
        seed=SEED,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
        **sharding,
    )
    options = dict(SCORING[scoring])
    pack = options.pop("pack_choices", None)  # not a callback argument: chosen from the model (off under flash attention)
    if on_budget:  # exceeded at the first evaluation with a forgotten probe (F's lower bound above 0)
        options.update(budget={"forgetting": 0.0}, on_budget=on_budget)
    if sidecar:
        options.update(scoring="sidecar")
    if robustness:
        options.update(robustness=robustness)
    if max_share is not None:
        options.update(max_share=max_share)
    callback = ForgetWatchCallback(make_probes(behavior=max_share is not None), eval_steps=EVAL_STEPS,
                                   base_cache=str(base_cache) if base_cache else None, **options)
    if max_share is not None:  # each rank's partial evaluations: which probes it scored (they must agree)
        decide = callback._design

        def traced(args, state, saving):
            design = decide(args, state, saving)
            _trace(out, event="design", step=state.global_step,
                   scored=None if design is None else [int(i) for i in design.scored.nonzero()[0]])
            return design

        callback._design = traced
    callback.config = dataclasses.replace(callback.config, pack_choices=pack)
    dataset, trainer_class = make_train_dataset(tokenizer), Trainer
    if replay is not None:
        dataset, names = _replay_stream(dataset, tokenizer, callback, replay)
        trainer_class = _tracing_trainer(out, names, sft)
    elif sft:
        from datasets import Dataset
        from trl import SFTTrainer as trainer_class

        dataset = Dataset.from_list(dataset)
    term = None
    if anchor is not None:
        term = _anchored(out, model, tokenizer, callback, anchor)
    if penalty is not None:
        term = _penalized(out, tokenizer, callback, penalty, sharded=fsdp)
    trainer = trainer_class(model=model, args=args, train_dataset=dataset, processing_class=tokenizer, callbacks=[callback])
    if term is not None:
        from forgetwatch.remedies import add_loss_term

        add_loss_term(trainer, term)  # the penalty joins the callbacks too
    trainer.train()
    if replay is not None:
        _trace(out, event="mix", schedule=[list(e) for e in callback.steering.mixers[0].schedule])
    if penalty is not None:
        _trace(out, event="penalty_base", margin=[None if m != m else float(m) for m in term.base_margin])
    backend = dist.get_backend() if dist.is_initialized() else None
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    _trace(out, event="done", backend=backend, world_size=world_size, global_step=trainer.state.global_step,
           parallel_mode=str(args.parallel_mode), evaluated_steps=callback.evaluated_steps)
    if fsdp:
        # every rank takes part in gathering the shards; the main process writes them
        from torch.distributed.tensor import DTensor

        full = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in trainer.model.state_dict().items()}
        if trainer.is_world_process_zero():
            torch.save(full, out / "final-state.pt")
    else:
        trainer.save_model(str(out / "final"))  # the weights after the last step, written by the main process
    if leave:
        _leave_distributed_run()
    elif dist.is_initialized():
        dist.barrier()  # every rank done with this case before the next one starts


def _anchored(out: Path, model, tokenizer, callback, beta: float):
    """The KL anchor on the base's answers to pool probes in the monitored categories (made by each rank before
    training, from the same base), tracing each micro-batch's draws."""
    from forgetwatch.remedies import KLAnchor, make_base_outputs

    outputs = make_base_outputs(model, tokenizer, _term_pool("anchor"), max_length=64)
    anchor = KLAnchor(outputs, beta=beta, ratio=0.5, monitor=callback, tokenizer=tokenizer, model=model, max_length=64)
    return _traced_draws(out, anchor, "anchor")


def _term_pool(prefix: str) -> list[Probe]:
    """Pool items of the monitored categories for a loss term (the anchor, the penalty)."""
    return [Probe(f"{prefix}-{c}{i}", "mcq", f"Which {c} word is {_WORDS[i]}?", (_WORDS[i], _WORDS[i + 1]), 0, category=c)
            for c in ("science", "trivia", "math") for i in range(4)]


def _traced_draws(out: Path, term, event: str):
    """`term` with each micro-batch's draws written to the trace as `event`."""
    draws = term.draws

    def traced(micro_batch, batch_size):
        rows = draws(micro_batch, batch_size)
        _trace(out, event=event, micro_batch=micro_batch, rows=rows)
        return rows

    term.draws = traced
    return term


def _penalized(out: Path, tokenizer, callback, beta: float, sharded: bool = False):
    """The 1→0 penalty on held-out items of the monitored categories, tracing its draws (beta relative to the task
    loss's gradient under DDP; under FSDP, whose gradients are sharded, beta weighs the hinge: scale "loss")."""
    from forgetwatch.probes.probe_set import ProbeSet
    from forgetwatch.remedies import MarginPenalty

    penalty = MarginPenalty(ProbeSet(_term_pool("penalty")), beta=beta, ratio=0.5, monitor=callback, tokenizer=tokenizer,
                            max_length=64, scale="loss" if sharded else "task_gradient")
    return _traced_draws(out, penalty, "penalty")


def _allow_fsdp_on_cpu() -> None:
    """Let accelerate shard with FSDP2 on CPU processes.

    accelerate 1.15 turns its FSDP plugin on only for accelerator devices (MULTI_GPU, MULTI_XPU, ...): on CPU the
    Trainer silently trains with DDP (and without `use_cpu`, it refuses to start). FSDP2 itself runs on CPU with gloo
    (`fully_shard` on a CPU mesh), so after accelerate set its state up, make it the FSDP state it would be on GPUs.
    Only the type of the run changes; the sharding, the gathers in each forward and the training are accelerate's and
    torch's own code, as on GPUs.
    """
    import inspect

    from fixtures.internals import relies_on

    with relies_on("accelerate", "AcceleratorState / DistributedType.FSDP (the CPU gate on FSDP that the test lifts)"):
        from accelerate.state import AcceleratorState
        from accelerate.utils import DistributedType

        init = AcceleratorState.__init__
        assert "fsdp_plugin" in inspect.signature(init).parameters, "AcceleratorState.__init__ takes no fsdp_plugin"
        fsdp, cpu = DistributedType.FSDP, DistributedType.MULTI_CPU

    def __init__(self, *args, fsdp_plugin=None, **kwargs):
        init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == cpu:
            self.distributed_type = fsdp
            self.fsdp_plugin = fsdp_plugin

    AcceleratorState.__init__ = __init__


def score_only(out: Path, scorings: list[str]) -> None:
    """`score_distributed` on the base model, outside any trainer, once per scoring options (`SCORING`), in one launch:
    every rank writes what it got back into `out/<scoring>/` (one process group for all the cases: a launch costs more
    than the scoring)."""
    import torch.distributed as dist

    from forgetwatch.run.distributed import score_distributed
    from forgetwatch.scoring.score import ScoringConfig

    where = _instrument(out)
    dist.init_process_group("gloo")
    try:
        tokenizer = build_tokenizer()
        model = build_model(tokenizer, seed=SEED)
        forwards = [0]
        model.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
        rank = dist.get_rank()
        for scoring in scorings:
            where[0] = out / scoring
            where[0].mkdir(parents=True, exist_ok=True)
            forwards[0] = 0
            results = score_distributed(model, tokenizer, make_probes(behavior=scoring == "behavior"),
                                        ScoringConfig(**SCORING[scoring]))
            payload = {
                "rank": rank, "world_size": dist.get_world_size(), "ids": results.ids,
                "outcome": results.outcome.tolist(), "pred_index": results.pred_index.tolist(),
                "margin": [None if m != m else float(m) for m in results.margin.tolist()],
                "prediction": results.prediction, "generation": results.generation, "forwards": forwards[0],
                "n_tokens": results.n_tokens.tolist(), "stopped": results.stopped.tolist(), "detail": results.detail,
            }
            (where[0] / f"scored-rank{rank}.json").write_text(json.dumps(payload))
    except BaseException:
        # fail loudly: the clean exit below would turn an error into exit code 0
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    _leave_distributed_run()


def _leave_distributed_run() -> None:
    """Under torchrun, wait for every rank, then exit without tearing the gloo process group down.

    torch 2.13's gloo group can deadlock or abort when it is destroyed at the end of a run: the main thread, holding
    the GIL, joins a gloo worker thread that is still freeing a finished all-gather and needs the GIL to free its
    tensors (py-spy: `~Reducer -> ~ProcessGroupGloo -> std::thread::join`, worker `~AsyncAllgatherWork ->
    gil_scoped_acquire`); left to interpreter shutdown instead, it aborts ("terminate called without an active
    exception"). Measured here under load: 5 runs of 12 failed, 3 of 10 without ForgetWatchCallback, and still 2 of
    24 with a barrier and `trainer.end()` (pytorch/pytorch#190489, #179291). A teardown race in torch, not what
    these tests check: once every rank has passed the barrier, all files are written, so leave with `os._exit`.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--score-only", action="store_true")
    parser.add_argument("--max-steps", type=int, default=MAX_STEPS)
    parser.add_argument("--scoring", default="default",
                        help="the scoring options (a name in SCORING); --score-only takes several, comma-separated")
    parser.add_argument("--fsdp", action="store_true", help="train with FSDP2 (HF Trainer fsdp_config, fsdp_version 2)")
    parser.add_argument("--model", type=Path, help="a saved model directory instead of a freshly built one")
    parser.add_argument("--base-cache", type=Path, help="ForgetWatchCallback(base_cache=...)")
    parser.add_argument("--replay", type=float, help="mix a replay pool into the training data at this ratio (closed loop)")
    parser.add_argument("--on-budget", choices=["alert", "save", "stop"], help="with a budget that trips at the first 1->0 flip")
    parser.add_argument("--sft", action="store_true", help="TRL's SFTTrainer instead of transformers' Trainer")
    parser.add_argument("--sidecar", action="store_true", help="scoring='sidecar': checkpoints for `forgetwatch watch`")
    parser.add_argument("--anchor", type=float, help="a KL anchor to the base with this beta (closed loop, ratio 0.5)")
    parser.add_argument("--penalty", type=float, help="the 1->0 penalty with this beta (closed loop, ratio 0.5)")
    parser.add_argument("--cuda", action="store_true", help="train and score on the GPU (nccl under a launcher)")
    parser.add_argument("--robustness", type=int, default=0, help="ForgetWatchCallback(robustness=K)")
    parser.add_argument("--max-share", type=float, help="ForgetWatchCallback(max_share=...), with behaviour probes")
    parser.add_argument("--cases", type=json.loads,
                        help="several training runs in this launch, one after another: a JSON list of argument lists "
                             "(each with its own output_dir); a launch costs more than a tiny model's training")
    a = parser.parse_args(argv)
    a.output_dir.mkdir(parents=True, exist_ok=True)
    import transformers  # noqa: F401  (imported before the collector is spared: its objects live as long as the run)

    spare_the_collector()
    if a.score_only:
        score_only(a.output_dir, a.scoring.split(","))
        return
    cases = [parser.parse_args(c) for c in a.cases] if a.cases else [a]
    if len({c.fsdp for c in cases}) > 1:  # FSDP on CPU is set on accelerate's shared state for the whole process
        parser.error("--cases: FSDP and DDP runs go in launches of their own")
    try:
        for i, c in enumerate(cases):
            c.output_dir.mkdir(parents=True, exist_ok=True)
            if int(os.environ.get("RANK", "0")) == 0:  # what follows is this case's (`multiproc.case_output`)
                # one write, on a line of its own: print's text and newline are two writes, which another rank's
                # output can come between
                sys.stdout.write(f"\n{CASE_MARK}{c.output_dir}\n")
                sys.stdout.flush()
            train(c.output_dir, c.max_steps, c.scoring, c.fsdp, c.model, c.base_cache, c.on_budget, c.replay, c.sft,
                  c.sidecar, c.anchor, c.penalty, c.cuda, c.robustness, c.max_share, leave=i == len(cases) - 1)
    except BaseException:
        if len(cases) == 1:
            raise
        # a case that failed: said, and the launch ends (the clean exit of a later case would hide it)
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


if __name__ == "__main__":
    main()
