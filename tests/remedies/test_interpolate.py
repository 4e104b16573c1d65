"""`forgetwatch interpolate` (issue 30): a fine-tune moved back toward its base, θ_base + α(θ_ft − θ_base), scored at
each α against the base cache. A tiny Llama fine-tuned for real (TRL SFT, CPU), a LoRA adapter trained the same way."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import build_model, build_tokenizer
from fixtures.trainers import make_probes, sft_dataset, sft_trainer
from safetensors.torch import load_file

from forgetwatch.cli import main as cli
from forgetwatch.remedies.interpolate import InterpolationError, alpha_grid

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`gradient_checkpointing.*` is deprecated:FutureWarning")]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """The tiny base, its base cache, a full fine-tune of it and a LoRA adapter of it, and a held-out task set."""
    root = tmp_path_factory.mktemp("interpolate")
    tok = build_tokenizer()
    base = root / "base"
    build_model(tok).save_pretrained(base)
    tok.save_pretrained(base)
    probes = root / "probes.jsonl"
    make_probes().to_jsonl(probes)
    cache = root / "base.parquet"
    assert cli(["cache", "--model", str(base), "--probes", str(probes), "--max-new-tokens", "4", "-o", str(cache)]) == 0
    from transformers import AutoModelForCausalLM

    trainer = sft_trainer(tok, root / "ft-run", model=AutoModelForCausalLM.from_pretrained(base), bf16=False)
    trainer.train()
    trainer.save_model(str(root / "ft"))
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    sft_trainer(tok, root / "lora-run", model=lora, bf16=False, max_steps=4).train()
    lora.save_pretrained(root / "lora")
    tok.save_pretrained(root / "lora")
    task = root / "task.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in sft_dataset().to_list()[:8]))
    return {"root": root, "base": base, "probes": probes, "cache": cache, "ft": root / "ft", "lora": root / "lora", "task": task}


def run(t, *extra, model="ft", as_json=True) -> list[str]:
    return ["interpolate", "--model", str(t[model]), "--probes", str(t["probes"]), "--base", str(t["cache"]),
            *(["--json"] if as_json else []), *extra]


def interpolate(capsys, t, *extra, model="ft") -> dict:
    assert cli(run(t, *extra, model=model)) == 0
    return json.loads(capsys.readouterr().out)


def test_alpha_0_is_the_base_and_alpha_1_the_checkpoint_as_compare_scores_it(tuned, capsys):
    out = interpolate(capsys, tuned, "--alphas", "0,0.5,1", "--task-data", str(tuned["task"]), "--task-max-length", "48")
    assert [s["alpha"] for s in out["alphas"]] == [0, 0.5, 1]
    zero, one = out["alphas"][0]["metrics"], out["alphas"][-1]["metrics"]
    for group, row in zero.items():  # the base against its own cache: nothing flipped, nothing drifted
        assert row["forgotten"] == 0 and row["learned"] == 0 and row["accuracy_pre"] == row["accuracy_post"], group
        assert (row.get("kl") or 0) == pytest.approx(0, abs=1e-6)  # null: a group without options (short answers)
    assert cli(["compare", "--model", str(tuned["ft"]), "--probes", str(tuned["probes"]), "--base", str(tuned["cache"]),
                "--json"]) == 0
    compared = json.loads(capsys.readouterr().out)["metrics"]
    for group, m in compared.items():
        assert {k: one[group][k] for k in m} == pytest.approx(m, nan_ok=True), group
    assert any(one["overall"][k] > 0 for k in ("forgotten", "learned"))  # the fine-tune moved
    losses = [s["task"] for s in out["alphas"]]
    assert losses[-1] < losses[0]  # the fine-tune learned its own data: the loss falls toward α = 1
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forgetwatch.remedies.interpolate import held_out_loss, load_task_data

    ft = AutoModelForCausalLM.from_pretrained(tuned["ft"])
    direct = held_out_loss(ft, AutoTokenizer.from_pretrained(tuned["ft"]), load_task_data(tuned["task"]), max_length=48)
    assert losses[-1] == pytest.approx(direct, rel=1e-5)  # answers cut at --task-max-length, as training cut them


def test_the_weights_at_alpha_are_the_interpolation(tuned, capsys, tmp_path):
    out = tmp_path / "mid"
    assert cli([*run(tuned, "--alphas", "0.5", "--save-at", "0.25", str(out))]) == 0
    capsys.readouterr()
    base, ft, mid = (load_file(d / "model.safetensors") for d in (tuned["base"], tuned["ft"], out))
    assert set(mid) == set(ft)
    for name, t in mid.items():
        torch.testing.assert_close(t, base[name] + 0.25 * (ft[name] - base[name]), rtol=0, atol=1e-6, msg=name)
    assert (out / "tokenizer_config.json").is_file()
    # never over a file without --force
    assert cli([*run(tuned, "--alphas", "0.5", "--save-at", "0.25", str(out))]) == 2
    assert "exists" in capsys.readouterr().err


@pytest.mark.parametrize("model", ["ft", "lora"])
def test_the_scoring_model_is_let_go_before_save_at_writes(tuned, capsys, tmp_path, monkeypatch, model):
    """--save-at writes from the two directories: with the scoring model still alive it would hold two models."""
    import gc
    import weakref

    import forgetwatch.remedies.interpolate as interp
    import forgetwatch.remedies.sweep as sweep

    loaded, alive_at_save = [], []
    load = sweep._load
    monkeypatch.setattr(sweep, "_load", lambda *a, **k: (out := load(*a, **k), loaded.append(weakref.ref(out[0])))[0])
    def spying(save):
        def spy(*a, **k):
            gc.collect()
            alive_at_save.append(loaded[0]() is not None)
            return save(*a, **k)
        return spy

    for name in ("save_interpolated", "save_lora_merged"):
        monkeypatch.setattr(interp, name, spying(getattr(interp, name)))
    assert cli([*run(tuned, "--alphas", "0.5", "--save-at", "0.5", str(tmp_path / "out"), model=model)]) == 0
    capsys.readouterr()
    assert alive_at_save == [False]


def test_a_lora_adapter_is_scaled_by_alpha(tuned, capsys, tmp_path):
    out = interpolate(capsys, tuned, "--alphas", "0,1", model="lora")
    zero, one = out["alphas"][0]["metrics"]["overall"], out["alphas"][1]["metrics"]["overall"]
    assert zero["forgotten"] == 0 and zero["learned"] == 0 and zero["kl"] == pytest.approx(0, abs=1e-6)
    assert cli(["compare", "--model", str(tuned["lora"]), "--probes", str(tuned["probes"]), "--base", str(tuned["cache"]),
                "--json"]) == 0
    compared = json.loads(capsys.readouterr().out)["metrics"]["overall"]
    assert {k: one[k] for k in compared} == pytest.approx(compared, nan_ok=True)
    assert one["kl"] > 0  # the adapter moved the model
    # saved at an α: the adapter merged at that scale into full weights
    merged = tmp_path / "merged"
    assert cli([*run(tuned, "--alphas", "1", "--save-at", "0", str(merged), model="lora")]) == 0
    base = load_file(tuned["base"] / "model.safetensors")
    for name, t in load_file(merged / "model.safetensors").items():
        torch.testing.assert_close(t, base[name], rtol=0, atol=1e-6, msg=name)


def test_a_budget_chooses_the_best_alpha_within_it(tuned, capsys):
    out = interpolate(capsys, tuned, "--alphas", "0,0.5,1", "--task-data", str(tuned["task"]), "--budget",
                      "forgetting=0.05", "--budget-bound", "point")
    within = [s for s in out["alphas"] if s["within_budget"]]
    assert all((s["metrics"]["overall"]["forgetting"] <= 0.05) == s["within_budget"] for s in out["alphas"])
    assert out["chosen_alpha"] == min(within, key=lambda s: s["task"])["alpha"]
    assert cli(run(tuned, "--alphas", "0,1", "--budget", "forgetting=0.05", "--budget-bound", "point", as_json=False)) == 0
    text = capsys.readouterr().out
    assert "picked (budget forgetting=0.05): α = " in text and "F adj" in text


def test_without_a_budget_the_task_measure_picks_as_rewind_does(tuned, capsys):
    """One α rule (forgetwatch.remedies.alpha): without a budget, `interpolate` picks the lowest task loss, as rewind."""
    out = interpolate(capsys, tuned, "--alphas", "0,0.5,1", "--task-data", str(tuned["task"]))
    assert out["chosen_alpha"] == min(out["alphas"], key=lambda s: s["task"])["alpha"]
    assert out["chosen_by"] == "the lowest task loss (no budget)"


def test_the_plot_and_a_task_probe_set(tuned, capsys, tmp_path):
    plot = tmp_path / "front.png"
    out = interpolate(capsys, tuned, "--alphas", "0,1", "--task-probes", str(tuned["probes"]), "--plot", str(plot))
    assert out["task"] == "accuracy" and out["alphas"][0]["task"] == out["alphas"][0]["metrics"]["overall"]["accuracy_post"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("extra, says", [
    (("--alphas", "0,1.5"), "1.5 is outside [0, 1]"),
    (("--alphas", "a,b"), "give numbers separated by commas"),
    (("--save-at", "2", "out"), "--save-at: 2 is outside [0, 1]"),
    (("--task-data", "missing.jsonl"), "missing.jsonl: no such file"),
    (("--task-data", "BAD"), "line 2: a task example needs"),
])
def test_bad_input_is_refused_before_any_scoring(tuned, capsys, monkeypatch, tmp_path, extra, says):
    import forgetwatch.scoring.score as scoring

    monkeypatch.setattr(scoring, "score_probes", lambda *a, **k: pytest.fail("scored"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"question": "no answer"}\n')
    extra = tuple(str(bad) if e == "BAD" else str(tmp_path / e) if e.endswith(".jsonl") else e for e in extra)
    assert cli(run(tuned, *extra)) == 2
    assert says in capsys.readouterr().err


def test_another_architecture_or_an_adapter_of_another_base_is_refused(tuned, capsys, tmp_path):
    tok = build_tokenizer()
    wide = tmp_path / "wide"
    build_model(tok, hidden=96).save_pretrained(wide)
    tok.save_pretrained(wide)
    assert cli(run(tuned, "--alphas", "1", "--base-model", str(wide))) == 2
    assert "was made with" in capsys.readouterr().err  # not the cache's base
    assert cli(run(tuned, "--alphas", "1", "--base-model", str(wide), "--allow-other-model")) == 2
    err = capsys.readouterr().err
    assert "has shape" in err and "not the same architecture" in err  # and not the checkpoint's either
    config = json.loads((tuned["lora"] / "adapter_config.json").read_text())
    other = tmp_path / "other-lora"
    other.mkdir()
    for f in tuned["lora"].iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    (other / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(wide)}))
    assert cli(["interpolate", "--model", str(other), "--probes", str(tuned["probes"]), "--base", str(tuned["cache"])]) == 2
    assert "the adapter was trained on" in capsys.readouterr().err


def test_weights_that_are_not_floats_are_refused_before_scoring(tuned, capsys, monkeypatch, tmp_path):
    import shutil

    from safetensors.torch import save_file

    import forgetwatch.scoring.score as scoring

    quantised = tmp_path / "fp8"
    shutil.copytree(tuned["ft"], quantised)
    weights = load_file(quantised / "model.safetensors")
    name = next(n for n in weights if n.endswith("q_proj.weight"))
    weights[name] = weights[name].to(torch.float8_e4m3fn)
    save_file(weights, str(quantised / "model.safetensors"), metadata={"format": "pt"})
    monkeypatch.setattr(scoring, "score_probes", lambda *a, **k: pytest.fail("scored"))
    assert cli(run({**tuned, "ft": quantised}, "--alphas", "0.5")) == 2
    err = capsys.readouterr().err
    assert f"tensor {name!r} is F8_E4M3" in err and "dequantise" in err


def test_the_sweep_runs_without_the_command_line(tuned, capsys, tmp_path):
    """The library's sweep is what `interpolate` prints: the front at a grid of α, the α chosen within a budget and the
    model saved there, with no parser (rewind calls it)."""
    from forgetwatch.measures.budgets import Budget, parse_budget
    from forgetwatch.probes.probe_set import ProbeSet
    from forgetwatch.record.cache import BaseCache
    from forgetwatch.remedies.alpha import front_points, pick_alpha
    from forgetwatch.remedies.sweep import (
        InterpolationSweep,
        interpolation_front,
        resolve_base_model,
    )
    from forgetwatch.scoring.score import ScoringConfig

    printed = interpolate(capsys, tuned, "--alphas", "0,1", "--task-data", str(tuned["task"]), "--task-max-length", "48")
    probes = ProbeSet.from_jsonl(tuned["probes"])
    cache = BaseCache.load(tuned["cache"]).for_probes(probes.ids, tuned["cache"])
    config = ScoringConfig(max_new_tokens=4)  # as the cache was made; anything else is refused before scoring
    name, base_dir = resolve_base_model(None, cache)
    assert base_dir.resolve() == tuned["base"].resolve()
    steps = interpolation_front(tuned["ft"], base_dir, probes, cache, [0, 1], config, task_data=tuned["task"],
                                task_max_length=48, base_name=name)
    for step, shown in zip(steps, printed["alphas"], strict=True):
        assert step["alpha"] == shown["alpha"] and step["task"] == pytest.approx(shown["task"], rel=1e-6)
        for group, row in shown["metrics"].items():
            assert {k: step["metrics"][group][k] for k in ("forgotten", "learned", "accuracy_post")} == \
                {k: row[k] for k in ("forgotten", "learned", "accuracy_post")}, group
    sweep = InterpolationSweep(tuned["ft"], base_dir, probes, cache, config,
                               budget=Budget(parse_budget("forgetting=1"), "alert", "point", probes.groups))
    steps = sweep.run([0, 0.5])
    assert [s["within_budget"] for s in steps] == [True, True] and sweep.task_kind is None
    assert pick_alpha(front_points(steps), budgeted=True) == (
        0.5,
        "largest_within",
        "no task loss: the largest α within the budget",
    )
    sweep.save(0.5, tmp_path / "rewound")
    assert sweep.model is None and (tmp_path / "rewound" / "model.safetensors").is_file()


def test_alpha_grids():
    assert alpha_grid(None) == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    assert alpha_grid("1,0,0.5") == [0, 0.5, 1]
    assert alpha_grid("-0.5,1.5", extrapolate=True) == [-0.5, 1.5]
    with pytest.raises(InterpolationError):
        alpha_grid("1:0:0.1")


def _copy(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


@pytest.mark.parametrize("part, says", [
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"use_dora": True}, "DoRA"),
    ({"bias": "all"}, "bias"),
    ({"trainable_token_indices": [1, 2]}, "trainable_token_indices"),
])
def test_adapter_parts_that_alpha_cannot_scale_are_refused_before_scoring(tuned, capsys, monkeypatch, tmp_path, part, says):
    """Only the LoRA update B A is scaled by α: layers kept whole (modules_to_save), DoRA's magnitude, trained biases
    and trained token rows would stay at α = 1, so α = 0 would not be the base (review of issue 30)."""
    import forgetwatch.scoring.score as scoring

    monkeypatch.setattr(scoring, "score_probes", lambda *a, **k: pytest.fail("scored"))
    adapter = _copy(tuned["lora"], tmp_path / "adapter")
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, **part}))
    assert cli(["interpolate", "--model", str(adapter), *run(tuned, "--alphas", "0,1")[3:]]) == 2
    err = capsys.readouterr().err
    assert says in err and "merge_and_unload" in err


def test_a_base_model_other_than_the_caches_is_refused(tuned, capsys, tmp_path):
    """The base cache was made with one model; interpolating toward another would score α = 0 as a drift from the
    cached base (review of issue 30: forgotten 4, learned 7 at α = 0, silently)."""
    tok = build_tokenizer()
    other = tmp_path / "other-base"
    build_model(tok, seed=1).save_pretrained(other)
    tok.save_pretrained(other)
    assert cli(run(tuned, "--alphas", "0", "--base-model", str(other))) == 2
    err = capsys.readouterr().err
    assert "was made with" in err and "--allow-other-model" in err
    assert cli(run(tuned, "--alphas", "0", "--base-model", str(other), "--allow-other-model")) == 0
    capsys.readouterr()
    assert cli(run(tuned, "--alphas", "0", "--base-model", str(tuned["base"]))) == 0  # the cache's own base: fine


def test_save_at_writes_the_checkpoints_precision_not_the_scoring_one(tuned, capsys, tmp_path):
    """A cache scored in bf16 loads the model in bf16 to score; the model saved at α is still θ(α) in the checkpoint's
    own dtype (review of issue 30: α = 1 came out in bf16, 4.8e-4 off the checkpoint)."""
    cache = tmp_path / "bf16.parquet"
    assert cli(["cache", "--model", str(tuned["base"]), "--probes", str(tuned["probes"]), "--max-new-tokens", "4",
                "--dtype", "bfloat16", "-o", str(cache)]) == 0
    out = tmp_path / "at1"
    assert cli(["interpolate", "--model", str(tuned["ft"]), "--probes", str(tuned["probes"]), "--base", str(cache),
                "--alphas", "1", "--save-at", "1", str(out), "--base-model", str(tuned["base"])]) == 0
    capsys.readouterr()
    ft, saved = load_file(tuned["ft"] / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(saved) == set(ft)
    for name, t in saved.items():
        assert t.dtype == ft[name].dtype and torch.equal(t, ft[name]), name
    assert json.loads((out / "config.json").read_text()).get("dtype") != "bfloat16"
    merged = tmp_path / "lora-at-half"
    assert cli(["interpolate", "--model", str(tuned["lora"]), "--probes", str(tuned["probes"]), "--base", str(cache),
                "--alphas", "1", "--save-at", "0.5", str(merged), "--base-model", str(tuned["base"])]) == 0
    capsys.readouterr()
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ref = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tuned["base"]), tuned["lora"])
    from forgetwatch.remedies.interpolate import LoraScaler

    LoraScaler(ref).set(0.5)
    ref = ref.merge_and_unload().state_dict()
    for name, t in load_file(merged / "model.safetensors").items():
        assert t.dtype == torch.float32, name
        torch.testing.assert_close(t, ref[name], rtol=0, atol=1e-6, msg=name)


def test_task_rows_that_cannot_be_read_by_the_model_are_refused_before_scoring(tuned, capsys, monkeypatch, tmp_path):
    """Chat rows need the checkpoint's chat template, and an answer cut away by --task-max-length has no loss: refused
    (by line; the cut only when it takes every row) before any α is scored (review of issue 30: the template error came
    mid-loop)."""
    import forgetwatch.scoring.score as scoring

    monkeypatch.setattr(scoring, "score_probes", lambda *a, **k: pytest.fail("scored"))
    assert cli(run(tuned, "--alphas", "0,1", "--task-data", str(tuned["task"]), "--task-max-length", "4")) == 2
    err = capsys.readouterr().err
    assert "line 1" in err and "no row keeps any of its answer within --task-max-length 4" in err
    plain = _copy(tuned["ft"], tmp_path / "no-template")
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    assert cli(["interpolate", "--model", str(plain), "--probes", str(tuned["probes"]), "--base", str(tuned["cache"]),
                "--base-model", str(tuned["base"]), "--alphas", "0,1", "--task-data", str(tuned["task"])]) == 2
    err = capsys.readouterr().err
    assert "line 1" in err and "chat template" in err


def test_outputs_are_never_replaced_without_force(tuned, capsys, monkeypatch, tmp_path):
    import forgetwatch.scoring.score as scoring

    monkeypatch.setattr(scoring, "score_probes", lambda *a, **k: pytest.fail("scored"))
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    assert cli(run(tuned, "--alphas", "0,1", "--plot", str(notes))) == 2
    assert "--plot" in capsys.readouterr().err and notes.read_text() == "mine"
    assert cli(run(tuned, "--alphas", "0,1", "--plot", str(tuned["probes"]), "--force")) == 2  # an input: never
    assert "--plot" in capsys.readouterr().err
    kept = tmp_path / "kept"
    kept.mkdir()
    assert cli(run(tuned, "--alphas", "1", "--save-at", "0.5", str(kept))) == 2
    err = capsys.readouterr().err
    assert "--save-at" in err and "-o " not in err
    assert cli(run(tuned, "--alphas", "1", "--save-at", "0.2,0.5", str(tmp_path / "two"))) == 2
    assert "one α" in capsys.readouterr().err


def test_a_chat_template_that_does_not_render_the_prompt_as_a_prefix_is_refused(tuned, capsys, monkeypatch, tmp_path):
    """The answer's tokens start where the prompt (with the generation prompt) ends: only right when the template
    renders the prompt as a prefix of the whole conversation. One that does not (here, as with templates that rewrite
    earlier turns) is refused by line rather than scoring a misplaced span (review of issue 30)."""
    import forgetwatch.scoring.score as scoring

    monkeypatch.setattr(scoring, "score_probes", lambda *a, **k: pytest.fail("scored"))
    odd = _copy(tuned["ft"], tmp_path / "odd-template")
    template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                "{% if add_generation_prompt %}assistant (thinking): {% endif %}")
    config = json.loads((odd / "tokenizer_config.json").read_text())
    (odd / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    (odd / "chat_template.jinja").write_text(template)
    assert cli(["interpolate", "--model", str(odd), "--probes", str(tuned["probes"]), "--base", str(tuned["cache"]),
                "--base-model", str(tuned["base"]), "--alphas", "0,1", "--task-data", str(tuned["task"])]) == 2
    err = capsys.readouterr().err
    assert "line 1" in err and "prefix" in err


def test_rows_whose_answer_is_cut_away_are_left_out_with_a_warning(tuned, caplog):
    """As training cuts them: a row whose prompt fills --task-max-length has no answer token; it is left out of the
    task loss and said, and the loss is the other rows' (what RESULTS §12's held-out loss does)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from forgetwatch.remedies.interpolate import encode_task_rows, held_out_loss, load_task_data

    tok = AutoTokenizer.from_pretrained(tuned["ft"])
    rows = load_task_data(tuned["task"])
    long_first = [{"prompt": "one two three " * 20, "completion": " four"}, *rows[1:]]
    with caplog.at_level("WARNING", logger="forgetwatch.remedies.interpolate"):
        pairs = encode_task_rows(tok, long_first, max_length=24)
    assert len(pairs) == len(rows) - 1 and "1 of 8 task rows have no answer token" in caplog.text and "line 1" in caplog.text
    model = AutoModelForCausalLM.from_pretrained(tuned["ft"])
    assert held_out_loss(model, tok, long_first, max_length=24) == pytest.approx(
        held_out_loss(model, tok, rows[1:], max_length=24)
    )


