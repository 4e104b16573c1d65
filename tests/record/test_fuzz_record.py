"""A seeded fuzz pass over the record's files and the probe loader's subtler faults, and every `-o` through a link
(issue 44: readers that never crash, the audit's four kept-back cases).

The record is a real one: a tiny model trained in sidecar mode and a watcher that scored its checkpoints (built once for
the module), with every kind of file an evaluation writes (metrics, flips, at-risk rows, budget events and budget.json,
npz, the trainer's log, the sidecar manifest, the lock files). Each input is a copy of it with one file changed: a
truncation at many byte offsets, a field set to every JSON type (NaN, infinities and huge numbers among them), a field
left out or added, bytes that are not UTF-8, an empty file, an npz with arrays missing, added, of another dtype or shape.
Each goes through the readers a user meets: `forgetwatch report` (its reading of every file, in process), `load_record`
and `RunRecord.check`, and a watcher opening the record (`Monitor.open`). Every input must end either in a named refusal
(a `ForgetWatchError` naming the file, and the line and field where there is one) or, when the file holds what
forgetwatch could have written, in a read; never a traceback, and never a value of the wrong type read as a figure.
"""

from __future__ import annotations

import collections
import json
import logging
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from fixtures.records import OPTIONS
from fixtures.trainers import sft_trainer, watcher

import forgetwatch.report.render as report
from forgetwatch.errors import ForgetWatchError
from forgetwatch.record.store import load_record
from forgetwatch.report import load, page
from forgetwatch.run.watcher import Watcher

# the whole pass (2,250 inputs, about 100 s) runs in `make test-slow`; `test_the_faults_the_fuzz_found_are_named` keeps
# one input of each kind it found in the default suite
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`gradient_checkpointing.*` is deprecated:FutureWarning"),
              pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing.*:FutureWarning")]

SEED = 44
VALUES = [None, True, False, 0, -1, 7, 1.5, float("nan"), float("inf"), float("-inf"), 10**30, "", "x", "2", [], [1],
          ["x"], {}, {"a": 1}]
MISSING = object()  # the field left out
TRIED: collections.Counter = collections.Counter()  # inputs tried, by file type (printed at the end of the module)


@pytest.fixture(scope="module")
def run(tokenizer, tmp_path_factory):
    """A finished sidecar run, scored by a watcher: the pristine record (checkpoints left out: nothing to score again)."""
    root = tmp_path_factory.mktemp("fuzz-record")
    out = root / "trained"
    sft_trainer(tokenizer, out, [watcher(scoring="sidecar", **OPTIONS)]).train()
    assert Watcher(out, device="cpu").run(once=True) == 3
    pristine = root / "pristine"
    shutil.copytree(out, pristine, ignore=shutil.ignore_patterns("checkpoint-*", "model"))
    yield pristine, root
    print("\ninputs tried, by file:", dict(sorted(TRIED.items())), "total", sum(TRIED.values()))


def _report_reads(out: Path) -> None:
    """Everything `forgetwatch report` reads, in process and without drawing (the plots take only what these return)."""
    record, probes, rows, _, _ = load.read_run(out, warn=False)
    load.trainer_log(record, [r["step"] for r in rows])
    load.probe_states(record, probes)
    load.final_flips(record, probes, rows[-1]["step"])
    page.drift_section(record, rows, 50)
    page.robust_section(record, probes, rows, 50)
    report.summarize_run(out)
    rec = load_record(out)
    rec.check(probes.fingerprint, len(probes))
    rec.outcome_matrix()
    for s in rec.eval_steps():
        rec.read_results(s, probes.ids)


def _watcher_opens(out: Path) -> None:
    """A watcher opening the record (`Monitor.open`: recover, read back every evaluation, the budget's state)."""
    Watcher(out, device="cpu").run(once=True)


def _try(fn, out: Path):
    """("ok", None) or ("refused", message); any exception that is not a named refusal propagates (a crash)."""
    try:
        fn(out)
    except ForgetWatchError as e:
        return "refused", str(e)
    except FileNotFoundError as e:  # a manifest naming a base cache that is not there: named, with how to make it
        assert str(out) in str(e) and "no base cache here" in str(e), e
        return "refused", str(e)
    return "ok", None


