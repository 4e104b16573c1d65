"""`forgetwatch compare BEFORE AFTER` on real lm-evaluation-harness `--log_samples` outputs.

The outputs are made here by the `lm_eval` command's own code (0.4.13, in this process) from the tiny model and a perturbed
copy, on two local
tasks: a multiple-choice task whose documents have 2, 3 or 4 options, and a generative task whose answers are the
base model's own greedy outputs (so the base is right on all of them and the perturbed copy forgets some).
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import build_model, build_tokenizer  # tests/ is on sys.path (pytest "prepend" import mode)

from forgetwatch.cli import main
from forgetwatch.measures.lm_eval_samples import _gold_choice, _lm_eval_sample
from forgetwatch.measures.samples import SamplesFormatError, compare_samples, read_samples

MC_TASK = """task: fw_mc
dataset_path: json
dataset_kwargs:
  data_files: {data}/mc.jsonl
test_split: train
output_type: multiple_choice
doc_to_text: "{{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
  - metric: acc_norm
  - metric: acc_mutual_info
"""
QA_TASK = """task: fw_qa
dataset_path: json
dataset_kwargs:
  data_files: {data}/qa.jsonl
test_split: train
output_type: generate_until
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: answer
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 8
  do_sample: false
metric_list:
  - metric: exact_match
filter_list:
  - name: strict
    filter:
      - function: take_first
  - name: loose
    filter:
      - function: regex
        regex_pattern: "(\\\\d+)"
      - function: take_first
"""


GROUP = """group: fw_group
task:
  - fw_mc
  - fw_qa
"""


def _lm_eval(model_dir: Path, tasks_dir: Path, out: Path, tasks: str = "fw_mc,fw_qa") -> None:
    """The `lm_eval` command's own code (its CLI parser and runner), in this process: the same files as
    `python -m lm_eval ...` writes, without a fresh interpreter importing torch, transformers and lm-eval each time.
    The global state lm-eval seeds (the RNGs) and the log handlers it adds are put back as they were."""
    import logging
    import random

    import torch
    from lm_eval.__main__ import HarnessCLI

    argv = ["--model", "hf", "--model_args", f"pretrained={model_dir}", "--include_path", str(tasks_dir), "--tasks", tasks,
            "--output_path", str(out), "--log_samples", "--device", "cpu", "--batch_size", "8"]
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    handlers = list(logging.getLogger().handlers)
    try:
        cli = HarnessCLI()
        cli.execute(cli._parser.parse_args(["run", *argv]))  # `lm_eval ARGS` is `lm_eval run ARGS` (its parse_args)
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        logging.getLogger().handlers[:] = handlers


def _base_model(root: Path):
    """A tiny model and its tokenizer saved to root/base, and an empty root/tasks for lm-eval task files."""
    tok = build_tokenizer()
    model = build_model(tok)
    model.save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    (root / "tasks").mkdir()
    return tok, model, root / "tasks"


def _save_perturbed(model, tok, root: Path, seed: int) -> None:
    """The model with noise of its own scale on every weight, saved to root/after."""
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(p.std() * torch.randn_like(p))
    model.save_pretrained(root / "after")
    tok.save_pretrained(root / "after")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Real lm-eval outputs: {"base": dir, "after": dir, "tasks": dir}."""
    import torch

    root = tmp_path_factory.mktemp("lm-eval")
    tok, model, data = _base_model(root)
    with open(data / "mc.jsonl", "w") as f:
        for i in range(30):
            k = 2 + i % 3
            f.write(json.dumps({"question": f"Question {i}: which one is right?",
                                "choices": [f"option {j} of {i}" for j in range(k)], "label": i % k}) + "\n")
    with open(data / "qa.jsonl", "w") as f, torch.no_grad():
        for i in range(8):
            q = f"What is {i}+{i}?"
            ids = tok(f"Question: {q}\nAnswer:", return_tensors="pt").input_ids
            out = model.generate(ids, max_new_tokens=8, do_sample=False)
            f.write(
                json.dumps({"question": q, "answer": tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True).split("\n")[0]})
                + "\n"
            )
    (data / "fw_mc.yaml").write_text(MC_TASK.format(data=data))
    (data / "fw_qa.yaml").write_text(QA_TASK.format(data=data))
    (data / "fw_group.yaml").write_text(GROUP)
    _save_perturbed(model, tok, root, seed=1)
    _lm_eval(root / "base", data, root / "out-base", tasks="fw_group")  # the base through a group, as for mmlu
    _lm_eval(root / "after", data, root / "out-after")
    return {"base": root / "out-base", "after": root / "out-after", "tasks": data}


