"""The console line (`forgetwatch.run.console`): one line per evaluation beside the Trainer's own log lines.

The formatter on rows written by hand (milliseconds), then real transformers `Trainer` runs of a tiny model on the CPU
whose stdout is read back: a line per evaluation with the record's figures, the Trainer's lines still there, with and
without its tqdm bar, and none with `console=False`. One line per evaluation from two ranks: tests/run/test_distributed.py.
"""

from __future__ import annotations

import logging
import re

import pytest
from fixtures.cli import train_tiny

from forgetwatch.record.store import RunRecord
from forgetwatch.run.console import CONSOLE_LOGGER, format_evaluation, say, worst_categories

NAN = float("nan")
LINE = re.compile(r"^forgetwatch step (\d+)\b")


def _row(f: float, bt: float = 0.0, **extra) -> dict:
    return {"n": 100, "forgetting": f, "forgetting_ci_low": max(f - 0.05, 0), "forgetting_ci_high": f + 0.06,
            "forgetting_adjusted": max(f - 0.08, 0), "adjusted": True, "backward_transfer": bt,
            "backward_transfer_ci_low": 0.0, "backward_transfer_ci_high": bt + 0.04, "accuracy_pre": 0.6, **extra}


# -- the formatter --------------------------------------------------------------------------------------------------
def test_a_knowledge_line_names_the_figures_the_worst_category_and_the_time():
    rows = {"overall": _row(0.205, 0.02), "triviaqa": _row(0.375), "arc_easy": _row(0.1), "sciq": _row(0.0)}
    line = format_evaluation(30, rows, 28.12)
    assert line == ("forgetwatch step 30: F 0.205 [0.15, 0.27] adj 0.125, BT 0.020 [0.00, 0.06]; worst triviaqa F 0.375; "
                    "probing 28.1 s")


def test_short_answers_only_have_no_adjusted_figure_and_one_category_no_worst():
    rows = {"overall": _row(0.1, adjusted=False), "short": _row(0.1, adjusted=False)}
    assert format_evaluation(4, rows) == "forgetwatch step 4: F 0.100 [0.05, 0.16], BT 0.000 [0.00, 0.04]"


def test_mixed_probes_show_knowledge_f_and_behaviour_base_to_now():
    behaviour = {"instruct_compliance_base": 0.39, "instruct_compliance": 0.17, "runaway_rate_base": 0.28,
                 "runaway_rate": 0.61}
    rows = {"overall": _row(0.3), "all_knowledge": _row(0.205, 0.02), "all_behavior": {**_row(0.5), **behaviour},
            "triviaqa": _row(0.375), "change_case": _row(0.2)}
    line = format_evaluation(30, rows, 28.12)
    assert line == ("forgetwatch step 30: F 0.205 [0.15, 0.27] adj 0.125, BT 0.020 [0.00, 0.06]; worst triviaqa F 0.375; "
                    "instructions 0.39→0.17, runaways 0.28→0.61; probing 28.1 s")
    assert len(line) < 160
    # every figure there is: robustness, a long category name, harmless requests refused, the watcher's label
    rows["overall"]["robust_forgetting"] = 0.41
    rows["all_behavior"].update(over_refusal_rate_base=0.02, over_refusal_rate=0.1)
    rows["mmlu_high_school_government_and_politics"] = _row(0.5)
    line = format_evaluation(1200, rows, 131.4, label="forgetwatch watch")
    assert line == ("forgetwatch watch step 1200: F 0.205 [0.15, 0.27] adj 0.125, BT 0.020 [0.00, 0.06], robust F 0.410; "
                    "worst mmlu_high_school_govern… F 0.500; instructions 0.39→0.17, refusals 0.02→0.10, runaways "
                    "0.28→0.61; probing 131.4 s")
    assert len(line) < 220
    # the kind groups are not categories: "all_behavior" has the highest F but is not the worst category
    assert worst_categories(rows) == [("mmlu_high_school_government_and_politics", 0.5), ("triviaqa", 0.375),
                                      ("change_case", 0.2)]


def test_runaways_alone_are_no_behaviour_and_the_base_line_says_accuracy():
    generated = {"runaway_rate_base": 0.5, "runaway_rate": 0.75, "instruct_compliance": NAN, "over_refusal_rate": NAN}
    assert "runaway" not in format_evaluation(2, {"overall": _row(0.1, **generated)})
    base = {"overall": {"n": 40, "accuracy_pre": 0.525, "instruct_compliance_base": 0.5, "instruct_compliance": 0.5,
                        "runaway_rate_base": 0.25, "runaway_rate": 0.25}}
    assert (
        format_evaluation(0, base, 0.0)
        == "forgetwatch step 0 (base): accuracy 0.525 on 40 probes; instructions 0.50, runaways 0.25"
    )


