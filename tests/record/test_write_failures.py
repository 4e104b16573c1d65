"""Issue 44, cases 4, 6 and the first half of 8: the record never hides what it lacks.

- A step that cannot be written (the issue's immutable `evals/`) stops the run's probing loudly, training goes on
  untouched, the loss is noted in `unwritten.jsonl` and sent to W&B, and `forgetwatch report` names it (exit 1).
- A base cache with a NaN margin where the option scores give one is refused by name (it can only be damage).
- One step's npz of another probe count or probe set is left out of the probe x evaluation matrix, named, and the
  rest of the report is written.

Failures are real: as root, `chmod` stops no write, so a folder is made immutable with `chattr +i` (the issue's own
way; root cannot write into it either), or, run as another user, read-only with `chmod`.
"""

from __future__ import annotations

import html
import logging
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import clear_wandb_env
from fixtures.trainers import make_probes, own_logs, sft_trainer, watcher
from transformers import TrainerCallback

import forgetwatch
from forgetwatch.cli import main as cli
from forgetwatch.record.store import RunRecord
from forgetwatch.report.render import summarize_run

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`gradient_checkpointing.*` is deprecated:FutureWarning"),
              pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")]


# -- making a folder unwritable, for real ---------------------------------------------------------------------------
@pytest.fixture
def unwritable():
    """`freeze(folder)` makes a folder unwritable to this process, `thaw(folder)` writable again; every frozen folder
    is thawed when the test ends (an immutable folder could not even be deleted)."""
    frozen: list[Path] = []

    def freeze(folder: Path) -> None:
        if os.geteuid() != 0:  # another user than root: permissions hold
            folder.chmod(0o555)
        else:  # root: chmod stops nothing; an immutable folder stops root too (ext4, xfs, btrfs; not tmpfs)
            done = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
            if done.returncode != 0:
                pytest.skip(f"cannot make {folder} immutable here (chattr: {done.stderr.strip()}); run as another "
                            "user than root, or on ext4")
        frozen.append(folder)
        with pytest.raises(OSError):  # unwritable indeed
            (folder / "probe-write").write_text("x")

    def thaw(folder: Path) -> None:
        if os.geteuid() != 0:
            folder.chmod(0o755)
        else:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        frozen.remove(folder)

    try:
        yield freeze, thaw
    finally:
        for folder in list(frozen):
            thaw(folder)


class BreakAt(TrainerCallback):
    """At the end of optimizer step `step` (between two evaluations), make the record's `evals/` unwritable."""

    def __init__(self, step: int, freeze):
        self.step, self.freeze = step, freeze

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.freeze(Path(args.output_dir) / "forgetwatch" / "evals")


def losses(trainer) -> list[tuple[int, float]]:
    return [(e["step"], e["loss"]) for e in own_logs(trainer) if "loss" in e]