class Inputs:
    """Copies of the pristine record, one file changed each, and what the readers made of it."""

    def __init__(self, pristine: Path, work: Path):
        self.pristine, self.work = pristine, work

    def file(self, name: str) -> Path:
        return self.pristine / name if name.startswith(".") else self.pristine / "forgetwatch" / name

    def run(self, kind: str, name: str, change, watch: bool = True) -> dict[str, tuple[str, str | None]]:
        out = self.work / "input"
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(self.pristine, out)
        change(out / name if name.startswith(".") else out / "forgetwatch" / name)
        TRIED[kind] += 1
        got = {"report": _try(_report_reads, out)}
        if watch:
            got["watch"] = _try(_watcher_opens, out)
        for said, message in got.values():
            if said == "refused":
                assert "Traceback" not in message
        return got


@pytest.fixture
def inputs(run, tmp_path):
    logging.disable(logging.WARNING)  # thousands of inputs, most of them warned about: the assertions say what matters
    try:
        yield Inputs(run[0], tmp_path)
    finally:
        logging.disable(logging.NOTSET)


def _lines(rows) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


# -- the rules each line's fields follow, restated (the oracle: a legal value must be read, an illegal one refused) ---
def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**53


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not (isinstance(v, int) and abs(v) >= 2**53)


def _any_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _text(v) -> bool:
    return isinstance(v, str)


def _text_or_none(v) -> bool:
    return v is None or isinstance(v, str)


def _figures(v) -> bool:
    return isinstance(v, dict) and all(isinstance(g, dict) and all(isinstance(x, (int, float, str)) for x in g.values())
                                       for g in v.values())


RULES = {  # field: (legal value, may be left out)
    "metrics.jsonl": {"step": (_whole, False), "epoch": (_any_num, True), "seconds": (_any_num, True),
                      "metrics": (_figures, False)},
    "flips.jsonl": {"step": (_whole, False), "id": (_text, False), "direction": (_text, True),
                    "category": (_text, True), "question": (_text, True), "gold": (_text_or_none, True),
                    "vs_base": (_text, True), "base_prediction": (_text_or_none, True),
                    "prediction": (_text_or_none, True)},
    "at_risk.jsonl": {"step": (_whole, False), "id": (_text, False), "category": (_text, True),
                      "question": (_text, True), "gold": (_text_or_none, True), "margin_base": (_num, False),
                      "margin_now": (_num, False)},
    "events.jsonl": {"step": (_whole, False), "event": (_text, False), "key": (_text, True), "value": (_num, True),
                     "measured": (_num, True), "limit": (_num, True), "bound": (_text, True), "action": (_text, True),
                     "last_within_budget": (lambda v: v is None or (isinstance(v, dict) and _whole(v.get("step"))
                                                                    or v == {"step": None, "checkpoint": None}), True)},
    "trainer_log.jsonl": {"step": (_whole, False), "loss": (lambda v: v is None or _num(v), True),  # NaN: written null
                          "epoch": (lambda v: True, True), "learning_rate": (lambda v: True, True)},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RULES))
def test_every_field_of_every_record_line_of_every_type(inputs, name):
    rows = [json.loads(line) for line in inputs.file(name).read_text().splitlines()]
    at = min(1, len(rows) - 1)
    for field in rows[at]:
        for value in [MISSING, *VALUES]:
            changed = [dict(r) for r in rows]
            if value is MISSING:
                del changed[at][field]
            else:
                changed[at][field] = value
            got = inputs.run(name, name, lambda p, c=changed: p.write_text(_lines(c)),
                             watch=value in (MISSING, None, "x", [], 10**30, float("nan")))
            rule, optional = RULES[name].get(field, (lambda v: True, True))
            legal = optional if value is MISSING else rule(value)
            said, message = got["report"]
            if legal:
                assert said == "ok", (name, field, value, message)
            else:
                assert said == "refused", (name, field, value)
                where = f"{inputs.work / 'input' / 'forgetwatch' / name}, line {at + 1}: field `{field}"
                assert message.startswith(where), (name, field, value, message)
    # a field forgetwatch does not know (a later version's) is left alone; a line that is no object is refused
    changed = [dict(r, later_field=[1, {"x": None}]) for r in rows]
    assert inputs.run(name, name, lambda p: p.write_text(_lines(changed)))["report"] == ("ok", None)
    for value in (None, 3, "x", [1]):
        text = _lines(rows).splitlines()
        text[at] = json.dumps(value)
        said, message = inputs.run(name, name, lambda p, t=text: p.write_text("\n".join(t) + "\n"), watch=False)["report"]
        if name == "trainer_log.jsonl":  # written without fsync: a garbled line is left out of the plot
            assert said == "ok"
        else:
            assert said == "refused" and f"{name} line {at + 1}: " in message, (name, value, message)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["metrics.jsonl", "flips.jsonl", "at_risk.jsonl", "events.jsonl", "trainer_log.jsonl",
                                  "budget.json", "sidecar.json"])
