"""The base cache: roundtrips, refusals that say what differs, damaged files, atomic and concurrent writes."""

from __future__ import annotations

import multiprocessing
import time

import numpy as np
import pytest

from forgetwatch.probes.probe_set import Probe, ProbeSet
from forgetwatch.record.cache import BaseCache, CacheFormatError, CacheMismatchError, make_cache_key, read_key
from forgetwatch.scoring.results import ProbeResults

SUFFIXES = [".parquet", ".jsonl"]


def probe_set(n: int = 5) -> ProbeSet:
    return ProbeSet(Probe(f"q{i}", "mcq", f"question {i}?", ("yes", "no"), i % 2) for i in range(n))


def scoring_key(**changes) -> dict:
    key = {"mcq_mode": "loglik", "chat_template": None, "cot": False, "max_new_tokens": 32, "short_match": "exact",
           "system_prompt": None, "prompt_version": 1, "chat": {"mcq": False, "short": True}, "precision": "float32"}
    return {**key, **changes}


def model_key(name: str = "/models/base") -> dict:
    return {"name_or_path": name, "revision": None, "num_parameters": 2_500_000}


def sample_results(ids: list[str], seed: int = 0) -> ProbeResults:
    """Every column filled, with NaN, invalid rows, empty and non-ASCII strings, newlines and quotes."""
    rng = np.random.default_rng(seed)
    n = len(ids)
    gold = rng.normal(-5, 2, n).astype(np.float32)
    margin = rng.normal(0, 1, n).astype(np.float32)
    gold[1::3] = np.nan
    margin[1::3] = np.nan
    texts = ["Paris", "", "naïve café — 東京", 'say "B"\nthen stop', "C"]
    return ProbeResults(
        ids=list(ids),
        outcome=rng.choice([-1, 0, 1], n),
        pred_index=rng.integers(-1, 4, n),
        prediction=[texts[i % len(texts)] for i in range(n)],
        gold_logprob=gold,
        margin=margin,
        generation=[texts[(i + 2) % len(texts)] * (i % 3) for i in range(n)],
        # 2 to 5 options, none for every third row (a short answer)
        option_scores=[[] if i % 3 == 1 else rng.normal(-5, 2, 2 + i % 4).astype(np.float32) for i in range(n)],
    )


def assert_same(a: ProbeResults, b: ProbeResults) -> None:
    assert a.ids == b.ids
    for name in ("outcome", "pred_index", "gold_logprob", "margin"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)  # NaN == NaN here, positions included
    assert a.prediction == b.prediction and a.generation == b.generation
    assert [x.tolist() for x in a.option_scores] == [x.tolist() for x in b.option_scores]
    assert all(x.dtype == np.float32 for x in b.option_scores)


def saved(tmp_path, suffix=".parquet", n=5, **scoring) -> tuple[str, dict, ProbeResults]:
    probes = probe_set(n)
    key = make_cache_key(model_key(), probes, scoring_key(**scoring))
    results = sample_results(probes.ids)
    path = BaseCache(key, results).save(tmp_path / f"base{suffix}")
    return path, key, results


