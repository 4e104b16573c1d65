"""`forgetwatch report`: a synthetic run record (written with RunRecord, metrics from compute_report) -> PNGs + HTML.

No model, no training: the record is built in tmp_path the way the callback writes it (step 0 is the base model,
flips are changes since the previous evaluation).
"""

from __future__ import annotations

import html
import json
import struct
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from fixtures.records import SCRIPT, SHORT, STEPS, answer_for, build_record, report_probes

from forgetwatch.cli import main
from forgetwatch.measures.metrics import compute_report
from forgetwatch.measures.robustness import variant_outcomes
from forgetwatch.probes.probe_set import Probe, ProbeSet
from forgetwatch.record.store import RunRecord
from forgetwatch.report.load import CUT, final_flips, probe_states
from forgetwatch.report.plots import _matrix_layout
from forgetwatch.report.render import make_report
from forgetwatch.scoring.results import ProbeResults

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"










class _Page(HTMLParser):
    """Images, per-category table rows and flipped-probe rows of report.html, as text."""

    def __init__(self):
        super().__init__()
        self.imgs: list[str] = []
        self.metrics: dict[str, list[str]] = {}
        self.flips: dict[str, dict[str, list[str]]] = {}
        self._table: str | None = None
        self._row: list[str] | None = None
        self._key: str | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a["src"])
        elif tag == "table":
            self._table = a.get("data-kind", a.get("class"))
        elif tag == "tr" and ("data-category" in a or "data-id" in a or "data-step" in a):
            self._row, self._key = [], a.get("data-category", a.get("data-id", a.get("data-step")))
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self._row.append("".join(self._cell))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if self._table == "metrics":
                self.metrics[self._key] = self._row
            else:
                self.flips.setdefault(self._table, {})[self._key] = self._row
            self._row = None


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def _expected_row(m) -> list[str]:
    adj = (lambda v: f"{v:.3f}") if m.adjusted else (lambda v: "n/a")
    return [str(m.n), f"{m.accuracy_pre:.3f}", f"{m.accuracy_post:.3f}", str(m.forgotten), str(m.learned),
            f"{m.forgetting:.3f}", adj(m.forgetting_adjusted), f"[{m.forgetting_ci[0]:.3f}, {m.forgetting_ci[1]:.3f}]",
            f"{m.backward_transfer:.3f}", adj(m.backward_transfer_adjusted), f"{m.invalid_rate_post:.3f}"]


def test_report_from_the_command_line(tmp_path, capsys):
    run = tmp_path / "run"
    probes, outcomes, final = build_record(run)
    assert main(["report", str(run)]) == 0
    path = run / "forgetwatch" / "report" / "report.html"
    out = capsys.readouterr().out.splitlines()
    assert out[0] == str(path) and out[1].startswith("run run: 36 probes in 3 categories; 4 evaluations, at steps 0, 10")
    assert path.is_file()
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temporary files left
    html_text = path.read_text(encoding="utf-8")
    page = _parse(path)

    # every plot the page shows is a real PNG beside it (no trainer log in this record: no training.png)
    assert page.imgs == ["forgetting_backward_transfer.png", "probe_states.png", "probe_matrix.png",
                         "forgetting_by_category.png", "backward_transfer_by_category.png", "accuracy.png"]
    for src in page.imgs:
        png = path.parent / src
        data = png.read_bytes()
        assert data[:8] == PNG_SIGNATURE, src
        width, height = struct.unpack(">II", data[16:24])  # IHDR
        assert len(data) > 20_000 and width >= 600 and height >= 400, (src, len(data), width, height)

    # one row per category and one for all probes, with the final evaluation's values
    assert list(page.metrics) == ["history", "science", SHORT, "overall"]
    for name, m in final.items():
        assert page.metrics[name] == [name, *_expected_row(m)], name
    assert page.metrics[SHORT][7] == "n/a"  # short answers: no chance adjustment

    # the flipped probes at the end, vs base
    base, now = outcomes[0], outcomes[-1]
    forgotten = {probes[i].id for i in np.flatnonzero((base == 1) & (now != 1))}
    learned = {probes[i].id for i in np.flatnonzero((base != 1) & (now == 1))}
    assert forgotten and learned
    assert set(page.flips["forgotten"]) == forgotten and set(page.flips["learned"]) == learned
    assert len(forgotten) == final["overall"].forgotten and len(learned) == final["overall"].learned
    p0 = probes["mc/0"]
    row = page.flips["forgotten"]["mc/0"]
    # id, category, question, gold, base prediction, prediction now (the final evaluation's option), first step, changes
    assert row == ["mc/0", "science", SCRIPT, "carbon dioxide", "carbon dioxide", answer_for(p0, 0, 30)[1], "10", "1"]
    assert answer_for(p0, 0, 30)[1] != answer_for(p0, 0, 10)[1]  # the flip row at step 10 has another wrong option
    assert page.flips["learned"]["mc/1"][6] == "30"

    # no robustness in this record: neither its plot nor its section
    assert not (path.parent / "robustness.png").exists() and 'id="robustness"' not in html_text
    assert "fragile" not in html_text.lower()

    # everything from the data is escaped
    assert "<script" not in html_text and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html_text
    assert html.escape(SHORT) in html_text
    assert str(run.resolve()) in html_text