# -- case 4: a record that becomes unwritable mid-run ---------------------------------------------------------------
def test_a_step_that_cannot_be_written_stops_probing_loudly_and_report_names_it(tokenizer, tmp_path, unwritable,
                                                                                monkeypatch, caplog, capsys):
    from fixtures.wandb_offline import find_run_file, finish_offline_run, read_records, read_summary

    freeze, thaw = unwritable
    save = {"save_strategy": "steps", "save_steps": 2}
    reference = sft_trainer(tokenizer, tmp_path / "whole", [watcher()], **save)
    reference.train()

    out = tmp_path / "run"
    clear_wandb_env(monkeypatch, tmp_path / "wandb")
    finish_offline_run()
    try:
        with caplog.at_level(logging.INFO, logger="forgetwatch"):
            broken = sft_trainer(tokenizer, out, [BreakAt(3, freeze), watcher()], report_to="wandb", **save)
            broken.train()
    finally:
        finish_offline_run()

    # training went on, untouched: the same loss curve, to the last step, and the trainer's own log rows are kept
    assert broken.state.global_step == 6 and losses(broken) == losses(reference)
    rec = RunRecord(out / "forgetwatch")
    assert [r["step"] for r in rec.read_trainer_log() if "loss" in r] == [1, 2, 3, 4, 5, 6]
    # probing stopped at the step that could not be written: nothing scored after it
    assert rec.committed_steps() == [0, 2]
    assert "scored 32 probes at step 4" in caplog.text and "at step 6" not in caplog.text
    # one clear ERROR naming the step, the file, the OS error and what to do; no traceback
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is None
    said = errors[0].getMessage()
    evals = out / "forgetwatch" / "evals"
    for text in ("step 4 could not be written to the record", f"writing {evals / 'step-00000004.npz'}", "PermissionError",
                 "Probing stops here", "training goes on untouched", "The record ends at step 2",
                 f"Make {evals} writable again", f"resume training from {out / 'checkpoint-2'}"):
        assert text in said, text
    (lost,) = rec.unwritten()
    assert lost["step"] == 4 and lost["path"] == str(evals / "step-00000004.npz") and "PermissionError" in lost["error"]

    # sent to W&B: an alert, and the summary says which step the record lacks
    run_file = find_run_file(tmp_path / "wandb")
    alerts = [r.alert for r in read_records(run_file) if r.WhichOneof("record_type") == "alert"]
    assert [a.title for a in alerts] == ["forgetwatch: record not written"] and "step 4" in alerts[0].text
    assert read_summary(run_file)["forgetwatch/unwritten_step"] == 4

    # `forgetwatch report` names it, and says the record is incomplete by its exit status
    capsys.readouterr()
    assert cli(["report", str(out)]) == 1
    printed = capsys.readouterr()
    assert "record incomplete: step 4 could not be written (writing" in printed.out
    assert "probing stopped there" in printed.out and "the record is incomplete" in printed.err
    page = html.unescape((rec.root / "report" / "report.html").read_text())
    assert "This record is incomplete" in page and "step 4 could not be written (writing" in page

    # the advice, followed: the folder made writable again, training resumed from the checkpoint before step 4
    thaw(evals)
    resumed = sft_trainer(tokenizer, out, [watcher()], **save)
    resumed.train(resume_from_checkpoint=str(out / "checkpoint-2"))
    assert rec.committed_steps() == [0, 2, 4, 6] and rec.unwritten() == []
    assert rec.check(make_probes().fingerprint, len(make_probes())) == []
    assert cli(["report", str(out)]) == 0
    assert "incomplete" not in capsys.readouterr().out


def test_a_watcher_that_cannot_write_a_step_stops_with_a_clear_error_and_its_advice_completes_the_record(
        tokenizer, tmp_path, unwritable, capsys):
    """The watcher (strict) raises: it can be restarted, and then scores the step again."""
    from forgetwatch.run.watcher import Watcher

    freeze, thaw = unwritable
    out = tmp_path / "run"
    sft_trainer(tokenizer, out, [watcher(scoring="sidecar")]).train()  # checkpoints 2, 4, 6, nothing scored
    rec = RunRecord(out / "forgetwatch")
    first = Watcher(out, device="cpu")  # writes the base, step 0
    freeze(rec.evals_dir)
    with pytest.raises(OSError) as e:  # a RecordWriteError: `except OSError` code catches it as before
        first.run(once=True)
    said = str(e.value)
    assert type(e.value).__name__ == "RecordWriteError" and isinstance(e.value, forgetwatch.ForgetWatchError), said
    for text in ("step 2 could not be written to the record", f"writing {rec.eval_path(2)}", "PermissionError",
                 "The watcher stops", "the record ends at step 0", f"Make {rec.evals_dir} writable again",
                 "run `forgetwatch watch` again"):
        assert text in said, text

    capsys.readouterr()
    command = ["watch", str(out), "--once"]
    assert cli(command) == 2  # from the command line: one line, no traceback
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith("forgetwatch: error: step 2 could not be written") and "Traceback" not in err
    assert err.count("could not be written") == 1  # said once, not logged and raised both
    assert "record incomplete: step 2 could not be written" in summarize_run(out)

    thaw(rec.evals_dir)  # the advice, followed
    assert cli(command) == 0
    assert rec.committed_steps() == [0, 2, 4, 6] and rec.unwritten() == []
    assert "incomplete" not in summarize_run(out)


