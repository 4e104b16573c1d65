"""Robustness drift in real runs (issue 29): `robustness=K` on the callback, the watcher and the CLI.

A tiny random Llama trained with TRL's SFTTrainer (bf16 autocast, CPU, offline W&B): the robust figures reach W&B as
the record has them, are right when the checkpoints are scored again, survive a resume, never change training, and the
base cache is keyed by its variants.
"""

from __future__ import annotations

import json
import logging
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("wandb")

from conftest import build_model  # noqa: E402,I001
from fixtures.trainers import (
    BF16,
    SCORING,
    CrashBeforeStep,
    assert_same_weights,
    logged_name,
    metric_rows,
    make_probes,
    own_logs,
    sft_trainer,
    the_watcher,
    watcher,
)
from conftest import clear_wandb_env
from fixtures.wandb_offline import find_run_file, finish_offline_run, read_history  # noqa: E402

from forgetwatch import BaseCache, ForgetWatchCallback, load_record, score_probes  # noqa: E402
from forgetwatch.measures.robustness import variant_outcomes
from forgetwatch.options import ForgetWatchArguments  # noqa: E402
from forgetwatch.cli import main as cli  # noqa: E402
from forgetwatch.scoring.models import load_checkpoint  # noqa: E402
from forgetwatch.record.store import RunRecord  # noqa: E402
from forgetwatch.measures.robustness import SCALARS, robust_rows  # noqa: E402
from forgetwatch.probes.variants import RobustnessError, make_plan  # noqa: E402
from forgetwatch.scoring.score import ScoringConfig  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`gradient_checkpointing.*` is deprecated:FutureWarning")]

K = 3
LIMIT = 0.1  # robust_forgetting budget (point): the run below goes over it at step 4
CATEGORIES = ("add", "compare", "count", "short")


def robust_watcher(**kwargs) -> ForgetWatchCallback:
    return watcher(robustness=K, **kwargs)


@pytest.fixture(scope="module")
def robust_run(tokenizer, tmp_path_factory):
    """SFT for 6 steps, probes and 3 variants each every 2 steps, checkpoints every 2 steps, a robust budget, W&B."""
    root = tmp_path_factory.mktemp("robust_run")
    with pytest.MonkeyPatch.context() as mp:
        clear_wandb_env(mp, root / "wandb")
        finish_offline_run()
        cb = robust_watcher(budget={"robust_forgetting": LIMIT}, budget_bound="point")
        trainer = sft_trainer(tokenizer, root / "out", [cb], report_to="wandb", save_strategy="steps", save_steps=2)
        try:
            trainer.train()
        finally:
            finish_offline_run()
    return SimpleNamespace(trainer=trainer, callback=cb, out=root / "out", wandb_file=find_run_file(root / "wandb"),
                           record=load_record(root / "out"))


def logged(group: str, name: str) -> str:
    return logged_name(group, name)


def test_robust_figures_reach_wandb_as_the_record_has_them(robust_run):
    metrics = metric_rows(robust_run.record)
    assert sorted(metrics) == [0, 2, 4, 6]
    rows = [r for r in read_history(robust_run.wandb_file) if "forgetwatch/forgetting" in r]
    assert [r["train/global_step"] for r in rows] == [0, 2, 4, 6]
    for r in rows:
        groups = metrics[r["train/global_step"]]["metrics"]
        assert set(groups) == {"overall", *CATEGORIES}
        for group, m in groups.items():
            assert m["robust_n"] == {"overall": 32, "add": 12, "compare": 8, "count": 8, "short": 4}[group]
            assert m["robust_variants"] == K
            for name, field in SCALARS.items():
                value = m.get(field)
                if value is None or (isinstance(value, float) and math.isnan(value)):
                    assert logged(group, name) not in r  # NaN (nothing robust at base) and lettered-only figures
                else:
                    assert r[logged(group, name)] == pytest.approx(value), (group, name)
    final = metrics[6]["metrics"]["overall"]
    assert "position_bias_post" not in final  # log-likelihood: options are read one by one, order cannot matter
    assert final["robust_pre"] > 0 and final["consistency_post"] != final["consistency_pre"]  # the model moved