def test_a_sharded_checkpoint_is_streamed_and_saved_shard_by_shard(tuned, capsys, tmp_path):
    """A checkpoint in several safetensors shards (its index) against a one-file base: the same θ(α) as the one-file
    checkpoint, scored the same, and saved in the checkpoint's own shards."""
    from transformers import AutoModelForCausalLM

    sharded = tmp_path / "ft-sharded"
    AutoModelForCausalLM.from_pretrained(tuned["ft"]).save_pretrained(sharded, max_shard_size="100KB")
    for f in tuned["ft"].glob("tokenizer*"):
        (sharded / f.name).write_bytes(f.read_bytes())
    assert (sharded / "model.safetensors.index.json").is_file()
    out = tmp_path / "half"
    one = interpolate(capsys, tuned, "--alphas", "0.5")
    two = interpolate(capsys, {**tuned, "ft": sharded}, "--alphas", "0.5", "--save-at", "0.5", str(out))
    for group, row in one["alphas"][0]["metrics"].items():
        assert two["alphas"][0]["metrics"][group] == pytest.approx(row, nan_ok=True), group
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert sorted(set(index.values())) == sorted(p.name for p in out.glob("model-*.safetensors"))
    base, ft = load_file(tuned["base"] / "model.safetensors"), load_file(tuned["ft"] / "model.safetensors")
    for shard in sorted(set(index.values())):
        for name, t in load_file(out / shard).items():
            torch.testing.assert_close(t, base[name] + 0.5 * (ft[name] - base[name]), rtol=0, atol=1e-6, msg=name)