# -- case 6: NaN margins in a base cache ------------------------------------------------------------------------------
def test_a_base_cache_with_nan_margins_beside_option_scores_is_refused_by_name(tiny_model_dir, tmp_path, capsys):
    """A margin_drop budget over such a cache used to be silently blind: NaN margins were read as "not scored that
    way", so margin_drop was NaN (or the mean of the rest) and never tripped."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from forgetwatch.errors import CacheFormatError
    from forgetwatch.run.callback import ForgetWatchCallback

    probes = make_probes()
    probes.to_jsonl(tmp_path / "probes.jsonl")
    cache = tmp_path / "base.parquet"
    make = ["cache", "--model", str(tiny_model_dir), "--probes", str(tmp_path / "probes.jsonl"), "-o", str(cache),
            "--max-new-tokens", "4"]
    assert cli(make) == 0
    table = pq.read_table(cache)
    margin = table.column("margin").to_numpy(zero_copy_only=False)
    assert np.isfinite(margin[:28]).all() and np.isnan(margin[28:]).all()  # 28 multiple choice, 4 generated answers
    damaged = np.full(len(margin), np.nan, np.float32)  # the cache: every margin NaN
    table = table.set_column(table.schema.get_field_index("margin"), "margin", pa.array(damaged))
    pq.write_table(table, cache)  # the forgetwatch key stays in the schema's metadata

    with pytest.raises(CacheFormatError) as e:
        ForgetWatchCallback(probes, eval_steps=2, base_cache=str(cache), budget={"margin_drop": 0.1})
    said = str(e.value)
    assert said.startswith(f"{cache} row 0 (probe 'add0'): column `margin` is NaN, but the row holds 4 option scores")
    assert "delete it and run `forgetwatch cache` again" in said

    cache.unlink()  # the advice, followed
    assert cli(make) == 0
    ForgetWatchCallback(probes, eval_steps=2, base_cache=str(cache), budget={"margin_drop": 0.1})


def test_a_nan_margin_without_option_scores_is_still_not_scored_that_way(tmp_path):
    """The legitimate NaN (a generated answer has no options to rank) is read back as before, in both formats."""
    from forgetwatch.errors import CacheFormatError
    from forgetwatch.record.cache import BaseCache, make_cache_key
    from forgetwatch.scoring.results import ProbeResults

    probes = make_probes()
    results = ProbeResults.empty(probes.ids)
    results.option_scores = [np.array([0.0, -1.0], np.float32) if p.kind == "mcq" else np.zeros(0, np.float32)
                             for p in probes]
    results.margin[:] = [1.0 if p.kind == "mcq" else np.nan for p in probes]
    key = make_cache_key({}, probes, {})
    for suffix in (".parquet", ".jsonl"):
        path = BaseCache(key, results).save(tmp_path / f"base{suffix}")
        back = BaseCache.load(path).results
        assert np.isnan(back.margin[-4:]).all() and (back.margin[:-4] == 1.0).all()
    results.margin[5] = np.nan
    for suffix in (".parquet", ".jsonl"):
        path = BaseCache(key, results).save(tmp_path / f"damaged{suffix}")
        where = "row 5" if suffix == ".parquet" else "line 7"  # parquet rows from 0; the JSONL's line 1 is its key
        with pytest.raises(CacheFormatError, match=rf"{path} {where} \(probe 'add5'\): column `margin` is NaN"):
            BaseCache.load(path)


# -- case 8: one step's npz of another probe count or probe set ------------------------------------------------------
def _record(root: Path) -> RunRecord:
    """A record of steps 0, 2, 4 made by the monitor from made-up results (no model needed)."""
    from forgetwatch.record.cache import BaseCache
    from forgetwatch.run.monitor import Monitor
    from forgetwatch.scoring.results import ProbeResults

    probes = make_probes()
    base = ProbeResults.empty(probes.ids)
    base.outcome[:] = 1
    base.pred_index[:] = [p.gold if p.kind == "mcq" else -1 for p in probes]
    monitor = Monitor(probes)
    monitor.open(root, BaseCache({}, base), "float32", [], resume_step=None)
    for step, wrong in ((2, [0, 13]), (4, [0, 13, 21])):
        now = base.take(range(len(probes)))
        now.outcome[wrong] = 0
        monitor.report(now, step=step, epoch=step / 6, seconds=1.0)
    return monitor.record


@pytest.mark.parametrize("foreign", ["probe count", "probe set"])
def test_an_npz_of_another_probe_set_is_left_out_of_the_matrix_by_name(tmp_path, caplog, capsys, foreign):
    rec = _record(tmp_path)
    own = rec.eval_path(2).read_bytes()
    z = dict(rec.read_eval(2))
    if foreign == "probe count":  # another run's file, of 31 probes
        z = {k: (v[:31] if k in ("outcome", "pred_index", "margin", "gold_logprob", "n_tokens", "stopped", "detail",
                                 "nonfinite") else v) for k, v in z.items()}
        for flat, offsets in (("option_scores", "option_offsets"), ("prediction_utf8", "prediction_offsets")):
            if offsets in z:  # packed rows: the first 31 probes' (a whole file of another probe set)
                z[offsets] = z[offsets][:32]
                z[flat] = z[flat][: int(z[offsets][-1])]
        said = f"{rec.eval_path(2)}: 31 probes, but the record's probes.jsonl has 32"
    else:
        z["fingerprint"] = np.asarray("0123456789abcdef")
        said = f"{rec.eval_path(2)}: scored on probe set 0123456789abcdef, but the record's probes.jsonl is"
    np.savez(rec.eval_path(2), **z)

    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        assert cli(["report", str(tmp_path)]) == 0  # the page is written, without that step's per-probe views
    page = html.unescape((rec.root / "report" / "report.html").read_text())
    for text in (said, "left out of the probe x evaluation matrix", "put step 2's own file back"):
        assert text in caplog.text and text in page, text
    assert (rec.root / "report" / "probe_states.png").is_file() and (rec.root / "report" / "probe_matrix.png").is_file()
    steps, matrix = rec.outcome_matrix()
    assert steps == [0, 4] and matrix.shape == (2, 32)

    rec.eval_path(2).write_bytes(own)  # the advice, followed: the step's own file back
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="forgetwatch"):
        assert cli(["report", str(tmp_path)]) == 0
    assert "left out" not in caplog.text and rec.outcome_matrix()[0] == [0, 2, 4]


def test_a_base_that_cannot_be_written_is_named_by_report(tmp_path, unwritable, caplog, capsys):
    """The first evaluation (the base, step 0) lost: report says so instead of "no evaluation yet"."""
    from forgetwatch.record.cache import BaseCache
    from forgetwatch.run.monitor import Monitor
    from forgetwatch.scoring.results import ProbeResults

    freeze, _ = unwritable
    probes = make_probes()
    evals = tmp_path / "forgetwatch" / "evals"
    evals.mkdir(parents=True)
    freeze(evals)
    monitor = Monitor(probes)
    with caplog.at_level(logging.ERROR, logger="forgetwatch"):
        monitor.open(tmp_path, BaseCache({}, ProbeResults.empty(probes.ids)), "float32", [], resume_step=None)
    assert monitor.write_failure["step"] == 0
    assert "The record holds no evaluation" in caplog.text and "start the training again" in caplog.text
    assert cli(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "the record has no evaluation yet" in err and "step 0 could not be written (writing" in err