def _rows(out: Path, task: str, filter: str) -> list[dict]:
    (f,) = out.rglob(f"samples_{task}_*.jsonl")
    return [r for r in map(json.loads, f.read_text().splitlines()) if r["filter"] == filter]


def _expected(runs, metric="acc", qa_filter="strict"):
    """Counts read straight from the files, keyed by lm-eval's doc_hash: {task: (n, 1->0, 0->1)}."""
    out = {}
    for task, flt, m in (("fw_mc", "none", metric), ("fw_qa", qa_filter, "exact_match")):
        pre = {r["doc_hash"]: r[m] for r in _rows(runs["base"], task, flt)}
        post = {r["doc_hash"]: r[m] for r in _rows(runs["after"], task, flt)}
        out[task] = (len(pre), sum(pre[h] == 1 and post[h] == 0 for h in pre), sum(pre[h] == 0 and post[h] == 1 for h in pre))
    return out


def test_compare_matches_every_document_and_counts_its_own_options(runs):
    cmp = compare_samples(runs["base"], runs["after"])
    expected = _expected(runs)
    for task, (n, forgotten, learned) in expected.items():
        m = cmp.report[task]
        assert (m.n, m.forgotten, m.learned) == (n, forgotten, learned)
    assert cmp.report["overall"].n == 38 and not cmp.only_before and not cmp.only_after
    assert cmp.match_by == {"fw_mc": "content hash", "fw_qa": "content hash"}
    # lm-eval's groups (from results_*.json): a table by group beside the one by task
    assert cmp.before.groups == {"fw_mc": "fw_group", "fw_qa": "fw_group"} and cmp.after.groups == {}
    assert list(cmp.by_group) == ["overall", "fw_group"]
    assert cmp.by_group["fw_group"].to_dict() == cmp.report["overall"].to_dict()
    # the base model is right on every generative document (they are its own answers); the perturbed copy forgets some
    assert cmp.report["fw_qa"].accuracy_pre == 1.0 and cmp.report["fw_qa"].forgotten > 0
    assert cmp.report["fw_mc"].forgotten + cmp.report["fw_mc"].learned > 0
    # k from each document: 2, 3 or 4 options, 0 for the generative task
    docs = [json.loads(line) for line in (runs["tasks"] / "mc.jsonl").read_text().splitlines()]
    ks = {s.doc_id: s.num_choices for s in cmp.before.samples if s.task == "fw_mc"}
    assert ks == {str(i): len(d["choices"]) for i, d in enumerate(docs)}
    # (acc_mutual_info makes lm-eval ask every option twice, the second time without context: still k options)
    (row, *_) = _rows(runs["base"], "fw_mc", "none")
    assert len(row["arguments"]) == 2 * len(docs[0]["choices"]) and "acc_mutual_info" in row
    assert {s.num_choices for s in cmp.before.samples if s.task == "fw_qa"} == {0}
    # the chance term uses those k: 4-option documents expect fewer lucky flips than 2-option ones
    assert cmp.report["fw_mc"].adjusted and not cmp.report["fw_qa"].adjusted
    flip = next(f for f in cmp.flips if f["task"] == "fw_mc")
    doc = docs[int(flip["doc_id"])]
    assert flip["question"] == doc["question"] and flip["gold"] == doc["choices"][doc["label"]]
    assert {flip["before"], flip["after"]} <= set(doc["choices"]) and flip["before"] != flip["after"]


