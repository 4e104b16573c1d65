"""Issue 44, second pass, cases 7 and 9: other weights saved at the model's path, a report read while an evaluation is
being written, an output_dir that cannot be written, and a probe far longer than the model's context.

Every fault is real: the weights are saved again with `save_pretrained`, the scoring lock is held by another live
process, the unwritable directory is written by a process running as an unprivileged user (`setpriv`; the tests run as
root, whom `chmod` does not stop), and the long probe is tokenized by a real tokenizer.
"""

from __future__ import annotations

import ctypes
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import build_model, build_tokenizer, own_tqdm_lock

from forgetwatch.cli import main
from forgetwatch.errors import RecordUnwritableError
from forgetwatch.probes.probe_set import Probe, ProbeSet
from forgetwatch.record.cache import BaseCache, CacheMismatchError, make_cache_key
from forgetwatch.scoring.models import model_identity
from forgetwatch.scoring.weights import weights_fingerprint

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`gradient_checkpointing.*` is deprecated:FutureWarning"),
              pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")]

ROOT = Path(__file__).resolve().parents[2]


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def save_model(path: Path, seed: int) -> None:
    tok = build_tokenizer()
    build_model(tok, seed=seed).save_pretrained(path)
    tok.save_pretrained(path)


# -- case 7: other weights saved at the base model's path ------------------------------------------------------------
KEPT = "already holds this cache (same model, probes and scoring): nothing scored, nothing written"


def test_other_weights_saved_at_the_same_path_are_not_taken_for_the_cached_model(capsys, tmp_path, probe_file):
    model, cache = tmp_path / "base", tmp_path / "base.parquet"
    save_model(model, seed=0)
    assert run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache)[0] == 0
    before = cache.read_bytes()
    save_model(model, seed=1)  # a fine-tune written over its base: same path, same architecture, other weights
    code, out, err = run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache)
    assert code == 2 and KEPT not in out, out
    assert f"-o {cache} exists and holds a cache made under another key" in err
    assert f"model.weights: the weight files at {model.resolve()} are not those this cache was made from" in err
    assert "choose another -o, or pass --force to replace it" in err
    assert cache.read_bytes() == before
    # the callback's check (`_find_base` loads the cache with the key of the model it trains) refuses it too
    from transformers import AutoModelForCausalLM

    old = BaseCache.load(cache)
    key = make_cache_key(model_identity(AutoModelForCausalLM.from_pretrained(model)), ProbeSet.from_jsonl(probe_file),
                         old.key["scoring"])
    with pytest.raises(CacheMismatchError, match="model.weights: the weight files at .* are not those"):
        BaseCache.load(cache, expect=key)
    # the advice, followed: --force scores the new weights, and the same command then keeps that cache
    code, _, err = run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache, "--force")
    assert code == 0, err
    assert BaseCache.load(cache).key["model"]["weights"] == weights_fingerprint(model)
    code, out, err = run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache)
    assert code == 0 and KEPT in out and "note" not in err, err


def test_the_same_bytes_with_new_file_times_are_kept_with_a_note(capsys, tmp_path, probe_file):
    """`cp -r` (new times) of the same weights is the same model, said in a note; `cp -a` (times kept) says nothing."""
    model, cache, backup = tmp_path / "base", tmp_path / "base.parquet", tmp_path / "backup"
    save_model(model, seed=0)
    assert run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache)[0] == 0
    shutil.copytree(model, backup)  # cp -a: times kept
    shutil.rmtree(model)
    shutil.copytree(backup, model)
    code, out, err = run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache)
    assert code == 0 and KEPT in out and "note" not in err, err
    shutil.rmtree(model)
    shutil.copytree(backup, model, copy_function=shutil.copyfile)  # cp -r: new times, the same bytes
    os.utime(model / "model.safetensors", (time.time() + 5, time.time() + 5))  # a coarse clock could give the old time
    code, out, err = run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache)
    assert code == 0 and KEPT in out, err
    assert f"the weight files at {model.resolve()} were written again since this cache was made" in err
    assert "with the same size and sampled bytes (a copy, or the same weights saved again): the cache is used" in err


def test_a_cache_made_before_weight_fingerprints_still_serves(capsys, tmp_path, probe_file):
    model, cache = tmp_path / "base", tmp_path / "base.parquet"
    save_model(model, seed=0)
    assert run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache)[0] == 0
    # the key as forgetwatch wrote it before the fingerprint existed
    table = pq.read_table(cache)
    key = json.loads(table.schema.metadata[b"forgetwatch"])
    del key["model"]["weights"]
    pq.write_table(table.replace_schema_metadata({b"forgetwatch": json.dumps(key).encode()}), cache)
    code, out, err = run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache)
    assert code == 0 and KEPT in out, err
    assert f"{cache} was made without the weight files' fingerprint" in err
    assert f"`forgetwatch cache ... -o {cache} --force` makes it again with one" in err
    # the note's advice, followed: the cache made again holds the fingerprint, and the note is gone
    assert run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache, "--force")[0] == 0
    code, out, err = run(capsys, "cache", "--model", model, "--probes", probe_file, "-o", cache)
    assert code == 0 and KEPT in out and "note" not in err, err
    # a Hub id has no files here to fingerprint: its revision names its weights
    assert weights_fingerprint("HuggingFaceTB/SmolLM2-135M-Instruct") is None


