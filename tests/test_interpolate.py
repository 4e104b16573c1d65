"""`forgetwatch interpolate` (issue 30): a fine-tune moved back toward its base, θ_base + α(θ_ft − θ_base), scored at
each α against the base cache. A tiny Llama fine-tuned for real (TRL SFT, CPU), a LoRA adapter trained the same way."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import build_model, build_tokenizer
from safetensors.torch import load_file
from test_callback import make_probes, sft_dataset, sft_trainer

from forgetwatch.cli import main as cli
from forgetwatch.interpolate import InterpolationError, alpha_grid

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

    from forgetwatch.interpolate import held_out_loss, load_task_data

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
    assert "within budget forgetting=0.05: α = " in text and "F adj" in text


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
    import forgetwatch.scoring as scoring

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
    err = capsys.readouterr().err
    assert "has shape" in err and "not the same architecture" in err
    config = json.loads((tuned["lora"] / "adapter_config.json").read_text())
    other = tmp_path / "other-lora"
    other.mkdir()
    for f in tuned["lora"].iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    (other / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": str(wide)}))
    assert cli(["interpolate", "--model", str(other), "--probes", str(tuned["probes"]), "--base", str(tuned["cache"])]) == 2
    assert "the adapter was trained on" in capsys.readouterr().err


def test_alpha_grids():
    assert alpha_grid(None) == [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    assert alpha_grid("1,0,0.5") == [0, 0.5, 1]
    assert alpha_grid("-0.5,1.5", extrapolate=True) == [-0.5, 1.5]
    with pytest.raises(InterpolationError):
        alpha_grid("1:0:0.1")