def leftovers(directory) -> list[str]:
    """Temporary files left next to the cache (the lock file is not one)."""
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_roundtrip_keeps_every_column(tmp_path, suffix):
    path, key, results = saved(tmp_path, suffix, n=12)
    assert path == tmp_path / f"base{suffix}"
    assert np.isnan(results.gold_logprob).sum() == 4  # the NaN rows really are there
    back = BaseCache.load(path, expect=key)
    assert back.key == key
    assert_same(back.results, results)
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_roundtrip_of_real_scoring_config_key(tmp_path, suffix):
    from forgetwatch.scoring.score import ScoringConfig

    probes = probe_set(3)
    key = make_cache_key(
        model_key(), probes, ScoringConfig(mcq_mode="generate", system_prompt="Be brief.").key(precision="bfloat16")
    )
    BaseCache(key, sample_results(probes.ids)).save(tmp_path / f"c{suffix}")
    assert BaseCache.load(tmp_path / f"c{suffix}", expect=key).key == key


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_the_key_alone_is_read_without_the_rows(tmp_path, suffix):
    path, key, _ = saved(tmp_path, suffix, n=12)
    assert read_key(path) == BaseCache.load(path).key == key
    (tmp_path / f"junk{suffix}").write_bytes(b"not a cache\n")
    assert read_key(tmp_path / f"junk{suffix}") is None
    assert read_key(tmp_path / f"absent{suffix}") is None


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_mismatch_is_refused_listing_what_differs(tmp_path, suffix):
    path, key, _ = saved(tmp_path, suffix)
    other_probes = ProbeSet(list(probe_set(5))[:4] + [Probe("q4", "mcq", "question 4?", ("yes", "no"), 1)])
    expect = make_cache_key(model_key(), other_probes, scoring_key(mcq_mode="letter", precision="float32+autocast-bfloat16"))
    with pytest.raises(CacheMismatchError) as e:
        BaseCache.load(path, expect=expect)
    msg = str(e.value)
    assert str(path) in msg
    assert f"probes.fingerprint: cache has {key['probes']['fingerprint']!r}, now {other_probes.fingerprint!r}" in msg
    assert "scoring.mcq_mode: cache has 'loglik', now 'letter'" in msg
    assert "scoring.precision: cache has 'float32', now 'float32+autocast-bfloat16'" in msg
    # only what differs is listed, one line each
    listed = [line.split(":")[0].strip() for line in msg.splitlines() if line.startswith("  ")]
    assert listed == ["probes.fingerprint", "scoring.mcq_mode", "scoring.precision"]
    assert "forgetwatch cache" in msg
    assert isinstance(e.value, ValueError)  # the CLI reports it as a usage error


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_ignore_skips_a_section(tmp_path, suffix):
    path, key, results = saved(tmp_path, suffix)
    checkpoint = {**key, "model": model_key("/models/checkpoint-500")}
    with pytest.raises(CacheMismatchError, match=r"model\.name_or_path: cache has '/models/base', now '/models/checkpoint-500'"):
        BaseCache.load(path, expect=checkpoint)
    assert_same(BaseCache.load(path, expect=checkpoint, ignore=("model",)).results, results)
    # ignoring one section does not hide another
    with pytest.raises(CacheMismatchError, match="scoring.cot"):
        BaseCache.load(path, expect={**checkpoint, "scoring": scoring_key(cot=True)}, ignore=("model",))


def test_missing_keys_and_sections_are_reported(tmp_path):
    path, key, _ = saved(tmp_path)
    expect = {**key, "scoring": {k: v for k, v in key["scoring"].items() if k != "precision"} | {"new_field": 1}}
    with pytest.raises(CacheMismatchError) as e:
        BaseCache.load(path, expect=expect)
    assert "scoring.new_field: cache has '<absent>', now 1" in str(e.value)
    assert "scoring.precision: cache has 'float32', now '<absent>'" in str(e.value)


def test_missing_file_says_how_to_make_one(tmp_path):
    path = tmp_path / "nope.parquet"
    with pytest.raises(FileNotFoundError) as e:
        BaseCache.load(path)
    assert str(path) in str(e.value) and "forgetwatch cache" in str(e.value)


def _truncate_half(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _drop_last_line(path):
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[:-1]), encoding="utf-8")


def _garbage(path):
    path.write_bytes(b"\x00\x01 not a cache \xff" * 10)


def _empty(path):
    path.write_bytes(b"")


def _plain_file(path):
    # a valid Parquet / JSONL file that forgetwatch did not write
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"id": ["q0"], "outcome": [1]}), path)
    else:
        path.write_text('{"id": "q0", "outcome": 1}\n')


@pytest.mark.parametrize(
    "suffix, damage",
    [(s, d) for s in SUFFIXES for d in (_truncate_half, _garbage, _empty, _plain_file)] + [(".jsonl", _drop_last_line)],
)
def test_damaged_file_names_it_and_says_to_rebuild(tmp_path, suffix, damage):
    path, key, _ = saved(tmp_path, suffix)
    damage(path)
    with pytest.raises(ValueError) as e:
        BaseCache.load(path, expect=key)
    msg = str(e.value)
    assert not isinstance(e.value, CacheMismatchError)
    assert str(path) in msg and "not a readable forgetwatch cache" in msg
    assert "delete it and run `forgetwatch cache` again" in msg
    if damage is _drop_last_line:
        assert "4 rows, but it was made for 5 probes" in msg