def test_record_files_truncated_at_many_offsets_and_with_bytes_not_utf8(inputs, name):
    data = inputs.file(name).read_bytes()
    rng = random.Random(SEED)
    ends = [i + 1 for i, b in enumerate(data) if b == ord("\n")]
    cuts = sorted({0, 1, len(data) - 1, *ends, *(e - 1 for e in ends), *rng.sample(range(len(data)), min(40, len(data)))})
    for cut in cuts:
        got = inputs.run(name, name, lambda p, c=cut: p.write_bytes(data[:c]), watch=cut % 4 == 0)
        for said, message in got.values():
            if said == "refused":
                assert str(inputs.work / "input") in message, (cut, message)
        if name.endswith(".json") and 0 < cut < len(data) - 1:  # written whole: a part of one is never read as a whole
            assert got["report"][0] == "refused" or name == "sidecar.json", cut
            if name == "sidecar.json" and "watch" in got:
                assert got["watch"][0] == "refused", cut
    for _ in range(12):
        at = rng.randrange(len(data))
        got = inputs.run(name, name, lambda p, a=at: p.write_bytes(data[:a] + b"\xff" + data[a:]))
        line = data.count(b"\n", 0, at) + 1
        said, message = got["watch" if name == "sidecar.json" else "report"]
        if name == "trainer_log.jsonl":  # written without fsync: a garbled line is left out of the plot, said in the log
            assert said == "ok"
        else:
            assert said == "refused" and f"line {line}: not UTF-8 text" in message, (at, message)


BUDGET_RULES = {"limits": (lambda v: isinstance(v, dict) and all(_num(x) and abs(x) < float("inf") and x == x
                                                                  for x in v.values()), False),
                "on_budget": (_text, False), "bound": (_text, True), "over": (lambda v: isinstance(v, list) and all(
                    isinstance(x, str) for x in v), True),
                "last_within_budget": (lambda v: v is None or (isinstance(v, dict) and "step" in v and (
                    v["step"] is None or _whole(v["step"]))), True)}


def _with(doc: dict, path: tuple[str, ...], value) -> dict:
    """A copy of `doc` with the field at `path` set to `value`, or removed (`MISSING`)."""
    changed = json.loads(json.dumps(doc))
    inner = changed
    for k in path[:-1]:
        inner = inner[k]
    if value is MISSING:
        del inner[path[-1]]
    else:
        inner[path[-1]] = value
    return changed


@pytest.mark.slow
def test_every_field_of_budget_json_of_every_type(inputs):
    doc = json.loads(inputs.file("budget.json").read_text())
    fields = [(k,) for k in doc] + [("limits", "forgetting"), ("last_within_budget", "step"),
                                    ("last_within_budget", "checkpoint")]
    for path in fields:
        for value in [MISSING, *VALUES]:
            changed = _with(doc, path, value)
            said, message = inputs.run("budget.json", "budget.json",
                                       lambda p, c=changed: p.write_text(json.dumps(c)), watch=False)["report"]
            top = path[0]
            rule, optional = BUDGET_RULES[top]
            legal = optional if (value is MISSING and len(path) == 1) else rule(changed.get(top, MISSING))
            if path == ("last_within_budget", "checkpoint"):
                legal = value is MISSING or value is None or isinstance(value, str)
            if legal:
                assert said == "ok", (path, value, message)
            else:
                assert said == "refused" and message.startswith(
                    f"{inputs.work / 'input' / 'forgetwatch' / 'budget.json'}: "
                    f"field `{'.'.join(path) if top != 'last_within_budget' or len(path) == 1 or value is not MISSING else top}"
                ), (path, value, message)


MANIFEST_FIELDS = [("base_cache",), ("precision",), ("callback",), ("scoring_config",), ("max_steps",), ("report_to",),
                   ("started_at_step",), ("starts",), ("started_at",), ("pid",), ("host",), ("finished",),
                   ("final_step",), ("callback", "eval_steps"), ("callback", "budget"), ("callback", "at_risk_margin"),
                   ("callback", "replay"), ("scoring_config", "batch_size"), ("scoring_config", "mcq_mode"),
                   ("starts", 0, "step"), ("starts", 0, "id"), ("starts", 0, "at")]


