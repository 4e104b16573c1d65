"""`forgetwatch cache` (the base model scored once, its per-probe results kept) and `forgetwatch base-outputs` (the base
model's own answers to a replay pool)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..measures.noise import NoiseFloor
from ..measures.robustness import variant_outcomes
from ..options import count
from ..probes.probe_set import ProbeSet
from ..probes.suites import is_probe_file, load_probes
from ..record.cache import BaseCache, CacheMismatchError, make_cache_key
from ..remedies.base_outputs import make_base_outputs
from ..scoring.models import check_model_path, load_model, local_model_path, model_identity
from ..scoring.weights import weights_fingerprint
from .common import (
    check_output,
    device,
    first_ids,
    follow_link,
    model_args,
    open_model,
    read_probes,
    robust_plan,
    save_results,
    score,
    scoring_args,
    scoring_config,
)


def add_cache(sub) -> None:
    """`cache`."""
    c = sub.add_parser("cache", help="score the base model once and store its per-probe results")
    model_args(c)
    c.add_argument("-o", "--output", required=True,
                   help="cache file to write (.parquet or .jsonl), checked before anything is scored. An existing file is "
                        "never replaced unless --force: if it already holds the cache this command would write (same "
                        "model, probes and scoring key) nothing is scored and it is kept (exit 0); any other file is "
                        "refused, saying what differs")
    c.add_argument("--force", action="store_true", help="score again and replace the -o file if it exists")
    c.add_argument("--hash-weights", action="store_true",
                   help="put a hash of every weight in the cache key (reads every weight). Without it the key holds the "
                        "weight files' sizes and sampled bytes, which tell other weights saved at the same path apart")
    scoring_args(c, defaults=True)
    c.set_defaults(func=cmd_cache)


def add_base_outputs(sub) -> None:
    """`base-outputs`."""
    bo = sub.add_parser("base-outputs", help="the base model's own answers to a replay pool, for self-distilled replay and "
                                              "the KL anchor (`--forgetwatch_replay_targets base`, `--forgetwatch_anchor_beta`)")
    bo.add_argument("--model", required=True, help="the base model: a local directory, a Hub id, or `smollm2`")
    bo.add_argument("--pool", required=True, help="suite names (`arc_easy:200,sciq:200`), a probe JSONL, or a JSONL of "
                                                  "unlabelled prompts ({\"prompt\": ..., \"category\": ...})")
    bo.add_argument("--exclude", default=None, help="the monitored probes (a probe file or suite names): never in the pool")
    bo.add_argument("--exclude-per-suite", default=None, metavar="N|all",
                    help="with suite names in --exclude: the run's forgetwatch_per_suite (the monitored probes are a sample)")
    bo.add_argument(
        "--exclude-seed", type=int, default=0, help="with suite names in --exclude: the run's forgetwatch_seed (default 0)"
    )
    bo.add_argument("-o", "--output", required=True, help="the file to write (.parquet); an existing one is never overwritten")
    bo.add_argument("--max-length", type=count, default=None, help="the trainer's max_length: longer prompts are refused")
    bo.add_argument("--max-new-tokens", type=count, default=128, help="generation budget of generated answers (default 128)")
    bo.add_argument("--top-k", type=count, default=20, help="log-probabilities kept per answer token (default 20)")
    bo.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or float16")
    bo.add_argument("--device", type=device, default=None, help="cuda, cpu, ... (default: cuda when available)")
    bo.set_defaults(func=cmd_base_outputs)


def cmd_cache(args: argparse.Namespace) -> int:
    from ..scoring.score import describe_precision

    args.output = follow_link(args.output)
    exists = check_output(args.output, (".parquet", ".jsonl"), "base.parquet", {"--probes": args.probes}) and not args.force
    probes = read_probes(args)
    if args.model != "smollm2":
        check_model_path(args.model)
    config, dtype, autocast = scoring_config(args)
    plan = robust_plan(probes, args.robustness, args.robust_per_suite, config.mcq_mode)
    variants_key = plan.key() if plan is not None else None
    old = _existing_cache(args.output, probes) if exists else None
    model, tokenizer = open_model(args, dtype)
    identity = model_identity(model, weights_hash=args.hash_weights)
    # the identity as a callback computes it (`model_identity`): a local path resolved, so ./base and /work/base match
    if args.model != "smollm2" and identity["name_or_path"] != local_model_path(args.model):
        identity["name_or_path"] = local_model_path(args.model)
        identity.pop("weights", None)  # the fingerprint goes with the name: the files of the path given
        if (fingerprint := weights_fingerprint(identity["name_or_path"])) is not None:
            identity["weights"] = fingerprint
    identity["revision"] = args.revision or identity["revision"]
    if old is not None:
        # the whole key is known before scoring: the same cache again is kept, anything else is refused
        key = make_cache_key(identity, probes, config.key(tokenizer, describe_precision(model, autocast=autocast)), variants_key)
        for note in _same_cache_or_refuse(old, key, args.output):
            print(f"forgetwatch: note: {note}", file=sys.stderr)
        print(f"{args.output} already holds this cache (same model, probes and scoring): nothing scored, nothing written; "
              "pass --force to score again and replace it")
        return 0
    model, results, scoring_key = score(args, plan.scored() if plan else probes, config, dtype, autocast,
                                        loaded=(model, tokenizer))
    variants = None
    if plan is not None:
        results, variants = plan.split(results)
    reference = None
    if scoring_key["precision"] != "float32":
        # the precision noise floor: the same base in fp32 without autocast, kept with the cache
        del model
        _, reference, _ = score(args, probes, config, "float32", None)
        floor = NoiseFloor.from_outcomes(results.outcome, reference.outcome)
        print(f"precision noise floor: {floor.count} of {len(probes)} probes change correctness between "
              f"{scoring_key['precision']} and float32")
    save_results(BaseCache(make_cache_key(identity, probes, scoring_key, variants_key), results, reference, variants),
                 args.output, replace=args.force)
    if plan is not None:
        robust = variant_outcomes(plan, results, variants)
        print(f"robustness: {len(robust.ids)} probes x {plan.k} variants; right in every variant: "
              f"{int(robust.right.all(1).sum())} ({robust.right.all(1).mean():.3f}), share of variants right "
              f"{robust.right.mean():.3f}")
    bad = results.nonfinite_mask()
    if bad.any():  # kept, flagged: every comparison against this base reports their groups' figures as missing
        print(f"forgetwatch: warning: {int(bad.sum())} of {len(probes)} probes scored NaN or inf with {args.model} under "
              f"{scoring_key['precision']} (first: {', '.join(first_ids(probes, bad))}); the figures of their groups "
              "will be missing in every comparison with this cache. Score in float32: --dtype float32 --autocast none",
              file=sys.stderr)
        print(f"scored {len(probes)} probes with {args.model}; wrote {args.output}")
        return 0
    print(f"scored {len(probes)} probes with {args.model}: accuracy {results.accuracy:.3f}; wrote {args.output}")
    return 0


def _existing_cache(path: str, probes: ProbeSet):
    """The cache already at `path`, refused (before the model is loaded) unless it is a readable cache of `probes`."""

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


def _same_cache_or_refuse(old, key: dict[str, Any], path: str) -> list[str]:

    try:
        notes = old.check(key, path=path)
    except CacheMismatchError as e:
        raise ValueError(f"-o {path} exists and holds a cache made under another key ({_differences(e)}); forgetwatch "
                         "never replaces a file without being asked: choose another -o, or pass --force to replace it") from None
    if old.reference is None and str(key["scoring"].get("precision", "float32")) != "float32":
        raise ValueError(f"-o {path} exists and holds this cache without the fp32 reference (the precision noise floor) "
                         "this command adds; pass --force to score again and replace it")
    return notes


def _differences(e: Exception) -> str:
    """The `name: cache has X, now Y` lines of a CacheMismatchError, on one line."""
    lines = [line.strip() for line in str(e).splitlines() if line.startswith("  ")]
    return "; ".join(lines) or str(e)


def _excluded(args: argparse.Namespace):
    """The monitored probes named by --exclude: a file, or suite names sampled as the run samples them."""

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

    args.output = follow_link(args.output)
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

