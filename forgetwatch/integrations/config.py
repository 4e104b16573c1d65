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
    forgetwatch.integrations.config.ConfigKeyError: train.yaml: unknown key 'forgetwatch_eval_step': did you mean 'forgetwatch_eval_steps'? ...
    >>> parse_keys({"forgetwatch_eval_steps": "ten"}, source="train.yaml")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    forgetwatch.integrations.config.ConfigKeyError: train.yaml: forgetwatch_eval_steps must be an integer, got 'ten' (str); ...
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..callback import ForgetWatchArguments

__all__ = ["ConfigKeyError", "KEYS", "PREFIX", "check_keys", "parse_keys", "split_keys", "yaml_key_lines"]

PREFIX = "forgetwatch_"
KEYS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(ForgetWatchArguments)}
_HINTS = typing.get_type_hints(ForgetWatchArguments)
_TYPE_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a mapping",
               type(None): "null"}


class ConfigKeyError(ValueError):
    """A `forgetwatch_*` key of a front-end's config is unknown, of the wrong type, or refused; the message says which."""


def _where(source: str, lines: Mapping[str, int | str] | None, key: str) -> str:
    line = (lines or {}).get(key)
    if isinstance(line, str):  # given elsewhere than the file, e.g. "the command line (`forgetwatch_seed=1`)"
        return line
    return f"{source}, line {line}" if line else source


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
        close = difflib.get_close_matches(key.lower().replace("-", "_"), KEYS, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigKeyError(f"{_where(source, lines, key)}: unknown key {key!r}: {hint}forgetwatch's keys are "
                             f"{', '.join(sorted(KEYS))} (see `python -c \"from forgetwatch import ForgetWatchArguments; "
                             f"help(ForgetWatchArguments)\"`)")


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
    kinds = _allowed(_HINTS[key])
    if any(_fits(value, k) for k in kinds):
        return dict(value) if isinstance(value, Mapping) else value
    want = " or ".join(_TYPE_WORDS.get(k, k.__name__) for k in kinds)
    default = KEYS[key].default
    fix = f"; for example `{key}: {default!r}` (the default)" if default not in (None, dataclasses.MISSING) else ""
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
    values = {k: _check_type(k, v, _where(source, lines, k)) for k, v in keys.items()}
    try:
        args = ForgetWatchArguments(**values)
        if args.forgetwatch_probes:
            from ..callback import ForgetWatchCallback

            ForgetWatchCallback.from_args(args)
    except (ValueError, TypeError, FileNotFoundError) as e:
        if isinstance(e, ConfigKeyError):
            raise
        raise ConfigKeyError(f"{source}: the forgetwatch_* keys are refused: {e}") from e
    return args


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
