"""The `forgetwatch` command line: build probe sets, score a base model once, compare any checkpoint with it.

    forgetwatch probes build arc_easy mmlu sciq triviaqa --per-suite 100 --seed 0 -o probes.jsonl
    forgetwatch probes show probes.jsonl
    forgetwatch cache   --model <dir or hub id> --probes probes.jsonl -o base.parquet
    forgetwatch compare --model <checkpoint>    --probes probes.jsonl --base base.parquet [--json]
    forgetwatch compare BEFORE AFTER            # two lm-eval --log_samples outputs, or two lighteval details
    forgetwatch report  <output_dir> [-o DIR]
    forgetwatch llamafactory train config.yaml [key=value ...]   # a LLaMA-Factory YAML with forgetwatch_* keys
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from ._io import strict_json
from .commands import cache_command as cache_command  # re-exported: it lived here before commands.py
from .commands import quote
from .modes import ENGINES, MCQ_MODES, SHORT_MATCHES, SHORT_MODES
from .options import default
from .probes import ProbeFormatError, ProbeSet
from .robustness import make_plan
from .suites import from_suites, load_probes

_CHAT = {"auto": None, "on": True, "off": False}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        # `forgetwatch probes` alone prints the help of `probes`, not of the whole command
        (getattr(args, "help_parser", None) or parser).print_help()
        return 2
    try:
        return args.func(args) or 0
    except (ProbeFormatError, ValueError, OSError, ImportError) as e:  # OSError: also a Hub id that cannot be fetched
        print(f"forgetwatch: error: {e}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="forgetwatch", description="See what your model forgets: per-probe 1→0 / 0→1 tracking.")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = p.add_subparsers(title="commands", metavar="COMMAND")

    probes_parser = sub.add_parser("probes", help="build, inspect and list probe sets")
    probes_parser.set_defaults(help_parser=probes_parser)
    probes = probes_parser.add_subparsers(title="probes commands", metavar="COMMAND")
    b = probes.add_parser("build", help="build a probe set from built-in suites")
    b.add_argument("suites", nargs="+", help="suite names (see `forgetwatch probes suites`)")
    b.add_argument("--per-suite", type=int, default=None, help="probes per suite, stratified by category (default: all)")
    b.add_argument("--seed", type=int, default=0, help="subsampling seed (default 0)")
    b.add_argument("-o", "--output", required=True, help="the .jsonl file to write; an existing file is kept unless --force")
    b.add_argument("--force", action="store_true", help="replace the -o file if it exists")
    b.set_defaults(func=cmd_probes_build)
    s = probes.add_parser("show", help="summarise a probe file and print a few probes")
    s.add_argument("path", help="a probe JSONL file")
    s.add_argument("-n", type=int, default=3, help="probes to print (default 3)")
    s.set_defaults(func=cmd_probes_show)
    ls = probes.add_parser("suites", help="list the built-in suites")
    ls.set_defaults(func=cmd_probes_suites)

    c = sub.add_parser("cache", help="score the base model once and store its per-probe results")
    _model_args(c)
    c.add_argument("-o", "--output", required=True,
                   help="cache file to write (.parquet or .jsonl), checked before anything is scored. An existing file is "
                        "never replaced unless --force: if it already holds the cache this command would write (same "
                        "model, probes and scoring key) nothing is scored and it is kept (exit 0); any other file is "
                        "refused, saying what differs")
    c.add_argument("--force", action="store_true", help="score again and replace the -o file if it exists")
    c.add_argument("--hash-weights", action="store_true", help="put a hash of the weights in the cache key (reads every weight)")
    _scoring_args(c, defaults=True)
    c.set_defaults(func=cmd_cache)

    bo = sub.add_parser("base-outputs", help="the base model's own answers to a replay pool, for self-distilled replay and "
                                              "the KL anchor (`--forgetwatch_replay_targets base`, `--forgetwatch_anchor_beta`)")
    bo.add_argument("--model", required=True, help="the base model: a local directory, a Hub id, or `smollm2`")
    bo.add_argument("--pool", required=True, help="suite names (`arc_easy:200,sciq:200`), a probe JSONL, or a JSONL of "
                                                  "unlabelled prompts ({\"prompt\": ..., \"category\": ...})")
    bo.add_argument("--exclude", default=None, help="the monitored probes (a probe file or suite names): never in the pool")
    bo.add_argument("--exclude-per-suite", default=None, metavar="N|all",
                    help="with suite names in --exclude: the run's forgetwatch_per_suite (the monitored probes are a sample)")
    bo.add_argument("--exclude-seed", type=int, default=0, help="with suite names in --exclude: the run's forgetwatch_seed (default 0)")
    bo.add_argument("-o", "--output", required=True, help="the file to write (.parquet); an existing one is never overwritten")
    bo.add_argument("--max-length", type=int, default=None, help="the trainer's max_length: longer prompts are refused")
    bo.add_argument("--max-new-tokens", type=int, default=128, help="generation budget of generated answers (default 128)")
    bo.add_argument("--top-k", type=int, default=20, help="log-probabilities kept per answer token (default 20)")
    bo.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or float16")
    bo.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when available)")
    bo.set_defaults(func=cmd_base_outputs)

    m = sub.add_parser(
        "compare", help="score a checkpoint and compare it probe by probe with the base cache, or compare two "
        "lm-eval / lighteval per-sample outputs",
        usage="%(prog)s --model CHECKPOINT --probes PROBES --base BASE [options]\n"
              "       %(prog)s BEFORE AFTER [--json] [--metric M] [--filter F] [--match {auto,hash,id}]")
    m.add_argument("runs", nargs="*", metavar="BEFORE AFTER",
                   help="two lm-evaluation-harness --log_samples outputs (directories or samples_*.jsonl) or two lighteval "
                        "details (directories or details_*.parquet), before and after post-training; no model is loaded")
    _model_args(m, required=False)
    m.add_argument("--base", default=None, help="the base cache made by `forgetwatch cache`")
    m.add_argument("--json", action="store_true", help="print the report as JSON")
    m.add_argument("--flips", type=int, default=10, help="flipped probes to list in the table (default 10)")
    m.add_argument("--allow-other-model", action="store_true",
                   help="compare although the model's architecture differs from the cache's base model (two different models)")
    m.add_argument("-o", "--output", default=None,
                   help="also write this checkpoint's per-probe results (.parquet or .jsonl), checked before anything is "
                        "scored; an existing file is kept unless --force, and the --base cache is never replaced")
    m.add_argument("--force", action="store_true", help="replace the -o file if it exists (never the --base cache)")
    m.add_argument("--metric", default=None, help="with BEFORE AFTER: the 0/1 per-sample metric to count as correct "
                   "(default per task: acc, exact_match, ... whichever it logs)")
    m.add_argument("--filter", default=None, help="with lm-eval outputs: the filter whose answers count where a task logged "
                   "several (default: the task's first, e.g. gsm8k's strict-match)")
    m.add_argument("--match", choices=("auto", "hash", "id"), default="auto",
                   help="with BEFORE AFTER: match documents by content hash, by document id, or auto (hash where every "
                        "document has one, else id); never by position or prompt text")
    _scoring_args(m, defaults=False)
    m.set_defaults(func=cmd_compare)

    r = sub.add_parser("report", help="plots and an HTML page from a training run's local record (no W&B needed)")
    r.add_argument("output_dir", help="the trainer's output_dir (or its forgetwatch/ folder)")
    r.add_argument("-o", "--output", default=None, help="directory to write to (default: <output_dir>/forgetwatch/report/)")
    r.set_defaults(func=cmd_report)

    ip = sub.add_parser(
        "interpolate", help="score a checkpoint interpolated toward its base (θ_base + α(θ_ft − θ_base)) at each α, against the "
        "base cache, beside a task measure: what stepping back toward the base buys in forgetting and costs on the task",
        description="WiSE-FT without training: for each α of the grid the weights are θ_base + α(θ_ft − θ_base) (a LoRA "
                    "adapter is scaled by α), streamed in slices of a tensor (one model in memory), and scored as `compare` "
                    "scores a checkpoint. α = 0 is the base, α = 1 the checkpoint. More: docs/cli.md, section `interpolate`.")
    ip.add_argument("--model", required=True, help="the fine-tuned checkpoint: a model directory (safetensors) or a LoRA adapter directory")
    ip.add_argument("--probes", required=True, help="the probe set of the base cache: a JSONL file or suite names")
    ip.add_argument("--base", required=True, help="the base cache made by `forgetwatch cache`")
    ip.add_argument("--base-model", default=None,
                    help="the base model's directory (or Hub id; `smollm2`) (default: the model the base cache was made with)")
    ip.add_argument("--alphas", default=None, help="the grid: 0,0.5,1 or start:stop:step (default 0:1:0.1)")
    ip.add_argument("--extrapolate", action="store_true", help="allow α outside [0, 1]")
    ip.add_argument("--task-data", default=None, help="task measure: the held-out loss on this JSONL, or dataset (a "
                                                      "directory or Hub name; text, messages, or prompt + completion rows; "
                                                      "nats per answer token; lower is better)")
    ip.add_argument("--task-split", default="test", help="with a dataset in --task-data: its split (default test)")
    ip.add_argument("--task-max-examples", type=int, default=200, help="with --task-data: at most this many examples (default 200)")
    ip.add_argument("--task-max-length", type=int, default=1024,
                    help="with --task-data: examples cut at this many tokens, as training cut them (default 1024)")
    ip.add_argument("--task-probes", default=None, help="task measure: accuracy on this probe set of the task (e.g. gsm8k)")
    ip.add_argument("--task-per-suite", type=int, default=None, help="with suite names in --task-probes: probes per suite")
    ip.add_argument("--budget", default=None, help="choose the best α within this budget, e.g. "
                                                   "all_knowledge/forgetting_adjusted=0.05 (names as the callback's budget)")
    ip.add_argument("--budget-bound", choices=("lower", "point"), default="lower",
                    help="lower (default): a limit is exceeded when the lower end of the 95%% interval is above it; point")
    ip.add_argument("--json", action="store_true", help="print every α's figures as JSON")
    ip.add_argument("--plot", default=None, help="write a PNG of forgetting against the task measure, α by α (the Pareto front)")
    ip.add_argument("--save-at", nargs=2, metavar=("ALPHA", "OUT"), default=None,
                    help="also write the model at ALPHA to the directory OUT (refused if it exists, unless --force)")
    ip.add_argument("--force", action="store_true", help="replace --save-at's OUT or the --plot file if it exists")
    ip.add_argument("--allow-other-model", action="store_true",
                    help="the checkpoint's architecture differs from the base cache's model: compare anyway")
    ip.add_argument("--revision", default=None, help=argparse.SUPPRESS)
    ip.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when available)")
    _scoring_args(ip, defaults=False, robustness=False)  # it scores no variants: --robustness would be ignored
    ip.set_defaults(func=cmd_interpolate)

    w = sub.add_parser("watch", help="score a training run's checkpoints beside it (the callback with scoring='sidecar')")
    w.add_argument("output_dir", help="the trainer's output_dir")
    w.add_argument("--once", action="store_true", help="score the checkpoints already there, then exit")
    w.add_argument("--device", default=None, help="where to score: cuda:1, cpu, ... (default: cuda when available)")
    w.add_argument("--poll", type=float, default=10.0, help="seconds between looks for new checkpoints (default 10)")
    w.add_argument("--timeout", type=float, default=None, help="give up after this many seconds (default: when training ends)")
    w.add_argument("--report-to", default=None,
                   help="comma-separated: wandb, tensorboard, trackio, none (default: the trainer's report_to)")
    w.add_argument("--into-trainer-run", action="store_true",
                   help="after training has ended, log into the trainer's own W&B run instead of a run beside it")
    w.add_argument("--batch-size", type=int, default=None, help="probes per forward pass (default: the callback's)")
    w.add_argument("--engine", choices=ENGINES, default=None,
                   help="what runs generation: hf or continuous (transformers' continuous batching) (default: the callback's)")
    w.add_argument("--robustness", type=int, default=None, metavar="K",
                   help="score K variants of each knowledge probe (default: the callback's robustness; 0: none); the "
                        "record's base cache must hold the same variants")
    w.add_argument("--robust-per-suite", type=int, default=None, metavar="N",
                   help="with --robustness: variants of only N probes per suite (default: the callback's)")
    w.set_defaults(func=cmd_watch)

    lf_parser = sub.add_parser("llamafactory", help="run a LLaMA-Factory YAML with forgetwatch_* keys (needs llamafactory "
                                                    "0.9.5 installed; docs/llamafactory.md)")
    lf_parser.set_defaults(help_parser=lf_parser)
    lf = lf_parser.add_subparsers(title="llamafactory commands", metavar="COMMAND")
    t = lf.add_parser("train", help="train as `llamafactory-cli train` does, with the forgetwatch callback",
                      description="Reads the config and key=value overrides as `llamafactory-cli train` does, checks the "
                                  "forgetwatch_* keys (a misspelt key or a wrong type is named with its file and line "
                                  "before anything is trained), takes them out and runs LLaMA-Factory's run_exp with "
                                  "ForgetWatchCallback. Several GPUs: re-runs itself under torchrun, as "
                                  "`torchrun --nproc_per_node N -m forgetwatch.integrations.llamafactory config.yaml`.")
    t.add_argument("config", help="a LLaMA-Factory .yaml (or .json) config; `model_name_or_path: smollm2` is the offline "
                                  "SmolLM2-135M-Instruct")
    t.add_argument("overrides", nargs="*", metavar="key=value", help="overrides, as `llamafactory-cli train` takes them")
    t.add_argument("--check", action="store_true", help="check the config (forgetwatch's keys, then LLaMA-Factory's own "
                                                        "parser) and train nothing")
    t.set_defaults(func=cmd_llamafactory_train)
    return p


def cmd_llamafactory_train(args: argparse.Namespace) -> int:
    from .integrations import llamafactory

    if args.check:
        llamafactory.check(args.config, args.overrides)
        return 0
    fw_args, rest = llamafactory.prepare(args.config, args.overrides)  # bad keys: one line from main(), nothing trained
    try:
        return llamafactory.launch(fw_args, rest, args.config, args.overrides)
    except Exception:  # LLaMA-Factory's own errors while training keep their traceback
        import traceback

        traceback.print_exc()
        print("forgetwatch: LLaMA-Factory stopped with the error above", file=sys.stderr)
        return 1


def _version() -> str:
    from . import __version__

    return __version__


def _model_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--model", required=required, help="a local model directory, a Hub id, or `smollm2` (the offline SmolLM2-135M-Instruct)")
    p.add_argument("--probes", required=required, help="a probe JSONL file, or comma-separated suite names")
    p.add_argument("--revision", default=None, help="Hub revision (branch, tag or commit)")
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when available)")


def _scoring_args(p: argparse.ArgumentParser, defaults: bool, robustness: bool = True) -> None:
    # `compare` takes every scoring option from the base cache unless given, so both sides match. `robustness`: the
    # command scores variants (--robustness, --robust-per-suite); one that does not must not take them
    d = (lambda v: v) if defaults else (lambda v: None)
    note = "" if defaults else " (default: as in the base cache)"
    p.add_argument("--mcq-mode", choices=MCQ_MODES, default=d(default("mcq_mode")), help=f"how multiple-choice probes are scored{note}")
    p.add_argument("--chat-template", choices=tuple(_CHAT), default=d("auto"), help=f"wrap prompts in the chat template{note}")
    p.add_argument("--cot", action=argparse.BooleanOptionalAction, default=d(False), help=f"chain-of-thought generation with a final 'Answer:' line{note}")
    p.add_argument("--max-new-tokens", type=int, default=None, help=f"generation budget (default 32, 256 with --cot){note}")
    p.add_argument("--behavior-max-new-tokens", type=int, default=None,
                   help=f"generation budget of behaviour probes (instruct, comply); an answer that reaches it without ending "
                        f"is a runaway (default 256){note}")
    p.add_argument("--short-mode", choices=SHORT_MODES, default=None,
                   help="short answers: greedy_match (one forward: would greedy decoding give an accepted answer?) or "
                        "generate (decode, extract, match)" + (note or "; default greedy_match, generate with --cot"))
    p.add_argument("--short-match", choices=SHORT_MATCHES, default=d(default("short_match")), help=f"with --short-mode generate: exact or contains (whole words){note}")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=d("float32"), help=f"weights dtype{note}")
    p.add_argument("--autocast", choices=("none", "bfloat16", "float16"), default=d("none"),
                   help="score under torch.autocast in this dtype, as a Trainer with bf16=True / fp16=True (TRL's default) "
                        f"runs the model; the callback then accepts the cache{note}"),
    p.add_argument("--batch-size", type=int, default=default("batch_size"),
                   help=f"questions per forward (default {default('batch_size')})")
    p.add_argument("--engine", choices=ENGINES, default="hf",
                   help="what runs generation: hf (default: this process, a refilling batch) or continuous (transformers' "
                        "continuous batching, where it is faster: docs/speed.md); the same answers either way")
    p.add_argument("--per-suite", type=int, default=None, help="with suite names in --probes: probes per suite")
    p.add_argument("--seed", type=int, default=0, help="with suite names in --probes: subsampling seed")
    if not robustness:
        return
    p.add_argument("--robustness", type=int, default=None, metavar="K",
                   help="also score K variants of each knowledge probe (option orders in letter/generate modes, question "
                        "frames, lower case, typos) for robust accuracy, consistency and position bias; each variant costs "
                        f"about one probe{(note[:-1] + '; 0: none)') if note else ' (default: none)'}")
    p.add_argument("--robust-per-suite", type=int, default=None, metavar="N",
                   help=f"with --robustness: variants of only N probes per suite (a seeded draw){note}")


def cmd_probes_build(args: argparse.Namespace) -> int:
    if _check_output(args.output, (".jsonl",), "probes.jsonl") and not args.force:
        raise _exists(args.output, "a probe file")
    probes = from_suites(args.suites, per_suite=args.per_suite, seed=args.seed)
    probes.to_jsonl(args.output)
    print(f"wrote {len(probes)} probes to {args.output} (fingerprint {probes.fingerprint})")
    _print_summary(probes)
    return 0


def cmd_probes_show(args: argparse.Namespace) -> int:
    probes = ProbeSet.from_jsonl(args.path)
    print(f"{args.path}: {len(probes)} probes, fingerprint {probes.fingerprint}")
    _print_summary(probes)
    for p in list(probes)[: args.n]:
        print()
        print(json.dumps(p.to_dict(), ensure_ascii=False, indent=1))
    return 0


def cmd_probes_suites(args: argparse.Namespace) -> int:
    from .suites import list_suites

    for name in list_suites():
        print(name)
    return 0


def _print_summary(probes: ProbeSet) -> None:
    by_cat = Counter(p.category for p in probes)
    kinds = Counter(p.kind if p.kind != "mcq" else f"mcq k={p.num_choices}" for p in probes)
    print("kinds: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    print("categories: " + ", ".join(f"{c} {n}" for c, n in sorted(by_cat.items())))


def _scoring_config(args: argparse.Namespace, base_key: dict[str, Any] | None = None):
    from .scoring import BEHAVIOR_MAX_NEW_TOKENS, ScoringConfig

    fields = {"mcq_mode": args.mcq_mode, "cot": args.cot, "short_mode": args.short_mode, "short_match": args.short_match,
              "max_new_tokens": args.max_new_tokens, "behavior_max_new_tokens": args.behavior_max_new_tokens}
    fields["chat_template"] = _CHAT[args.chat_template] if args.chat_template is not None else None
    dtype, autocast = args.dtype, args.autocast
    if base_key is not None:
        scoring = base_key.get("scoring", {})
        for name in ("mcq_mode", "cot", "short_mode", "short_match", "max_new_tokens", "behavior_max_new_tokens"):
            if fields[name] is None:
                fields[name] = scoring.get(name)
        if args.chat_template is None:
            fields["chat_template"] = scoring.get("chat_template")
        precision = str(scoring.get("precision", "float32"))
        if dtype is None:
            dtype = precision.split("+")[0]
        if autocast is None:
            autocast = precision.split("+autocast-")[1] if "+autocast-" in precision else "none"
    config = ScoringConfig(
        mcq_mode=fields["mcq_mode"] or default("mcq_mode"),
        chat_template=fields["chat_template"],
        cot=bool(fields["cot"]),
        max_new_tokens=fields["max_new_tokens"],
        short_mode=fields["short_mode"],
        short_match=fields["short_match"] or default("short_match"),
        batch_size=args.batch_size,
        engine=args.engine,
        behavior_max_new_tokens=fields["behavior_max_new_tokens"] or BEHAVIOR_MAX_NEW_TOKENS,
    )
    return config, dtype or "float32", None if autocast in (None, "none") else autocast


def _load_probes(args: argparse.Namespace) -> ProbeSet:
    return load_probes(args.probes, per_suite=args.per_suite, seed=args.seed)


def _load_model(args: argparse.Namespace, dtype: str):
    from .models import load_model

    return load_model(args.model, dtype=dtype, revision=args.revision, device=args.device)


def _score(args: argparse.Namespace, probes: ProbeSet, config, dtype: str, autocast: str | None, check=None, loaded=None):
    """Load the model (unless `loaded`: a (model, tokenizer) pair), run `check(model)`, score; (model, results, key)."""
    import contextlib

    import torch

    from .scoring import describe_precision, score_probes

    model, tokenizer = loaded or _load_model(args, dtype)
    if check is not None:
        check(model)  # before the scoring time is spent
    device_type = next(model.parameters()).device.type
    context = torch.autocast(device_type, dtype=getattr(torch, autocast)) if autocast else contextlib.nullcontext()
    with context:
        results = score_probes(model, tokenizer, probes, config, progress=True, desc=f"scoring {args.model}")
    return model, results, config.key(tokenizer, describe_precision(model, autocast=autocast))


def _check_output(path: str, suffixes: tuple[str, ...], example: str, inputs: dict[str, str | None] | None = None,
                  option: str = "-o") -> bool:
    """Refuse an `-o` (or another `option`) that cannot be written, before any time is spent: the file of an input
    (always), a directory, an unsupported suffix, a parent directory that is missing, not a directory, or not writable.
    True if it exists (the caller decides whether it may be replaced)."""
    out = Path(path)
    for flag, given in (inputs or {}).items():
        if given and _same_file(out, Path(given)):
            raise ValueError(f"{option} {path} is the {flag} file itself ({given}): writing the results there would "
                             f"replace it. Choose another {option} (this is refused even with --force)")
    if out.is_dir():
        raise ValueError(f"{option} {path} is a directory; give a file in it, e.g. {option} {quote(out / example)}")
    if out.suffix not in suffixes:
        raise ValueError(f"{option} {path}: the file name must end in {' or '.join(suffixes)} (it decides the format), "
                         f"e.g. {option} {quote(out.with_suffix(suffixes[0]) if out.suffix else out.parent / example)}")
    parent = out.parent
    if not parent.exists():
        raise ValueError(f"{option} {path}: the directory {parent} does not exist. Create it first (mkdir -p "
                         f"{quote(parent)}) or choose another {option}; it is not created for you, in case the path is "
                         "mistyped")
    if not parent.is_dir():
        raise ValueError(f"{option} {path}: {parent} is not a directory")
    if out.exists() and not out.is_file():
        raise ValueError(f"{option} {path} exists and is not a regular file; choose another {option}")
    try:  # the real test (permissions, read-only mounts, quotas at zero): create a file where the results will go
        fd, probe = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ValueError(f"{option} {path}: cannot write in {parent} ({e.strerror or e}); choose another {option}") from None
    return out.exists()


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)  # hard links, symlinks and other spellings of one file
        return a.resolve() == b.resolve()
    except OSError:
        return False


def _exists(path: str, what: str, option: str = "-o") -> ValueError:
    return ValueError(f"{option} {path} exists ({what}), and forgetwatch never replaces a file without being asked: choose "
                      f"another {option}, or pass --force to replace it")


def _save(cache, path: str, replace: bool) -> None:
    """`cache.save(path)`; when that fails (disk full, the directory gone, the file made meanwhile by another process
    and `replace` is False) the results go to a fallback file and the OSError raised says where."""
    try:
        if not replace and Path(path).exists():
            raise FileExistsError(f"{path} appeared while scoring (another process?) and is not replaced")
        cache.save(path)
        return
    except OSError as e:
        failure = e
    out = Path(path)
    tried = []
    for where in dict.fromkeys([out.parent, Path(tempfile.gettempdir())]):
        fallback = None
        try:
            fd, fallback = tempfile.mkstemp(prefix=f"{out.stem}.unsaved-", suffix=out.suffix, dir=where)  # a new name
            os.close(fd)
            cache.save(fallback)
        except OSError as e:
            tried.append(f"{where}: {e.strerror or e}")
            if fallback is not None:
                with contextlib.suppress(OSError):
                    os.unlink(fallback)  # the empty placeholder: no file that looks like results but is not
            continue
        raise OSError(f"could not write {path} ({failure}); the results were saved to {fallback} instead. Move them into "
                      f"place with: mv {quote(fallback)} {quote(path)}") from None
    raise OSError(f"could not write {path} ({failure}), nor a copy elsewhere ({'; '.join(tried)}): the results are lost") from None


def cmd_cache(args: argparse.Namespace) -> int:
    from .cache import BaseCache, make_cache_key
    from .models import check_model_path, local_model_path, model_identity
    from .noise import NoiseFloor
    from .scoring import describe_precision

    exists = _check_output(args.output, (".parquet", ".jsonl"), "base.parquet", {"--probes": args.probes}) and not args.force
    probes = _load_probes(args)
    if args.model != "smollm2":
        check_model_path(args.model)
    config, dtype, autocast = _scoring_config(args)
    plan = _cli_plan(probes, args.robustness, args.robust_per_suite, config.mcq_mode)
    variants_key = plan.key() if plan is not None else None
    old = _existing_cache(args.output, probes) if exists else None
    model, tokenizer = _load_model(args, dtype)
    identity = model_identity(model, weights_hash=args.hash_weights)
    # the identity as a callback computes it (`model_identity`): a local path resolved, so ./base and /work/base match
    identity["name_or_path"] = local_model_path(args.model) if args.model != "smollm2" else identity["name_or_path"]
    identity["revision"] = args.revision or identity["revision"]
    if old is not None:
        # the whole key is known before scoring: the same cache again is kept, anything else is refused
        key = make_cache_key(identity, probes, config.key(tokenizer, describe_precision(model, autocast=autocast)), variants_key)
        _same_cache_or_refuse(old, key, args.output)
        print(f"{args.output} already holds this cache (same model, probes and scoring): nothing scored, nothing written; "
              "pass --force to score again and replace it")
        return 0
    model, results, scoring_key = _score(args, plan.scored() if plan else probes, config, dtype, autocast,
                                         loaded=(model, tokenizer))
    variants = None
    if plan is not None:
        results, variants = plan.split(results)
    reference = None
    if scoring_key["precision"] != "float32":
        # the precision noise floor: the same base in fp32 without autocast, kept with the cache
        del model
        _, reference, _ = _score(args, probes, config, "float32", None)
        floor = NoiseFloor.from_outcomes(results.outcome, reference.outcome)
        print(f"precision noise floor: {floor.count} of {len(probes)} probes change correctness between "
              f"{scoring_key['precision']} and float32")
    _save(BaseCache(make_cache_key(identity, probes, scoring_key, variants_key), results, reference, variants), args.output,
          replace=args.force)
    if plan is not None:
        robust = plan.outcomes(results, variants)
        print(f"robustness: {len(robust.ids)} probes x {plan.k} variants; right in every variant: "
              f"{int(robust.right.all(1).sum())} ({robust.right.all(1).mean():.3f}), share of variants right "
              f"{robust.right.mean():.3f}")
    bad = results.nonfinite_mask()
    if bad.any():  # kept, flagged: every comparison against this base reports their groups' figures as missing
        print(f"forgetwatch: warning: {int(bad.sum())} of {len(probes)} probes scored NaN or inf with {args.model} under "
              f"{scoring_key['precision']} (first: {', '.join(_first_ids(probes, bad))}); the figures of their groups "
              "will be missing in every comparison with this cache. Score in float32: --dtype float32 --autocast none",
              file=sys.stderr)
        print(f"scored {len(probes)} probes with {args.model}; wrote {args.output}")
        return 0
    print(f"scored {len(probes)} probes with {args.model}: accuracy {results.accuracy:.3f}; wrote {args.output}")
    return 0


def _first_ids(probes: ProbeSet, mask, n: int = 3) -> list[str]:
    return [probes[int(i)].id for i in mask.nonzero()[0][:n]]


def _existing_cache(path: str, probes: ProbeSet):
    """The cache already at `path`, refused (before the model is loaded) unless it is a readable cache of `probes`."""
    from .cache import BaseCache, CacheMismatchError, make_cache_key

    try:
        old = BaseCache.load(path)
        old.check(make_cache_key({}, probes, {}), ignore=("format", "model", "scoring"), path=path)
    except CacheMismatchError as e:
        raise ValueError(f"-o {path} exists and holds another cache ({_differences(e)}); forgetwatch never replaces a "
                         "file without being asked: choose another -o, or pass --force to replace it") from None
    except ValueError as e:
        raise ValueError(f"-o {path} exists and is not a readable forgetwatch cache ({str(e).split(': ', 1)[-1]}); "
                         "forgetwatch never replaces a file without being asked: choose another -o, or pass --force to "
                         "replace it") from None
    return old


def _same_cache_or_refuse(old, key: dict[str, Any], path: str) -> None:
    from .cache import CacheMismatchError

    try:
        old.check(key, path=path)
    except CacheMismatchError as e:
        raise ValueError(f"-o {path} exists and holds a cache made under another key ({_differences(e)}); forgetwatch "
                         "never replaces a file without being asked: choose another -o, or pass --force to replace it") from None
    if old.reference is None and str(key["scoring"].get("precision", "float32")) != "float32":
        raise ValueError(f"-o {path} exists and holds this cache without the fp32 reference (the precision noise floor) "
                         "this command adds; pass --force to score again and replace it")


def _differences(e: Exception) -> str:
    """The `name: cache has X, now Y` lines of a CacheMismatchError, on one line."""
    lines = [line.strip() for line in str(e).splitlines() if line.startswith("  ")]
    return "; ".join(lines) or str(e)


def _excluded(args: argparse.Namespace):
    """The monitored probes named by --exclude: a file, or suite names sampled as the run samples them."""
    from .suites import is_probe_file, load_probes

    spec = args.exclude
    if is_probe_file(spec):
        return load_probes(spec)
    per_suite = args.exclude_per_suite
    if per_suite is None and any(":" not in name for name in spec.split(",") if name.strip()):
        raise ValueError(f"--exclude {spec} names suites, and a run monitors a sample of each: give the run's "
                         "forgetwatch_per_suite and forgetwatch_seed as --exclude-per-suite N --exclude-seed S "
                         "(--exclude-per-suite all for every probe), or the monitored probe file")
    if per_suite in (None, "all"):
        return load_probes(spec, None, args.exclude_seed)
    if not str(per_suite).isdigit() or int(per_suite) < 1:
        raise ValueError(f"--exclude-per-suite must be a whole number >= 1 or `all`; got {per_suite!r}")
    return load_probes(spec, int(per_suite), args.exclude_seed)


def cmd_base_outputs(args: argparse.Namespace) -> int:
    from .distill import make_base_outputs
    from .models import load_model

    if Path(args.output).exists():
        raise ValueError(f"{args.output} exists: base outputs are never overwritten; remove it or choose another path")
    exclude = _excluded(args) if args.exclude else None
    model, tokenizer = load_model(args.model, dtype=args.dtype, device=args.device)
    outs = make_base_outputs(model, tokenizer, args.pool, exclude=exclude, max_length=args.max_length,
                             top_k=args.top_k, max_new_tokens=args.max_new_tokens, progress=True)
    if args.model != "smollm2":
        outs.key["model"]["name_or_path"] = args.model
    outs.save(args.output)
    kinds = ", ".join(f"{k} {sum(r['kind'] == k for r in outs.rows)}" for k in sorted({r["kind"] for r in outs.rows}))
    print(f"{len(outs)} answers of {args.model} ({kinds}) over {len(outs.categories)} categories; wrote {args.output}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    if args.runs:
        return cmd_compare_samples(args)
    missing = [f"--{n}" for n in ("model", "probes", "base") if getattr(args, n) is None]
    if missing:
        raise ValueError(f"compare needs {', '.join(missing)} (a checkpoint scored against a base cache), "
                         "or two per-sample outputs: forgetwatch compare BEFORE AFTER")
    from .cache import BaseCache, make_cache_key
    from .metrics import compute_report
    from .models import check_model_path, model_identity

    if args.output is not None:
        inputs = {"--base": args.base, "--probes": args.probes}
        if _check_output(args.output, (".parquet", ".jsonl"), "checkpoint.parquet", inputs) and not args.force:
            raise _exists(args.output, "per-probe results")
    probes = _load_probes(args)
    if args.model != "smollm2":
        check_model_path(args.model)
    base = BaseCache.load(args.base)
    # A cache for another probe set can never match: refuse it before loading and scoring the model.
    base.check(make_cache_key({}, probes, {}), ignore=("format", "model", "scoring"), path=args.base)
    base = base.for_probes(probes.ids, args.base)  # its rows too, not only its key
    config, dtype, autocast = _scoring_config(args, base.key)
    base_model = base.key.get("model", {})
    plan = _compare_plan(args, probes, base.key, config.mcq_mode)

    def same_architecture(model) -> None:
        # A base and its fine-tune share an architecture; a cache of another model compares nothing meaningful.
        built, now = base_model.get("architecture"), model_identity(model)["architecture"]
        if built and now and built != now and not args.allow_other_model:
            raise ValueError(
                f"{args.base} was made with {base_model.get('name_or_path') or 'a model'} (architecture {built}), but "
                f"--model {args.model} is another architecture ({now}): not a fine-tune of that base. Use the base "
                "model's own cache, or pass --allow-other-model to compare two different models on purpose."
            )

    if plan is not None:  # refused before the model is loaded and scored
        base.check({"variants": plan.key()}, ignore=("format", "model", "probes", "scoring"), path=args.base)
    model, results, scoring_key = _score(args, plan.scored() if plan else probes, config, dtype, autocast,
                                         check=same_architecture)
    variants = None
    if plan is not None:
        results, variants = plan.split(results)
    key = make_cache_key(model_identity(model), probes, scoring_key, plan.key() if plan else None)
    # The checkpoint is meant to differ from the base model: compare everything but the model's identity.
    base.check(key, ignore=("model",), path=args.base)
    unsaved = None
    if args.output:
        try:
            _save(BaseCache(key, results, None, variants), args.output, args.force)
        except OSError as e:
            unsaved = e  # said after the report, which is printed all the same

    pre = base.results
    bad = pre.nonfinite_mask() | results.nonfinite_mask()
    if bad.any():  # argmax over NaN picks an option as if it were an answer: no figure is better than a wrong one
        if unsaved is not None:
            raise unsaved
        raise ValueError(f"{int(bad.sum())} of {len(probes)} probes scored NaN or inf (first: "
                         f"{', '.join(_first_ids(probes, bad))}): {'the base cache' if pre.nonfinite_mask().any() else args.model}"
                         "'s outputs overflowed or are not numbers, so the comparison cannot be computed. Score in float32 "
                         "(--dtype float32 --autocast none), or check the model's weights")
    report = compute_report(pre.outcome, results.outcome, [p.num_choices for p in probes], [p.category for p in probes],
                            probes.kind_groups())
    flips = _flips(probes, pre, results)
    behavior = None
    if (pre.stopped >= 0).any():  # generated answers: how they behave since base (stopping, length, refusals)
        from .behavior import compute_behavior

        behavior = compute_behavior(pre, results, [p.category for p in probes], [p.kind for p in probes], probes.kind_groups())
    robust_rows_, fragile = None, []
    if plan is not None:
        robust_rows_, fragile = _robust_compare(plan, probes, base, results, variants, report)
        flips += fragile
    if args.json:
        out = {"base": args.base, "base_model": base_model, "model": args.model, "n": len(probes),
               "metrics": {k: v.to_dict() for k, v in report.items()}, "flips": flips}
        if behavior is not None:
            out["behavior"] = {k: v.to_dict() for k, v in behavior.items()}
        if robust_rows_ is not None:
            out["robustness"] = {"k": plan.k, "per_suite": plan.per_suite, "lettered": plan.lettered, "groups": robust_rows_}
        print(strict_json(out, indent=1))
        if unsaved is not None:
            raise unsaved
        return 0
    print(f"base: {base_model.get('name_or_path') or '?'} ({base_model.get('architecture') or 'architecture unknown'}), "
          f"cache {args.base}\nnow:  {args.model}\n")
    print(format_report(report))
    if behavior is not None:
        from .behavior import format_behavior

        print("\nbehaviour since base (generated answers, each against the same probe's answer at base):")
        print(format_behavior(behavior))
    if robust_rows_ is not None:
        print(f"\nrobustness since base ({plan.k} variants of each of {robust_rows_['overall']['robust_n']} probes, each "
              "against the same probe's variants at base):")
        print(format_robust(robust_rows_))
    if flips and args.flips:
        print(f"\nflipped probes ({len(flips)}; first {min(args.flips, len(flips))}):")
        for f in flips[: args.flips]:
            print(f"  {f['direction']}  {f['id']}  [{f['category']}]  base: {f['base_prediction']!r}  now: {f['prediction']!r}  gold: {f['gold']!r}")
    if unsaved is not None:
        raise unsaved
    return 0


def cmd_compare_samples(args: argparse.Namespace) -> int:
    from .samples import compare_samples

    if len(args.runs) != 2:
        raise ValueError(f"compare takes two per-sample outputs, BEFORE and AFTER; got {len(args.runs)}: {' '.join(args.runs)}")
    given = [f"--{n}" for n in ("model", "probes", "base", "output") if getattr(args, n) is not None]
    if given:
        raise ValueError(f"{', '.join(given)} score a model; with two per-sample outputs (BEFORE AFTER) nothing is scored: drop them")
    cmp = compare_samples(args.runs[0], args.runs[1], metric=args.metric, filter=args.filter, match=args.match)
    # acc_norm ranks the options by log-likelihood per character, another figure than acc: the header's "counted" list
    # is easy to read past, so a task counted that way without being asked for says so in a note of its own
    switched = [f"{t}: counted {m} (length-normalised), not acc: the task logs no 0/1 `acc` on every sample; pass "
                f"--metric to choose the metric yourself" for t, m in sorted(cmp.before.metric.items())
                if args.metric is None and t in cmp.match_by and m.endswith("acc_norm")]
    if args.json:
        out = cmp.to_dict()
        out["notes"] = [*out.get("notes", []), *switched]
        print(strict_json(out, indent=1, ensure_ascii=False))
        return 0
    for label, side in (("before", cmp.before), ("after", cmp.after)):
        what = f"{side.format} {side.version}" if side.version else side.format
        print(f"{label + ':':<8}{side.path}  ({what}{', model ' + side.model if side.model else ''})")
    hows = sorted(set(cmp.match_by.values()))
    print(f"matched {len(cmp.matched)} samples of {len(cmp.match_by)} task(s) by {' / '.join(hows)}; "
          f"counted: {', '.join(f'{t} {m}' for t, m in sorted(cmp.before.metric.items()) if t in cmp.match_by)}")
    for note in dict.fromkeys(switched + cmp.before.notes + cmp.after.notes + cmp.notes):
        print(f"  note: {note}")
    for label, tasks in (("before", cmp.tasks_only_before), ("after", cmp.tasks_only_after)):
        if tasks:
            print(f"  tasks only {label} (not compared): {', '.join(tasks)}")
    for label, only in (("before", cmp.only_before), ("after", cmp.only_after)):
        if only:
            per = Counter(s.task for s in only)
            print(f"  samples only {label} (not compared): {len(only)} ({', '.join(f'{t}: {n}' for t, n in sorted(per.items()))}); "
                  "--json lists them")
    print()
    print(format_report(cmp.report, label="task"))
    if cmp.by_group:
        print("\nby lm-eval group (a task outside any group stands for itself):\n")
        print(format_report(cmp.by_group, label="group", footer=False))
    flips = cmp.flips
    if flips and args.flips:
        print(f"\nflipped samples ({len(flips)}; first {min(args.flips, len(flips))}):")
        for f in flips[: args.flips]:
            doc = f"doc {f['doc_id']}" if f["doc_id"] else Path(f["where"]).name  # older lighteval: no ids, the row
            print(f"  {f['direction']}  {f['task']} {doc}  {_cut(f['question'])!r}  before: {_cut(f['before'], 30)!r}  "
                  f"after: {_cut(f['after'], 30)!r}  gold: {_cut(f['gold'], 30)!r}")
    return 0


def _cut(text: str, width: int = 60) -> str:
    """One line of at most `width` characters (the full text is in --json)."""
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def cmd_report(args: argparse.Namespace) -> int:
    from .report import make_report

    print(make_report(args.output_dir, args.output))
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    import time

    from .watch import SidecarError, Watcher

    report_to = [b.strip() for b in args.report_to.split(",") if b.strip()] if args.report_to is not None else None
    t0, said = time.monotonic(), False
    while True:
        try:
            watcher = Watcher(args.output_dir, device=args.device, report_to=report_to,
                              into_trainer_run=args.into_trainer_run, batch_size=args.batch_size, engine=args.engine,
                              robustness=args.robustness, robust_per_suite=args.robust_per_suite)
            break
        except SidecarError as e:
            # started beside a training run that has not written its manifest yet: wait for it (not with --once)
            if args.once or (args.timeout is not None and time.monotonic() - t0 > args.timeout):
                raise
            if not said:
                print(f"forgetwatch watch: waiting for training to start ({e})", file=sys.stderr, flush=True)
                said = True
            time.sleep(args.poll)
    n = watcher.run(once=args.once, poll_seconds=args.poll, timeout=args.timeout)
    print(f"forgetwatch watch: scored {n} checkpoint(s); record: {watcher.monitor.record.root}")
    return 0


def cmd_interpolate(args: argparse.Namespace) -> int:
    from .budgets import Budget, parse_budget
    from .cache import BaseCache, make_cache_key
    from .interpolate import InterpolationError, alpha_grid, load_task_data
    from .models import model_identity

    # everything that can be refused is refused before a model is loaded
    alphas = alpha_grid(args.alphas, args.extrapolate)
    save_at = None
    if args.save_at:
        try:
            at = alpha_grid(args.save_at[0], args.extrapolate)
        except InterpolationError as e:
            raise InterpolationError(str(e).replace("--alphas", "--save-at")) from None
        if len(at) != 1:
            raise InterpolationError(f"--save-at {args.save_at[0]}: give one α to save the model at (e.g. --save-at 0.5 "
                                     "OUT), not a grid")
        save_at = (at[0], Path(args.save_at[1]))
        _check_save_at(save_at[1], {"--model": args.model, "--probes": args.probes, "--base": args.base,
                                    "--task-data": args.task_data, "--task-probes": args.task_probes,
                                    "--base-model": args.base_model})
        if save_at[1].exists() and not args.force:
            raise _exists(str(save_at[1]), "a directory or file", "--save-at ALPHA")
    if args.plot:
        try:
            import matplotlib  # noqa: F401  (an extra: known missing now, not after the scoring)
        except ImportError as e:
            raise ValueError(f"--plot {args.plot}: the plot is drawn with matplotlib, which cannot be imported ({e}): pip "
                             "install 'forgetwatch[report]', or leave out --plot") from None
    if args.plot and _check_output(args.plot, (".png",), "front.png", {"--probes": args.probes, "--base": args.base,
                                   "--task-data": args.task_data, "--model": args.model}, option="--plot") and not args.force:
        raise _exists(args.plot, "a file", "--plot")
    if args.task_max_length < 2:
        raise ValueError(f"--task-max-length {args.task_max_length}: an example needs at least 2 tokens to have a loss")
    task_rows = load_task_data(args.task_data, args.task_max_examples, args.task_split) if args.task_data else None
    task_probes = load_probes(args.task_probes, per_suite=args.task_per_suite, seed=args.seed) if args.task_probes else None
    if task_rows is not None and task_probes is not None:
        raise ValueError("give one task measure: --task-data (held-out loss) or --task-probes (accuracy), not both")
    probes = _load_probes(args)
    base = BaseCache.load(args.base)
    base.check(make_cache_key({}, probes, {}), ignore=("format", "model", "scoring"), path=args.base)
    base = base.for_probes(probes.ids, args.base)
    config, dtype, autocast = _scoring_config(args, base.key)
    budget = Budget(parse_budget(args.budget), "alert", args.budget_bound, probes.groups) if args.budget else None
    cached = base.key.get("model", {}).get("name_or_path")
    if args.base_model and cached and not _model_names(args.base_model) & _model_names(cached) and not args.allow_other_model:
        raise InterpolationError(f"{args.base} was made with {cached}, not with --base-model {args.base_model}: α = 0 would "
                                 "be scored as a drift from another model. Give the cache's own base (or make a cache with "
                                 "this one: forgetwatch cache --model ...), or pass --allow-other-model to go on")
    base_name = args.base_model or cached
    base_dir = _base_model_dir(base_name, args.base)
    if save_at is not None:
        _check_save_at(save_at[1], {"the base model's directory": str(base_dir)})
    model, tokenizer, setter = _interpolated_model(args.model, base_dir, dtype, args.device, base_name)
    built, now = base.key.get("model", {}).get("architecture"), model_identity(model)["architecture"]
    if built and now and built != now and not args.allow_other_model:
        raise InterpolationError(f"{args.base} was made with a {built}, and --model {args.model} is a {now}: not a fine-tune "
                                 "of that base (pass --allow-other-model to go on)")
    from .interpolate import setting_differences
    from .scoring import describe_precision

    differ = setting_differences(base_dir, model, tokenizer)
    if differ:
        print(f"forgetwatch interpolate: warning: every α is scored with the checkpoint's tokenizer and generation "
              f"settings (θ(α) ships with them), and they differ from the base's in {'; '.join(differ)}: α = 0 is the "
              "base's weights under them, so its figures need not be zero (the cache scored the base under its own)",
              file=sys.stderr)
    # the cache's scoring settings (template, precision, ...) against this model's, before any scoring
    before = config.key(tokenizer, describe_precision(model, autocast=autocast))
    base.check(make_cache_key(model_identity(model), probes, before), ignore=("model",), path=args.base)
    task_pairs = None
    if task_rows is not None:  # every row encoded now, so that a row the model cannot read is refused before scoring
        from .interpolate import encode_task_rows

        task_pairs = encode_task_rows(tokenizer, task_rows, args.task_max_length, source=args.task_data)

    from .monitor import figure_rows

    steps = []
    for i, alpha in enumerate(alphas):
        setter.set(alpha)
        print(f"α = {alpha:g} ({i + 1} of {len(alphas)})", file=sys.stderr, flush=True)
        results, scoring_key = _score(args, probes, config, dtype, autocast, loaded=(model, tokenizer))[1:]
        if i == 0 and scoring_key != before:  # as checked above, unless scoring settled something the key names
            base.check(make_cache_key(model_identity(model), probes, scoring_key), ignore=("model",), path=args.base)
        rows = figure_rows(probes, base.results, results)[2]
        task = None
        if task_pairs is not None:
            from .interpolate import held_out_loss

            task = held_out_loss(model, tokenizer, task_pairs, batch_size=config.batch_size)
        elif task_probes is not None:
            task = _score(args, task_probes, config, dtype, autocast, loaded=(model, tokenizer))[1].accuracy
        breaches = budget.check(rows) if budget is not None else []
        missing = [name for name, row in rows.items() if row.get("missing")]
        steps.append({"alpha": alpha, "metrics": rows, "task": task, "breaches": [b.describe() for b in breaches],
                      "within_budget": None if budget is None else not breaches and not missing})
    task_kind = "loss" if task_rows is not None else "accuracy" if task_probes is not None else None
    chosen = _choose_alpha(steps, task_kind, budget is not None)
    # the figures first: a plot or a model that cannot be written must not take the scoring with it
    if args.json:
        print(strict_json({"model": args.model, "base": args.base, "base_model": str(base_dir), "task": task_kind,
                           "budget": budget.to_dict() if budget else None, "chosen_alpha": chosen, "alphas": steps}, indent=1))
    else:
        print(format_interpolation(steps, task_kind))
        if budget is not None:
            print(f"\nwithin budget {', '.join(f'{k}={v:g}' for k, v in budget.to_dict()['limits'].items())}: "
                  + (f"α = {chosen:g} (" + ("the best task measure among those within" if task_kind else "the largest")
                     + ")" if chosen is not None else "no α (even the base is over it?)"))
    sys.stdout.flush()
    if args.plot:
        _plot_interpolation(steps, task_kind, args.plot, chosen)
    if save_at is not None:
        # θ(α) is written from the two directories, not from the scoring model: let it go first (memory: one model)
        setter.release()
        del model
        gc.collect()
        setter.save(save_at[0], save_at[1], tokenizer)
        print(f"wrote the model at α = {save_at[0]:g} to {save_at[1]}", file=sys.stderr)
    return 0


def _check_save_at(out: Path, inputs: dict[str, str | None]) -> None:
    """Refuse a `--save-at` directory that is an input or holds one (the old one is removed when the new is in place,
    even with --force), or whose parent cannot be written: before any model is loaded, not after the scoring."""
    for flag, given in inputs.items():
        if not given or not Path(given).exists():  # a model name, not a path: nothing on this disk to lose
            continue
        given_path = Path(given)
        if _same_file(out, given_path) or (out.exists() and out.resolve() in given_path.resolve().parents):
            raise ValueError(f"--save-at {out}: {'is' if _same_file(out, given_path) else 'holds'} {flag} ({given}); "
                             "writing the model there would remove it. Choose another directory (this is refused even "
                             "with --force)")
    parent = out.absolute().parent
    if not parent.is_dir():
        raise ValueError(f"--save-at {out}: the directory {parent} does not exist. Create it first (mkdir -p "
                         f"{quote(parent)}) or choose another place")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--save-at {out}: cannot write in {parent}; choose another place")


def _base_model_dir(name: str | None, cache: str) -> Path:
    """The base model's local directory (its weights are streamed from there)."""
    from .models import check_model_path, smollm2_path

    if not name:
        raise ValueError(f"{cache} does not say which model it was made with: pass --base-model")
    if name == "smollm2":
        return smollm2_path()
    local = check_model_path(name)
    if local is not None:
        return local
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt"]))