# -- case 9: a record read while it is written, or where it cannot be written ----------------------------------------
@pytest.fixture(scope="module")
def run_dir(tokenizer, tmp_path_factory) -> Path:
    """A real inline-scored SFT run of 4 steps: evaluations at steps 0, 2, 4 (read-only for the tests: copy it)."""
    from fixtures.trainers import sft_trainer, watcher

    out = tmp_path_factory.mktemp("second") / "run"
    with pytest.MonkeyPatch.context():
        sft_trainer(tokenizer, out, [watcher()], max_steps=4).train()
    return out


def mid_evaluation(run_dir: Path, dest: Path) -> Path:
    """A copy of the run as a report finds it while step 4 is being written: its npz is there, its line not yet."""
    shutil.copytree(run_dir, dest)
    metrics = dest / "forgetwatch" / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    assert json.loads(lines[-1])["step"] == 4 and (dest / "forgetwatch" / "evals" / "step-00000004.npz").is_file()
    metrics.write_text("".join(lines[:-1]))
    return dest


def hold_lock(output_dir: Path, role: str = "scoring") -> subprocess.Popen:
    """Another live process holding the record's `role` lock, as `forgetwatch watch` or a training run does."""
    code = ("import sys, time; from forgetwatch.record.lock import acquire; "
            f"acquire(sys.argv[1], {role!r}, run='forgetwatch watch (a test)'); print('held', flush=True); time.sleep(300)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(output_dir)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_report_read_while_an_evaluation_is_written_says_so_and_finds_no_problem(run_dir, tmp_path, capsys):
    from forgetwatch.report.render import summarize_run

    out = mid_evaluation(run_dir, tmp_path / "run")
    holder = hold_lock(out)
    try:
        code, stdout, err = run(capsys, "report", out)
        assert code == 0, err
        page = (out / "forgetwatch" / "report" / "report.html").read_text()
        assert "not consistent" not in page and "record problems" not in stdout, stdout
        assert "2 evaluations, at steps 0, 2\n" in stdout, stdout
        said = f"being written: step 4, by forgetwatch watch (a test) (pid {holder.pid} on"
        assert said in stdout and "not in these figures" in stdout, stdout
        assert "being written" in page
    finally:
        holder.kill()
        holder.wait()
    # the writer gone without its line (killed): the same files are an unfinished evaluation, a problem of the record
    summary = summarize_run(out)
    assert "being written" not in summary and "record problems: 1" in summary, summary


def in_read_only(path: Path, fn):
    """`fn()` in a forked child that sees `path` as a read-only bind mount: a mount namespace of its own (nothing else
    sees the mount, and it ends with the child). Returns `("ok", value)` or `("raised", exception)`.

    As root `chmod` stops no write, and this machine's Python lives under /root, which an unprivileged user cannot run:
    a read-only file system is the real fault that is left (EROFS stops root too)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            own_tqdm_lock()
            os.close(read)
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS
                raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
            for cmd in (["mount", "--make-rprivate", "/"], ["mount", "--bind", "-o", "ro", str(path), str(path)]):
                subprocess.run(cmd, check=True, capture_output=True)
            try:
                result = ("ok", fn())
            except Exception as e:  # noqa: BLE001 - handed to the parent, which asserts on it
                result = ("raised", e)
            data = pickle.dumps(result)
        except BaseException as e:  # noqa: BLE001 - no mount namespace here: the parent skips
            data = pickle.dumps(("setup", f"{type(e).__name__}: {e}"))
        with os.fdopen(write, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    if kind == "setup":
        pytest.skip(f"a read-only bind mount needs a private mount namespace (root, CAP_SYS_ADMIN): {value}")
    return kind, value


def test_training_into_a_read_only_output_dir_is_refused_as_unwritable_not_in_use(tokenizer, tmp_path):
    from fixtures.trainers import sft_trainer, watcher

    from forgetwatch.record.lock import acquire

    readonly, elsewhere = tmp_path / "readonly", tmp_path / "elsewhere"
    readonly.mkdir()

    def train():
        try:
            sft_trainer(tokenizer, readonly, [watcher()], max_steps=2).train()
        except RecordUnwritableError as e:
            refusal = str(e)
        # the advice, followed: another output_dir, which can be written
        sft_trainer(tokenizer, elsewhere, [watcher()], max_steps=2).train()
        try:
            acquire(readonly, "scoring", run="forgetwatch watch")  # what `forgetwatch watch` takes first
        except RecordUnwritableError as e:
            return refusal, str(e)

    kind, value = in_read_only(readonly, train)
    assert kind == "ok" and value is not None, value
    refusal, watching = value
    assert refusal == (f"{readonly}: cannot write to {readonly / '.forgetwatch-training.lock'}: read-only file system. "
                       "forgetwatch writes the training run's record and its writer lock there: give an output_dir you "
                       "can write (`forgetwatch report` only reads a record, and writes its page where it can)")
    assert "one record takes one writer" not in refusal
    assert watching.startswith(f"{readonly}: cannot write to {readonly / '.forgetwatch-scoring.lock'}: read-only file "
                               "system. forgetwatch writes the evaluations `forgetwatch watch` scores")
    assert [json.loads(line)["step"] for line in (elsewhere / "forgetwatch" / "metrics.jsonl").read_text().splitlines()] == [0, 2]
    assert list(readonly.iterdir()) == []


def test_a_report_of_a_read_only_record_is_made_without_writing_into_it(run_dir, tmp_path):
    import logging

    from forgetwatch.report.render import make_report

    out = tmp_path / "run"
    shutil.copytree(run_dir, out)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    chosen = tmp_path / "page"

    def report():
        said = []
        handler = logging.Handler()
        handler.emit = lambda record: said.append(record.getMessage())
        logging.getLogger("forgetwatch").addHandler(handler)
        try:
            page = make_report(out)
            # the warning's advice, followed: --output names where the page goes
            assert main(["report", str(out), "--output", str(chosen)]) == 0
        finally:
            logging.getLogger("forgetwatch").removeHandler(handler)
        return str(page), said

    kind, value = in_read_only(out, report)
    assert kind == "ok", value
    page, said = value
    assert Path(page).is_file() and Path(page).parent.name.startswith("forgetwatch-report-run-"), page
    assert f"forgetwatch report: cannot write to {out / 'forgetwatch' / 'report'} (read-only file system): the record is " \
           f"only read, and the page goes to {Path(page).parent} (`forgetwatch report {out} --output DIR` chooses where)" in said
    assert (chosen / "report.html").is_file()
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before  # nothing written into the record
    shutil.rmtree(Path(page).parent)


# -- case 9: a probe far longer than the model's context -------------------------------------------------------------
def test_a_probe_far_over_the_context_is_refused_on_its_first_characters(tokenizer, tiny_model_dir, tmp_path, capsys,
                                                                          monkeypatch):
    """A 2 MB question for a context of 512 tokens: refused, named, without the whole text ever being tokenized (the
    text each tokenizer call gets is recorded; before, measuring it took tens of seconds and gigabytes at 5 MB)."""
    from transformers import AutoTokenizer

    from forgetwatch import ForgetWatchCallback, ProbeSetError

    longest = []  # the longest text each call of a tokenizer was given (an observer: the call goes through unchanged)
    for cls in {type(tokenizer), type(AutoTokenizer.from_pretrained(tiny_model_dir))}:
        def spy(self, text=None, *args, _call=cls.__call__, **kwargs):
            texts = [text] if isinstance(text, str) else list(text or [])
            longest.append(max((len(t) for t in texts if isinstance(t, str)), default=0))
            return _call(self, text, *args, **kwargs)

        monkeypatch.setattr(cls, "__call__", spy)
    text = "the quick brown fox jumps over the lazy dog " * 50_000  # 2.2 MB
    probes = [Probe("huge", "mcq", text, ("yes", "no"), 0, category="big"),
              *(Probe(f"q{i}", "mcq", f"Question {i}: which?", ("Paris", "London"), i % 2) for i in range(4))]
    model = build_model(tokenizer)
    callback = ForgetWatchCallback(ProbeSet(probes), eval_steps=2)
    with pytest.raises(ProbeSetError) as refused:
        callback.fit_probes(model, tokenizer)
    said = str(refused.value)
    assert said.startswith("1 of 5 probe(s) do not fit the model's context of 512 tokens"), said
    assert "huge (over " in said and "big: 1 of 1 over, longest over " in said and "unfit_probes='drop'" in said
    # the refusal's other way, taken: dropped with a warning, the other probes kept
    dropping = ForgetWatchCallback(ProbeSet(probes), eval_steps=2, unfit_probes="drop")
    dropping.fit_probes(model, tokenizer)
    assert dropping.probes.ids == ["q0", "q1", "q2", "q3"]
    # the command line, which scores without the callback's measure, refuses it the same way
    path = tmp_path / "probes.jsonl"
    ProbeSet(probes).to_jsonl(path)
    code, _, err = run(capsys, "cache", "--model", tiny_model_dir, "--probes", path, "-o", tmp_path / "base.parquet")
    assert code == 2 and "do not fit the model's context of 512 tokens" in err and "huge (over " in err, err
    assert "Remove them from the probe set, or shorten their text" in err
    assert max(longest) < len(text) // 10, "the whole text was tokenized"