def test_missing_figures_are_said_not_printed_as_nan():
    rows = {"overall": {**_row(NAN), "missing": "3 of 100 probes scored NaN or inf", "nonfinite_probes": 3},
            "a": {**_row(NAN), "missing": "3 of 50"}, "b": _row(0.2)}
    assert format_evaluation(6, rows, 1.0) == ("forgetwatch step 6: figures missing (3 probes scored NaN or inf; see "
                                               "metrics.jsonl); probing 1.0 s")
    assert worst_categories(rows) == [("b", 0.2)]


def test_say_writes_one_line_to_stdout_and_obeys_the_loggers_level(capsys):
    say("forgetwatch step 1: hello")
    assert capsys.readouterr().out == "forgetwatch step 1: hello\n"
    logging.getLogger(CONSOLE_LOGGER).setLevel(logging.WARNING)
    try:
        say("forgetwatch step 2: hello")
        assert capsys.readouterr().out == ""
    finally:
        logging.getLogger(CONSOLE_LOGGER).setLevel(logging.INFO)




def _trainer_lines(out: str) -> list[str]:
    """The Trainer's own log lines (ProgressCallback / PrinterCallback print each `logs` dict)."""
    return [line for line in out.splitlines() if line.startswith("{") and "'loss'" in line]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("disable_tqdm", [False, True], ids=["bar", "no-bar"])
def test_one_line_per_evaluation_beside_the_trainers_own(tokenizer, tmp_path, capsys, disable_tqdm):
    callback = train_tiny(tokenizer, tmp_path, max_steps=4, disable_tqdm=disable_tqdm)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if LINE.match(line)]
    rows = RunRecord(tmp_path / "forgetwatch").read_metrics()
    assert [int(LINE.match(line).group(1)) for line in lines] == [r["step"] for r in rows] == [0, 2, 4]
    for line, row in zip(lines, rows, strict=True):
        # the record's figures (its seconds are rounded to the millisecond: the time is compared apart)
        said = format_evaluation(row["step"], row["metrics"], categories=callback.probes.categories)
        assert line.split("; probing ")[0] == said and len(line) < 180  # with the three behaviour figures
        assert "; probing " in line  # step 0 too: the base was scored in this run, and its time is part of the cost
    assert "F " in lines[1] and "instructions " in lines[1] and "runaways " in lines[1]
    assert len(_trainer_lines(out)) == 4  # the Trainer's lines are still all there


@pytest.mark.usefixtures("one_thread")
def test_console_false_is_quiet(tokenizer, tmp_path, capsys):
    train_tiny(tokenizer, tmp_path, max_steps=2, disable_tqdm=True, console=False)
    out = capsys.readouterr().out
    assert not [line for line in out.splitlines() if "forgetwatch" in line]
    assert len(_trainer_lines(out)) == 2
    assert [r["step"] for r in RunRecord(tmp_path / "forgetwatch").read_metrics()] == [0, 2]  # quiet, not off


def test_the_worst_categories_are_ranked_by_what_is_sure():
    # one instruction probe that flipped (F 1, Wilson interval 0.21-1) against 15 of 40 (F 0.375, 0.24-0.53): the
    # suite of 40 forgot more for sure, and is named first
    from forgetwatch.measures.metrics import wilson_interval

    def row(k, n):
        low, high = wilson_interval(k, n)
        return {"forgetting": k / n, "forgetting_ci_low": low, "forgetting_ci_high": high}

    rows = {"overall": {}, "language": row(1, 1), "sciq": row(15, 40), "piqa": row(5, 40)}
    assert [name for name, _ in worst_categories(rows)] == ["sciq", "language", "piqa"]


def test_worst_is_chosen_among_the_knowledge_categories_when_the_line_shows_their_f():
    from forgetwatch.probes.probe_set import Probe, ProbeSet
    from forgetwatch.run.console import headline_categories

    mixed = ProbeSet([Probe("a", "mcq", "1+1?", ("1", "2"), 1, category="math"),
                      Probe("b", "instruct", "Answer in lower case.", category="change_case",
                            instructions=[{"id": "change_case:english_lowercase"}]),
                      Probe("c", "comply", "How do I kill a process?", category="over_refusal")])
    assert headline_categories(mixed) == ("math",)
    knowledge = ProbeSet([Probe("a", "mcq", "1+1?", ("1", "2"), 1, category="math"),
                          Probe("b", "mcq", "2+2?", ("4", "5"), 0, category="more")])
    assert headline_categories(knowledge) == ("math", "more")
