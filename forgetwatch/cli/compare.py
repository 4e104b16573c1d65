"""`forgetwatch compare`: a checkpoint scored and compared probe by probe with the base cache, or two lm-eval / lighteval
per-sample outputs compared (BEFORE AFTER). The figures are the library's (`forgetwatch.measures.metrics`, `.behavior`,
`.monitor`): a run's record holds the same."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from .._io import strict_json
from ..measures.metrics import compute_report, format_report
from ..measures.robustness import variant_outcomes
from ..measures.samples import compare_samples
from ..probes.probe_set import ProbeSet
from ..record.cache import BaseCache, make_cache_key
from ..run.rows import add_robust_figures, flip_rows, fragile_flip_rows
from ..scoring.models import check_model_path, model_identity
from .common import (
    check_output,
    exists_error,
    first_ids,
    follow_link,
    model_args,
    read_base,
    read_probes,
    robust_plan,
    save_results,
    score,
    scoring_args,
    scoring_config,
)


def add_compare(sub) -> None:
    """`compare`."""
    m = sub.add_parser(
        "compare", help="score a checkpoint and compare it probe by probe with the base cache, or compare two "
        "lm-eval / lighteval per-sample outputs",
        usage="%(prog)s --model CHECKPOINT --probes PROBES --base BASE [options]\n"
              "       %(prog)s BEFORE AFTER [--json] [--metric M] [--filter F] [--match {auto,hash,id}]")
    m.add_argument("runs", nargs="*", metavar="BEFORE AFTER",
                   help="two lm-evaluation-harness --log_samples outputs (directories or samples_*.jsonl) or two lighteval "
                        "details (directories or details_*.parquet), before and after post-training; no model is loaded")
    model_args(m, required=False)
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
    scoring_args(m, defaults=False)
    m.set_defaults(func=cmd_compare)


def cmd_compare(args: argparse.Namespace) -> int:
    if args.runs:
        return cmd_compare_samples(args)
    missing = [f"--{n}" for n in ("model", "probes", "base") if getattr(args, n) is None]
    if missing:
        raise ValueError(f"compare needs {', '.join(missing)} (a checkpoint scored against a base cache), "
                         "or two per-sample outputs: forgetwatch compare BEFORE AFTER")

    if args.output is not None:
        args.output = follow_link(args.output)
        inputs = {"--base": args.base, "--probes": args.probes}
        if check_output(args.output, (".parquet", ".jsonl"), "checkpoint.parquet", inputs) and not args.force:
            raise exists_error(args.output, "per-probe results")
    probes = read_probes(args)
    if args.model != "smollm2":
        check_model_path(args.model)
    base = read_base(args.base, probes)
    config, dtype, autocast = scoring_config(args, base.key)
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
    model, results, scoring_key = score(args, plan.scored() if plan else probes, config, dtype, autocast,
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
            save_results(BaseCache(key, results, None, variants), args.output, args.force)
        except OSError as e:
            unsaved = e  # said after the report, which is printed all the same

    pre = base.results
    bad = pre.nonfinite_mask() | results.nonfinite_mask()
    if bad.any():  # argmax over NaN picks an option as if it were an answer: no figure is better than a wrong one
        if unsaved is not None:
            raise unsaved
        raise ValueError(f"{int(bad.sum())} of {len(probes)} probes scored NaN or inf (first: "
                         f"{', '.join(first_ids(probes, bad))}): {'the base cache' if pre.nonfinite_mask().any() else args.model}"
                         "'s outputs overflowed or are not numbers, so the comparison cannot be computed. Score in float32 "
                         "(--dtype float32 --autocast none), or check the model's weights")
    report = compute_report(pre.outcome, results.outcome, [p.num_choices for p in probes], [p.category for p in probes],
                            probes.kind_groups())
    flips = flip_rows(probes, pre, pre, results)
    behavior = None
    if (pre.stopped >= 0).any():  # generated answers: how they behave since base (stopping, length, refusals)
        from ..measures.behavior import compute_behavior

        behavior = compute_behavior(pre, results, [p.category for p in probes], [p.kind for p in probes], probes.kind_groups())
    robust_rows_, fragile = None, []
    if plan is not None:
        robust_rows_, fragile = _robust_figures(plan, probes, base, results, variants, report)
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
        from ..measures.behavior import format_behavior

        print("\nbehaviour since base (generated answers, each against the same probe's answer at base):")
        print(format_behavior(behavior))
    if robust_rows_ is not None:
        from ..measures.robustness import format_robust

        print(f"\nrobustness since base ({plan.k} variants of each of {robust_rows_['overall']['robust_n']} probes, each "
              "against the same probe's variants at base):")
        print(format_robust(robust_rows_))
    if flips and args.flips:
        print(f"\nflipped probes ({len(flips)}; first {min(args.flips, len(flips))}):")
        for f in flips[: args.flips]:
            print(
                f"  {f['direction']}  {f['id']}  [{f['category']}]  base: {f['base_prediction']!r}  now: {f['prediction']!r}  "
                f"gold: {f['gold']!r}"
            )
    if unsaved is not None:
        raise unsaved
    return 0


def cmd_compare_samples(args: argparse.Namespace) -> int:

    if len(args.runs) != 2:
        raise ValueError(f"compare takes two per-sample outputs, BEFORE and AFTER; got {len(args.runs)}: {' '.join(args.runs)}")
    given = [f"--{n}" for n in ("model", "probes", "base", "output") if getattr(args, n) is not None]
    if given:
        raise ValueError(
            f"{', '.join(given)} score a model; with two per-sample outputs (BEFORE AFTER) nothing is scored: drop them"
        )
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
            print(
                f"  samples only {label} (not compared): {len(only)} ({', '.join(f'{t}: {n}' for t, n in sorted(per.items()))}); "
                "--json lists them"
            )
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
    return robust_plan(probes, robustness, per_suite, mcq_mode)


def _robust_figures(plan, probes: ProbeSet, base, results, variants, report: dict
                    ) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """`compare`'s robust figures by group (as metrics.jsonl has them: `add_robust_figures`) and the fragile flips
    since base (`fragile_flip_rows`)."""

    pre, now = variant_outcomes(plan, base.results, base.variants), variant_outcomes(plan, results, variants)
    where = " and ".join(w for w, m in (("the base cache", pre.nonfinite.any()), ("the model", now.nonfinite.any())) if m)
    rows: dict[str, dict[str, Any]] = {name: {} for name in dict.fromkeys(["overall", *probes.kind_groups(), *report])}
    # a variant scored NaN / inf blanks its groups' robust figures only (as in a run's record): the probes as asked
    # have their answers, and the plain comparison above stands
    bad = add_robust_figures(rows, probes, pre, now, plan.lettered, what=f"have a variant scored NaN or inf by {where}")
    if bad:
        print(f"forgetwatch: warning: {bad} probes have variants scored NaN or inf by {where}: their groups' "
              "robust figures are missing. Score in float32 (--dtype float32 --autocast none"
              + (", and make the cache again so" if pre.nonfinite.any() else "") + ") to have them", file=sys.stderr)
    return {name: row for name, row in rows.items() if row}, fragile_flip_rows(probes, base.results, pre, pre, now, results)
