"""`forgetwatch watch` (a training run's checkpoints scored beside it) and `forgetwatch report` (plots and a page from a
run's record)."""

from __future__ import annotations

import argparse
import sys

from ..options import add_flag
from ..record.store import load_record
from ..report.render import incomplete, make_report, summarize_run
from ..run.watcher import SidecarError, Watcher
from .common import device


def add_report(sub) -> None:
    """`report`."""
    r = sub.add_parser("report", help="plots and an HTML page from a training run's local record (no W&B needed)")
    r.add_argument("output_dir", help="the trainer's output_dir (or its forgetwatch/ folder)")
    r.add_argument("-o", "--output", default=None, help="directory to write to (default: <output_dir>/forgetwatch/report/)")
    r.set_defaults(func=cmd_report)


def add_watch(sub) -> None:
    """`watch`."""
    w = sub.add_parser("watch", help="score a training run's checkpoints beside it (the callback with scoring='sidecar')")
    w.add_argument("output_dir", help="the trainer's output_dir")
    w.add_argument("--once", action="store_true", help="score the checkpoints already there, then exit")
    w.add_argument("--device", type=device, default=None, help="where to score: cuda:1, cpu, ... (default: cuda when available)")
    w.add_argument("--poll", type=float, default=10.0, help="seconds between looks for new checkpoints (default 10)")
    w.add_argument("--timeout", type=float, default=None, help="give up after this many seconds (default: when training ends)")
    w.add_argument("--report-to", default=None,
                   help="comma-separated: wandb, tensorboard, trackio, none (default: the trainer's report_to)")
    w.add_argument("--into-trainer-run", action="store_true",
                   help="after training has ended, log into the trainer's own W&B run instead of a run beside it")
    w.add_argument("--rescore", type=training_step, default=None, metavar="STEP",
                   help="score this step again from its checkpoint (its evaluation file damaged): its files in the record "
                        "are set aside under forgetwatch/superseded/ (never deleted) and checkpoint-STEP is scored into "
                        "the record in step order; implies --once; refused, touching nothing, without checkpoint-STEP")
    add_flag(w, "batch_size", default=None, note=" (default: the run's)")
    add_flag(w, "engine", default=None, note=" (default: the run's)")
    add_flag(w, "robustness", default=None, metavar="K",
             note=" (default: the run's); the record's base cache must hold the same variants")
    add_flag(w, "robust_per_suite", default=None, metavar="N", note=" (default: the run's)")
    add_flag(w, "probe_change", default=None, note=" (default: the run's). For the watcher: the record's probes.jsonl "
             "is not the probe set its evaluations were scored on (replaced after them).")
    w.set_defaults(func=cmd_watch)


def cmd_report(args: argparse.Namespace) -> int:

    print(make_report(args.output_dir, args.output))  # the page's path first: `forgetwatch report DIR | head -1`
    print(summarize_run(args.output_dir))  # the rewind's line, when the run has one, last
    if lost := incomplete(load_record(args.output_dir)):
        # a script must not take a record that stops short for a whole one
        print(f"forgetwatch report: the record is incomplete ({len(lost)} step(s) could not be written; the summary "
              "says which): its figures end before training did", file=sys.stderr)
        return 1
    return 0


def training_step(text: str) -> int:
    """--rescore's STEP: a training step (1 or more); 0 is the base's evaluation, which is never scored again."""
    try:
        step = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a step is a whole number (an evaluation step of the record)") from None
    if step == 0:
        raise argparse.ArgumentTypeError("0 is the base's evaluation (the base cache), which is never scored again: give "
                                          "a training step the record evaluated")
    if step < 0:
        raise argparse.ArgumentTypeError(f"{step}: a step is a whole number of at least 1 (an evaluation step of the record)")
    return step


def cmd_watch(args: argparse.Namespace) -> int:
    try:
        return _watch(args)
    except KeyboardInterrupt:  # Ctrl-C: the user's choice, not a failure to show as a traceback
        print("forgetwatch watch: interrupted; the record keeps every evaluation committed before it (an unfinished one "
              "is set aside and scored again): run the same command again to go on", file=sys.stderr)
        return 130  # 128 + SIGINT, as a shell reports it


def _watch(args: argparse.Namespace) -> int:
    import time


    report_to = [b.strip() for b in args.report_to.split(",") if b.strip()] if args.report_to is not None else None
    t0, said = time.monotonic(), False
    while True:
        try:
            watcher = Watcher(args.output_dir, device=args.device, report_to=report_to,
                              into_trainer_run=args.into_trainer_run, batch_size=args.batch_size, engine=args.engine,
                              robustness=args.robustness, robust_per_suite=args.robust_per_suite,
                              probe_change=args.probe_change, rescore=args.rescore)
            break
        except SidecarError as e:
            # started beside a training run that has not written its manifest yet: wait for it (not with --once)
            if args.once or args.rescore is not None or (args.timeout is not None and time.monotonic() - t0 > args.timeout):
                raise
            if not said:
                print(f"forgetwatch watch: waiting for training to start ({e})", file=sys.stderr, flush=True)
                said = True
            time.sleep(args.poll)
    n = watcher.run(once=args.once or args.rescore is not None, poll_seconds=args.poll, timeout=args.timeout)
    print(f"forgetwatch watch: scored {n} checkpoint(s); record: {watcher.monitor.record.root}")
    if skipped := watcher.unscored():
        # a script that runs `watch --once` must not take a record with holes for a whole one
        print(f"forgetwatch watch: {len(skipped)} checkpoint(s) could not be scored and are missing from the record "
              f"(step {', '.join(map(str, skipped))}; why: the warnings above). Mend or replace them and run the same "
              "command again: it scores what the record lacks", file=sys.stderr)
        return 1
    return 0