def _interpolated_model(path: str, base_dir: Path, dtype: str, device: str | None, base_name: str | None = None):
    """(model, tokenizer, setter): the checkpoint loaded once, and what moves it along α (weights, or a LoRA's scale)."""
    from .interpolate import InterpolationError, Interpolator, LoraScaler, check_lora_config
    from .models import check_model_path, load_checkpoint, load_model

    directory = check_model_path(path)
    if directory is None:
        raise InterpolationError(f"--model {path}: interpolate reads a local checkpoint directory")
    adapter = directory / "adapter_config.json"
    if adapter.is_file():
        config = json.loads(adapter.read_text(encoding="utf-8"))
        check_lora_config(config, adapter)
        said = config.get("base_model_name_or_path") or ""
        if not _model_names(said) & (_model_names(str(base_dir)) | _model_names(base_name or "")):
            raise InterpolationError(f"{adapter}: the adapter was trained on {said or 'an unnamed base'}, not on the base "
                                     f"model {base_dir}: interpolate an adapter toward its own base (--base-model, or a cache "
                                     "made with that model)")
        model, tokenizer = load_checkpoint(directory, dtype=dtype, device=device)
        return model, tokenizer, _Setter(LoraScaler(model), base_dir, directory)
    model, tokenizer = load_model(str(directory), dtype=dtype, device=device)
    return model, tokenizer, _Setter(Interpolator(model, base_dir, directory), base_dir, directory)