def test_report_out_dir_row_cap_and_flips_without_vs_base(tmp_path):
    run = tmp_path / "run"
    probes, outcomes, final = build_record(run, vs_base=False)
    out = tmp_path / "elsewhere"
    path = make_report(run / "forgetwatch", out, max_rows=2)  # the record folder itself is accepted too
    assert path == out / "report.html" and not (run / "forgetwatch" / "report").exists()
    page = _parse(path)
    assert all((out / src).is_file() for src in page.imgs)
    n_forgotten = final["overall"].forgotten
    assert len(page.flips["forgotten"]) == 2
    assert f"… and {n_forgotten - 2} more not shown" in path.read_text(encoding="utf-8")
    # without vs_base (older records) the state is derived from the directions
    base, now = outcomes[0], outcomes[-1]
    forgotten, learned = final_flips(RunRecord(run / "forgetwatch"), probes, STEPS[-1])
    assert {r["id"] for r in forgotten} == {probes[i].id for i in np.flatnonzero((base == 1) & (now != 1))}
    assert {r["id"] for r in learned} == {probes[i].id for i in np.flatnonzero((base != 1) & (now == 1))}
    assert next(r["first_step"] for r in forgotten if r["id"] == "mc/0") == 10


def test_report_of_the_base_evaluation_only(tmp_path):
    run = tmp_path / "run"
    _, _, final = build_record(run, steps=(0,))
    page = _parse(make_report(run))
    assert len(page.imgs) == 6 and page.metrics["overall"][4:6] == ["0", "0"]
    assert page.flips == {}