@pytest.mark.slow
def test_every_field_of_the_sidecar_manifest_of_every_type(inputs):
    """A watcher reads the manifest first: a field of the wrong type is named (it was a TypeError, a KeyError, a
    MemoryError for a huge final_step, a ZeroDivisionError for eval_steps false)."""
    doc = json.loads(inputs.file("sidecar.json").read_text())
    manifest = inputs.work / "input" / "forgetwatch" / "sidecar.json"
    accepted = 0
    for path in MANIFEST_FIELDS:
        for value in [MISSING, *VALUES]:
            changed = _with(doc, path, value)
            got = inputs.run("sidecar.json", "sidecar.json", lambda p, c=changed: p.write_text(json.dumps(c)))
            said, message = got["watch"]
            if said == "refused" and "no base cache here" in message:  # another file name: said, with how to make it
                assert path == ("base_cache",) and isinstance(value, str), (path, value)
            elif said == "refused":
                assert message.startswith(f"{manifest}: field `"), (path, value, message)
                named = path[0] if path[0] not in ("callback", "scoring_config") else "callback` or `scoring_config"
                assert f"`{named}" in message or f"`{'.'.join(map(str, path))}" in message.replace("[0]", ".0"), \
                    (path, value, message)
            else:
                accepted += 1
    assert accepted > 0  # legal changes (another host, a later final step, ...) are read


@pytest.mark.slow
def test_npz_files_of_every_damage(inputs):
    z = dict(np.load(inputs.file("evals/step-00000004.npz")))
    file = inputs.work / "input" / "forgetwatch" / "evals" / "step-00000004.npz"
    changes = {("extra array",): lambda d: d.update(later=np.zeros(3))}
    for k in z:
        changes[("no", k)] = lambda d, k=k: d.pop(k)
        if z[k].dtype.kind != "U":
            changes[("float64", k)] = lambda d, k=k: d.update({k: d[k].astype(np.float64)})
        if z[k].dtype.kind != "U":
            changes[("text", k)] = lambda d, k=k: d.update({k: d[k].astype(str)})
        changes[("3 values", k)] = lambda d, k=k: d.update({k: d[k].reshape(-1)[:3]})
        changes[("2-d", k)] = lambda d, k=k: d.update({k: np.stack([d[k], d[k]])})
        changes[("objects", k)] = lambda d, k=k: d.update({k: np.array([{"a": 1}] * max(d[k].size, 1), dtype=object)})
        changes[("NaN", k)] = lambda d, k=k: d.update({k: np.full(d[k].shape, np.nan)})
        changes[("huge", k)] = lambda d, k=k: d.update({k: np.full(d[k].shape, 10**9, np.int64)})
    for what, change in changes.items():
        def write(p, change=change):
            d = dict(z)
            change(d)
            np.savez(file, **d)
        got = inputs.run("npz", "evals", write)
        same = {k: v for k, v in np.load(file, allow_pickle=True).items()}
        harmless = what[0] == "extra array" or (what[0] == "no" and what[1] in ("fingerprint", "nonfinite", "gold_logprob")) \
            or (what[0] == "float64" and what[1] in ("margin", "gold_logprob", "option_scores")) \
            or (what[0] == "NaN" and what[1] in ("margin", "gold_logprob", "option_scores")) \
            or (what[0] == "huge" and what[1] in ("pred_index", "n_tokens"))  # an index or a count: any whole number
        for reader, (said, message) in got.items():
            if harmless:
                assert said == "ok", (what, reader, message)
            else:
                assert said == "refused" and str(file) in message, (what, reader, message)
                assert "allow_pickle" not in message
        del same


@pytest.mark.slow
def test_a_lock_file_of_garbage_is_taken_over_or_named(inputs):
    """Whatever a lock file holds, a watcher takes it over (its holder is gone) or refuses naming it; never a crash
    (a `since` of 1e300 or NaN, a pid of 10**30, used to be an OverflowError or ValueError)."""
    lock = inputs.file(".forgetwatch-scoring.lock")
    info = json.loads(lock.read_text())
    info["released"] = None
    other = dict(info, host="another-host")  # its heartbeat (the file's time) is fresh: another host's live holder
    cases = [b"", b"\xff\xfe garbage", b"[1, 2]", b"null", b'{"host": ', json.dumps(info).encode()]
    for field in ("host", "pid", "since", "run", "released"):
        for value in VALUES:
            cases += [json.dumps(dict(info, **{field: value})).encode(), json.dumps(dict(other, **{field: value})).encode()]
    for data in cases:
        got = inputs.run(".lock", ".forgetwatch-scoring.lock", lambda p, d=data: p.write_bytes(d), watch=True)
        said, message = got["watch"]
        if said == "refused":
            assert "one record takes one writer" in message and ".forgetwatch-scoring.lock" in message, (data, message)
        assert got["report"] == ("ok", None)


