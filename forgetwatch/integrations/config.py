"""`forgetwatch_*` keys in a front-end's YAML (Axolotl, LLaMA-Factory): taken out, checked, made into arguments.

The keys are `ForgetWatchArguments`' fields, with the same names and meanings as in the TRL recipes. A front-end's own
parser either refuses keys it does not know (LLaMA-Factory) or would carry a misspelt one silently, so every key is
checked here, before any training step: an unknown `forgetwatch_*` key (or one a letter away from a real one), a value
of the wrong type or an option the callback refuses raises `ConfigKeyError` naming the file, the line, the key and the fix.

Example:
    >>> fw, rest = split_keys({"forgetwatch_probes": "arc_easy", "learning_rate": 1e-5}, source="train.yaml")
    >>> fw, rest
    ({'forgetwatch_probes': 'arc_easy'}, {'learning_rate': 1e-05})
    >>> split_keys({"forgetwatch_eval_step": 10}, source="train.yaml")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    forgetwatch.errors.ConfigKeyError: train.yaml: unknown key 'forgetwatch_eval_step': did you mean 'forgetwatch_eval_steps'? ...
    >>> parse_keys({"forgetwatch_eval_steps": "ten"}, source="train.yaml")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    forgetwatch.errors.ConfigKeyError: train.yaml: forgetwatch_eval_steps must be an integer, got 'ten' (str); ...
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..docs import docs_hint
from ..errors import ConfigKeyError
from ..options import ForgetWatchArguments, read_legacy
from ..remedies import check_remedies

__all__ = ["ConfigKeyError", "KEYS", "PREFIX", "RECIPE_ONLY", "TERM_OPTIONS", "TYPES", "check_keys", "front_end_arguments",
           "duplicate_keys", "parse_keys", "penalty_needs_nonreentrant", "refuse_duplicate_keys", "split_keys",
           "where_given", "yaml_key_lines"]

PREFIX = "forgetwatch_"
KEYS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(ForgetWatchArguments)}
TYPES = typing.get_type_hints(ForgetWatchArguments)
_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a mapping",
               type(None): "null"}


def where_given(source: str, lines: Mapping[str, int | str] | None, key: str) -> str:
    """Where `key` was given, for a message: "FILE, line N", the text `lines` holds for it, or FILE."""
    line = (lines or {}).get(key)
    if isinstance(line, str):  # given elsewhere than the file, e.g. "the command line (`forgetwatch_seed=1`)"
        return line
    return f"{source}, line {line}" if line else source


def _yaml(value: Any) -> str:
    """A value as it is written in YAML (null, true), for messages about a YAML file."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


def _looks_like_ours(key: str) -> bool:
    """A key meant for forgetwatch: the prefix in any case or spelling close to it, or a name a letter off one of ours."""
    low = key.lower().replace("-", "_")
    if low.startswith(("forgetwatch", "forget_watch")):
        return True
    head = low.split("_", 1)[0]
    return difflib.SequenceMatcher(None, head, "forgetwatch").ratio() >= 0.8 or bool(
        difflib.get_close_matches(low, KEYS, n=1, cutoff=0.9))