def test_the_base_against_itself_changes_no_robust_figure(robust_run):
    base = metric_rows(robust_run.record)[0]["metrics"]
    for group, m in base.items():
        assert m["consistency_change"] == 0 and m["fragile"] == 0 and m["robust_lost"] == 0, group
        assert m["robust_accuracy_pre"] == m["robust_accuracy_post"]
        assert m["robust_forgetting"] == 0 or (m["robust_pre"] == 0 and math.isnan(m["robust_forgetting"]))


def test_robust_figures_are_right_when_the_checkpoints_are_scored_again(robust_run, tokenizer):
    """The record's variants and figures at steps 2, 4 and 6 equal a fresh scoring of each checkpoint."""
    record, probes = robust_run.record, robust_run.callback.probes
    plan = make_plan(probes, K)
    cache = BaseCache.load(record.root / "base.parquet")
    base = variant_outcomes(plan, cache.results, cache.variants)
    np.testing.assert_array_equal(record.read_robust(0).right, base.right)
    category = np.array([probes[pid].category for pid in base.ids])
    groups = {"overall": np.ones(len(base.ids), bool), **{c: category == c for c in CATEGORIES}}
    metrics = metric_rows(record)
    for step in (2, 4, 6):
        model, _ = load_checkpoint(robust_run.out / f"checkpoint-{step}", dtype="float32", device="cpu")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            full = score_probes(model, tokenizer, plan.scored(), ScoringConfig(**SCORING))
        now = variant_outcomes(plan, *plan.split(full))
        recorded = record.read_robust(step)
        assert recorded.ids == now.ids
        np.testing.assert_array_equal(recorded.right, now.right, err_msg=f"step {step}")
        for group, row in robust_rows(base, now, groups, lettered=False).items():
            got = {k: metrics[step]["metrics"][group][k] for k in row}
            assert got == pytest.approx(row, nan_ok=True), (step, group)


def test_a_robust_budget_is_judged_on_the_robust_figures(robust_run):
    metrics = metric_rows(robust_run.record)
    over = [s for s in (2, 4, 6) if metrics[s]["metrics"]["overall"]["robust_forgetting"] > LIMIT]
    assert over, "the run is meant to go over the limit (its seed and LR are fixed)"
    events = [e for e in robust_run.record.read_events() if e["event"] == "budget_exceeded"]
    assert [e["step"] for e in events] == over[:1]  # said once, when it starts
    assert (
        events[0]["key"] == "robust_forgetting"
        and events[0]["measured"] == metrics[over[0]]["metrics"]["overall"]["robust_forgetting"]
    )


def test_the_base_cache_is_keyed_by_its_variants(robust_run, tokenizer, tmp_path, caplog):
    path = robust_run.record.root / "base.parquet"
    cache = BaseCache.load(path)
    plan = make_plan(robust_run.callback.probes, K)
    assert cache.key["variants"] == plan.key() and cache.key["variants"]["rows"] == 32 * K
    assert cache.variants.ids == [p.id for p in plan.extra()] and len(cache.results) == 32
    # a run without robustness uses it as it is (the probes' own rows), and so does one with fewer of its variants (the
    # first K of a larger K); one that needs variants it lacks scores the base again
    for name, extra in (("plain", {}), ("fewer", {"robustness": 2})):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="forgetwatch"):
            sft_trainer(tokenizer, tmp_path / name, [watcher(base_cache=str(path), **extra)], max_steps=2).train()
        assert "Scoring the base model now" not in caplog.text, name
    fewer = metric_rows(load_record(tmp_path / "fewer"))[0]["metrics"]["overall"]
    assert fewer["robust_variants"] == 2 and fewer["consistency_change"] == 0
    right = BaseCache.load(path).variants
    plan2 = make_plan(robust_run.callback.probes, 2)
    np.testing.assert_array_equal(load_record(tmp_path / "fewer").read_robust(0).right,
                                  variant_outcomes(plan2, cache.results, right).right)  # the cache's own first 2 variants
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        sft_trainer(tokenizer, tmp_path / "other", [watcher(base_cache=str(path), robustness=4)], max_steps=2).train()
    assert "variants.k: cache has 3, now 4" in caplog.text and "--robustness 4" in caplog.text
    assert "Scoring the base model now" in caplog.text
    assert BaseCache.load(tmp_path / "other" / "forgetwatch" / "base.parquet").key["variants"]["k"] == 4
    assert BaseCache.load(path).key["variants"]["k"] == K  # the given cache is never overwritten


