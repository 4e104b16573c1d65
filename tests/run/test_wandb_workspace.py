"""The W&B layout: the keys a real offline run logs (read back from disk) make few sections with the overview first, and
the workspace template (`forgetwatch.run.wandb_workspace`) shows exactly those keys, overview first."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

pytest.importorskip("trl")
pytest.importorskip("wandb")
pytest.importorskip("if_verifiable")

from conftest import clear_wandb_env
from fixtures.scoring import behavior_probes  # noqa: E402
from fixtures.trainers import sft_trainer  # noqa: E402
from fixtures.wandb_offline import find_run_file, finish_offline_run, read_history  # noqa: E402

from forgetwatch import Probe, ProbeSet, load_record  # noqa: E402
from forgetwatch.cli import main as cli  # noqa: E402
from forgetwatch.run.callback import ForgetWatchCallback  # noqa: E402
from forgetwatch.run.keys import OVERVIEW  # noqa: E402
from forgetwatch.run.wandb_workspace import describe, save_for_run, sections_of_record  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def run(tokenizer, tmp_path_factory):
    """Three knowledge suites and behaviour probes, a budget, the workspace option on, logged to an offline W&B run."""
    root = tmp_path_factory.mktemp("layout")
    probes = ProbeSet([Probe(f"{s}{i}", "mcq", f"{i} {op} 1 = ?", (str(i), str(i + 1), str(i + 2)), 1, category=s)
                       for s, op in (("add", "+"), ("sub", "-"), ("mul", "*")) for i in range(4)]) + behavior_probes()
    said = _Collect()
    log = logging.getLogger("forgetwatch.run.wandb_workspace")
    log.addHandler(said)
    old_level, log.level = log.level, logging.INFO
    with pytest.MonkeyPatch.context() as mp:
        clear_wandb_env(mp, root / "wandb")
        finish_offline_run()
        cb = ForgetWatchCallback(probes, eval_steps=3, behavior_max_new_tokens=10, budget={"forgetting": 0.5},
                                 wandb_workspace=True)
        trainer = sft_trainer(tokenizer, root / "out", [cb], report_to="wandb")
        try:
            trainer.train()
        finally:
            finish_offline_run()
            log.removeHandler(said)
            log.level = old_level
    history = read_history(find_run_file(root / "wandb"))
    keys = {k for r in history for k in r if k.startswith("forgetwatch")}
    return SimpleNamespace(out=root / "out", history=history, keys=keys, said=said.messages)


def test_the_run_fills_few_sections_with_the_overview_apart(run):
    """W&B makes a section per prefix up to the last "/" (its default; or up to the first): 9 of ours here (24 before
    this layout), 3 when grouped by the first prefix; the overview section holds the overview's figures and flips only."""
    last = {k.rsplit("/", 1)[0] for k in run.keys}
    first = {k.split("/")[0] for k in run.keys}
    assert first == {"forgetwatch", "forgetwatch_by_category", "forgetwatch_details"}
    assert last == {"forgetwatch", "forgetwatch_details"} | {k.rsplit("/", 1)[0] for k in run.keys
                                                             if k.startswith("forgetwatch_by_category/")}
    assert len(last) == 9
    overview = {k.split("/", 1)[1] for k in run.keys if k.rsplit("/", 1)[0] == "forgetwatch"}
    assert {"forgetting", "backward_transfer", "forgetting_adjusted", "backward_transfer_adjusted",
            "over_budget", "flips"} <= overview <= set(OVERVIEW) | {"flips"}
    # every per-category section is an overview figure; every category of the run is in it
    for k in run.keys:
        if k.startswith("forgetwatch_by_category/"):
            assert k.split("/")[1] in OVERVIEW
    assert {k.rsplit("/", 1)[1] for k in run.keys if k.startswith("forgetwatch_by_category/forgetting/")} == {
        "add", "sub", "mul", "change_case", "length_constraints", "over_refusal", "all_knowledge", "all_behavior"}


def test_the_budget_state_is_a_curve(run):
    rows = [r for r in run.history if "forgetwatch/over_budget" in r]
    assert [r["train/global_step"] for r in rows] == [0, 3, 6]
    budget = json.loads((run.out / "forgetwatch" / "budget.json").read_text())
    assert rows[-1]["forgetwatch/over_budget"] == len(budget["over"])
    assert all(r["forgetwatch_details/probe_seconds"] > 0 for r in rows[1:])


