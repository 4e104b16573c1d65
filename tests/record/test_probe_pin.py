"""The probe set is pinned to the record (issue 44, case 3): a resume or a watcher with other probes is refused before
anything is scored, naming what changed and the two ways on; `probe_change="new_segment"` starts a new segment of the
record, which `forgetwatch report` shows apart from the earlier one. The same probes in another order are no change."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
from fixtures.trainers import SCORING, StepCounter, make_probes, sft_trainer

from forgetwatch import ForgetWatchCallback, ProbeSetChangedError
from forgetwatch.cli import main as cli
from forgetwatch.probes.probe_set import Probe, ProbeSet
from forgetwatch.record.cache import CacheMismatchError
from forgetwatch.record.store import RunRecord
from forgetwatch.report.render import summarize_run

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`gradient_checkpointing.*` is deprecated:FutureWarning"),
              pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")]

CKPT = {"save_strategy": "steps", "save_steps": 2}


def edited() -> ProbeSet:
    """The probe file edited between runs: one question changed (add0), one probe removed (cmp7), one added (new0)."""
    probes = [p for p in make_probes() if p.id != "cmp7"]
    probes[0] = Probe("add0", "mcq", "0 + 0 = ? (edited)", probes[0].choices, probes[0].gold, category="add")
    probes.append(Probe("new0", "mcq", "Is 3 bigger than 2?", ("yes", "no"), 0, category="compare"))
    return ProbeSet(probes)


def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir)


def callback(probes: Path, **kwargs) -> ForgetWatchCallback:
    return ForgetWatchCallback(str(probes), eval_steps=2, **SCORING, **kwargs)


def steps(root: Path) -> list[int]:
    return [r["step"] for r in RunRecord(root).read_metrics()]


@pytest.fixture(scope="module")
def trained(tokenizer, tiny_model_dir, tmp_path_factory):
    """A 6-step run with checkpoints 2, 4, 6, scored inline at 0, 2, 4, 6, from a probe file in the run's folder."""
    root = tmp_path_factory.mktemp("pin")
    probes = root / "probes.jsonl"
    make_probes().to_jsonl(probes)
    sft_trainer(tokenizer, root / "run", [callback(probes)], model=model(tiny_model_dir), **CKPT).train()
    return root


def copy_run(trained: Path, tmp_path: Path) -> tuple[Path, Path]:
    shutil.copytree(trained, tmp_path, dirs_exist_ok=True)
    return tmp_path / "run", tmp_path / "probes.jsonl"


def resume(tokenizer, tiny_model_dir, out: Path, cb, counter=None):
    trainer = sft_trainer(tokenizer, out, [cb] + ([counter] if counter else []), model=model(tiny_model_dir), **CKPT)
    trainer.train(resume_from_checkpoint=str(out / "checkpoint-4"))
    return trainer


