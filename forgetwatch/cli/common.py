"""What the commands share: the model and scoring options, the scoring config they make, scoring a model, and the
checks and writes of output files (never one replaced without --force, never an input)."""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

from ..commands import quote
from ..modes import ENGINES, MCQ_MODES, SHORT_MATCHES, SHORT_MODES
from ..probes import ProbeSet
from ..robustness import make_plan
from ..suites import load_probes

_CHAT = {"auto": None, "on": True, "off": False}


def model_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--model", required=required, help="a local model directory, a Hub id, or `smollm2` (the offline SmolLM2-135M-Instruct)")
    p.add_argument("--probes", required=required, help="a probe JSONL file, or comma-separated suite names")
    p.add_argument("--revision", default=None, help="Hub revision (branch, tag or commit)")
    p.add_argument("--device", default=None, help="cuda, cpu, ... (default: cuda when available)")


def scoring_args(p: argparse.ArgumentParser, defaults: bool, robustness: bool = True) -> None:
    # `compare` takes every scoring option from the base cache unless given, so both sides match. `robustness`: the
    # command scores variants (--robustness, --robust-per-suite); one that does not must not take them
    d = (lambda v: v) if defaults else (lambda v: None)
    note = "" if defaults else " (default: as in the base cache)"
    p.add_argument("--mcq-mode", choices=MCQ_MODES, default=d("loglik"), help=f"how multiple-choice probes are scored{note}")
    p.add_argument("--chat-template", choices=tuple(_CHAT), default=d("auto"), help=f"wrap prompts in the chat template{note}")
    p.add_argument("--cot", action=argparse.BooleanOptionalAction, default=d(False), help=f"chain-of-thought generation with a final 'Answer:' line{note}")
    p.add_argument("--max-new-tokens", type=int, default=None, help=f"generation budget (default 32, 256 with --cot){note}")
    p.add_argument("--behavior-max-new-tokens", type=int, default=None,
                   help=f"generation budget of behaviour probes (instruct, comply); an answer that reaches it without ending "
                        f"is a runaway (default 256){note}")
    p.add_argument("--short-mode", choices=SHORT_MODES, default=None,
                   help="short answers: greedy_match (one forward: would greedy decoding give an accepted answer?) or "
                        "generate (decode, extract, match)" + (note or "; default greedy_match, generate with --cot"))
    p.add_argument("--short-match", choices=SHORT_MATCHES, default=d("exact"), help=f"with --short-mode generate: exact or contains (whole words){note}")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=d("float32"), help=f"weights dtype{note}")
    p.add_argument("--autocast", choices=("none", "bfloat16", "float16"), default=d("none"),
                   help="score under torch.autocast in this dtype, as a Trainer with bf16=True / fp16=True (TRL's default) "
                        f"runs the model; the callback then accepts the cache{note}"),
    p.add_argument("--batch-size", type=int, default=16, help="questions per forward (default 16)")
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


def scoring_config(args: argparse.Namespace, base_key: dict[str, Any] | None = None):
    """(ScoringConfig, dtype, autocast) from the scoring options; with `base_key`, what is not given as in the cache."""
    from ..scoring import BEHAVIOR_MAX_NEW_TOKENS, ScoringConfig

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
        mcq_mode=fields["mcq_mode"] or "loglik",
        chat_template=fields["chat_template"],
        cot=bool(fields["cot"]),
        max_new_tokens=fields["max_new_tokens"],
        short_mode=fields["short_mode"],
        short_match=fields["short_match"] or "exact",
        batch_size=args.batch_size,
        engine=args.engine,
        behavior_max_new_tokens=fields["behavior_max_new_tokens"] or BEHAVIOR_MAX_NEW_TOKENS,
    )
    return config, dtype or "float32", None if autocast in (None, "none") else autocast


def read_probes(args: argparse.Namespace) -> ProbeSet:
    return load_probes(args.probes, per_suite=args.per_suite, seed=args.seed)


def open_model(args: argparse.Namespace, dtype: str):
    from ..models import load_model

    return load_model(args.model, dtype=dtype, revision=args.revision, device=args.device)


def score(args: argparse.Namespace, probes: ProbeSet, config, dtype: str, autocast: str | None, check=None, loaded=None):
    """Load the model (unless `loaded`: a (model, tokenizer) pair), run `check(model)`, score; (model, results, key)."""
    from ..scoring import score_with_key

    model, tokenizer = loaded or open_model(args, dtype)
    if check is not None:
        check(model)  # before the scoring time is spent
    return (model, *score_with_key(model, tokenizer, probes, config, autocast, desc=f"scoring {args.model}"))


def read_base(path: str, probes: ProbeSet):
    """The base cache at `path`, its rows those of `probes`; a cache for another probe set is refused (it can never
    match) before any model is loaded."""
    from ..cache import BaseCache, make_cache_key

    base = BaseCache.load(path)
    base.check(make_cache_key({}, probes, {}), ignore=("format", "model", "scoring"), path=path)
    return base.for_probes(probes.ids, path)  # its rows too, not only its key


def robust_plan(probes: ProbeSet, robustness: int | None, per_suite: int | None, mcq_mode: str):
    """`make_plan`, its refusals in the command line's words (--robustness, not `robustness`)."""
    try:
        return make_plan(probes, robustness, per_suite, mcq_mode)
    except ValueError as e:
        text = str(e)
        for name, flag in (("robust_per_suite", "--robust-per-suite"), ("robustness", "--robustness")):
            text = text.replace(f"`{name}`", flag).replace(f"{name}=", f"{flag} ")
        raise type(e)(text) from None


def check_output(path: str, suffixes: tuple[str, ...], example: str, inputs: dict[str, str | None] | None = None,
                 option: str = "-o") -> bool:
    """Refuse an `-o` (or another `option`) that cannot be written, before any time is spent: the file of an input
    (always), a directory, an unsupported suffix, a parent directory that is missing, not a directory, or not writable.
    True if it exists (the caller decides whether it may be replaced)."""
    out = Path(path)
    for flag, given in (inputs or {}).items():
        if given and same_file(out, Path(given)):
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


def same_file(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)  # hard links, symlinks and other spellings of one file
        return a.resolve() == b.resolve()
    except OSError:
        return False


def exists_error(path: str, what: str, option: str = "-o") -> ValueError:
    return ValueError(f"{option} {path} exists ({what}), and forgetwatch never replaces a file without being asked: choose "
                      f"another {option}, or pass --force to replace it")


def save_results(cache, path: str, replace: bool) -> None:
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


def first_ids(probes: ProbeSet, mask, n: int = 3) -> list[str]:
    return [probes[int(i)].id for i in mask.nonzero()[0][:n]]