def test_the_workspace_shows_exactly_the_logged_keys_overview_first(run):
    sections = sections_of_record(run.out)
    assert [(s.name, s.pinned, s.is_open) for s in sections] == [
        ("forgetwatch: overview", True, True), ("forgetwatch: by category", False, True),
        ("forgetwatch: details", False, False)]
    overview = [p.title for p in sections[0].panels]
    assert overview[:2] == ["forgetting", "backward_transfer"] and overview[-1] == "flips"
    assert overview[:-1] == [name for name in OVERVIEW if f"forgetwatch/{name}" in run.keys]
    by_category = sections[1].panels
    assert [p.title for p in by_category] == [f"{n} by category" for n in OVERVIEW
                                             if any(k.startswith(f"forgetwatch_by_category/{n}/") for k in run.keys)]
    assert set(by_category[0].keys) == {k for k in run.keys if k.startswith("forgetwatch_by_category/forgetting/")}
    shown = [k for s in sections for k in s.keys()]
    assert len(shown) == len(set(shown))
    assert set(shown) == run.keys  # every panel's key was logged by the run, and every logged key has a panel


def test_the_workspace_object(run):
    pytest.importorskip("wandb_workspaces")
    from forgetwatch.run.wandb_workspace import build_workspace

    sections = sections_of_record(run.out)
    workspace = build_workspace(sections, entity="me", project="sft")
    assert [s.name for s in workspace.sections] == [s.name for s in sections]
    assert [s.pinned for s in workspace.sections] == [True, False, False]
    spec = workspace._to_model().model_dump(by_alias=True, exclude_none=True)["spec"]["section"]
    built = spec["panelBankConfig"]["sections"]
    for ours, theirs in zip(sections, built, strict=True):
        assert len(theirs["panels"]) == len(ours.panels)
        for p, q in zip(ours.panels, theirs["panels"], strict=True):
            if p.table:
                assert p.keys[0] in json.dumps(q)
            else:
                assert q["config"]["metrics"] == list(p.keys) and q["config"]["xAxis"] == "train/global_step"
                assert q["config"]["chartTitle"] == p.title


def test_the_cli_prints_what_it_would_save(run, capsys):
    assert cli(["wandb-workspace", "--entity", "me", "--project", "sft", "--run", str(run.out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(describe(sections_of_record(run.out), "me", "sft")))
    assert cli(["wandb-workspace", "--entity", "me", "--project", "sft", "--run", str(run.out), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.index("forgetwatch/forgetting") < out.index("forgetwatch_by_category/") < out.index("forgetwatch_details/")
    empty = run.out.parent / "empty"
    assert cli(["wandb-workspace", "--entity", "me", "--project", "sft", "--run", str(empty), "--dry-run"]) == 2
    assert "no forgetwatch record" in capsys.readouterr().err


def test_at_train_start_offline_is_one_line_and_a_failure_a_warning(run, tmp_path, monkeypatch, caplog):
    assert sum("W&B is offline" in m for m in run.said) == 1
    assert load_record(run.out).read_metrics()  # the run went on
    # online but not logged in (no key anywhere): W&B refuses at once; a warning, never an exception
    pytest.importorskip("wandb_workspaces")
    for key in [k for k in __import__("os").environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    online = SimpleNamespace(offline=False, disabled=False, entity="me", project="sft")
    with caplog.at_level(logging.WARNING, logger="forgetwatch.run.wandb_workspace"):
        assert save_for_run(online, run.out) is None
    assert "could not save the W&B workspace" in caplog.text and "forgetwatch wandb-workspace" in caplog.text


def test_without_wandb_workspaces_the_error_says_what_to_install(run, monkeypatch):
    import sys

    from forgetwatch.run.wandb_workspace import build_workspace

    monkeypatch.setitem(sys.modules, "wandb_workspaces", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "wandb_workspaces.workspaces", None)
    monkeypatch.setitem(sys.modules, "wandb_workspaces.reports.v2", None)
    with pytest.raises(ImportError, match=r"pip install 'forgetwatch\[workspace\]'"):
        build_workspace(sections_of_record(run.out), "me", "sft")