def _edit_line(name: str, change):
    def write(path: Path) -> None:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        change(rows[min(1, len(rows) - 1)])
        path.write_text(_lines(rows))
    return name, write


def _edit_json(name: str, change):
    def write(path: Path) -> None:
        doc = json.loads(path.read_text())
        change(doc)
        path.write_text(json.dumps(doc))
    return name, write


def _edit_npz(change):
    def write(evals: Path) -> None:
        file = evals / "step-00000004.npz"
        z = dict(np.load(file))
        change(z)
        np.savez(file, **z)
    return "evals", write


# one input of each kind the fuzz pass found crashing a reader before the fix: (file, the change, the reader, what the
# refusal names)
FOUND = {
    "flips step null (TypeError)": (*_edit_line("flips.jsonl", lambda r: r.update(step=None)), "report", "field `step`"),
    "flips id null (TypeError)": (*_edit_line("flips.jsonl", lambda r: r.update(id=None)), "report", "field `id`"),
    "at-risk step missing (KeyError)": (*_edit_line("at_risk.jsonl", lambda r: r.pop("step")), "report",
                                        "field `step` is missing"),
    "event value null (TypeError)": (*_edit_line("events.jsonl", lambda r: r.update(value=None)), "report",
                                     "field `value`"),
    "trainer-log step null (TypeError)": (*_edit_line("trainer_log.jsonl", lambda r: r.update(step=None)), "report",
                                          "field `step`"),
    "metrics step a list (TypeError)": (*_edit_line("metrics.jsonl", lambda r: r.update(step=[])), "watch", None),
    "budget limits true (AttributeError)": (*_edit_json("budget.json", lambda d: d.update(limits=True)), "report",
                                            "field `limits`"),
    "budget limit null (TypeError)": (*_edit_json("budget.json", lambda d: d["limits"].update(forgetting=None)),
                                      "report", "field `limits.forgetting`"),
    "manifest callback null (AttributeError)": (*_edit_json("sidecar.json", lambda d: d.update(callback=None)), "watch",
                                                "field `callback`"),
    "manifest eval_steps false (ZeroDivisionError)": (
        *_edit_json("sidecar.json", lambda d: d["callback"].update(eval_steps=False)), "watch", "`eval_steps`"),
    "manifest starts text (AttributeError)": (*_edit_json("sidecar.json", lambda d: d.update(starts="x")), "watch",
                                              "field `starts`"),
    "npz offsets float (TypeError)": (*_edit_npz(lambda z: z.update(option_offsets=z["option_offsets"].astype(float))),
                                      "report", "array `option_offsets`"),
    "npz pred_index missing (KeyError)": (*_edit_npz(lambda z: z.pop("pred_index")), "report", "no `pred_index` array"),
    "npz of 3 probes (ValueError of np.stack)": (*_edit_npz(lambda z: z.update(outcome=z["outcome"][:3])), "report",
                                                 "array `pred_index` has 32 values, but `outcome` 3"),
}


@pytest.mark.parametrize("case", list(FOUND))
def test_the_faults_the_fuzz_found_are_named(inputs, case):
    name, change, reader, said = FOUND[case]
    got = inputs.run("found", name, change)
    kind, message = got[reader]
    if said is None:  # a watcher sets a metrics line it cannot read aside (with a warning), as a crash's cut line
        assert kind == "ok"
        assert list((inputs.work / "input" / "forgetwatch" / "recovered").glob("*/metrics.jsonl"))
    else:
        assert kind == "refused" and said in message, message
        assert str(inputs.work / "input" / "forgetwatch") in message, message


def test_a_garbled_lock_of_another_hosts_live_holder_is_named(inputs):
    """A `since` no clock can show (1e300, NaN) was an OverflowError / ValueError in the refusal's message."""
    lock = inputs.file(".forgetwatch-scoring.lock")
    for since in (1e300, float("nan"), "yesterday"):
        info = dict(json.loads(lock.read_text()), host="another-host", released=None, since=since)
        kind, message = inputs.run(".lock", ".forgetwatch-scoring.lock",
                                   lambda p, i=info: p.write_text(json.dumps(i)))["watch"]
        assert kind == "refused" and "since ?" in message and "one record takes one writer" in message, message