def test_resume_recomputes_the_robust_figures(robust_run, tokenizer, tmp_path):
    out = tmp_path / "out"
    budget = {"budget": {"robust_forgetting": LIMIT}, "budget_bound": "point"}
    first = sft_trainer(tokenizer, out, [robust_watcher(**budget), CrashBeforeStep(5)], save_strategy="steps", save_steps=2)
    with pytest.raises(RuntimeError, match="simulated crash"):
        first.train()
    second = sft_trainer(tokenizer, out, [robust_watcher(**budget)], save_strategy="steps", save_steps=2,
                         restore_callback_states_from_checkpoint=True)
    second.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert the_watcher(second).evaluated_steps == [0, 2, 4, 6]
    record, reference = load_record(out), robust_run.record
    mine, theirs = metric_rows(record), metric_rows(reference)
    for step in (0, 2, 4, 6):
        assert mine[step]["metrics"] == theirs[step]["metrics"], step
        np.testing.assert_array_equal(record.read_robust(step).right, reference.read_robust(step).right)
    assert record.read_flips() == reference.read_flips()
    assert [e["step"] for e in record.read_events()] == [e["step"] for e in reference.read_events()]


def test_variants_never_change_training(tokenizer, tmp_path):
    runs = {}
    for name, callbacks in [("watched", [robust_watcher(eval_steps=1)]), ("plain", [])]:
        runs[name] = sft_trainer(tokenizer, tmp_path / name, callbacks, dropout=0.1, max_steps=3)
        runs[name].train()
    assert load_record(tmp_path / "watched").eval_steps() == [0, 1, 2, 3]
    assert_same_weights(runs["watched"].model, runs["plain"].model)
    assert own_logs(runs["watched"]) == own_logs(runs["plain"])


def test_the_sidecar_record_holds_the_same_variants(robust_run, tokenizer, tmp_path):
    side = tmp_path / "side"
    base = str(robust_run.record.root / "base.parquet")
    sft_trainer(tokenizer, side, [robust_watcher(scoring="sidecar", base_cache=base)]).train()
    assert cli(["watch", str(side), "--once", "--device", "cpu"]) == 0
    record = RunRecord(side / "forgetwatch")
    assert record.eval_steps() == [0, 2, 4, 6]
    for step in record.eval_steps():
        a, b = record.read_eval(step), robust_run.record.read_eval(step)
        for key in (k for k in a if k.startswith("robust_")):
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"step {step}: {key}")
    # time taken, and which training start wrote the checkpoint (the watcher says): not figures
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("seconds", "start")} for r in rows]  # noqa: E731
    assert strip(record.read_metrics()) == strip(robust_run.record.read_metrics())


def test_a_watcher_asked_for_variants_the_base_cache_lacks_says_how_to_make_it(tokenizer, tmp_path):
    sft_trainer(tokenizer, tmp_path, [watcher(scoring="sidecar")], max_steps=2).train()
    from forgetwatch.run.watcher import SidecarError, Watcher

    with pytest.raises(SidecarError, match=r"holds no variants.*--robustness 2 .*-o .*base\.parquet --force"):
        Watcher(tmp_path, device="cpu", robustness=2)


@pytest.mark.parametrize("kwargs, says", [
    ({"robustness": -1}, "an integer ≥ 1"),
    ({"robustness": 99}, "has 11 variants besides itself"),
    ({"robustness": 2.5}, "an integer ≥ 1"),
    ({"robust_per_suite": 5}, "set `robustness`"),
    ({"robustness": 2, "robust_per_suite": 0}, "robust_per_suite"),
    ({"budget": {"robust_forgetting": 0.1}}, "robust figures need variants"),
    ({"budget": {"consistency_drop": 0.1}}, "robust figures need variants"),
])
def test_bad_robustness_is_refused_at_construction(kwargs, says):
    with pytest.raises(ValueError, match=says):
        watcher(**kwargs)


def test_robustness_0_is_off():
    """"Off" is 0 for every option that turns something on (forgetwatch.options)."""
    assert watcher(robustness=0).plan is None and watcher().plan is None