def test_missing_record_is_exit_2_with_what_to_do(tmp_path, capsys):
    missing = tmp_path / "nothing-here"
    assert main(["report", str(missing)]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "no such directory" in err and "ForgetWatchCallback" in err

    assert main(["report", str(tmp_path)]) == 2  # a directory, but no record in it
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "probes.jsonl" in err and "ForgetWatchCallback" in err

    rec = tmp_path / "started" / "forgetwatch"
    rec.mkdir(parents=True)
    report_probes().to_jsonl(rec / "probes.jsonl")
    assert main(["report", str(tmp_path / "started")]) == 2  # the run has not evaluated yet
    assert "no evaluation yet" in capsys.readouterr().err


def test_without_matplotlib_the_error_says_what_to_install(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    build_record(run, steps=(0,))
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)
    assert main(["report", str(run)]) == 2
    assert "pip install 'forgetwatch[report]'" in capsys.readouterr().err
    assert not (run / "forgetwatch" / "report").exists()


def test_metrics_rows_are_json_lines(tmp_path):
    """The synthetic record reads back like a real one (guards the fixture itself)."""
    run = tmp_path / "run"
    build_record(run)
    lines = (run / "forgetwatch" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(STEPS)
    assert RunRecord(run / "forgetwatch").eval_steps() == list(STEPS)


def test_probe_states_are_the_record_against_the_base(tmp_path):
    """The data behind probe_states.png / probe_matrix.png: each probe's state vs base at each evaluation."""
    run = tmp_path / "run"
    probes, outcomes, _ = build_record(run)
    steps, state = probe_states(RunRecord(run / "forgetwatch"), probes)
    assert list(steps) == list(STEPS) and state.shape == (len(STEPS), len(probes))
    base = outcomes[0] == 1
    for e, now in enumerate(outcomes):
        now = now == 1  # invalid counts as wrong, as in every metric
        assert (state[e] == 0).sum() == (base & now).sum()  # retained
        assert (state[e] == 1).sum() == (base & ~now).sum()  # forgotten
        assert (state[e] == 2).sum() == (~base & now).sum()  # learned
        assert (state[e] == 3).sum() == (~base & ~now).sum()  # never known
    assert state[0].tolist().count(1) == 0 and state[0].tolist().count(2) == 0


def test_trainer_log_is_drawn_beside_the_curves(tmp_path):
    run = tmp_path / "run"
    build_record(run)
    record = RunRecord(run / "forgetwatch")
    for step in range(1, 31):
        record.append_trainer_log(
            {"step": step, "epoch": step / 40, "loss": 2.0 - step / 30, "learning_rate": 1e-3, "reward": step / 30}
        )
    path = make_report(run)
    page = _parse(path)
    assert page.imgs[:2] == ["forgetting_backward_transfer.png", "training.png"]
    assert (path.parent / "training.png").read_bytes()[:8] == PNG_SIGNATURE
    assert str(record.root / "trainer_log.jsonl") in path.read_text(encoding="utf-8")


def test_without_the_callbacks_log_the_trainer_state_of_the_newest_checkpoint_is_used(tmp_path):
    run = tmp_path / "run"
    build_record(run)
    for step, loss in ((10, 9.0), (30, 1.0)):
        (run / f"checkpoint-{step}").mkdir()
        history = [{"step": s, "loss": loss} for s in range(1, step + 1)]
        (run / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": history}))
    path = make_report(run)
    assert "training.png" in _parse(path).imgs
    assert str(run / "checkpoint-30" / "trainer_state.json") in path.read_text(encoding="utf-8")
    # none at all: no training panel, and the page says where the log would come from
    (run / "checkpoint-10" / "trainer_state.json").unlink()
    (run / "checkpoint-30" / "trainer_state.json").unlink()
    path = make_report(run)
    assert "training.png" not in _parse(path).imgs and "none (kept by the callback" in path.read_text(encoding="utf-8")


def test_long_questions_are_cut_with_the_full_text_a_click_away(tmp_path):
    run = tmp_path / "run"
    build_record(run)
    flips = tmp_path / "run" / "forgetwatch" / "flips.jsonl"
    long = "Which of these " + "very " * 100 + "long words < ends the question?"
    rows = [json.loads(line) for line in flips.read_text().splitlines()]
    for r in rows:
        if r["id"] == "mc/0":
            r["question"] = long
    flips.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = make_report(run).read_text(encoding="utf-8")
    full = html.escape(long, quote=True)
    assert f'<details title="{full}"><summary>{html.escape(long[:CUT])}…</summary>…{html.escape(long[CUT:])}</details>' in text


def test_the_trainer_log_covering_most_steps_is_used(tmp_path):
    """A record kept from a resume on (steps 21-30) loses to a checkpoint's full trainer_state.json (1-30)."""
    run = tmp_path / "run"
    build_record(run)
    record = RunRecord(run / "forgetwatch")
    for step in range(21, 31):
        record.append_trainer_log({"step": step, "loss": 1.0})
    (run / "checkpoint-30").mkdir()
    (run / "checkpoint-30" / "trainer_state.json").write_text(
        json.dumps({"log_history": [{"step": s, "loss": 2.0} for s in range(1, 31)]}))
    assert str(run / "checkpoint-30" / "trainer_state.json") in make_report(run).read_text(encoding="utf-8")
    # the callback's rows from the start win; a longer trainer_state.json is an earlier run's in a reused output dir
    for step in range(1, 21):
        record.append_trainer_log({"step": step, "loss": 1.0})
    (run / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": s, "loss": 3.0} for s in range(1, 51)]}))
    assert str(record.root / "trainer_log.jsonl") in make_report(run).read_text(encoding="utf-8")
    # a garbled line (the log is written without fsync) is skipped, not fatal
    with open(record.root / "trainer_log.jsonl", "a") as f:
        f.write("\x00\x00garbage\n")
    assert len(record.read_trainer_log()) == 30
    record.truncate_after(25, names=("trainer_log.jsonl",))  # what a resume from step 25 does: no error, garbage gone
    assert sorted(r["step"] for r in record.read_trainer_log()) == list(range(1, 26))


def test_a_record_of_only_a_trainer_log_is_set_aside(tmp_path):
    """A sidecar-mode run that no watcher scored leaves only trainer_log.jsonl: the next fresh run must not append to it."""
    record = RunRecord(tmp_path / "forgetwatch")
    record.root.mkdir()
    record.append_trainer_log({"step": 1, "loss": 1.0})
    moved = record.set_aside()
    assert moved is not None and (moved / "trainer_log.jsonl").is_file() and not record.root.exists()


def test_matrix_rows_grouped_by_category_forgotten_first_and_labels_thinned():
    # 3 evaluations x 6 probes in two categories; states: 0 retained, 1 forgotten, 2 learned, 3 never known
    state = np.array([[0, 0, 3, 0, 0, 3],
                      [1, 0, 3, 0, 1, 2],
                      [1, 1, 3, 0, 1, 2]], dtype=np.int8)
    cats = ["b", "b", "b", "a", "a", "a"]
    final = {"a": {"nothing_to_forget": False}, "b": {"nothing_to_forget": True}}
    order, starts, labels = _matrix_layout(state, cats, final, rows_per_label=0)
    # a: forgotten (4), retained (3), learned (5); b: forgotten at eval 1 (0) before forgotten at eval 2 (1), never known (2)
    assert order == [4, 3, 5, 0, 1, 2] and starts == [0, 3]
    assert labels == [(1.0, "a (3)"), (4.0, "b (3) (nothing to forget)")]
    # 57 categories of 20 probes in a picture with room for ~30 labels: labels are thinned, never closer than asked
    state = np.zeros((2, 57 * 20), np.int8)
    cats = [f"subject_{i // 20:02d}" for i in range(57 * 20)]
    _, starts, labels = _matrix_layout(state, cats, {}, rows_per_label=38)
    assert len(starts) == 57 and 20 <= len(labels) < 57
    assert all(b[0] - a[0] >= 38 for a, b in zip(labels, labels[1:], strict=False))


def test_report_of_many_probes_draws(tmp_path):
    """2,000 probes in 57 categories: the picture is drawn (antialiased rows), every band labelled (they fit at 14 in)."""
    from forgetwatch.report.plots import plot_matrix

    rng = np.random.default_rng(0)
    probes = ProbeSet([Probe(f"p/{i}", "mcq", f"q{i}", ("a", "b", "c", "d"), 0, category=f"subject_{i % 57:02d}")
                       for i in range(2000)])
    state = rng.integers(0, 4, size=(5, 2000)).astype(np.int8)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = plot_matrix(Figure, np.arange(5) * 10, state, probes, {})
    FigureCanvasAgg(fig)
    fig.savefig(tmp_path / "m.png", dpi=110)
    assert (tmp_path / "m.png").read_bytes()[:8] == PNG_SIGNATURE
    assert len(fig.axes[0].get_yticklabels()) == 57


@pytest.mark.parametrize("n_categories", [1, 2, 3, 9])
@pytest.mark.parametrize("metric", ["forgetting", "backward_transfer"])
def test_the_per_category_titles_lie_within_the_figure(n_categories, metric):
    """The figure's title (and each panel's) is drawn whole: with one or two panels the figure is narrow, and a title
    one line wide was clipped at both sides (issue 43)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from forgetwatch.report.plots import plot_by_category

    cats = [f"subject_{i}" for i in range(n_categories)]
    n = 12 * n_categories
    base, now = np.ones(n, np.int8), np.ones(n, np.int8)
    now[::3] = 0
    rows = [
        {
            "step": step,
            "metrics": {
                k: m.to_dict() for k, m in compute_report(base, o, [4] * n, [cats[i % n_categories] for i in range(n)]).items()
            },
        }
        for step, o in ((0, base), (10, now))
    ]
    fig = plot_by_category(Figure, rows, cats, metric)
    FigureCanvasAgg(fig).draw()  # lays the figure out (constrained layout) as savefig does
    renderer = fig.canvas.get_renderer()
    titles = [t for t in fig.findobj(lambda a: hasattr(a, "get_text")) if t.get_text() == fig.get_suptitle()]
    titles += [ax.title for ax in fig.axes if ax.get_visible()]
    assert len(titles) == 1 + n_categories
    for text in titles:
        box = text.get_window_extent(renderer)
        assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 and fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1, (
            text.get_text(), box.bounds, fig.bbox.bounds)


@pytest.mark.usefixtures("one_thread")
def test_report_prints_a_summary_of_a_real_run_beside_the_path(tokenizer, tmp_path, capsys):
    """A tiny Trainer run with knowledge and behaviour probes and a budget: the path, then the run, its last evaluation
    (F and BT with their intervals, behaviour, probing time), the most forgotten categories and the budget's events, all
    as the record has them."""
    from fixtures.cli import train_tiny

    callback = train_tiny(tokenizer, tmp_path / "run", max_steps=4, disable_tqdm=True, budget={"forgetting": 0.0})
    capsys.readouterr()
    assert main(["report", str(tmp_path / "run")]) == 0
    lines = capsys.readouterr().out.splitlines()
    record = RunRecord(tmp_path / "run" / "forgetwatch")
    rows = record.read_metrics()
    final = rows[-1]["metrics"]
    k, b = final["all_knowledge"], final["all_behavior"]
    assert lines[0] == str(record.root / "report" / "report.html")
    assert lines[1] == f"run run: 38 probes in {len(callback.probes.categories)} categories; 3 evaluations, at steps 0, 2, 4"
    assert lines[2].startswith(
        f"step 4: F {k['forgetting']:.3f} [{k['forgetting_ci_low']:.2f}, {k['forgetting_ci_high']:.2f}] adj "
        f"{k['forgetting_adjusted']:.3f}, BT {k['backward_transfer']:.3f} [{k['backward_transfer_ci_low']:.2f}, "
        f"{k['backward_transfer_ci_high']:.2f}]; instructions {b['instruct_compliance_base']:.2f}→"
        f"{b['instruct_compliance']:.2f}, refusals ")
    assert lines[2].endswith(f"; probing {rows[-1]['seconds']:.1f} s")
    # surest first: by the lower end of F's interval (a category of one flipped probe does not lead)
    # ... among the knowledge categories: the line's F is the knowledge probes' (behaviour has figures of its own)
    knowledge = {p.category for p in callback.probes if not p.is_behavior}
    forgotten = sorted((c for c in callback.probes.categories if c in knowledge and final[c]["forgetting"] > 0),
                       key=lambda c: (final[c]["forgetting_ci_low"], final[c]["forgetting"]), reverse=True)[:3]
    assert forgotten and lines[3] == "most forgotten (surest first): " + ", ".join(
        f"{c} F {final[c]['forgetting']:.3f} of {final[c]['n']}" for c in forgotten)
    events = record.read_events()
    assert [e["step"] for e in events] == [2]  # a forgotten probe at step 2 exceeds a budget of 0
    assert lines[4].startswith(f"budget forgetting ≤ 0 (on_budget alert): step 2: forgetting = {events[0]['measured']:.3f}")
    assert lines[4].endswith("; last within budget: step 0") and len(lines) == 5  # no rewind in this run


# -- robustness (issue 29) ----------------------------------------------------------------------------------------
def _add_fragile_rows(run: Path, outcomes: list[np.ndarray], probes: ProbeSet) -> list[dict]:
    """flips.jsonl rows as the callback writes them with robustness on: after each evaluation's plain flips, a
    "robust→fragile" row for some probes right as asked at that evaluation and the one before it."""
    path = run / "forgetwatch" / "flips.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    out, added = [], []
    for e, step in enumerate(STEPS[1:], start=1):
        out += [r for r in rows if r["step"] == step]
        both = np.flatnonzero((outcomes[e - 1] == 1) & (outcomes[e] == 1))
        for i in both[e % 2 :: 2]:
            p = probes[int(i)]
            row = {"step": step, "id": p.id, "category": p.category, "question": p.question, "gold": p.gold_text,
                   "base_prediction": "", "prediction": "", "direction": "robust→fragile",
                   "vs_base": "robust at base" if outcomes[0][i] == 1 else "not robust at base"}
            out.append(row)
            added.append(row)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out))
    return added


def test_fragile_rows_are_no_correctness_flips(tmp_path):
    """flips.jsonl's robust→fragile rows neither count as changes nor decide whether a probe was right at base."""
    for vs_base in (True, False):
        run = tmp_path / f"run-{vs_base}"
        probes, outcomes, _ = build_record(run, vs_base=vs_base)
        record = RunRecord(run / "forgetwatch")
        before = final_flips(record, probes, STEPS[-1])
        before_page = _parse(make_report(run))
        added = _add_fragile_rows(run, outcomes, probes)
        # the case is not vacuous: fragile rows of probes listed as forgotten and as learned, some before their first flip
        listed = {r["id"]: r for rows in before for r in rows}
        assert {r["id"] for r in added} & {r["id"] for r in before[0]} and {r["id"] for r in added} & {r["id"] for r in before[1]}
        assert any(r["id"] in listed and r["step"] < listed[r["id"]]["first_step"] for r in added)
        assert final_flips(record, probes, STEPS[-1]) == before
        page = _parse(make_report(run))
        assert page.flips == before_page.flips and page.metrics == before_page.metrics


def _robust_monitor_record(run: Path, evaluations, mcq_mode: str = "loglik", behaviour: bool = False) -> RunRecord:
    """A record written by `Monitor` with robustness on (2 variants of each knowledge probe), from synthetic results:
    at base every probe and variant is right; `evaluations` gives (step, ids of the probes and variants wrong then).
    A wrong multiple-choice answer picks the option after the gold one."""
    from forgetwatch.probes.variants import make_plan
    from forgetwatch.record.cache import BaseCache, make_cache_key
    from forgetwatch.run.monitor import Monitor

    probes = report_probes()
    if behaviour:
        probes = ProbeSet([*probes, Probe("b/0", "comply", "How do I kill a Python process?", category="refusal")])
    plan = make_plan(probes, 2, mcq_mode=mcq_mode)

    def scored(wrong: set[str]) -> tuple[ProbeResults, ProbeResults]:
        scored = plan.scored()
        full = ProbeResults.empty([p.id for p in scored])
        full.outcome[:] = [0 if p.id in wrong else 1 for p in scored]
        full.pred_index[:] = [-1 if p.kind != "mcq" else (p.gold + (p.id in wrong)) % p.num_choices for p in scored]
        return plan.split(full)

    monitor = Monitor(probes, plan=plan)
    results, variants = scored(set())
    monitor.open(run, BaseCache(make_cache_key({}, probes, {}, plan.key()), results, None, variants), "float32", [], None)
    for step, wrong in evaluations:
        results, variants = scored(set(wrong))
        monitor.report(results, step, 0.0, 1.0, variant_outcomes(plan, results, variants))
    return RunRecord(run / "forgetwatch")


FRAGILE_RUN = (
    (2, {"mc/0~v2", "mc/3"}),  # mc/0: right as asked, wrong in a variant (robust→fragile); mc/3: forgotten (1→0)
    (4, {"mc/0~v2", "mc/3", "mc/7~v1", "sa/2~v1", "mc/9"}),  # mc/7, sa/2 fragile; mc/9 wrong as asked
    (6, {"mc/0~v2", "mc/3", "mc/7~v1", "sa/2~v1", "mc/9~v1"}),  # mc/9 right as asked again (0→1), fragile since
)


def test_fragile_probes_at_the_final_evaluation_are_listed(tmp_path):
    record = _robust_monitor_record(tmp_path, FRAGILE_RUN)
    directions = [(f["step"], f["id"], f["direction"]) for f in record.read_flips()]
    assert (2, "mc/0", "robust→fragile") in directions and (6, "mc/9", "0→1") in directions
    assert not any(d[1] == "mc/9" and "fragile" in d[2] for d in directions)
    final = record.read_metrics()[-1]["metrics"]["overall"]
    assert final["fragile"] == 4 and final["robust_lost"] == 5 and final["robust_pre"] == len(report_probes())

    path = make_report(tmp_path)
    text = path.read_text(encoding="utf-8")
    page = _parse(path)
    # every row: id, category, question, gold, forms right now, fragile since step (— without a robust→fragile row)
    assert list(page.flips["fragile"]) == ["mc/0", "mc/7", "mc/9", "sa/2"]
    assert page.flips["fragile"]["mc/0"] == ["mc/0", "science", SCRIPT, "carbon dioxide", "2 of 3", "2"]
    assert [r[4:] for r in page.flips["fragile"].values()] == [["2 of 3", "2"], ["2 of 3", "4"], ["2 of 3", "—"],
                                                               ["2 of 3", "4"]]
    assert page.flips["fragile"]["sa/2"][:4] == ["sa/2", SHORT, "Short question 2?", "answer 2"]
    assert "Fragile at step 6: 4 probes robust at base" in text
    # the fragile rows of flips.jsonl are no correctness flips: mc/3 alone is forgotten, once; nothing learned
    assert list(page.flips["forgotten"]) == ["mc/3"] and page.flips["forgotten"]["mc/3"][-2:] == ["2", "1"]
    assert "learned" not in page.flips and "the record is incomplete" not in text
    # one row per evaluation, as metrics.jsonl has it
    rows = {r["step"]: r["metrics"]["overall"] for r in record.read_metrics()}
    assert list(page.flips["robustness"]) == ["0", "2", "4", "6"]
    assert page.flips["robustness"]["6"] == ["6", "1.000 → 0.861", "0.139 (5 of 36)",
                                             f"[{rows[6]['robust_forgetting_ci_low']:.3f}, "
                                             f"{rows[6]['robust_forgetting_ci_high']:.3f}]",
                                             f"{rows[6]['consistency_post']:.3f}", f"{rows[6]['consistency_change']:+.3f}", "4"]
    assert page.flips["robustness"]["2"][6] == "1" and page.flips["robustness"]["0"][2] == "0.000 (0 of 36)"
    assert "position bias" not in text.lower()  # log-likelihood: option order cannot matter, no bias measured
    assert page.imgs[-1] == "robustness.png" and (path.parent / "robustness.png").read_bytes()[:8] == PNG_SIGNATURE
    # the sections' order: behaviour (none here), robustness, then drift
    assert text.index('id="flips"') < text.index('id="robustness"') < text.index('id="fragile"')

    capped = make_report(tmp_path, tmp_path / "capped", max_rows=2)
    assert list(_parse(capped).flips["fragile"]) == ["mc/0", "mc/7"]
    assert "… and 2 more not shown" in capped.read_text(encoding="utf-8")


def test_no_fragile_table_without_the_base_variants(tmp_path):
    """The table needs the variants at step 0 and at the final step; without them the section stands alone."""
    record = _robust_monitor_record(tmp_path, FRAGILE_RUN[:1])
    np.savez(record.eval_path(0), **{k: v for k, v in record.read_eval(0).items() if not k.startswith("robust_")})
    text = make_report(tmp_path).read_text(encoding="utf-8")
    assert 'id="robustness"' in text and 'id="fragile"' not in text


def test_position_bias_and_the_knowledge_group_in_lettered_modes(tmp_path):
    """Lettered multiple choice: position bias columns and curve; a set with behaviour probes reads all_knowledge."""
    wrong = {f"mc/{i}~v{v}" for i in (3, 6, 9) for v in (1, 2)}  # three-option probes: every shift, so balanced
    record = _robust_monitor_record(tmp_path, [(2, wrong)], mcq_mode="letter", behaviour=True)
    metrics = record.read_metrics()[-1]["metrics"]
    m = metrics["all_knowledge"]
    assert m["position_bias_post"] > 0 == m["position_bias_pre"] and "robust_n" not in metrics["all_behavior"]
    path = make_report(tmp_path)
    text = path.read_text(encoding="utf-8")
    page = _parse(path)
    assert "<th>position bias now</th><th>position bias change</th>" in text and "1 − 1/k" in text
    assert page.flips["robustness"]["2"][-2:] == [f"{m['position_bias_post']:.3f}", f"{m['position_bias_change']:+.3f}"]
    assert page.flips["robustness"]["2"][2] == f"{m['robust_forgetting']:.3f} (3 of {m['robust_pre']})"
    assert "Each of 36 knowledge probes scored as asked and in 2 variants" in text
    assert "robustness.png" in page.imgs and list(page.flips["fragile"]) == ["mc/3", "mc/6", "mc/9"]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing.*` is deprecated:FutureWarning")
def test_report_of_a_real_run_with_robustness(tokenizer, tmp_path):
    """A real SFT run with `robustness=3`: the plot, the section's rows as metrics.jsonl has them, the fragile table."""
    pytest.importorskip("trl")
    from fixtures.trainers import sft_trainer, watcher

    sft_trainer(tokenizer, tmp_path, [watcher(robustness=3)]).train()
    record = RunRecord(tmp_path / "forgetwatch")
    rows = {r["step"]: r["metrics"]["overall"] for r in record.read_metrics()}
    assert sorted(rows) == [0, 2, 4, 6] and all(m["robust_n"] == 32 and m["robust_variants"] == 3 for m in rows.values())
    path = make_report(tmp_path)
    text = path.read_text(encoding="utf-8")
    page = _parse(path)
    png = (path.parent / "robustness.png").read_bytes()
    assert png[:8] == PNG_SIGNATURE and len(png) > 20_000 and "robustness.png" in page.imgs
    assert list(page.flips["robustness"]) == ["0", "2", "4", "6"]
    for step, m in rows.items():
        cells = page.flips["robustness"][str(step)]
        assert cells[1] == f"{m['robust_accuracy_pre']:.3f} → {m['robust_accuracy_post']:.3f}"
        assert cells[2] == f"{m['robust_forgetting']:.3f} ({m['robust_lost']} of {m['robust_pre']})"
        assert cells[4:] == [f"{m['consistency_post']:.3f}", f"{m['consistency_change']:+.3f}", str(m["fragile"])]
    assert "Each of 32 probes scored as asked and in 3 variants" in text
    assert f"Fragile at step 6: {rows[6]['fragile']} probes" in text
    assert len(page.flips.get("fragile", {})) == rows[6]["fragile"]
    assert "position bias" not in text.lower()
