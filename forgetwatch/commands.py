"""Shell commands that forgetwatch suggests in its messages, quoted so that they can be pasted as they are.

Library code (the callback, the cache) suggests commands too, so the builders live here and not in `cli.py`: the
library never imports its own command line. Nothing here imports torch.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from .options import default

__all__ = ["cache_command", "quote"]

# what the callback appends to its suite names: `arc_easy,mmlu --per-suite 100 --seed 1` (options, not part of the name)
_SUITE_OPTIONS = re.compile(r"^(?P<spec>.*?)(?P<options>(?: --(?:per-suite|seed) \d+)+)$")


def quote(arg: Any) -> str:
    """One argument as the shell reads it back: `shlex.quote`, with `<placeholders>` left as they are.

    Example:
        >>> quote("my models/base"), quote("org/model"), quote("<your base model>")
        ("'my models/base'", 'org/model', '<your base model>')
    """
    text = str(arg)
    if text.startswith("<") and text.endswith(">"):  # a placeholder the user replaces, not a value
        return text
    return shlex.quote(text)


def cache_command(model: str, probes: str, scoring_key: dict[str, Any], output: str = "base.parquet",
                  per_suite: int | None = None, seed: int | None = None, robustness: int | None = None,
                  robust_per_suite: int | None = None) -> str:
    """The `forgetwatch cache` command whose cache matches `scoring_key` (what a callback expects), for messages.

    Paths are quoted for the shell. `probes` may end in ` --per-suite N --seed S` (suite names with their sampling);
    those options are kept apart from the quoted spec. `per_suite` and `seed` add them explicitly.

    Example:
        >>> cache_command("org/model", "probes.jsonl", {"mcq_mode": "loglik", "precision": "float32+autocast-bfloat16"})
        'forgetwatch cache --model org/model --probes probes.jsonl --dtype float32 --autocast bfloat16 -o base.parquet'
        >>> cache_command("/data/my model", "arc_easy --per-suite 50", {}, "my cache.parquet")
        "forgetwatch cache --model '/data/my model' --probes arc_easy --per-suite 50 --dtype float32 -o 'my cache.parquet'"
    """
    probes = str(probes)
    options = ""
    if m := _SUITE_OPTIONS.match(probes):
        probes, options = m["spec"], m["options"]
    if per_suite:
        options += f" --per-suite {int(per_suite)}"
    if seed:
        options += f" --seed {int(seed)}"
    parts = ["forgetwatch cache", f"--model {quote(model or '<your base model>')}", f"--probes {quote(probes)}{options}"]
    s = scoring_key
    if s.get("mcq_mode", default("mcq_mode")) != default("mcq_mode"):
        parts.append(f"--mcq-mode {s['mcq_mode']}")
    if s.get("chat_template") is not None:
        parts.append(f"--chat-template {'on' if s['chat_template'] else 'off'}")
    if s.get("cot"):
        parts.append("--cot")
    if s.get("short_mode") and s["short_mode"] != ("generate" if s.get("cot") else "greedy_match"):
        parts.append(f"--short-mode {s['short_mode']}")
    if s.get("short_match", default("short_match")) != default("short_match"):
        parts.append(f"--short-match {s['short_match']}")
    if s.get("max_new_tokens") and s["max_new_tokens"] != (256 if s.get("cot") else 32):
        parts.append(f"--max-new-tokens {s['max_new_tokens']}")
    if s.get("behavior_max_new_tokens") not in (None, default("behavior_max_new_tokens")):
        parts.append(f"--behavior-max-new-tokens {s['behavior_max_new_tokens']}")
    dtype, _, autocast = str(s.get("precision", "float32")).partition("+autocast-")
    parts.append(f"--dtype {dtype}")
    if autocast:
        parts.append(f"--autocast {autocast}")
    if robustness:
        parts.append(f"--robustness {int(robustness)}")
    if robust_per_suite:
        parts.append(f"--robust-per-suite {int(robust_per_suite)}")
    return " ".join([*parts, f"-o {quote(output)}"])