def test_robustness_on_behaviour_only_probes_is_refused():
    from forgetwatch import Probe, ProbeSet

    probes = ProbeSet([Probe("b1", "comply", "How do I kill a Python process?", category="refusal")])
    with pytest.raises(RobustnessError, match="only behaviour probes"):
        ForgetWatchCallback(probes, robustness=2)


def test_robust_per_suite_bounds_the_variants_and_reaches_the_cache_key(tokenizer, tmp_path):
    cb = watcher(robustness=2, robust_per_suite=3)
    # probes without a suite (`source`) are drawn per category: 3 of each of the 4
    assert len(cb.plan.variants) == 12
    assert {pid.rstrip("0123456789") for pid in cb.plan.variants} == {"add", "cmp", "cnt", "short"}
    assert cb.plan.variants.keys() == watcher(robustness=2, robust_per_suite=3).plan.variants.keys()  # the same draw
    sft_trainer(tokenizer, tmp_path, [cb], max_steps=2).train()
    key = BaseCache.load(tmp_path / "forgetwatch" / "base.parquet").key["variants"]
    assert key["per_suite"] == 3 and key["probes"] == 12 and key["rows"] == 24
    rows = metric_rows(load_record(tmp_path))[2]["metrics"]
    assert rows["overall"]["robust_n"] == 12 and rows["add"]["robust_n"] == 3


def test_recipe_arguments_carry_robustness():
    args = ForgetWatchArguments(forgetwatch_probes="x.jsonl", forgetwatch_robustness=5, forgetwatch_robust_per_suite=20)
    kwargs = args.to_kwargs()
    assert kwargs["robustness"] == 5 and kwargs["robust_per_suite"] == 20