# -- a second review of issue 30 (2026-11-26): what got past the first -------------------------------------------
def _no_scoring(monkeypatch):
    import forgetwatch.scoring.score as scoring

    monkeypatch.setattr(scoring, "score_probes", lambda *a, **k: pytest.fail("scored"))


@pytest.mark.parametrize("init", ["pissa", "pissa_niter_4", "olora", "corda", "loftq"])
def test_an_adapter_whose_init_changed_the_base_is_refused(tuned, capsys, monkeypatch, tmp_path, init):
    """PiSSA, OLoRA, CorDA and LoftQ take the adapter's start out of the base's weights, and PEFT does it again when it
    loads the adapter: α = 0 would be that changed base (measured 4.3e-3 in the logits), silently."""
    _no_scoring(monkeypatch)
    adapter = _copy(tuned["lora"], tmp_path / "adapter")
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "init_lora_weights": init}))
    assert cli(["interpolate", "--model", str(adapter), *run(tuned, "--alphas", "0,1")[3:]]) == 2
    err = capsys.readouterr().err
    assert f"init_lora_weights {init!r}" in err and "path_initial_model_for_weight_conversion" in err


def test_save_at_never_removes_an_input_even_with_force(tuned, capsys, monkeypatch, tmp_path):
    """--save-at OUT --force replaces OUT when the model is written: OUT must not be, or hold, the checkpoint, the base
    or another input (as --plot and compare -o refuse theirs)."""
    _no_scoring(monkeypatch)
    run_dir = tmp_path / "run"
    ckpt = _copy(tuned["ft"], run_dir.mkdir() or run_dir / "checkpoint-8")
    before = sorted(p.name for p in ckpt.iterdir())
    for out, says in ((ckpt, "is --model"), (run_dir, "holds --model")):
        assert cli(run({**tuned, "ft": ckpt}, "--alphas", "0.5", "--save-at", "0.5", str(out), "--force")) == 2
        err = capsys.readouterr().err
        assert says in err and "even with --force" in err
    assert sorted(p.name for p in ckpt.iterdir()) == before
    assert cli(run(tuned, "--alphas", "0.5", "--save-at", "0.5", str(tuned["base"]), "--force",
                   "--base-model", str(tuned["base"]))) == 2
    assert "--base-model" in capsys.readouterr().err
    assert cli(run(tuned, "--alphas", "0.5", "--save-at", "0.5", str(tuned["base"]), "--force")) == 2  # the cache's
    assert "the base model's directory" in capsys.readouterr().err
    assert (tuned["base"] / "model.safetensors").is_file()
    assert cli(run(tuned, "--alphas", "0.5", "--save-at", "0.5", str(tmp_path / "no" / "such" / "out"))) == 2
    assert "does not exist" in capsys.readouterr().err