def test_failed_parquet_write_keeps_the_previous_cache(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    path, key, old = saved(tmp_path)
    before = path.read_bytes()

    def write_some_then_fail(table, where, **kwargs):
        where.write(b"PAR1 half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", write_some_then_fail)
    with pytest.raises(OSError, match="No space left"):
        BaseCache(key, sample_results(old.ids, seed=1)).save(path)
    assert path.read_bytes() == before
    assert_same(BaseCache.load(path, expect=key).results, old)
    assert leftovers(tmp_path) == []


def test_failed_jsonl_write_keeps_the_previous_cache(tmp_path, monkeypatch):
    import forgetwatch.record.cache as cache_module

    path, key, old = saved(tmp_path, ".jsonl")
    before = path.read_bytes()
    calls = []

    def fail_on_the_third_row(x):
        calls.append(x)
        if len(calls) > 12:
            raise KeyboardInterrupt  # interrupted midway, rows already written
        return x.item() if hasattr(x, "item") else x

    monkeypatch.setattr(cache_module, "_plain", fail_on_the_third_row)
    with pytest.raises(KeyboardInterrupt):
        BaseCache(key, sample_results(old.ids, seed=1)).save(path)
    assert path.read_bytes() == before
    assert leftovers(tmp_path) == []


def test_save_creates_the_directory_and_overwrites(tmp_path):
    probes = probe_set(3)
    key = make_cache_key(model_key(), probes, scoring_key())
    path = tmp_path / "a" / "b" / "base.parquet"
    BaseCache(key, sample_results(probes.ids, seed=0)).save(path)
    new = sample_results(probes.ids, seed=1)
    BaseCache(key, new).save(path)
    assert_same(BaseCache.load(path).results, new)


# -- two processes, one path ----------------------------------------------------------------------------------

_N_ROWS = {".parquet": 20_000, ".jsonl": 4_000}  # each save takes some milliseconds: the writers overlap


def _save_many(path: str, seed: int, start, rounds: int) -> None:
    """Child process: wait for the start signal, then save this seed's cache `rounds` times."""
    probes = probe_set(_N_ROWS[path[path.rindex("."):]])
    key = make_cache_key(model_key(f"writer-{seed}"), probes, scoring_key())
    cache = BaseCache(key, sample_results(probes.ids, seed=seed))
    start.wait()
    for _ in range(rounds):
        cache.save(path)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_concurrent_saves_leave_a_valid_file(tmp_path, suffix):
    path = tmp_path / f"base{suffix}"
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    writers = [ctx.Process(target=_save_many, args=(str(path), seed, start, 6)) for seed in (1, 2)]
    for w in writers:
        w.start()
    start.set()
    # read while they write: every read sees a whole file from one writer or the other
    reads = 0
    deadline = time.monotonic() + 120
    while any(w.is_alive() for w in writers) and time.monotonic() < deadline:
        if path.exists():
            cache = BaseCache.load(path)
            assert len(cache.results) == _N_ROWS[suffix] and cache.key["model"]["name_or_path"] in ("writer-1", "writer-2")
            reads += 1
        time.sleep(0.01)
    for w in writers:
        w.join(timeout=60)
        assert w.exitcode == 0
    final = BaseCache.load(path)
    seed = int(final.key["model"]["name_or_path"].split("-")[1])
    assert_same(final.results, sample_results(probe_set(_N_ROWS[suffix]).ids, seed=seed))
    assert leftovers(tmp_path) == []


def test_model_identity_is_the_same_under_sharding_and_training_settings(tokenizer):
    """Every rank must reach the same cache decision: identity never counts the parameters a rank holds."""
    import torch
    from conftest import build_model

    from forgetwatch.scoring.models import model_identity

    model = build_model(tokenizer)
    full = model_identity(model)
    with torch.no_grad():  # ZeRO-3 leaves each rank's parameters empty; FSDP1 leaves a shard
        for p in model.parameters():
            p.data = p.data.new_empty(0)
    assert model_identity(model) == full
    assert model_identity(build_model(tokenizer, seed=5, dropout=0.1)) == full  # other weights and dropout: same base model
    model.config.pad_token_id = 0  # TRL sets it before training
    assert model_identity(model) == full
    assert model_identity(build_model(tokenizer, hidden=128))["architecture"] != full["architecture"]


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_an_older_cache_format_is_refused_with_how_to_rebuild(tmp_path, suffix):
    """Format 1 kept no option scores (drift and KL need them): refused, naming the file and the command."""
    path, key, results = saved(tmp_path, suffix)
    old = BaseCache({**key, "format": 1}, results)
    old.save(path)
    with pytest.raises(CacheMismatchError) as e:
        BaseCache.load(path)
    msg = str(e.value)
    assert str(path) in msg and "cache format 1" in msg and "format 2" in msg
    assert f"forgetwatch cache --model <base> --probes <file> -o {path}" in msg


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_the_fp32_reference_roundtrips(tmp_path, suffix):
    path, key, results = saved(tmp_path, suffix, n=9)
    ref = ProbeResults.empty(results.ids)
    ref.outcome = np.where(np.arange(9) % 4 == 0, 1 - np.clip(results.outcome, 0, 1), results.outcome)
    ref.margin = results.margin + 1e-3
    BaseCache(key, results, ref).save(path)
    back = BaseCache.load(path, expect=key)
    assert_same(back.results, results)
    np.testing.assert_array_equal(back.reference.outcome, ref.outcome)
    np.testing.assert_array_equal(back.reference.margin, ref.margin)  # NaN rows included
    assert BaseCache.load(saved(tmp_path / "plain", suffix)[0]).reference is None


# -- malformed values: refused naming file, column and row, never read as a plain-looking number ---------------


def _edit_jsonl(path, row: int, **changes) -> None:
    """Set fields of data row `row` (0-based, line row + 2) of a JSONL cache, written as Python's json writes them."""
    import json

    lines = path.read_text(encoding="utf-8").splitlines()
    data = json.loads(lines[row + 1])
    data.update(changes)
    lines[row + 1] = json.dumps(data)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _edit_parquet(path, column: str, values, type_=None) -> None:
    """Replace one column of a parquet cache, keeping the forgetwatch key in its metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    arr = pa.array(values, type=type_)
    if column in table.column_names:
        table = table.set_column(table.column_names.index(column), column, arr)
    else:
        table = table.append_column(column, arr)
    pq.write_table(table, path)


def _nan_outcome_cache(tmp_path, suffix):
    """4 probes, one right at base (accuracy 0.25); the outcome of row 2 is then NaN (a float column in parquet)."""
    probes = probe_set(4)
    key = make_cache_key(model_key(), probes, scoring_key())
    results = sample_results(probes.ids)
    results.outcome[:] = [1, 0, 0, 0]
    path = BaseCache(key, results).save(tmp_path / f"base{suffix}")
    if suffix == ".jsonl":
        _edit_jsonl(path, 2, outcome=float("nan"))
    else:
        _edit_parquet(path, "outcome", [1.0, 0.0, float("nan"), 0.0])
    return path, key


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_nan_outcome_is_refused_naming_file_column_and_row(tmp_path, suffix):
    """Issue 26 item 3: a NaN outcome was cast to int8 and read as 0 (wrong) with only numpy's RuntimeWarning."""
    path, key = _nan_outcome_cache(tmp_path, suffix)
    with pytest.raises(CacheFormatError) as e:
        BaseCache.load(path, expect=key)
    msg = str(e.value)
    where = "line 4 (probe 'q2')" if suffix == ".jsonl" else "row 2 (probe 'q2')"
    assert f"{path} {where}: column `outcome` is NaN, and it must be -1, 0 or 1" in msg, msg
    assert "delete it and run `forgetwatch cache` again" in msg


BAD_VALUES = [
    # column, value, what the message says
    ("outcome", None, "column `outcome` is null, not a number"),
    ("outcome", 2, "column `outcome` is 2, and it must be -1, 0 or 1"),
    ("outcome", 0.5, "column `outcome` is 0.5, and it must be -1, 0 or 1"),
    ("outcome", "1", "column `outcome` is '1', not a number"),
    ("outcome", True, "column `outcome` is True, not a number"),
    ("pred_index", float("nan"), "column `pred_index` is NaN, and it must be a whole number >= -1"),
    ("pred_index", 1.5, "column `pred_index` is 1.5, and it must be a whole number >= -1"),
    ("pred_index", None, "column `pred_index` is null, not a number"),
    ("n_tokens", float("inf"), "column `n_tokens` is inf, and it must be a whole number >= -1"),
    ("n_tokens", -7, "column `n_tokens` is -7, and it must be a whole number >= -1"),
    ("stopped", float("nan"), "column `stopped` is NaN, and it must be -1, 0 or 1"),
    ("margin", float("inf"), "column `margin` is inf (an overflow, not a score"),
    ("margin", "big", "column `margin` is 'big', not a number"),
    ("gold_logprob", float("-inf"), "column `gold_logprob` is -inf (an overflow"),
    ("gold_logprob", 1e300, "column `gold_logprob` is 1e+300 (an overflow"),  # finite in JSON, inf in float32
    ("option_scores", [-1.0, float("nan")], "column `option_scores` holds nan at option 1"),
    ("option_scores", [float("-inf"), -2.0], "column `option_scores` holds -inf at option 0"),
    ("option_scores", [-1.0, None], "column `option_scores` holds null, not a number"),
    ("option_scores", 3.0, "column `option_scores` is 3.0, not a list of numbers"),
    ("id", None, "column `id` is None, not a probe id"),
    ("id", "q0", "column `id` repeats probe 'q0' (first at line 2 (probe 'q0'))"),
]


@pytest.mark.parametrize("column, value, says", BAD_VALUES, ids=lambda v: repr(v)[:20])
def test_malformed_jsonl_values_are_refused(tmp_path, column, value, says):
    path, key, _ = saved(tmp_path, ".jsonl")
    _edit_jsonl(path, 3, **{column: value})
    with pytest.raises(CacheFormatError) as e:
        BaseCache.load(path, expect=key)
    msg = str(e.value)
    assert msg.startswith(f"{path} line 5 (probe "), msg
    assert says in msg, msg


PARQUET_BAD = [
    ("outcome", [1, 0, None, 0, 1], "int8", "row 2 (probe 'q2'): column `outcome` is null"),
    ("outcome", [1.0, 0.0, 0.0, float("inf"), 1.0], None, "row 3 (probe 'q3'): column `outcome` is inf"),
    ("pred_index", [0, 1, 0.25, 0, 1], None, "row 2 (probe 'q2'): column `pred_index` is 0.25"),
    ("stopped", [-1, -1, -1, 5, -1], None, "row 3 (probe 'q3'): column `stopped` is 5"),
    ("margin", [0.5, float("nan"), float("inf"), 0.1, 0.2], None, "row 2 (probe 'q2'): column `margin` is inf"),
    ("option_scores", [[-1.0, -2.0], [], [-1.0, float("nan")], [], [-3.0, -1.0]], None,
     "row 2 (probe 'q2'): column `option_scores` holds nan at option 1"),
    ("reference_margin", [0.5, float("-inf"), 0.1, 0.1, 0.2], None, "row 1 (probe 'q1'): column `reference_margin` is -inf"),
]


@pytest.mark.parametrize("column, values, type_, says", PARQUET_BAD, ids=lambda v: repr(v)[:20])
def test_malformed_parquet_values_are_refused(tmp_path, column, values, type_, says):
    import pyarrow as pa

    path, key, results = saved(tmp_path, ".parquet")
    if column == "reference_margin":
        BaseCache(key, results, results).save(path)
    _edit_parquet(path, column, values, pa.int8() if type_ == "int8" else None)  # a nullable int column
    with pytest.raises(CacheFormatError) as e:
        BaseCache.load(path, expect=key)
    assert f"{path} {says}" in str(e.value), str(e.value)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_nan_scores_are_legitimate(tmp_path, suffix):
    """NaN (or null) in margin and gold_logprob means "not scored that way": read as NaN, not refused. (A NaN margin
    beside option scores, from which a margin is always computed, is refused: tests/record/test_write_failures.py.)"""
    path, key, results = saved(tmp_path, suffix, n=6)
    if suffix == ".jsonl":  # row 4 has no option scores (a generated answer); row 2 has
        _edit_jsonl(path, 4, margin=None, gold_logprob=None)
        _edit_jsonl(path, 2, gold_logprob=float("nan"))
    back = BaseCache.load(path, expect=key).results
    assert np.isnan(back.margin[1]) and np.isnan(back.gold_logprob[1])  # NaN as saved
    if suffix == ".jsonl":
        assert np.isnan(back.margin[4]) and np.isnan(back.gold_logprob[4]) and np.isnan(back.gold_logprob[2])


KEY_DAMAGE = [
    (lambda key: [key], "its key (the file's forgetwatch metadata) is a JSON array, not an object"),
    (lambda key: "a string", "its key (the file's forgetwatch metadata) is a JSON string, not an object"),
    (lambda key: {**key, "probes": "probes.jsonl"}, "the cache key's `probes` is a JSON string, not an object"),
    (lambda key: {**key, "model": ["a"]}, "the cache key's `model` is a JSON array, not an object"),
    (lambda key: {k: v for k, v in key.items() if k != "scoring"}, "the cache key's `scoring` is absent, not an object"),
    (lambda key: {**key, "probes": {**key["probes"], "n": "5"}}, "the cache key's `probes.n` is '5', not a count"),
    (lambda key: {**key, "probes": {"n": 5}}, "the cache key's `probes.fingerprint` is None, not a string"),
]


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("damage, says", KEY_DAMAGE, ids=lambda v: v if isinstance(v, str) else "")
def test_a_key_of_the_wrong_json_type_is_refused(tmp_path, suffix, damage, says):
    """Issue 26 item 8: `key.get` on a list, `.get("n")` on a string raised AttributeError tracebacks."""
    import json

    path, key, _ = saved(tmp_path, suffix)
    bad = damage(key)
    if suffix == ".jsonl":
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        path.write_text(json.dumps({"forgetwatch_cache": bad}) + "\n" + "".join(lines[1:]), encoding="utf-8")
    else:
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        pq.write_table(table.replace_schema_metadata({b"forgetwatch": json.dumps(bad).encode()}), path)
    with pytest.raises(CacheFormatError) as e:
        BaseCache.load(path)
    assert str(e.value).startswith(str(path)) and says in str(e.value), str(e.value)


def test_a_jsonl_row_that_is_not_an_object_is_refused(tmp_path):
    path, key, _ = saved(tmp_path, ".jsonl")
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[3] = "[1, 2]"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(CacheFormatError, match=r"base.jsonl line 4: expected a JSON object"):
        BaseCache.load(path)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_rows_that_are_not_the_probes_are_refused_naming_them(tmp_path, suffix):
    """Issue 26 item 8: rows of other ids than the key's probes raised a bare KeyError from `select`."""
    path, key, results = saved(tmp_path, suffix, n=8)
    renamed = ProbeResults.from_columns(
        {**results.to_columns(), "id": [f"x{i}" if i % 2 else pid for i, pid in enumerate(results.ids)]}
    )
    BaseCache(key, renamed).save(path)
    cache = BaseCache.load(path, expect=key)  # the key matches: only the rows say otherwise
    with pytest.raises(CacheMismatchError) as e:
        cache.for_probes(probe_set(8).ids, path)
    msg = str(e.value)
    assert f"{path}: the cache's rows are not the probes': 4 probe(s) without a row ('q1', 'q3', 'q5', 'q7'); " \
           "4 row(s) of no probe ('x1', 'x3', 'x5', 'x7')" in msg, msg
    # the probes it holds, in the probes' order, reference included
    BaseCache(key, results, results).save(path)
    order = list(reversed(results.ids))
    picked = BaseCache.load(path).for_probes(order, path)
    assert picked.results.ids == order == picked.reference.ids


def test_a_cache_row_of_many_ids_lists_the_first_five(tmp_path):
    path, key, results = saved(tmp_path, ".parquet", n=12)
    cache = BaseCache.load(path)
    with pytest.raises(CacheMismatchError, match=r"12 probe\(s\) without a row \('p0', 'p1', 'p2', 'p3', 'p4', \.\.\.\)"):
        cache.for_probes([f"p{i}" for i in range(12)], path)


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_a_cache_with_overflowed_probes_reads_back_with_them_flagged(tmp_path, suffix):
    """Scoring keeps NaN / inf scores on rows it flags `nonfinite` (their figures are then missing): such a cache, as
    forgetwatch writes it, must load; the same values on a row not flagged are refused."""
    from forgetwatch.probes.probe_set import Probe, ProbeSet
    from forgetwatch.record.cache import CacheFormatError, make_cache_key
    from forgetwatch.scoring.results import ProbeResults

    probes = ProbeSet([Probe(f"q{i}", "mcq", f"{i}?", ("a", "b"), 0) for i in range(2)])
    r = ProbeResults.empty(probes.ids)
    r.outcome[:] = [1, 1]
    r.option_scores = [np.array([0.0, -1.0], np.float32), np.array([np.nan, np.nan], np.float32)]
    r.margin[:] = [1.0, np.inf]
    r.nonfinite[:] = [False, True]
    path = BaseCache(make_cache_key({}, probes, {}), r).save(tmp_path / f"c{suffix}")
    back = BaseCache.load(path).results
    assert back.nonfinite.tolist() == [False, True] and back.nonfinite_mask().tolist() == [False, True]
    r.nonfinite[:] = False
    BaseCache(make_cache_key({}, probes, {}), r).save(path)
    with pytest.raises(CacheFormatError, match="q1"):
        BaseCache.load(path)