def test_cli_cache_and_compare_with_variants(tokenizer, tiny_model_dir, tmp_path, capsys):
    probes = tmp_path / "probes.jsonl"
    make_probes().to_jsonl(probes)
    base = tmp_path / "base.parquet"
    assert cli(["cache", "--model", str(tiny_model_dir), "--probes", str(probes), "--robustness", "2",
                "--max-new-tokens", "4", "-o", str(base)]) == 0
    assert "robustness: 32 probes x 2 variants" in capsys.readouterr().out
    assert BaseCache.load(base).key["variants"]["k"] == 2
    # the same model against its cache: compare takes the cache's robustness, and every robust figure is unchanged
    assert cli(["compare", "--model", str(tiny_model_dir), "--probes", str(probes), "--base", str(base), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    overall = out["robustness"]["groups"]["overall"]
    assert out["robustness"]["k"] == 2 and overall["robust_n"] == 32
    assert overall["consistency_change"] == 0 and overall["fragile"] == 0 and overall["robust_lost"] == 0
    assert cli(["compare", "--model", str(tiny_model_dir), "--probes", str(probes), "--base", str(base)]) == 0
    text = capsys.readouterr().out
    assert "robustness since base (2 variants of each of 32 probes" in text and "robust F" in text
    # other variants than the cache's: refused, saying what differs, before the model is scored
    assert cli(["compare", "--model", str(tiny_model_dir), "--probes", str(probes), "--base", str(base),
                "--robustness", "3"]) != 0
    err = capsys.readouterr().err
    assert "variants.k: cache has 2, now 3" in err and "--robustness 3" in err and "scoring" not in capsys.readouterr().out
    # an existing -o made with other variants is never replaced without --force
    before = base.read_bytes()
    assert cli(["cache", "--model", str(tiny_model_dir), "--probes", str(probes), "--robustness", "3",
                "--max-new-tokens", "4", "-o", str(base)]) != 0
    assert "variants.k: cache has 2, now 3" in capsys.readouterr().err and base.read_bytes() == before


def test_compare_with_a_nan_variant_keeps_the_plain_comparison(tokenizer, tiny_model_dir, tmp_path, capsys):
    """`compare` against a base cache holding a variant scored NaN (an fp16 overflow when it was made): the plain
    comparison is computed, and only that probe's groups lose their robust figures, saying why, as a run's record does
    (it used to refuse the whole comparison)."""
    probes = tmp_path / "probes.jsonl"
    make_probes().to_jsonl(probes)
    base = tmp_path / "base.parquet"
    assert cli(["cache", "--model", str(tiny_model_dir), "--probes", str(probes), "--robustness", "2",
                "--max-new-tokens", "4", "-o", str(base)]) == 0
    cache = BaseCache.load(base)
    cache.variants.nonfinite[cache.variants.ids.index("cmp3~v2")] = True
    base.unlink()
    cache.save(base)
    capsys.readouterr()
    args = ["compare", "--model", str(tiny_model_dir), "--probes", str(probes), "--base", str(base)]
    assert cli(args + ["--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["metrics"]["overall"]["forgetting"] == 0.0 and "missing" not in out["metrics"]["compare"]
    groups = out["robustness"]["groups"]
    assert groups["compare"]["robust_missing"].startswith("1 of 8 probes have a variant scored NaN or inf by the base "
                                                          "cache (first: cmp3)")
    assert groups["compare"]["robust_forgetting"] is None and groups["compare"]["robust_n"] == 8  # NaN: null in JSON
    assert groups["add"]["consistency_change"] == 0 and "robust_missing" not in groups["add"]
    assert groups["overall"]["nonfinite_variant_probes"] == 1 and "robust_missing" in groups["overall"]
    assert "1 probes have variants scored NaN or inf by the base cache" in captured.err
    assert cli(args) == 0
    text = capsys.readouterr().out
    assert "compare: robust figures missing: 1 of 8 probes have a variant scored NaN or inf" in text
    assert "n/a" in text.split("robustness since base")[1]


def test_a_nan_variant_makes_the_robust_figures_missing(tokenizer, tmp_path, caplog):
    """A variant scored NaN (an fp16 overflow) is no answer: its groups' robust figures are missing, with the reason, and
    a robust budget cannot judge them; the probes as asked keep their figures, and a plain budget is judged."""
    from forgetwatch.measures.budgets import Budget, parse_budget
    from forgetwatch.record.cache import make_cache_key
    from forgetwatch.run.monitor import Monitor

    probes = make_probes()
    plan = make_plan(probes, 2)
    model = build_model(tokenizer)
    full = score_probes(model, tokenizer, plan.scored(), ScoringConfig(**SCORING))
    results, variants = plan.split(full)
    key = make_cache_key({}, probes, ScoringConfig(**SCORING).key(tokenizer, BF16), plan.key())
    budget = Budget(parse_budget({"compare/consistency_drop": 0.5, "compare/forgetting": 0.5}), "alert", "point",
                    probes.groups)
    monitor = Monitor(probes, budget, plan=plan)
    monitor.open(tmp_path, BaseCache(key, results, None, variants), "float32", [], None)
    variants.nonfinite[variants.ids.index("cmp3~v2")] = True
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        monitor.report(results, 2, 0.1, 1.0, variant_outcomes(plan, results, variants))
    assert "the robust figures of overall, compare are missing" in caplog.text
    record = RunRecord(tmp_path / "forgetwatch")
    rows = metric_rows(record)[2]["metrics"]
    assert math.isnan(rows["compare"]["consistency_change"]) and math.isnan(rows["compare"]["robust_forgetting"])
    assert "1 of 8 probes have a variant scored NaN or inf (first: cmp3)" in rows["compare"]["robust_missing"]
    assert "missing" not in rows["compare"] and rows["compare"]["forgetting"] == 0.0  # the probes as asked: judged
    assert not math.isnan(rows["add"]["consistency_change"]) and "robust_missing" not in rows["add"]
    assert rows["overall"]["nonfinite_variant_probes"] == 1 and "nonfinite_probes" not in rows["overall"]
    (event,) = record.read_events()
    assert event["event"] == "budget_cannot_judge" and event["keys"] == ["compare/consistency_drop"]
    assert "have a variant scored NaN or inf" in event["reason"]
    from forgetwatch.measures.robustness import format_robust

    table = format_robust({k: v for k, v in rows.items() if "robust_n" in v})
    assert "compare: robust figures missing: 1 of 8 probes have a variant scored NaN or inf" in table


def test_right_as_asked_but_no_longer_in_every_variant_is_a_flip_of_its_own_kind(tmp_path):
    from forgetwatch.record.cache import make_cache_key
    from forgetwatch.run.monitor import Monitor
    from forgetwatch.scoring.results import ProbeResults

    probes = make_probes()
    plan = make_plan(probes, 2)

    def scored(wrong: set[str]) -> tuple[ProbeResults, ProbeResults]:
        full = ProbeResults.empty([p.id for p in plan.scored()])
        full.outcome[:] = [0 if pid in wrong else 1 for pid in full.ids]
        return plan.split(full)

    class Tables:
        def __init__(self):
            self.tables = []

        def log(self, scalars, step):
            pass

        def log_table(self, name, cols, rows, step):
            self.tables.append((name, step, cols, rows))

    tables = Tables()
    monitor = Monitor(probes, plan=plan)
    base = BaseCache(make_cache_key({}, probes, {}, plan.key()), *scored(set())[:1], None, scored(set())[1])
    monitor.open(tmp_path, base, "float32", [tables], None)
    for step, wrong in ((2, {"add0~v2", "cnt1"}), (4, {"cnt1"})):
        monitor.report(*scored(wrong)[:1], step, 0.0, 1.0, variant_outcomes(plan, *scored(wrong)))
    flips = RunRecord(tmp_path / "forgetwatch").read_flips()
    assert [(f["step"], f["id"], f["direction"], f["vs_base"]) for f in flips] == [
        (2, "cnt1", "1→0", "forgotten"), (2, "add0", "robust→fragile", "robust at base"),
        (4, "add0", "fragile→robust", "robust at base")]
    rows = metric_rows(RunRecord(tmp_path / "forgetwatch"))
    assert rows[2]["metrics"]["overall"]["fragile"] == 1 and rows[4]["metrics"]["overall"]["fragile"] == 0
    assert rows[2]["metrics"]["add"]["robust_forgetting"] == pytest.approx(1 / 12)
    # cnt1 is wrong as asked: plain forgetting, and not robust any more, but not "fragile"
    assert rows[2]["metrics"]["count"]["robust_lost"] == 1 and rows[2]["metrics"]["count"]["fragile"] == 0
    (name, step, cols, table), *_ = [t for t in tables.tables if t[0].endswith("/flips")]
    assert step == 2 and [r[cols.index("direction")] for r in table] == ["1→0", "robust→fragile"]


def test_a_yaml_robustness_the_probes_cannot_take_names_its_key_and_line(tmp_path):
    """Axolotl / LLaMA-Factory configs: the callback's refusal in the config's words, at the key's line."""
    from forgetwatch.integrations.config import ConfigKeyError, parse_keys

    probes = tmp_path / "probes.jsonl"
    make_probes().to_jsonl(probes)
    keys = {"forgetwatch_probes": str(probes), "forgetwatch_robustness": 99}
    with pytest.raises(ConfigKeyError, match=r"config\.yaml, line 7: forgetwatch_robustness=99, but probe 'add0' .*"
                                             r"use forgetwatch_robustness ≤ 11"):
        parse_keys(keys, source="config.yaml", lines={"forgetwatch_probes": 6, "forgetwatch_robustness": 7})
    args = parse_keys({**keys, "forgetwatch_robustness": 4, "forgetwatch_robust_per_suite": 2}, source="config.yaml")
    assert ForgetWatchCallback.from_args(args).plan.k == 4


def test_interpolate_takes_no_robustness_it_would_ignore(capsys):
    """`interpolate` shares the scoring options of `cache` / `compare` but scores no variants: --robustness is refused
    by its parser, not accepted and ignored."""
    from forgetwatch.cli import build_parser

    for flag in ("--robustness", "--robust-per-suite"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["interpolate", "--model", "m", "--probes", "p.jsonl", "--base", "b.parquet", flag, "2"])
        assert f"unrecognized arguments: {flag} 2" in capsys.readouterr().err
    given = ["--model", "m", "--probes", "p.jsonl", "--robustness", "2", "--robust-per-suite", "3"]
    for argv in (["cache", *given, "-o", "b.parquet"], ["compare", *given, "--base", "b.parquet"]):  # they score variants
        args = build_parser().parse_args(argv)
        assert (args.robustness, args.robust_per_suite) == (2, 3)


def test_robustness_0_scores_no_variants_and_a_watcher_names_what_differs(robust_run, tokenizer, tiny_model_dir, tmp_path,
                                                                          capsys):
    """`--robustness 0`: compare and watch leave a cache's / callback's variants aside; a watcher asked for other
    variants than the cache's says which part of them differs."""
    from forgetwatch.run.watcher import SidecarError, Watcher

    probes = tmp_path / "probes.jsonl"
    make_probes().to_jsonl(probes)
    base = tmp_path / "base.parquet"
    assert cli(["cache", "--model", str(tiny_model_dir), "--probes", str(probes), "--robustness", "2",
                "--max-new-tokens", "4", "-o", str(base)]) == 0
    capsys.readouterr()
    assert cli(["compare", "--model", str(tiny_model_dir), "--probes", str(probes), "--base", str(base), "--json",
                "--robustness", "0"]) == 0
    assert "robustness" not in json.loads(capsys.readouterr().out)
    side = tmp_path / "side"
    cached = str(robust_run.record.root / "base.parquet")  # robustness=3 on every probe
    sft_trainer(tokenizer, side, [robust_watcher(scoring="sidecar", base_cache=cached)], max_steps=2).train()
    with pytest.raises(
        SidecarError, match=r"other variants \(.*per_suite: cache has None, now 2.*robustness=3 on 2 probes per suite"
    ):
        Watcher(side, device="cpu", robustness=3, robust_per_suite=2)
    assert Watcher(side, device="cpu", robustness=0).plan is None


def test_the_command_line_refuses_in_its_own_words(tmp_path, capsys):
    probes = tmp_path / "probes.jsonl"
    make_probes().to_jsonl(probes)
    assert (
        cli(["cache", "--model", "smollm2", "--probes", str(probes), "--robustness", "99", "-o", str(tmp_path / "c.parquet")])
        == 2
    )
    err = capsys.readouterr().err
    assert "--robustness 99, but probe 'add0'" in err and "use --robustness ≤ 11" in err and "`robustness`" not in err
    assert cli(["cache", "--model", "smollm2", "--probes", str(probes), "--robust-per-suite", "3", "-o",
                str(tmp_path / "c.parquet")]) == 2
    assert "--robust-per-suite 3 says how many probes get variants" in capsys.readouterr().err


def test_a_sidecar_resume_that_turns_robustness_on_gives_the_watcher_the_variants(robust_run, tokenizer, tmp_path,
                                                                                   caplog):
    out = tmp_path / "out"
    first = sft_trainer(tokenizer, out, [watcher(scoring="sidecar"), CrashBeforeStep(3)], save_strategy="steps", save_steps=2)
    caplog.set_level(logging.INFO, logger="forgetwatch")
    with pytest.raises(RuntimeError, match="simulated crash"):
        first.train()
    assert "under other options" not in caplog.text  # a fresh run keeps the base it wrote
    assert not BaseCache.load(out / "forgetwatch" / "base.parquet").key.get("variants")
    # the resume turns robustness on: the record's base has no variants, and the error says how to make a cache that has
    from forgetwatch.record.cache import CacheMismatchError

    without = sft_trainer(tokenizer, out, [robust_watcher(scoring="sidecar")], save_strategy="steps", save_steps=2)
    with pytest.raises(CacheMismatchError, match=rf"made with: forgetwatch cache .*--robustness {K}"):
        without.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    del without
    # with a cache of the same base that holds the variants
    with_variants = str(robust_run.record.root / "base.parquet")
    second = sft_trainer(tokenizer, out, [robust_watcher(scoring="sidecar", base_cache=with_variants)],
                         save_strategy="steps", save_steps=2)
    second.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert "under other options than this run's; replacing it" in caplog.text
    assert BaseCache.load(out / "forgetwatch" / "base.parquet").key["variants"]["k"] == K
    assert cli(["watch", str(out), "--once", "--device", "cpu"]) == 0
    record = RunRecord(out / "forgetwatch")
    assert record.eval_steps() == [0, 2, 4, 6]
    for step in (4, 6):  # after the resume, the figures of the run that had variants from the start
        np.testing.assert_array_equal(record.read_robust(step).right, robust_run.record.read_robust(step).right)