def test_the_issue_repro_a_resume_with_edited_probes_is_refused_then_a_new_segment(trained, tokenizer, tiny_model_dir,
                                                                                    tmp_path, capsys):
    out, probes = copy_run(trained, tmp_path)
    rec = out / "forgetwatch"
    before = (rec / "metrics.jsonl").read_text(), (rec / "probes.jsonl").read_text()
    edited().to_jsonl(probes)  # the user edits the probe file between runs

    # resumed as it is: its own base cache is of the old probes, so the cache refusal would come first today; with a
    # cache for the edited probes (what that refusal's advice makes) the resume was accepted and mixed the two sets
    mine = tmp_path / "edited.parquet"
    counter = StepCounter()
    with pytest.raises(CacheMismatchError, match="resuming at step 4") as refused:
        resume(tokenizer, tiny_model_dir, out, callback(probes, probe_change="new_segment"), counter)
    assert "probe_change='new_segment'" in str(refused.value) and counter.steps == 0
    assert not (rec / "segments").exists() and (rec / "metrics.jsonl").read_text() == before[0]  # nothing moved
    # follow its advice: the command that makes a cache of the base model for the edited probes
    command = str(refused.value).split("one of the base model made with: ")[1].strip()
    argv = shlex.split(command.removeprefix("forgetwatch "))
    argv[argv.index("-o") + 1] = str(mine)
    assert cli(argv) == 0

    # with that cache and no option: refused before anything is scored, naming the record, what changed, the ways on
    counter = StepCounter()
    with pytest.raises(ProbeSetChangedError) as refused:
        resume(tokenizer, tiny_model_dir, out, callback(probes, base_cache=str(mine)), counter)
    said = str(refused.value)
    assert str(rec) in said and "1 added ('new0')" in said and "1 removed ('cmp7')" in said
    assert "1 whose content changed ('add0')" in said and "new output dir" in said and "probe_change='new_segment'" in said
    assert counter.steps == 0
    assert ((rec / "metrics.jsonl").read_text(), (rec / "probes.jsonl").read_text()) == before  # nothing written

    # the way on it names: a new segment
    resume(tokenizer, tiny_model_dir, out, callback(probes, base_cache=str(mine), probe_change="new_segment"))
    (earlier,) = (rec / "segments").iterdir()
    assert earlier.name == "1-steps-0-4"
    assert steps(earlier) == [0, 2, 4] and steps(rec) == [6]  # the abandoned step 6 is set aside in the earlier one
    assert list((earlier / "superseded").glob("after-step-4-*/evals/step-00000006.npz"))
    assert ProbeSet.from_jsonl(earlier / "probes.jsonl").fingerprint == make_probes().fingerprint
    assert ProbeSet.from_jsonl(rec / "probes.jsonl").fingerprint == edited().fingerprint
    # neither mixed: every npz of each segment is of its own probe set
    for root, probe_set in ((earlier, make_probes()), (rec, edited())):
        assert RunRecord(root).check(probe_set.fingerprint, len(probe_set)) == []
    # the new segment's first evaluation: its flips are against the base (no base row at step 0 in it)
    assert "step 6: F" in (said := capsys.readouterr().out) and "new probe set since step 4: flips against the base" in said
    assert json.loads((rec / "segments.json").read_text())["from_step"] == 4

    # report: the record says where the probe set changed and where the earlier segment is; that one reports whole
    capsys.readouterr()
    assert cli(["report", str(out)]) == 0
    text = capsys.readouterr().out
    assert "probe set changed at step 4" in text and f"forgetwatch report {earlier}" in text
    assert "1 evaluation, at steps 6" in text and "record problems" not in text
    assert cli(["report", str(earlier)]) == 0
    text = capsys.readouterr().out
    assert "32 probes" in text and "at steps 0, 2, 4" in text and "an earlier segment of the record" in text
    assert "record problems" not in text
    page = (rec / "report" / "report.html").read_text()
    assert "probe set changed at step 4" in page


def test_the_same_probes_in_another_order_or_saved_again_are_no_change(trained, tokenizer, tiny_model_dir, tmp_path):
    out, probes = copy_run(trained, tmp_path)
    rec = out / "forgetwatch"
    pinned = (rec / "probes.jsonl").read_text()
    ProbeSet(list(reversed(make_probes()))).to_jsonl(probes)  # another order (re-saved: the same bytes again)
    resume(tokenizer, tiny_model_dir, out, callback(probes))
    assert steps(rec) == [0, 2, 4, 6] and not (rec / "segments").exists()
    assert (rec / "probes.jsonl").read_text() == pinned  # scored in the record's order
    assert RunRecord(rec).check(make_probes().fingerprint, len(make_probes())) == []
    make_probes().to_jsonl(probes)  # the file saved again as it was
    resume(tokenizer, tiny_model_dir, out, callback(probes))
    assert steps(rec) == [0, 2, 4, 6] and (rec / "probes.jsonl").read_text() == pinned