def check_keys(config: Mapping[str, Any], *, source: str = "config", lines: Mapping[str, int | str] | None = None) -> None:
    """Raise `ConfigKeyError` for the first key that looks meant for forgetwatch but is not one of its keys.

    `lines` maps a key to its 1-based line in `source`, or to a text saying where else it was given (a command line
    override): messages name that place instead of the file.
    """
    for key in config:
        if not isinstance(key, str) or key in KEYS or not _looks_like_ours(key):
            continue
        where = where_given(source, lines, key)
        if key.lower() in ("forgetwatch", "forget_watch"):
            raise ConfigKeyError(f"{where}: {key!r}: forgetwatch's keys are top-level keys with the prefix, not a nested "
                                 f"mapping: write `forgetwatch_probes: ...`, `forgetwatch_eval_steps: ...` at the top "
                                 f"level of the config")
        close = difflib.get_close_matches(key.lower().replace("-", "_"), KEYS, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else f"forgetwatch's keys are {', '.join(sorted(KEYS))}."
        raise ConfigKeyError(f"{where}: unknown key {key!r}: {hint} (Every key, with its meaning: `forgetwatch options`, "
                             f"or {docs_hint('options')})")


def split_keys(config: Mapping[str, Any], *, source: str = "config",
               lines: Mapping[str, int | str] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a front-end's config into (forgetwatch's keys, everything else), refusing misspelt forgetwatch keys.

    Example:
        >>> split_keys({"forgetwatch_probes": "sciq", "stage": "sft"})
        ({'forgetwatch_probes': 'sciq'}, {'stage': 'sft'})
    """
    check_keys(config, source=source, lines=lines)
    ours = {k: v for k, v in config.items() if k in KEYS}
    rest = {k: v for k, v in config.items() if k not in KEYS}
    return ours, rest


def _allowed(hint: Any) -> tuple[type, ...]:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return tuple(a for a in typing.get_args(hint))
    return (hint,)


def _fits(value: Any, kind: type) -> bool:
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is dict:
        return isinstance(value, Mapping)
    return isinstance(value, kind)


def _check_type(key: str, value: Any, where: str) -> Any:
    kinds = _allowed(TYPES[key])
    if float in kinds and isinstance(value, str):
        # YAML 1.1 (PyYAML) reads `1e-1` as a string, where Axolotl's pydantic and LLaMA-Factory's parser take it as a
        # number: so do we
        try:
            value = float(value)
        except ValueError:
            pass
    if any(_fits(value, k) for k in kinds):
        return dict(value) if isinstance(value, Mapping) else value
    want = " or ".join(_TYPE_WORDS.get(k, k.__name__) for k in kinds)
    default = KEYS[key].default
    fix = f"; for example `{key}: {_yaml(default)}` (the default)" if default not in (None, dataclasses.MISSING) else ""
    raise ConfigKeyError(f"{where}: {key} must be {want}, got {value!r} ({type(value).__name__}){fix}")


def parse_keys(keys: Mapping[str, Any], *, source: str = "config",
               lines: Mapping[str, int | str] | None = None) -> ForgetWatchArguments:
    """`ForgetWatchArguments` from a config's `forgetwatch_*` keys, each checked for its type and its values.

    The callback is built once here and thrown away, so that an option it refuses (a budget metric, a scoring mode, a
    probe suite) fails now, with the key's name, and not at the first evaluation.

    Example:
        >>> args = parse_keys({"forgetwatch_probes": "sciq", "forgetwatch_eval_steps": 10, "forgetwatch_per_suite": 4})
        >>> args.forgetwatch_eval_steps
        10
    """
    split_keys(keys, source=source, lines=lines)  # nothing unknown
    values = {k: _check_type(k, read_legacy(k, v), where_given(source, lines, k)) for k, v in keys.items()}
    try:
        args = ForgetWatchArguments(**values)
        if args.forgetwatch_probes:
            from ..run.callback import ForgetWatchCallback

            ForgetWatchCallback.from_args(args)
        if args.forgetwatch_rewind:
            from ..remedies.rewinder import rewind_callback

            rewind_callback(args)  # sidecar scoring, no probes: refused now
    except ConfigKeyError:
        raise
    except (ValueError, TypeError, FileNotFoundError, ImportError) as e:
        raise ConfigKeyError(_refusal(str(e), keys, source, lines)) from e
    return args


def _refusal(message: str, keys: Mapping[str, Any], source: str, lines: Mapping[str, int | str] | None) -> str:
    """The callback's own refusal, in the config's words: its argument names (`scoring`, on_budget=) become the keys
    the user wrote (forgetwatch_scoring), and the message starts at the line of the first key it names."""
    named = [k for k in keys if k in message or re.search(rf"(?<![\w])(`{re.escape(k.removeprefix(PREFIX))}`|"
                                                           rf"{re.escape(k.removeprefix(PREFIX))}=)", message)]
    if not named and "forgetwatch_probes" in keys and ("suite" in message or "probe" in message):
        named = ["forgetwatch_probes"]  # the probes could not be built: a suite name, a probe file
    for key in sorted(named, key=len, reverse=True):
        short = key.removeprefix(PREFIX)
        message = re.sub(rf"(?<![\w])`{re.escape(short)}`", key, message)
        message = re.sub(rf"(?<![\w]){re.escape(short)}=", f"{key}=", message)
    where = where_given(source, lines, named[0]) if named else source
    return f"{where}: {message}"


# Options of the TRL recipes that change the training data (recipes/common.py mixes replay in): a front-end builds its own
# data pipeline, so a value other than the default is refused, not ignored.
RECIPE_ONLY = ("forgetwatch_replay_mix", "forgetwatch_replay_targets")
# Options of the loss terms, and the options that turn their term on: set while no term is on, they would do nothing.
TERM_OPTIONS = {
    "forgetwatch_anchor_ratio": ("forgetwatch_anchor_beta",),
    "forgetwatch_base_outputs": ("forgetwatch_anchor_beta",),
    "forgetwatch_penalty_ratio": ("forgetwatch_penalty_beta",),
    "forgetwatch_penalty_floor": ("forgetwatch_penalty_beta",),
    "forgetwatch_penalty_scale": ("forgetwatch_penalty_beta",),
    "forgetwatch_replay_pool": ("forgetwatch_anchor_beta", "forgetwatch_penalty_beta"),
    "forgetwatch_replay_strategy": ("forgetwatch_anchor_beta", "forgetwatch_penalty_beta"),
}


def front_end_arguments(config: Mapping[str, Any], *, front_end: str, source: str = "config",
                        lines: Mapping[str, int | str] | None = None,
                        stage: str = "sft") -> tuple[ForgetWatchArguments | None, dict[str, Any]]:
    """(`ForgetWatchArguments` or None, the front-end's own keys) from a front-end's whole config, every rule checked.

    The rules every front-end shares: no misspelt key, each value of its type, nothing the callback refuses, none of
    the TRL recipes' data options (`RECIPE_ONLY`: replay mixing), no loss-term option without its term on
    (`TERM_OPTIONS`), the remedies fit the run (`forgetwatch.remedies.check_remedies`: the KL anchor and the 1→0
    penalty for `stage` sft only), and `forgetwatch_probes` given (not null, not empty) whenever any forgetwatch key
    is. None when the config sets no forgetwatch key at all.

    Example:
        >>> args, rest = front_end_arguments({"stage": "sft", "forgetwatch_probes": "sciq", "forgetwatch_per_suite": 4},
        ...                                  front_end="LLaMA-Factory")
        >>> args.forgetwatch_probes, rest
        ('sciq', {'stage': 'sft'})
        >>> front_end_arguments({"forgetwatch_eval_steps": 5}, front_end="Axolotl", source="c.yaml")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        forgetwatch.errors.ConfigKeyError: c.yaml: forgetwatch_eval_steps is set but forgetwatch_probes is not...
    """
    ours, rest = split_keys(config, source=source, lines=lines)
    if not ours:
        return None, rest
    for key in RECIPE_ONLY:
        if key in ours and ours[key] != KEYS[key].default:
            raise ConfigKeyError(
                f"{where_given(source, lines, key)}: {key} is an option of replay mixing, which changes the training data in "
                f"forgetwatch's TRL recipes (recipes/sft.py); {front_end} builds its own data pipeline, and forgetwatch does "
                f"not mix into it: remove "
                f"{key} (or set it to {_yaml(KEYS[key].default)}), or train with a recipe. The KL anchor "
                f"(forgetwatch_anchor_beta) and the 1→0 penalty (forgetwatch_penalty_beta) work here; "
                f"`forgetwatch_replay: true` writes the forgotten probes to <output_dir>/forgetwatch/replay.jsonl, for the "
                f"next run's data")
    for key, needs in TERM_OPTIONS.items():
        if key in ours and ours[key] != KEYS[key].default and not any(ours.get(n) for n in needs):
            raise ConfigKeyError(
                f"{where_given(source, lines, key)}: {key} is an option of "
                + " and of ".join({"forgetwatch_anchor_beta": "the KL anchor (forgetwatch_anchor_beta)",
                                   "forgetwatch_penalty_beta": "the 1→0 penalty (forgetwatch_penalty_beta)"}[n] for n in needs)
                + f", and {' / '.join(needs)} is 0 here, so it would do nothing ({front_end} gets no replay mixing): "
                f"set {needs[0]} (e.g. 5.0), or remove {key}")
    probes = ours.get("forgetwatch_probes")
    if probes is None or (isinstance(probes, str) and not probes.strip()):
        if "forgetwatch_probes" in ours:
            where, what = where_given(source, lines, "forgetwatch_probes"), f"forgetwatch_probes is {_yaml(probes)}"
        else:
            first = next(iter(ours))
            where, what = where_given(source, lines, first), f"{first} is set but forgetwatch_probes is not"
        raise ConfigKeyError(f"{where}: {what}, so nothing would be scored: set `forgetwatch_probes:` (built-in suite "
                             f"names such as arc_easy,sciq, or a probe JSONL file), or remove the forgetwatch_* keys")
    args = parse_keys(ours, source=source, lines=lines)
    if args.forgetwatch_rewind and stage != "sft" and not args.forgetwatch_rewind_data and not args.forgetwatch_budget:
        raise ConfigKeyError(
            f"{where_given(source, lines, 'forgetwatch_rewind')}: forgetwatch_rewind picks α by a task loss or within a "
            f"budget, and a {stage} run's eval batches are not language-model examples, so their loss is no task "
            "measure: set forgetwatch_rewind_data (held-out examples, a JSONL) or forgetwatch_budget")

    try:
        check_remedies(args, stage, front_end=front_end)
    except ValueError as e:
        raise ConfigKeyError(_refusal(str(e), ours, source, lines)) from e
    return args, rest


def penalty_needs_nonreentrant(args: ForgetWatchArguments | None, reentrant: Any, *, key: str, source: str = "config",
                               lines: Mapping[str, int | str] | None = None) -> bool:
    """Whether a front-end's activation checkpointing must be made non-reentrant for the 1→0 penalty (True: the
    config leaves it to the front-end's reentrant default, and the caller sets `key` off and says so).

    The penalty's `task_gradient` scale (the default) measures two gradients with `torch.autograd.grad`, which reentrant
    checkpointing cannot go through, and LLaMA-Factory (`use_reentrant_gc`) and Axolotl (`gradient_checkpointing_kwargs`)
    both checkpoint reentrantly unless told otherwise. Non-reentrant checkpointing computes the same gradients (it is what
    LLaMA-Factory itself switches to under FSDP2), so an unset choice is switched; one the user wrote is refused, naming
    its line, since nothing a user wrote is overridden without their say.

    `reentrant`: the value the config gives (None: not given; checkpointing is on).

    Example:
        >>> args = ForgetWatchArguments(forgetwatch_probes="sciq", forgetwatch_penalty_beta=1.0)
        >>> penalty_needs_nonreentrant(args, None, key="use_reentrant_gc")
        True
        >>> penalty_needs_nonreentrant(args, True, key="use_reentrant_gc", source="c.yaml",
        ...                            lines={"use_reentrant_gc": 4})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        forgetwatch.errors.ConfigKeyError: c.yaml, line 4: use_reentrant_gc: true with forgetwatch_penalty_beta: ...
    """
    if args is None or not args.forgetwatch_penalty_beta or args.forgetwatch_penalty_scale != "task_gradient":
        return False
    if reentrant is None:
        return True
    if reentrant:
        raise ConfigKeyError(
            f"{where_given(source, lines, key.split('.')[0])}: {key}: true with forgetwatch_penalty_beta: the penalty's scale "
            "task_gradient measures gradients with torch.autograd.grad, which reentrant activation checkpointing does "
            f"not support. Set {key} to false (the same gradients), turn checkpointing off, or set "
            "forgetwatch_penalty_scale: loss")
    return False


def yaml_key_lines(path: str | Path) -> dict[str, int]:
    """The 1-based line of each top-level key of a YAML mapping (for messages); {} when the file is not one.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "c.yaml")
        >>> _ = open(p, "w").write("base_model: x\\n\\nforgetwatch_probes: sciq\\n")
        >>> yaml_key_lines(p)
        {'base_model': 1, 'forgetwatch_probes': 3}
    """
    import yaml

    try:
        node = yaml.compose(Path(path).read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {k.value: k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}


def duplicate_keys(path: str | Path) -> list[tuple[str, int, int]]:
    """The keys a YAML file gives twice in one mapping, at any depth, as (dotted key, first line, second line), 1-based.
    YAML readers keep the last value without a word (a stricter budget given first is dropped); a config check must
    not say "keys ok" over it.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "c.yaml")
        >>> _ = open(p, "w").write("forgetwatch_eval_steps: 1\\nforgetwatch_budget: {forgetting: 0.1, forgetting: 0.5}\\n"
        ...                        "forgetwatch_eval_steps: 7\\n")
        >>> duplicate_keys(p)
        [('forgetwatch_eval_steps', 1, 3), ('forgetwatch_budget.forgetting', 2, 2)]
    """
    import yaml

    try:
        root = yaml.compose(Path(path).read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return []  # unreadable: the reader says so itself
    out: list[tuple[str, int, int]] = []

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key, value in node.value:
                name = f"{prefix}{key.value}" if isinstance(key, yaml.ScalarNode) else None
                if name is not None:
                    if name in seen:
                        out.append((name, seen[name], key.start_mark.line + 1))
                    else:
                        seen[name] = key.start_mark.line + 1
                walk(value, f"{name}." if name is not None else prefix)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                walk(item, prefix)

    walk(root, "")
    out.sort(key=lambda d: (d[1], d[2]))
    return out


def refuse_duplicate_keys(path: str | Path) -> None:
    """`ConfigKeyError` naming the file, the key and both lines when a YAML config gives one of forgetwatch's keys twice
    (`duplicate_keys`; the front-end's own keys are the front-end's business).

    Example:
        >>> refuse_duplicate_keys("config.yaml")  # doctest: +SKIP
    """
    found = [d for d in duplicate_keys(path) if d[0].startswith(PREFIX)]
    if found:
        key, first, second = found[0]
        more = f" (and {len(found) - 1} more: " + ", ".join(k for k, *_ in found[1:]) + ")" if len(found) > 1 else ""
        raise ConfigKeyError(f"{path}:{second}: {key} is given twice (first at line {first}): a YAML reader keeps the "
                             f"last value and drops the other without a word{more}. Keep the one you mean")