def test_cli_table_and_json(runs, capsys):
    assert main(["compare", str(runs["base"]), str(runs["after"])]) == 0
    out = capsys.readouterr().out
    assert "matched 38 samples of 2 task(s) by content hash" in out
    assert "fw_qa: answers after filter 'strict' (also logged: loose; choose with --filter)" in out
    assert "lm-eval 0.4.13" in out and "flipped samples" in out
    assert "by lm-eval group" in out and any(line.startswith("fw_group ") for line in out.splitlines())
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("fw_mc", "fw_qa", "overall"))}
    expected = _expected(runs)
    assert int(rows["fw_mc"][4]) == expected["fw_mc"][1] and int(rows["fw_qa"][4]) == expected["fw_qa"][1]

    assert main(["compare", str(runs["base"]), str(runs["after"]), "--json", "--metric", "acc_norm", "--filter", "loose"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["n"] == 38 and data["before"]["metric"] == {"fw_mc": "acc_norm", "fw_qa": "exact_match"}
    assert data["before"]["filter"] == {"fw_mc": "none", "fw_qa": "loose"}
    expected = _expected(runs, metric="acc_norm", qa_filter="loose")
    assert data["metrics"]["fw_mc"]["forgotten"] == expected["fw_mc"][1]
    assert data["metrics"]["fw_qa"]["forgotten"] == expected["fw_qa"][1]
    assert len(data["flips"]) == sum(e[1] + e[2] for e in expected.values())


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_samples(out: Path, task: str, edit) -> None:
    (f,) = out.rglob(f"samples_{task}_*.jsonl")
    rows = [json.loads(line) for line in f.read_text().splitlines()]
    f.write_text("".join(json.dumps(r) + "\n" for r in edit(rows)))


def test_reordered_dataset_still_matches_by_content_and_one_sided_samples_are_reported(runs, tmp_path, capsys):
    after = _copy(runs["after"], tmp_path / "after")

    def reorder_and_drop(rows):
        # the same documents in reverse order (new doc_ids), and three of them missing on this side
        n = len(rows)
        for r in rows:
            r["doc_id"] = n - 1 - r["doc_id"]
        return [r for r in rows if r["doc_id"] not in (0, 1, 2)]

    _edit_samples(after, "fw_mc", reorder_and_drop)
    cmp = compare_samples(runs["base"], after)
    full = compare_samples(runs["base"], runs["after"])
    assert cmp.report["fw_mc"].n == 27 and len(cmp.only_before) == 3 and not cmp.only_after
    assert {s.doc_id for s in cmp.only_before} == {"29", "28", "27"}
    dropped = {s.doc_hash for s in cmp.only_before}
    assert cmp.report["fw_mc"].forgotten == sum(1 for a, b in full.matched if a.task == "fw_mc" and a.doc_hash not in dropped
                                               and a.outcome == 1 and b.outcome == 0)
    assert main(["compare", str(runs["base"]), str(after)]) == 0
    assert "samples only before (not compared): 3 (fw_mc: 3); --json lists them" in capsys.readouterr().out
    # by id, the reordered documents would pair unrelated questions: refused, with the way out named
    with pytest.raises(SamplesFormatError, match=r"fw_mc: \d+ document id\(s\) hold different documents.*--match hash"):
        compare_samples(runs["base"], after, match="id")


def test_without_content_hashes_documents_match_by_id(runs, tmp_path):
    base, after = _copy(runs["base"], tmp_path / "base"), _copy(runs["after"], tmp_path / "after")
    for out in (base, after):
        for task in ("fw_mc", "fw_qa"):
            _edit_samples(out, task, lambda rows: [{k: v for k, v in r.items() if k != "doc_hash"} for r in rows])
    cmp = compare_samples(base, after)
    assert cmp.match_by == {"fw_mc": "doc_id", "fw_qa": "doc_id"}
    assert cmp.report["overall"].to_dict() == compare_samples(runs["base"], runs["after"]).report["overall"].to_dict()
    with pytest.raises(SamplesFormatError, match="--match hash, but some documents carry no content hash"):
        compare_samples(base, after, match="hash")
    # neither a hash nor an id: refused, never matched by position
    _edit_samples(after, "fw_mc", lambda rows: [{**r, "doc_id": None} for r in rows])
    with pytest.raises(
        SamplesFormatError,
        match=r"fw_mc: documents carry neither a content hash nor an id \(first at .*samples_fw_mc_.* line 1\)",
    ):
        compare_samples(base, after)


def test_a_reused_output_dir_uses_the_latest_run(runs, tmp_path):
    base = _copy(runs["base"], tmp_path / "base")
    (f,) = base.rglob("samples_fw_mc_*.jsonl")
    older = f.with_name("samples_fw_mc_2000-01-01T00-00-00.000000.jsonl")
    older.write_text(f.read_text().replace('"acc": 1.0', '"acc": 0.0'))
    s = read_samples(base)
    assert any(n.startswith("fw_mc: 2 runs found") and f.name in n for n in s.notes)
    assert (
        compare_samples(s, runs["after"]).report["overall"].to_dict()
        == compare_samples(runs["base"], runs["after"]).report["overall"].to_dict()
    )


def test_bad_input_names_the_problem(runs, tmp_path, capsys):
    with pytest.raises(SamplesFormatError, match="no per-sample outputs found.*lm-evaluation-harness.*lighteval"):
        read_samples(tmp_path)
    junk = tmp_path / "samples_x_2026-01-01T00-00-00.jsonl"
    junk.write_text('{"doc_id": 0, "filtered_resps": [], "metrics": ["acc"], "acc": 1}\n{"hello": 1}\n')
    with pytest.raises(SamplesFormatError, match=r"samples_x_2026-01-01T00-00-00.jsonl line 2: not an lm-eval sample"):
        read_samples(junk)
    (tmp_path / "a.csv").write_text("x\n")
    with pytest.raises(SamplesFormatError, match=r"a.csv: not a per-sample output.*reads lm-evaluation-harness"):
        read_samples(tmp_path / "a.csv")
    # two sides with different tasks: both lists named
    only_mc, only_qa = tmp_path / "mc", tmp_path / "qa"
    for dst, drop in ((only_mc, "fw_qa"), (only_qa, "fw_mc")):
        _copy(runs["base"], dst)
        for f in dst.rglob(f"samples_{drop}_*.jsonl"):
            f.unlink()
    with pytest.raises(SamplesFormatError, match=r"share no task: before .* has fw_mc; after .* has fw_qa"):
        compare_samples(only_mc, only_qa)
    # some tasks in common: the others are named, not silently dropped
    assert main(["compare", str(runs["base"]), str(only_mc)]) == 0
    assert "tasks only before (not compared): fw_qa" in capsys.readouterr().out
    with pytest.raises(SamplesFormatError, match="--filter 'nope': no task"):
        read_samples(runs["base"], filter="nope")
    with pytest.raises(SamplesFormatError, match="--metric 'f1': no task"):
        read_samples(runs["base"], metric="f1")
    # the two ways of calling compare do not mix, and the model way still names what it needs
    assert main(["compare", str(runs["base"]), str(runs["after"]), "--model", "x"]) == 2
    assert "--model score a model" in capsys.readouterr().err
    assert main(["compare", "--model", "x"]) == 2
    assert "compare needs --probes, --base" in capsys.readouterr().err
    assert main(["compare", str(runs["base"])]) == 2
    assert "takes two per-sample outputs" in capsys.readouterr().err


def test_sample_counts_per_task_are_the_files(runs):
    s = read_samples(runs["base"])
    assert s.format == "lm-eval" and s.version == "0.4.13"
    assert Counter(x.task for x in s.samples) == {"fw_mc": 30, "fw_qa": 8}


# -- lighteval ---------------------------------------------------------------------------------------------------
# Real details files written by lighteval 0.13.0 (`--save-details`) for the tiny model and a perturbed copy, on a
# multiple-choice task with 2-4 options per document and a generative one. lighteval installs here but does not run
# offline without patches (at import it downloads a file and calls the Hub), so they were made once by the scripts in
# tests/data/lighteval/make/ and are kept; lighteval stores them under names holding '|', restored here.
LIGHTEVAL = Path(__file__).parents[1] / "data" / "lighteval"


def _lighteval_run(root: Path, side: str, stamp: str) -> Path:
    d = root / side / "details" / "tmp" / "models" / f"tiny-{side}" / stamp
    d.mkdir(parents=True)
    for task in ("probe_mc", "probe_gen"):
        shutil.copy(LIGHTEVAL / side / f"{task}.parquet", d / f"details_{task}|0_{stamp}.parquet")
    return root / side


def _lighteval_rows(side: str, task: str) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(LIGHTEVAL / side / f"{task}.parquet").to_pylist()


def test_lighteval_details_are_matched_by_content_with_each_documents_options(tmp_path):
    base = _lighteval_run(tmp_path, "base", "2026-11-24T01-50-06.042509")
    after = _lighteval_run(tmp_path, "after", "2026-11-24T01-50-16.387675")
    cmp = compare_samples(base, after)
    assert cmp.before.format == "lighteval" and cmp.before.model == "tmp/models/tiny-base"
    assert cmp.match_by == {"probe_mc|0": "content hash", "probe_gen|0": "content hash"}
    assert cmp.before.metric == {"probe_mc|0": "acc", "probe_gen|0": "em"}
    for task, name, metric in (("probe_mc", "probe_mc|0", "acc"), ("probe_gen", "probe_gen|0", "em")):
        pre = {r["doc"]["id"]: r["metric"][metric] for r in _lighteval_rows("base", task)}
        post = {r["doc"]["id"]: r["metric"][metric] for r in _lighteval_rows("after", task)}
        m = cmp.report[name]
        assert (m.n, m.forgotten, m.learned) == (len(pre), sum(pre[i] > post[i] for i in pre), sum(pre[i] < post[i] for i in pre))
    # lighteval shuffles its rows: the two files order the documents differently, and the match does not care
    order = [[r["doc"]["id"] for r in _lighteval_rows(side, "probe_mc")] for side in ("base", "after")]
    assert sorted(order[0]) == sorted(order[1])
    assert cmp.report["probe_mc|0"].forgotten + cmp.report["probe_mc|0"].learned > 0
    ks = {s.doc_id: s.num_choices for s in cmp.before.samples if s.task == "probe_mc|0"}
    assert ks == {r["doc"]["id"]: len(r["doc"]["choices"]) for r in _lighteval_rows("base", "probe_mc")}
    assert set(ks.values()) == {2, 3, 4}
    assert {s.num_choices for s in cmp.before.samples if s.task == "probe_gen|0"} == {0}
    for f in cmp.flips:
        (row,) = [r for r in _lighteval_rows("base", "probe_mc") if r["doc"]["id"] == f["doc_id"]]
        assert f["question"] == row["doc"]["query"].strip()
        assert f["gold"] == row["doc"]["choices"][row["doc"]["gold_index"]].strip()


def test_lighteval_bad_input(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    f = tmp_path / "details_x|0_2026-01-01T00-00-00.parquet"
    pq.write_table(pa.table({"example": ["q"], "metric": [{"acc": 1}]}), f)
    with pytest.raises(
        SamplesFormatError, match=r"not lighteval details \(no columns doc \+ metric, nor example \+ metrics; it has example"
    ):
        read_samples(f)
    (tmp_path / "samples_x_2026-01-01T00-00-00.jsonl").write_text("{}\n")
    with pytest.raises(SamplesFormatError, match="holds both lm-eval samples .* and lighteval details"):
        read_samples(tmp_path)
    with pytest.raises(SamplesFormatError, match="--filter is an lm-eval option"):
        read_samples(f, filter="strict")


def test_what_the_two_sides_must_share(runs, tmp_path, capsys):
    # lines of several filters without a `filter` field (older lm-eval) would count each document twice: refused
    old = _copy(runs["after"], tmp_path / "old")
    _edit_samples(old, "fw_qa", lambda rows: [{k: v for k, v in r.items() if k != "filter"} for r in rows])
    with pytest.raises(SamplesFormatError, match=r"line \d+: doc_id 0 of task fw_qa again \(first on line 1\)"):
        read_samples(old)
    # the same document asked with another prompt: said, per task
    other = _copy(runs["after"], tmp_path / "prompt")
    _edit_samples(other, "fw_mc", lambda rows: [{**r, "prompt_hash": "x" + r["prompt_hash"]} if r["doc_id"] < 3 else r
                                                for r in rows])
    cmp = compare_samples(runs["base"], other)
    assert cmp.notes == [
        "fw_mc: 3 of 30 matched documents were asked with a different prompt (lm-eval's prompt_hash differs: "
        "few-shot examples, chat template or task version); their flips mix the model's change with the prompt's"
    ]
    assert main(["compare", str(runs["base"]), str(other)]) == 0
    assert "fw_mc: 3 of 30 matched documents were asked with a different prompt" in capsys.readouterr().out
    # answers after different filters, or documents with a different number of options, are not compared
    with pytest.raises(
        SamplesFormatError, match="fw_qa: before counts the answers after filter 'strict' but after after 'loose'"
    ):
        compare_samples(read_samples(runs["base"]), read_samples(runs["after"], filter="loose"))
    fewer = _copy(runs["after"], tmp_path / "fewer")
    _edit_samples(
        fewer,
        "fw_mc",
        lambda rows: [{**r, "arguments": dict(list(r["arguments"].items())[:1])} if r["doc_id"] == 5 else r for r in rows],
    )
    with pytest.raises(SamplesFormatError, match="fw_mc: the same document has 4 options before .* but no after"):
        compare_samples(runs["base"], fewer)
    # a --filter that one task lacks is said
    notes = read_samples(runs["base"], filter="loose").notes
    assert "fw_qa: answers after filter 'loose' (also logged: strict; choose with --filter)" in notes


def test_lm_eval_and_lighteval_are_not_compared_with_each_other(runs, tmp_path):
    lighteval = _lighteval_run(tmp_path, "after", "2026-11-24T01-50-16.387675")
    with pytest.raises(SamplesFormatError, match="holds lm-eval outputs but after .* holds lighteval outputs"):
        compare_samples(runs["base"], lighteval)


def test_gold_text_from_lm_eval_targets():
    options = [" 1", " 2", " 3"]
    assert _gold_choice("2", options) == "3"  # an index, though an option reads "2"
    assert _gold_choice("[0, 2]", options) == "1 | 3"  # several right options
    assert _gold_choice("5", [" a", " 5"]) == "5"  # no option 5: the text
    assert _gold_choice("zebra", [" horse", " zebra"]) == "zebra"  # the option's text


def test_lighteval_details_from_before_0_10_match_by_content(tmp_path, capsys):
    """lighteval 0.5-0.9 wrote flat columns (its `DetailsLogger.Detail`: example, choices, gold_index as a list,
    predictions as (log-likelihood, is-greedy) pairs or texts, gold, metrics) and no document id. Built here from the
    real 0.13 files in that documented schema, in another row order per side: the report is the same."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def old_run(side: str, stamp: str, reverse: bool) -> Path:
        d = tmp_path / f"old-{side}" / "details" / "m" / stamp
        d.mkdir(parents=True)
        for task in ("probe_mc", "probe_gen"):
            rows = []
            for r in _lighteval_rows(side, task):
                doc, resp = r["doc"], r["model_response"]
                row = {"example": doc["query"], "instruction": "", "full_prompt": doc["query"], "metrics": r["metric"]}
                if "LOGPROBS" in doc["sampling_methods"]:  # multiple choice: choices, gold_index as a list, (ll, greedy) pairs
                    row.update(
                        choices=doc["choices"], gold_index=[doc["gold_index"]], predictions=[[lp, 0.0] for lp in resp["logprobs"]]
                    )
                else:  # generative: the golds and the texts
                    row.update(gold=doc["choices"], predictions=resp["text"])
                rows.append(row)
            pq.write_table(pa.Table.from_pylist(rows[::-1] if reverse else rows), d / f"details_{task}|0_{stamp}.parquet")
        return tmp_path / f"old-{side}"

    old = compare_samples(old_run("base", "2024-05-01T00-00-00", False), old_run("after", "2024-05-02T00-00-00", True))
    new = compare_samples(_lighteval_run(tmp_path, "base", "2026-11-24T01-50-06.042509"),
                          _lighteval_run(tmp_path, "after", "2026-11-24T01-50-16.387675"))
    for task in ("overall", "probe_mc|0", "probe_gen|0"):
        assert old.report[task].to_dict() == new.report[task].to_dict(), task
    assert old.match_by == {"probe_mc|0": "content hash", "probe_gen|0": "content hash"}
    assert {s.doc_hash for s in old.before.samples} == {s.doc_hash for s in new.before.samples}  # the same documents
    assert {(f["question"], f["before"], f["after"]) for f in old.flips} == {
        (f["question"], f["before"], f["after"]) for f in new.flips
    }
    assert any("before 0.10 (no document ids)" in n for n in old.before.notes)
    assert main(["compare", str(tmp_path / "old-base"), str(tmp_path / "old-after")]) == 0
    assert "probe_mc|0 details_probe_mc|0_2024-05-01T00-00-00.parquet row" in capsys.readouterr().out


def test_options_in_the_context_and_empty_contexts():
    """winogrande asks one continuation after each filled-in sentence: the options shown are the sentences' ends. A
    task whose every context is empty is not mistaken for acc_mutual_info's doubled requests."""
    row = {"doc_id": 0, "doc": {"sentence": "The trophy does not fit in the suitcase because _ is too big."}, "target": "0",
           "arguments": {"gen_args_0": {"arg_0": "The trophy does not fit because the trophy", "arg_1": " is too big."},
                         "gen_args_1": {"arg_0": "The trophy does not fit because the suitcase", "arg_1": " is too big."}},
           "filtered_resps": [["-3.0", "False"], ["-5.0", "False"]], "filter": "none", "acc": 1.0}
    s = _lm_eval_sample("winogrande", "f line 1", row, "acc", {"output_type": "multiple_choice"})
    assert s.num_choices == 2 and s.prediction == s.gold == "The trophy does not fit because the trophy"
    empty = {"doc_id": 0, "doc": {}, "target": "1", "filter": "none", "acc": 0.0,
             "arguments": {f"gen_args_{i}": {"arg_0": "", "arg_1": f" w{i}"} for i in range(4)},
             "filtered_resps": [[str(-i), "False"] for i in range(4)]}
    assert _lm_eval_sample("t", "f line 1", empty, "acc", {"output_type": "multiple_choice"}).num_choices == 4


# -- lm-eval's ifeval task ---------------------------------------------------------------------------------------------

# lm-eval's own ifeval task (its yaml and its process_results), on IFEval lines from a local file instead of the Hub.
IFEVAL_TASK = """task: fw_ifeval
dataset_path: json
dataset_kwargs:
  data_files: {data}/ifeval.jsonl
test_split: train
output_type: generate_until
doc_to_text: prompt
doc_to_target: 0
generation_kwargs:
  until: []
  do_sample: false
  max_gen_toks: 12
process_results: !function fw_ifeval_utils.process_results
metric_list:
  - metric: prompt_level_strict_acc
    aggregation: mean
    higher_is_better: true
  - metric: inst_level_strict_acc
    aggregation: !function fw_ifeval_utils.agg_inst_level_acc
    higher_is_better: true
  - metric: prompt_level_loose_acc
    aggregation: mean
    higher_is_better: true
  - metric: inst_level_loose_acc
    aggregation: !function fw_ifeval_utils.agg_inst_level_acc
    higher_is_better: true
"""


@pytest.mark.long
def test_lm_eval_ifeval_outputs_compare_by_prompt_level_strict_accuracy(tmp_path, capsys):
    """`forgetwatch compare BEFORE AFTER` on lm-eval's ifeval task reads its per-sample prompt_level_strict_acc, with the
    document's instructions as the gold column."""
    root = tmp_path
    tok, _, data = _base_model(root)
    # prompts whose instructions a random model follows by chance half the time or so (no commas; lowercase)
    with open(data / "ifeval.jsonl", "w") as f:
        for i in range(24):
            ids = ["punctuation:no_comma"] if i % 2 else ["change_case:english_lowercase"]
            f.write(
                json.dumps({"key": 100 + i, "prompt": f"Tell me about {i}.", "instruction_id_list": ids, "kwargs": [{}]}) + "\n"
            )
    (data / "fw_ifeval.yaml").write_text(IFEVAL_TASK.format(data=data))
    (data / "fw_ifeval_utils.py").write_text(
        "from lm_eval.tasks.ifeval.utils import agg_inst_level_acc, process_results  # noqa: F401\n"
    )
    _save_perturbed(build_model(tok), tok, root, seed=2)
    _lm_eval(root / "base", data, root / "out-base", tasks="fw_ifeval")
    _lm_eval(root / "after", data, root / "out-after", tasks="fw_ifeval")

    cmp = compare_samples(root / "out-base", root / "out-after")
    assert cmp.before.metric == {"fw_ifeval": "prompt_level_strict_acc"}
    before = {r["doc"]["key"]: r for r in _rows(root / "out-base", "fw_ifeval", "none")}
    after_rows = {r["doc"]["key"]: r for r in _rows(root / "out-after", "fw_ifeval", "none")}
    pre = np.array([int(before[k]["prompt_level_strict_acc"]) for k in sorted(before)])
    post = np.array([int(after_rows[k]["prompt_level_strict_acc"]) for k in sorted(before)])
    assert cmp.report["overall"].forgotten == int(((pre == 1) & (post == 0)).sum())
    assert cmp.report["overall"].learned == int(((pre == 0) & (post == 1)).sum())
    assert cmp.report["overall"].n == 24
    gold = {s.gold for s in cmp.before.samples}
    assert gold == {"punctuation:no_comma", "change_case:english_lowercase"}
    assert main(["compare", str(root / "out-base"), str(root / "out-after")]) == 0
    assert "prompt_level_strict_acc" in capsys.readouterr().out


# -- what a damaged or hand-made file does (issue 26: a named refusal, never a traceback nor a made-up figure) --------


@pytest.mark.parametrize("value", [float("nan"), float("inf"), None, "1"])
def test_a_score_that_is_not_0_or_1_is_refused_naming_the_line_not_counted_nor_switched(runs, tmp_path, value):
    # fw_mc logs acc, acc_norm and acc_mutual_info: a NaN acc once made `after` count acc_norm without a word (then
    # refused as "before counts 'acc' but after counts 'acc_norm'", which names no file and misleads)
    bad = _copy(runs["after"], tmp_path / "bad")
    _edit_samples(bad, "fw_mc", lambda rows: [{**r, "acc": value} if r["doc_id"] == 4 else r for r in rows])
    (f,) = bad.rglob("samples_fw_mc_*.jsonl")
    line = next(i for i, r in enumerate(map(json.loads, f.read_text().splitlines()), 1) if r["doc_id"] == 4)
    with pytest.raises(SamplesFormatError, match=rf"{f} line {line}: metric 'acc' of task fw_mc is {value!r}, not 0 or 1 "
                                                 r"\(1 of 30 documents\)"):
        compare_samples(runs["base"], bad)


def test_non_utf8_bytes_in_samples_name_the_file_and_line(runs, tmp_path, capsys):
    bad = _copy(runs["after"], tmp_path / "bad")
    (f,) = bad.rglob("samples_fw_qa_*.jsonl")
    lines = f.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b'"doc_id"', b'"doc_\xe9id"', 1)
    f.write_bytes(b"\n".join(lines))
    assert main(["compare", str(runs["base"]), str(bad)]) == 2  # was a UnicodeDecodeError naming no file
    err = capsys.readouterr().err
    assert err.startswith(f"forgetwatch: error: {f} line 3: not UTF-8 text (byte 0xe9 at column ")


LM_EVAL_ROW = {"doc_id": 0, "doc": {"question": "q0", "choices": ["a", "b"]}, "target": "0",
               "arguments": {"gen_args_0": {"arg_0": "q0", "arg_1": " a"}, "gen_args_1": {"arg_0": "q0", "arg_1": " b"}},
               "resps": [[["-1.0", "False"]], [["-2.0", "False"]]], "filtered_resps": [["-1.0", "False"], ["-2.0", "False"]],
               "filter": "none", "metrics": ["acc"], "doc_hash": "h0", "prompt_hash": "p", "target_hash": "t", "acc": 1.0}


@pytest.mark.parametrize("field, value", [
    ("metrics", 5), ("metrics", "acc"), ("arguments", {"x": {"y": 1}}), ("arguments", {"gen_args_x": {"arg_0": "q"}}),
    ("doc_id", [0]), ("doc_hash", 7), ("filter", ["none"]), ("doc", [1]), ("filtered_resps", 5), ("arguments", "x"),
])
def test_lm_eval_fields_of_the_wrong_type_are_refused_naming_line_and_field(tmp_path, field, value):
    # before: TypeError / ValueError tracebacks (metrics 5, arguments keys), or a value taken as something else
    # (doc_id [0] became the id "[0]", filter ["none"] the filter "['none']")
    f = tmp_path / "samples_t_2026-01-01T00-00-00.jsonl"
    f.write_text(json.dumps(LM_EVAL_ROW) + "\n" + json.dumps({**LM_EVAL_ROW, "doc_id": 1, "doc_hash": "h1", field: value}) + "\n")
    with pytest.raises(SamplesFormatError, match=rf"{f} line 2: field `{field}`"):
        read_samples(f)


def test_lm_eval_results_file_that_cannot_be_read_is_said_and_left_out(runs, tmp_path):
    bad = _copy(runs["base"], tmp_path / "bad")
    (res,) = bad.rglob("results_*.json")
    res.write_bytes(b'{"configs": {"fw_mc": \xff}}')  # was a UnicodeDecodeError naming no file
    s = read_samples(bad)
    assert Counter(x.task for x in s.samples) == {"fw_mc": 30, "fw_qa": 8} and s.model is None
    assert any(n.startswith(f"{res} line 1: not UTF-8 text") and n.endswith("left out (it only adds task configurations, "
                                                                              "groups and the model's name)") for n in s.notes)
    res.write_text('{"configs": [1], "group_subtasks": {"g": 5}, "model_name": ["x"]}')  # was an AttributeError
    assert len(read_samples(bad).samples) == 38


def _lighteval_edit(run: Path, task: str, edit) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (f,) = run.rglob(f"details_{task}|0_*.parquet")
    pq.write_table(pa.Table.from_pylist(edit(pq.read_table(f).to_pylist())), f)
    return f


@pytest.mark.parametrize("path, value, says", [
    (("doc",), "x", "field `doc` must be an object"),
    (("metric",), [1], "field `metric` must be an object"),
    (("model_response",), 5, "field `model_response` must be an object"),
    (("doc", "choices"), 5, "field `doc.choices` must be a list of strings"),
    (("doc", "gold_index"), "x", "field `doc.gold_index` must be an index"),
    (("doc", "gold_index"), 9, "field `doc.gold_index`: 9 is out of range"),
    (("model_response", "logprobs"), 2.5, "field `model_response.logprobs` must be a list of numbers"),
    (("doc", "sampling_methods"), 5, "field `doc.sampling_methods` must be a list of strings"),
    (("metric", "acc"), float("nan"), "metric 'acc' of task probe_mc|0 is nan, not 0 or 1"),
    (("metric", "acc"), None, "metric 'acc' of task probe_mc|0 is None, not 0 or 1"),
])
def test_lighteval_rows_of_the_wrong_shape_are_refused_naming_the_row(tmp_path, path, value, says):
    # before: AttributeError / TypeError tracebacks, or (gold 9) a document silently unmatched
    base = _lighteval_run(tmp_path, "base", "2026-11-24T01-50-06.042509")
    after = _lighteval_run(tmp_path, "after", "2026-11-24T01-50-16.387675")

    def edit(rows):
        for r in rows:  # every row: a parquet column holds one type
            target = r
            for k in path[:-1]:
                target = target[k]
            target[path[-1]] = value
        return rows

    f = _lighteval_edit(after, "probe_mc", edit)
    with pytest.raises(SamplesFormatError) as e:
        compare_samples(base, after)
    assert str(e.value).startswith(f"{f} row 1: ") and says in str(e.value)