# -- sidecar: the training process refuses, the watcher follows the segment ------------------------------------------
@pytest.fixture(scope="module")
def watched(tokenizer, tiny_model_dir, tmp_path_factory):
    """A 6-step sidecar run (checkpoints 2, 4, 6) whose watcher scored 0, 2, 4, 6."""
    root = tmp_path_factory.mktemp("pin-sidecar")
    probes = root / "probes.jsonl"
    make_probes().to_jsonl(probes)
    sft_trainer(tokenizer, root / "run", [callback(probes, scoring="sidecar")], model=model(tiny_model_dir), **CKPT).train()
    assert cli(["watch", str(root / "run"), "--once", "--device", "cpu"]) == 0
    assert steps(root / "run" / "forgetwatch") == [0, 2, 4, 6]
    return root


def edited_cache(tiny_model_dir, probes: Path, path: Path) -> Path:
    assert cli(["cache", "--model", str(tiny_model_dir), "--probes", str(probes), "--max-new-tokens", "4",
                "--autocast", "bfloat16", "-o", str(path)]) == 0
    return path


def test_the_issue_repro_on_a_sidecar_run_refused_in_training_then_a_segment_the_watcher_scores(
        watched, tokenizer, tiny_model_dir, tmp_path, capsys):
    out, probes = copy_run(watched, tmp_path)
    rec = out / "forgetwatch"
    before = (rec / "probes.jsonl").read_text()
    edited().to_jsonl(probes)
    mine = edited_cache(tiny_model_dir, probes, tmp_path / "edited.parquet")
    counter = StepCounter()
    with pytest.raises(ProbeSetChangedError, match=r"1 added \('new0'\).*new output dir.*probe_change='new_segment'"):
        resume(tokenizer, tiny_model_dir, out, callback(probes, scoring="sidecar", base_cache=str(mine)), counter)
    assert counter.steps == 0 and (rec / "probes.jsonl").read_text() == before  # the watcher still reads the old set
    resume(tokenizer, tiny_model_dir, out, callback(probes, scoring="sidecar", base_cache=str(mine),
                                                    probe_change="new_segment"))
    capsys.readouterr()
    assert cli(["watch", str(out), "--once", "--device", "cpu"]) == 0
    assert "scored 1 checkpoint(s)" in capsys.readouterr().out  # step 6 of the new trajectory, not 2 and 4 again
    earlier = rec / "segments" / "1-steps-0-4"
    assert steps(earlier) == [0, 2, 4] and steps(rec) == [6]
    for root, probe_set in ((earlier, make_probes()), (rec, edited())):
        assert RunRecord(root).check(probe_set.fingerprint, len(probe_set)) == []
    assert "probe set changed at step 4" in summarize_run(out)
    assert cli(["report", str(earlier)]) == 0


def test_a_watcher_on_a_record_whose_probes_were_replaced_is_refused_then_starts_a_segment(watched, tiny_model_dir,
                                                                                          tmp_path, capsys):
    """As an earlier forgetwatch's resumed training left it: probes.jsonl and the base cache replaced by the edited set's."""
    out, probes = copy_run(watched, tmp_path)
    rec = out / "forgetwatch"
    edited().to_jsonl(probes)
    edited().to_jsonl(rec / "probes.jsonl")
    shutil.copy(edited_cache(tiny_model_dir, probes, tmp_path / "edited.parquet"), rec / "base.parquet")
    capsys.readouterr()
    assert cli(["watch", str(out), "--once", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "is not the probe set its evaluations were scored on" in err and "--probe-change new_segment" in err
    assert steps(rec) == [0, 2, 4, 6] and not (rec / "segments").exists()
    assert cli(["watch", str(out), "--once", "--device", "cpu", "--probe-change", "new_segment"]) == 0
    earlier = rec / "segments" / "1-steps-0-6"
    assert steps(earlier) == [0, 2, 4, 6] and steps(rec) == []
    assert json.loads((rec / "segments.json").read_text())["segments"][0]["probes_unknown"] is True
    assert (rec / "sidecar.json").is_file() and (rec / "base.parquet").is_file()  # the watcher can go on here
