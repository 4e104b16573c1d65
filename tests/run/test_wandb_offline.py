"""The offline wandb run-file reader (tests/fixtures/wandb_offline.py), on files written by wandb itself."""

from __future__ import annotations

import os

import pytest

wandb = pytest.importorskip("wandb")

from fixtures.internals import LibraryChanged  # noqa: E402
from fixtures.wandb_offline import (  # noqa: E402
    find_run_file,
    find_run_files,
    finish_offline_run,
    load_table,
    read_config,
    read_history,
    read_metric_definitions,
    read_records,
    read_summary,
    read_tables,
)

_VOLATILE = ("_timestamp", "_runtime")


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """An empty WANDB_DIR with wandb in offline mode; no WANDB_* setting of the caller leaks in, no wandb
    state leaks out."""
    for key in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(key)
    wandb_dir = tmp_path / "wandb_dir"
    wandb_dir.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")  # no stdout/stderr wrapping under pytest's capture
    finish_offline_run()  # whatever an earlier test left behind
    try:
        yield wandb_dir
    finally:
        finish_offline_run()


def _strip(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in _VOLATILE}


def test_plain_run_round_trip(offline_wandb):
    blob = "x" * 70_000  # makes the run record span three 32 KiB blocks (FIRST, MIDDLE, LAST chunks)
    run = wandb.init(
        mode="offline", dir=offline_wandb, project="t", config={"lr": 0.1, "nested": {"a": 1}, "blob": blob}
    )
    run.config.update({"batch": 4})
    run.define_metric("my_step")
    run.define_metric("acc", step_metric="my_step", summary="max")
    for i in range(3):
        run.log({"my_step": 10 * i, "acc": i / 4, "d": {"x": i, "s": f"r{i}"}})
    run.log({"tab": wandb.Table(columns=["a", "b"], data=[[1, "u"], [2, "v"]])})
    run.summary["final"] = 42
    run.finish()
    wandb.teardown()

    path = find_run_file(offline_wandb)
    assert path.name == f"run-{run.id}.wandb"
    assert path.parent.name.startswith("offline-run-")

    records = read_records(path)
    assert records[0].WhichOneof("record_type") == "header"
    assert records[-1].HasField("exit") and records[-1].exit.exit_code == 0

    rows = read_history(path)
    assert all(isinstance(row["_timestamp"], float) for row in rows)
    assert [_strip(row) for row in rows[:3]] == [
        {"_step": i, "my_step": 10 * i, "acc": i / 4, "d": {"x": i, "s": f"r{i}"}} for i in range(3)
    ]
    assert len(rows) == 4 and rows[3]["_step"] == 3
    table_value = rows[3]["tab"]
    assert table_value["_type"] == "table-file" and table_value["nrows"] == 2
    assert load_table(path.parent, table_value) == [{"a": 1, "b": "u"}, {"a": 2, "b": "v"}]
    assert read_tables(path) == {"tab": [[{"a": 1, "b": "u"}, {"a": 2, "b": "v"}]]}

    summary = read_summary(path)
    assert summary["final"] == 42
    assert summary["acc"] == {"max": 0.5}  # summary="max" in define_metric
    assert summary["my_step"] == 20 and summary["d"] == {"x": 2, "s": "r2"} and summary["_step"] == 3
    assert summary["tab"]["_type"] == "table-file"

    assert read_config(path) == {"lr": 0.1, "nested": {"a": 1}, "blob": blob, "batch": 4}

    assert read_metric_definitions(path) == [
        {"name": "my_step", "options": {"defined": True}},
        {
            "name": "acc",
            "step_metric": "my_step",
            "options": {"step_sync": True, "defined": True},
            "summary": {"max": True},
        },
    ]


def test_reader_rejects_bad_files(offline_wandb, tmp_path):
    with pytest.raises(FileNotFoundError, match="no run-"):
        find_run_file(offline_wandb)
    run = wandb.init(mode="offline", project="t")
    run.log({"a": 1})
    finish_offline_run()
    path = find_run_file(offline_wandb)
    data = path.read_bytes()
    records = read_records(path)

    # A file cut right before the exit record: complete records, but the run is unfinished.
    assert records[-1].HasField("exit")
    cut = tmp_path / "cut" / "run-cut.wandb"
    cut.parent.mkdir()
    cut.write_bytes(data[: len(data) - 7 - records[-1].ByteSize()])
    with pytest.raises(ValueError, match="no exit record"):
        read_history(cut)
    assert read_records(cut, require_exit=False) == records[:-1]
    assert read_history(cut, require_exit=False) == read_history(path)

    cut.write_bytes(data[:-3])
    with pytest.raises(ValueError, match="truncated"):
        read_records(cut, require_exit=False)
    cut.write_bytes(data[:-3] + bytes([data[-3] ^ 0xFF]) + data[-2:])
    with pytest.raises(ValueError, match="checksum"):
        read_records(cut, require_exit=False)
    cut.write_bytes(b"not a wandb file")
    with pytest.raises(ValueError, match="not a wandb run file"):
        read_records(cut)
    # A run file of a format version this reader does not know: a change of wandb's, named with its version.
    cut.write_bytes(data[:6] + bytes([data[6] + 1]) + data[7:])
    with pytest.raises(LibraryChanged, match=rf"wandb {wandb.__version__}: the offline run file format"):
        read_records(cut)

    (offline_wandb / "other").mkdir()
    (offline_wandb / "other" / "run-other.wandb").write_bytes(data)
    with pytest.raises(ValueError, match="find_run_files"):
        find_run_file(offline_wandb)
    assert len(find_run_files(offline_wandb)) == 2  # the latest-run symlink is not counted twice


def test_trainer_report_to_wandb(offline_wandb, monkeypatch, tmp_path):
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    monkeypatch.setenv("WANDB_PROJECT", "x")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    ids = torch.randint(0, 64, (8, 12), generator=torch.Generator().manual_seed(0))
    dataset = [{"input_ids": row, "labels": row.clone()} for row in ids]
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=4,
        logging_steps=1,
        report_to="wandb",
        use_cpu=True,
        per_device_train_batch_size=2,
        save_strategy="no",
    )
    trainer = Trainer(model=LlamaForCausalLM(config), args=args, train_dataset=dataset)
    trainer.train()
    finish_offline_run()  # WandbCallback leaves the run open

    path = find_run_file(offline_wandb)
    expected = {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}
    assert sorted(expected) == [1, 2, 3, 4]
    rows = read_history(path)
    logged = {row["train/global_step"]: row["train/loss"] for row in rows if "train/loss" in row}
    assert logged == pytest.approx(expected)
    assert all("train/global_step" in row for row in rows)
    assert read_summary(path)["train_loss"] == pytest.approx(trainer.state.log_history[-1]["train_loss"])
    assert read_config(path)["max_steps"] == 4
    assert {
        "glob_name": "*",
        "step_metric": "train/global_step",
        "options": {"step_sync": True, "defined": True},
    } in (read_metric_definitions(path))