def test_the_caches_scoring_settings_are_checked_before_any_scoring(tuned, capsys, monkeypatch, tmp_path):
    """A checkpoint whose tokenizer lost (or gained) its chat template is scored in another form than the cache: refused
    before α = 0 is scored, not after."""
    cache = tmp_path / "generated.parquet"  # answers generated: the chat template is used where there is one
    assert cli(["cache", "--model", str(tuned["base"]), "--probes", str(tuned["probes"]), "--max-new-tokens", "4",
                "--mcq-mode", "generate", "-o", str(cache)]) == 0
    capsys.readouterr()
    ckpt = _copy(tuned["ft"], tmp_path / "untemplated")
    (ckpt / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((ckpt / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (ckpt / "tokenizer_config.json").write_text(json.dumps(config))
    _no_scoring(monkeypatch)
    assert cli(run({**tuned, "ft": ckpt, "cache": cache}, "--alphas", "0,1")) == 2
    assert "chat" in capsys.readouterr().err


def test_the_figures_are_out_before_the_plot_or_the_model_is_written(tuned, capsys, monkeypatch, tmp_path):
    """A --save-at that fails at the end (a full disk) must not take the scoring with it; a --plot that cannot be drawn
    (matplotlib is an extra) is refused before any scoring."""
    import sys

    import forgetwatch.remedies.interpolate as interp

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(interp, "save_interpolated", full)
    assert cli(run(tuned, "--alphas", "0,1", "--save-at", "0.5", str(tmp_path / "out"))) != 0
    out = json.loads(capsys.readouterr().out)
    assert [s["alpha"] for s in out["alphas"]] == [0, 1]
    assert not (tmp_path / "out").exists()
    _no_scoring(monkeypatch)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert cli(run(tuned, "--alphas", "0,1", "--plot", str(tmp_path / "front.png"))) == 2
    assert "matplotlib" in capsys.readouterr().err


def test_settings_the_checkpoint_changed_are_said(tuned, capsys, tmp_path):
    """Every α is scored with the checkpoint's tokenizer and generation settings: where they are not the base's, α = 0
    is not the base as cached, and the user is told which differ."""
    assert cli(run(tuned, "--alphas", "0")) == 0
    assert "differ from the base's" not in capsys.readouterr().err
    same = _copy(tuned["ft"], tmp_path / "same-ends")
    gen = json.loads((same / "generation_config.json").read_text()) if (same / "generation_config.json").is_file() else {}
    base_end = json.loads((tuned["base"] / "generation_config.json").read_text()).get("eos_token_id")
    listed = base_end if isinstance(base_end, list) or base_end is None else [base_end]
    (same / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": listed}))
    assert cli(run({**tuned, "ft": same}, "--alphas", "0")) == 0  # 2 and [2]: one end token (transformers 4.56 wrote 2)
    assert "differ from the base's" not in capsys.readouterr().err
    ckpt = _copy(tuned["ft"], tmp_path / "other-ends")
    (ckpt / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [2, 5]}))
    assert cli(run({**tuned, "ft": ckpt}, "--alphas", "0")) == 0
    err = capsys.readouterr().err
    assert "differ from the base's" in err and "generation's end token ids ([2, 5]" in err


def test_the_task_set_can_be_a_dataset(tuned, capsys, tmp_path):
    """--task-data names a dataset as well as a JSONL file: a `save_to_disk` directory, a local dataset directory (a
    Hub name the same way, through `datasets`), at --task-split; the loss is the JSONL's on the same rows."""
    from datasets import Dataset, DatasetDict

    rows = [json.loads(line) for line in tuned["task"].read_text().splitlines()]
    on_disk = tmp_path / "saved"
    DatasetDict({"test": Dataset.from_list(rows), "train": Dataset.from_list(rows[:2])}).save_to_disk(on_disk)
    files = tmp_path / "files"
    files.mkdir()
    (files / "validation.jsonl").write_text(tuned["task"].read_text())
    args = ("--alphas", "1", "--task-max-length", "48")
    want = interpolate(capsys, tuned, *args, "--task-data", str(tuned["task"]))["alphas"][0]["task"]
    got = interpolate(capsys, tuned, *args, "--task-data", str(on_disk))["alphas"][0]["task"]
    assert got == pytest.approx(want, rel=1e-6)
    got = interpolate(capsys, tuned, *args, "--task-data", str(files), "--task-split", "validation")["alphas"][0]["task"]
    assert got == pytest.approx(want, rel=1e-6)
    assert cli(run(tuned, *args, "--task-data", str(on_disk), "--task-split", "dev")) == 2
    assert "no split 'dev'; it has test, train" in capsys.readouterr().err
    assert cli(run(tuned, *args, "--task-data", "nobody/no-such-dataset")) == 2
    assert "cannot load it as a dataset" in capsys.readouterr().err
    bad = tmp_path / "bad"
    Dataset.from_list([{"text": "fine"}, {"question": "no answer"}]).save_to_disk(bad)
    assert cli(run(tuned, *args, "--task-data", str(bad), "--task-split", "train")) == 2
    assert "row 1: a task example needs" in capsys.readouterr().err


def test_the_interpolation_is_made_a_slice_of_rows_at_a_time(tuned):
    """θ(α) is read from both files in slices (memory: one model plus a slice of each), the same numbers as whole."""
    from transformers import AutoModelForCausalLM

    from forgetwatch.remedies.interpolate import Interpolator

    model = AutoModelForCausalLM.from_pretrained(tuned["ft"])
    interp = Interpolator(model, tuned["base"], tuned["ft"], chunk=7)
    base, ft = load_file(tuned["base"] / "model.safetensors"), load_file(tuned["ft"] / "model.safetensors")
    got = dict(model.named_parameters())
    for alpha in (0.3, 0, 1):
        interp.set(alpha)
        for name in ft:
            if name in got:
                want = base[name] if alpha == 0 else ft[name] if alpha == 1 else base[name].lerp(ft[name], alpha)
                assert torch.equal(got[name].data, want), (alpha, name)


def test_a_checkpoint_with_a_tensor_the_base_lacks_is_refused_before_scoring(tuned, capsys, monkeypatch, tmp_path):
    """The files are compared with each other, both ways (names, shapes), before any scoring: a tensor only in the
    checkpoint used to pass the scoring and fail at --save-at."""
    from safetensors.torch import save_file

    _no_scoring(monkeypatch)
    ckpt = _copy(tuned["ft"], tmp_path / "extra")
    weights = load_file(ckpt / "model.safetensors")
    weights["model.extra_buffer"] = torch.zeros(3)
    save_file(weights, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    assert cli(run({**tuned, "ft": ckpt}, "--alphas", "0.5")) == 2
    assert "'model.extra_buffer' (1 in all) is not in" in capsys.readouterr().err


def test_an_architecture_transformers_renames_on_load_is_named_as_such(tmp_path):
    """Mixtral's files say `block_sparse_moe.experts.0.w1`, transformers 5 loads `mlp.experts.gate_up_proj`: the files
    agree with each other, so the refusal says that interpolate does not follow the renaming, not "another model"."""
    from transformers import AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM

    from forgetwatch.remedies.interpolate import Interpolator

    config = MixtralConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=1, num_local_experts=2, num_experts_per_tok=1)
    torch.manual_seed(0)
    MixtralForCausalLM(config).save_pretrained(tmp_path / "a")
    MixtralForCausalLM(config).save_pretrained(tmp_path / "b")
    if not any("block_sparse_moe" in k for k in load_file(tmp_path / "a" / "model.safetensors")):
        pytest.skip("this transformers saves Mixtral under its loaded names")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "b")
    if not any(n not in load_file(tmp_path / "a" / "model.safetensors") for n, _ in model.named_parameters()):
        pytest.skip("this transformers loads Mixtral under its file names")
    with pytest.raises(InterpolationError, match="renames or fuses"):
        Interpolator(model, tmp_path / "a", tmp_path / "b")


def test_the_checks_read_each_files_header_once(tuned, monkeypatch, tmp_path):
    """The shape and dtype checks read the headers with each file opened once, not once per tensor and question (a
    70B checkpoint has ~700 tensors over ~30 shards); the refusals they make are the tests above."""
    import safetensors
    from transformers import AutoModelForCausalLM

    from forgetwatch.remedies.interpolate import Interpolator

    sharded = tmp_path / "ft-sharded"
    AutoModelForCausalLM.from_pretrained(tuned["ft"]).save_pretrained(sharded, max_shard_size="100KB")
    shards = set(json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"].values())
    opened: list[str] = []
    real = safetensors.safe_open

    def counting(path, *args, **kwargs):
        opened.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(safetensors, "safe_open", counting)
    Interpolator(AutoModelForCausalLM.from_pretrained(sharded), tuned["base"], sharded)
    from collections import Counter

    # the one-file base: once to list its tensors, once for their headers; each shard of the index: once
    want = Counter({str(tuned["base"] / "model.safetensors"): 2, **{str(sharded / s): 1 for s in shards}})
    assert len(shards) > 2 and Counter(opened) == want, Counter(opened)


def test_other_weights_saved_at_the_bases_path_are_refused(tuned, capsys, tmp_path):
    """The cache names its base by path and keeps its weight files' fingerprint: other weights saved at that path after
    the cache was made are refused (interpolate and rewind alike), before anything is scored, unless
    --allow-other-model; α = 0 would otherwise be the other model, silently."""
    tok = build_tokenizer()
    base, probes, cache = tmp_path / "base", tmp_path / "probes.jsonl", tmp_path / "base.parquet"
    build_model(tok).save_pretrained(base)
    tok.save_pretrained(base)
    make_probes().to_jsonl(probes)
    assert cli(["cache", "--model", str(base), "--probes", str(probes), "--max-new-tokens", "4", "-o", str(cache)]) == 0
    build_model(tok, seed=1).save_pretrained(base)  # other weights, the same path and architecture
    capsys.readouterr()
    argv = ["interpolate", "--model", str(tuned["ft"]), "--probes", str(probes), "--base", str(cache), "--alphas", "0",
            "--json"]
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert "are not those this cache was made from" in err and "--allow-other-model" in err and "Traceback" not in err
    assert cli([*argv, "--allow-other-model"]) == 0


def test_the_saved_model_holds_the_models_files_and_nothing_else_of_the_directory(tuned, tmp_path):
    """The final checkpoint can be a trainer's output_dir: its logs, lock files and the user's own files (a `.env` with
    a token) stay out of the model a user ships; the config, the tokenizer and the remote code its config names go in."""
    from forgetwatch.remedies.interpolate import save_interpolated

    run = _copy(tuned["ft"], tmp_path / "run")
    (run / ".env").write_text("HF_TOKEN=hf_secret\n")
    (run / "train.log").write_text("step 1\n" * 1000)
    (run / ".forgetwatch-training.lock").write_text("123\n")
    (run / "my_data.jsonl").write_text("{}\n")
    (run / "modeling_custom.py").write_text("# the model's remote code\n")
    (run / "helper.py").write_text("# the user's own script\n")
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoModelForCausalLM": "modeling_custom.Custom"}}))
    save_interpolated(tuned["base"], run, 0.5, tmp_path / "rewound")
    names = {f.name for f in (tmp_path / "rewound").iterdir()}
    assert not names & {".env", "train.log", ".forgetwatch-training.lock", "my_data.jsonl", "helper.py"}, names
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "modeling_custom.py"} <= names
