"""What the commands share: the model and scoring options, the scoring config they make, scoring a model, and the
checks and writes of output files (never one replaced without --force, never an input)."""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from ..commands import quote
from ..options import add_flag
from ..probes.probe_set import ProbeSet
from ..probes.suites import load_probes
from ..probes.variants import make_plan
from ..record.cache import BaseCache, make_cache_key
from ..scoring.models import load_model

_CHAT = {"auto": None, "on": True, "off": False}
# scoring options that are part of the cache key (a command takes them from the base cache unless given)
_IN_KEY = ("mcq_mode", "chat_template", "cot", "short_mode", "short_match", "max_new_tokens", "behavior_max_new_tokens")
_NONE_MEANS_AUTO = ("chat_template", "short_mode", "max_new_tokens")  # None is a value of theirs, not "unset"


# torch's device types (`torch.device` names them): a device string is checked before torch is imported or a model loaded
_DEVICE = re.compile(r"^(cpu|cuda|mps|xpu|npu|hpu|mlu|meta|xla|ipu|mtia|maia|privateuseone)(:\d+)?$")


def device(text: str) -> str:
    """A `--device` value: a torch device type, with an index or not (`cpu`, `cuda`, `cuda:1`, `mps`, ...).

    Example:
        >>> device("cuda:1")
        'cuda:1'
    """
    if not _DEVICE.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device: use cpu, cuda, cuda:1, mps, xpu, ...")
    return text


def model_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument(
        "--model", required=required, help="a local model directory, a Hub id, or `smollm2` (the offline SmolLM2-135M-Instruct)"
    )
    p.add_argument("--probes", required=required, help="a probe JSONL file, or comma-separated suite names")
    p.add_argument("--revision", default=None, help="Hub revision (branch, tag or commit)")
    p.add_argument("--device", type=device, default=None, help="cuda, cpu, ... (default: cuda when available)")


def scoring_args(p: argparse.ArgumentParser, defaults: bool, robustness: bool = True) -> None:
    # `compare` takes every scoring option from the base cache unless given, so both sides match. `robustness`: the
    # command scores variants (--robustness, --robust-per-suite); one that does not must not take them
    d = {} if defaults else {"default": None}  # absent: the option's default, or as in the base cache
    note = "" if defaults else " (default: as in the base cache)"
    add_flag(p, "mcq_mode", note=note, **d)
    # the command line spells the option's true / false / null as on / off / auto
    add_flag(p, "chat_template", note=" (auto: null)" + note, choices=tuple(_CHAT), default="auto" if defaults else None,
             type=str, action=None)
    add_flag(p, "cot", note=note, **d)
    add_flag(p, "max_new_tokens", note=note, default=None)
    add_flag(p, "behavior_max_new_tokens", note=note, default=None)
    add_flag(p, "short_mode", note=note, default=None)
    add_flag(p, "short_match", note=note, **d)
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32" if defaults else None,
                   help=f"weights dtype{note}")
    p.add_argument("--autocast", choices=("none", "bfloat16", "float16"), default="none" if defaults else None,
                   help="score under torch.autocast in this dtype, as a Trainer with bf16=True / fp16=True (TRL's default) "
                        f"runs the model; the callback then accepts the cache{note}"),
    add_flag(p, "batch_size")
    add_flag(p, "engine")
    # a command scores what it is given: every probe of the suites unless told (the callback samples 100 by default;
    # the cache command it suggests names its --per-suite)
    add_flag(p, "per_suite", default=None, note=" Default here: every probe.")
    add_flag(p, "seed")
    if not robustness:
        return
    add_flag(p, "robustness", default=None, metavar="K", note=" (default: 0" + (", or as in the base cache)" if note else ")"))
    add_flag(p, "robust_per_suite", metavar="N", note=note)


def scoring_config(args: argparse.Namespace, base_key: dict[str, Any] | None = None):
    """(ScoringConfig, dtype, autocast) from the scoring options; with `base_key`, what is not given as in the cache."""
    from ..scoring.score import ScoringConfig

    # the options that change results (the cache key's); None: not given (then as in the base cache, else the default)
    fields = {name: getattr(args, name) for name in _IN_KEY}
    fields["chat_template"] = _CHAT[args.chat_template] if args.chat_template is not None else None
    dtype, autocast = args.dtype, args.autocast
    if base_key is not None:
        scoring = base_key.get("scoring", {})
        given = {name for name in _IN_KEY if getattr(args, name) is not None}
        fields = {name: value if name in given else scoring.get(name) for name, value in fields.items()}
        precision = str(scoring.get("precision", "float32"))
        if dtype is None:
            dtype = precision.split("+")[0]
        if autocast is None:
            autocast = precision.split("+autocast-")[1] if "+autocast-" in precision else "none"
    fields["cot"] = bool(fields["cot"])
    config = ScoringConfig(batch_size=args.batch_size, engine=args.engine,
                           **{k: v for k, v in fields.items() if v is not None or k in _NONE_MEANS_AUTO})
    return config, dtype or "float32", None if autocast in (None, "none") else autocast


def read_probes(args: argparse.Namespace) -> ProbeSet:
    return load_probes(args.probes, per_suite=args.per_suite, seed=args.seed)


def open_model(args: argparse.Namespace, dtype: str):

    return load_model(args.model, dtype=dtype, revision=args.revision, device=args.device)


def score(args: argparse.Namespace, probes: ProbeSet, config, dtype: str, autocast: str | None, check=None, loaded=None):
    """Load the model (unless `loaded`: a (model, tokenizer) pair), run `check(model)`, score; (model, results, key)."""
    from ..scoring.score import score_with_key

    model, tokenizer = loaded or open_model(args, dtype)
    if check is not None:
        check(model)  # before the scoring time is spent
    return (model, *score_with_key(model, tokenizer, probes, config, autocast, desc=f"scoring {args.model}"))


def read_base(path: str, probes: ProbeSet):
    """The base cache at `path`, its rows those of `probes`; a cache for another probe set is refused (it can never
    match) before any model is loaded."""

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


def follow_link(path: str, option: str = "-o") -> str:
    """The path an output option names, to write to: the target of a symbolic link, or the path itself.

    A link is the user's, and so is the file it points to: the link is kept and the target is written, as a shell's
    `>` would, so an existing target is "a file you wrote" (replaced only with --force) and a dangling link's target is
    created. Writing a new file in the link's place (what a rename onto the link does) would silently drop the link and
    leave its target stale. A link that loops, or whose target's directory is missing, is refused naming both.
    """
    if not os.path.islink(path):
        return path
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError(f"{option} {path} is a symbolic link that leads back to itself ({os.readlink(path)}); "
                             f"remove it or choose another {option}") from None
    target = os.path.realpath(path)
    if not os.path.isdir(os.path.dirname(target)):
        raise ValueError(f"{option} {path} is a symbolic link to {target}, whose directory does not exist: create "
                         f"{quote(os.path.dirname(target))}, remove the link, or choose another {option}")
    return target


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
    raise OSError(
        f"could not write {path} ({failure}), nor a copy elsewhere ({'; '.join(tried)}): the results are lost"
    ) from None


def first_ids(probes: ProbeSet, mask, n: int = 3) -> list[str]:
    return [probes[int(i)].id for i in mask.nonzero()[0][:n]]