def _model_names(name: str) -> set[str]:
    """The spellings of one model: as given and resolved; `smollm2` and the checkpoint it converts to are one."""
    from .models import local_model_path, smollm2_path

    if not name:
        return set()
    names = {name, local_model_path(name)}
    if name == "smollm2":
        names.add(local_model_path(str(smollm2_path())))
    return names


class _Setter:
    """Moves the scoring model along α, and writes θ(α) at the checkpoint's own precision (not the scoring one)."""

    def __init__(self, inner, base_dir: Path, tuned_dir: Path):
        from .interpolate import LoraScaler

        self.inner, self.base_dir, self.tuned_dir = inner, base_dir, tuned_dir
        self.lora = isinstance(inner, LoraScaler)

    def set(self, alpha: float) -> None:
        self.inner.set(alpha)

    def release(self) -> None:
        """Drop the scoring model (`save` does not need it)."""
        self.inner = None

    def save(self, alpha: float, out: Path, tokenizer) -> None:
        import shutil

        from .interpolate import save_interpolated, save_lora_merged

        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        if tmp.exists():
            shutil.rmtree(tmp)
        try:
            if self.lora:  # a LoRA at α: merged into the base's full weights
                save_lora_merged(self.base_dir, self.tuned_dir, alpha, tmp)
            else:
                save_interpolated(self.base_dir, self.tuned_dir, alpha, tmp)
            tokenizer.save_pretrained(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        tmp.rename(out)


def _choose_alpha(steps: list[dict[str, Any]], task_kind: str | None, budgeted: bool) -> float | None:
    """Among the α within budget: the best task measure (lowest loss, highest accuracy), else the largest α."""
    if not budgeted:
        return None
    ok = [s for s in steps if s["within_budget"]]
    if not ok:
        return None
    if task_kind is None or any(s["task"] is None or s["task"] != s["task"] for s in ok):
        return max(s["alpha"] for s in ok)
    sign = 1 if task_kind == "loss" else -1
    return min(ok, key=lambda s: (sign * s["task"], -s["alpha"]))["alpha"]


def format_interpolation(steps: list[dict[str, Any]], task_kind: str | None) -> str:
    """One row per α: forgetting, backward transfer and accuracy of the knowledge probes, behaviour where there is some,
    and the task measure."""
    first = steps[0]["metrics"]
    group = "all_knowledge" if "all_knowledge" in first else "overall"
    behaviour = "all_behavior" if "all_behavior" in first else None
    head = f"{'α':>6}{'F':>8}{'F adj':>8}{'BT':>8}{'acc':>8}"
    if behaviour:
        head += f"{'instr.':>9}{'runaway':>9}{'refused':>9}"
    if task_kind:
        head += f"{'task ' + task_kind:>15}"
    if steps[0]["within_budget"] is not None:
        head += f"{'budget':>9}"
    lines = [head, "-" * len(head)]
    for s in steps:
        m = s["metrics"][group]
        line = (f"{s['alpha']:>6g}{_num(m.get('forgetting')):>8}{_num(m.get('forgetting_adjusted')):>8}"
                f"{_num(m.get('backward_transfer')):>8}{_num(m.get('accuracy_post')):>8}")
        if behaviour:
            b = s["metrics"][behaviour]
            line += f"{_num(b.get('instruct_compliance')):>9}{_num(b.get('runaway_rate')):>9}{_num(b.get('over_refusal_rate')):>9}"
        if task_kind:
            line += f"{_num(s['task']):>15}"
        if s["within_budget"] is not None:
            line += f"{'within' if s['within_budget'] else 'over':>9}"
        lines.append(line)
    what = "knowledge probes" if group == "all_knowledge" else "all probes"
    lines.append(f"F, F adj, BT, acc: {what}, each against the base cache (α = 0 is the base, α = 1 the checkpoint)"
                 + ("; instr.: instructions followed, runaway: answers that hit the token limit, refused: harmless requests "
                    "refused" if behaviour else "")
                 + ("; task loss: nats per answer token on --task-data (lower is better)" if task_kind == "loss" else "")
                 + ("; task accuracy: on --task-probes" if task_kind == "accuracy" else ""))
    return "\n".join(lines)


def _plot_interpolation(steps: list[dict[str, Any]], task_kind: str | None, path: str, chosen: float | None) -> None:
    """Forgetting (chance-adjusted where it exists) against the task measure, one point per α, the Pareto front joined."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from ._io import atomic_write

    group = "all_knowledge" if "all_knowledge" in steps[0]["metrics"] else "overall"
    adjusted = bool(steps[0]["metrics"][group].get("adjusted"))
    key = "forgetting_adjusted" if adjusted else "forgetting"
    xs = [s["task"] if task_kind else s["alpha"] for s in steps]
    ys = [s["metrics"][group].get(key) for s in steps]
    fig = Figure(figsize=(6.5, 4.5), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(xs, ys, "o-", color="tab:red", alpha=0.35)
    better = (lambda a, b: a <= b) if task_kind == "loss" else (lambda a, b: a >= b)
    front = [i for i in range(len(steps)) if not any(
        j != i and better(xs[j], xs[i]) and ys[j] <= ys[i] and (xs[j], ys[j]) != (xs[i], ys[i]) for j in range(len(steps)))]
    ax.plot([xs[i] for i in front], [ys[i] for i in front], "o", color="tab:red", markersize=8, label="Pareto front")
    for s, x, y in zip(steps, xs, ys, strict=True):
        ax.annotate(f"α={s['alpha']:g}" + (" (chosen)" if s["alpha"] == chosen else ""), (x, y), fontsize=8,
                    textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel({"loss": "task loss (nats per answer token, lower is better)", "accuracy": "task accuracy"}.get(task_kind, "α"))
    ax.set_ylabel(("chance-adjusted " if adjusted else "") + "forgetting since base")
    ax.set_title("Interpolation toward the base: forgetting against the task")
    ax.legend(fontsize="small", frameon=False)
    FigureCanvasAgg(fig)
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png", dpi=110)


def _compare_plan(args: argparse.Namespace, probes: ProbeSet, key: dict[str, Any], mcq_mode: str):
    """The variants `compare` scores: --robustness as given (0: none), else the base cache's (so both sides match)."""
    robustness, per_suite = args.robustness, args.robust_per_suite
    if robustness == 0:  # the cache's variants left aside: its probes' own rows serve
        if per_suite is not None:
            raise ValueError("--robust-per-suite says how many probes get variants, and --robustness 0 scores none: drop one")
        return None
    found = key.get("variants") if isinstance(key.get("variants"), dict) else None
    if robustness is None and found is not None:
        robustness, per_suite = found.get("k"), per_suite if per_suite is not None else found.get("per_suite")
    return _cli_plan(probes, robustness, per_suite, mcq_mode)


def _cli_plan(probes: ProbeSet, robustness: int | None, per_suite: int | None, mcq_mode: str):
    """`make_plan`, its refusals in the command line's words (--robustness, not `robustness`)."""
    try:
        return make_plan(probes, robustness, per_suite, mcq_mode)
    except ValueError as e:
        text = str(e)
        for name, flag in (("robust_per_suite", "--robust-per-suite"), ("robustness", "--robustness")):
            text = text.replace(f"`{name}`", flag).replace(f"{name}=", f"{flag} ")
        raise type(e)(text) from None


def _robust_compare(plan, probes: ProbeSet, base, results, variants, report: dict) -> tuple[dict, list[dict[str, Any]]]:
    """`compare`'s robust figures by group (as metrics.jsonl has them) and the fragile flips since base."""
    import numpy as np

    from .metrics import mark_missing
    from .robust_metrics import fragile_changes, robust_rows

    pre, now = plan.outcomes(base.results, base.variants), plan.outcomes(results, variants)
    index = np.array([probes.index_of(pid) for pid in pre.ids], np.int64)
    categories = np.array([p.category for p in probes])
    groups = {"overall": np.ones(len(index), bool)}
    groups.update({name: np.asarray(mask, bool)[index] for name, mask in probes.kind_groups().items()})
    groups.update({c: categories[index] == c for c in report if c not in groups})
    rows = robust_rows(pre, now, groups, plan.lettered)
    # a variant scored NaN / inf blanks its groups' robust figures only (as in a run's record): the probes as asked
    # have their answers, and the plain comparison above stands
    bad = pre.nonfinite.any(1) | now.nonfinite.any(1)
    if bad.any():
        where = " and ".join(w for w, m in (("the base cache", pre.nonfinite.any()), ("the model", now.nonfinite.any())) if m)
        mark_missing(rows, bad, groups.__getitem__, [pre.ids[int(i)] for i in np.flatnonzero(bad)],
                     field="robust_missing", what=f"have a variant scored NaN or inf by {where}",
                     count="nonfinite_variant_probes")
        print(f"forgetwatch: warning: {int(bad.sum())} probes have variants scored NaN or inf by {where}: their groups' "
              "robust figures are missing. Score in float32 (--dtype float32 --autocast none"
              + (", and make the cache again so" if pre.nonfinite.any() else "") + ") to have them", file=sys.stderr)
    fragile = []
    for r, kind in fragile_changes(pre, now):
        p = probes[int(index[r])]
        fragile.append({"id": p.id, "category": p.category, "direction": kind, "question": p.question,
                        "gold": p.gold_text, "base_prediction": base.results.prediction[int(index[r])],
                        "prediction": results.prediction[int(index[r])]})
    return rows, fragile


def format_robust(rows: dict[str, dict[str, Any]]) -> str:
    """`compare`'s robustness table: one row per group that has robust probes, overall last."""
    w = max([22] + [len(k) + 2 for k in rows])
    lettered = any("position_bias_pre" in r for r in rows.values())
    head = (f"{'group':<{w}}{'n':>6}{'robust base':>13}{'robust now':>12}{'robust F':>10}{'consist. base':>15}"
            f"{'now':>7}{'change':>8}{'fragile':>9}" + (f"{'pos. bias base':>16}{'now':>7}" if lettered else ""))
    lines = [head, "-" * len(head)]
    for name in [k for k in rows if k != "overall"] + ["overall"]:
        r = rows[name]
        if name == "overall":
            lines.append("-" * len(head))
        change = r["consistency_change"]
        line = (f"{name:<{w}}{r['robust_n']:>6}{_num(r['robust_accuracy_pre']):>13}{_num(r['robust_accuracy_post']):>12}"
                f"{_num(r['robust_forgetting']):>10}{_num(r['consistency_pre']):>15}{_num(r['consistency_post']):>7}"
                f"{'n/a' if change != change else f'{change:+.3f}':>8}{_count(r['fragile']):>9}")
        if lettered:
            line += f"{_num(r.get('position_bias_pre')):>16}{_num(r.get('position_bias_post')):>7}"
        lines.append(line)
    lines += [f"{name}: robust figures missing: {r['robust_missing']}" for name, r in rows.items() if r.get("robust_missing")]
    lines.append("robust: right in every variant; robust F: of those robust at base, the share no longer robust; consist.: "
                 "share of variants right; fragile: robust at base, right as asked, wrong in some variant now"
                 + ("; pos. bias: distance of the chosen letters from the gold letters' distribution (0: none)" if lettered else ""))
    return "\n".join(lines)


def _num(v: Any) -> str:
    return "n/a" if v is None or (isinstance(v, float) and v != v) else f"{v:.3f}"


def _count(v: Any) -> str:
    return "n/a" if v is None or (isinstance(v, float) and v != v) else str(int(v))


def _flips(probes: ProbeSet, pre, post) -> list[dict[str, Any]]:
    out = []
    for i, p in enumerate(probes):
        a, b = int(pre.outcome[i]) == 1, int(post.outcome[i]) == 1
        if a != b:
            out.append({
                "id": p.id, "category": p.category, "direction": "1→0" if a else "0→1", "question": p.question,
                "gold": p.gold_text, "base_prediction": pre.prediction[i], "prediction": post.prediction[i],
            })
    return out


def format_report(report: dict, label: str = "category", footer: bool = True) -> str:
    """A fixed-width table, one row per category (or task) and one for all probes; `footer`: the net change, McNemar
    and what the columns mean (the nothing-to-forget mark is explained either way)."""
    w = max([22] + [len(k) + 4 for k in report])  # mmlu subtasks and lighteval's suite|task|k are long
    head = f"{label:<{w}}{'n':>6}{'acc base':>10}{'acc now':>9}{'1→0':>6}{'0→1':>6}{'F':>8}{'F adj':>8}{'F 95% CI':>16}{'BT':>8}{'BT adj':>8}{'invalid':>9}"
    lines = [head, "-" * len(head)]
    names = [k for k in report if k != "overall"] + ["overall"]
    for name in names:
        m = report[name]
        ci = f"[{m.forgetting_ci[0]:.3f}, {m.forgetting_ci[1]:.3f}]"
        adj = (lambda v: f"{v:.3f}") if m.adjusted else (lambda v: "n/a")
        if name == "overall":
            lines.append("-" * len(head))
        row = f"{name} *" if m.nothing_to_forget and name != "overall" else name
        lines.append(
            f"{row:<{w}}{m.n:>6}{m.accuracy_pre:>10.3f}{m.accuracy_post:>9.3f}{m.forgotten:>6}{m.learned:>6}"
            f"{m.forgetting:>8.3f}{adj(m.forgetting_adjusted):>8}{ci:>16}{m.backward_transfer:>8.3f}"
            f"{adj(m.backward_transfer_adjusted):>8}{m.invalid_rate_post:>9.3f}"
        )
    overall = report["overall"]
    if footer:
        lines.append(f"\nnet change {overall.net_change:+.3f} (= BT − F); McNemar exact p = {overall.mcnemar_p:.3g}")
        lines.append("F adj / BT adj subtract flips expected from guessing among each item's own k options; short-answer and generative items have no chance term (n/a).")
    nothing = [k for k in names if k != "overall" and report[k].nothing_to_forget]
    if nothing:
        lines.append(f"* nothing to forget ({', '.join(nothing)}): the base model knew nothing there beyond chance "
                     "(chance-corrected base accuracy 0, or fewer than 2 and under 2% of short answers right); only backward transfer can show.")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
