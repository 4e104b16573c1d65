"""The model's context, and the cheap screen of questions far over it: what `forgetwatch.scoring.fit` measures before a run
and `forgetwatch.scoring.score` checks before it scores, kept apart from both so that neither imports the other.

Example:
    >>> context_limit(model)  # doctest: +SKIP
    2048
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ProbeSetError
from ..probes.probe_set import Probe

__all__ = ["context_limit", "over_limit", "refuse_over", "screen_long"]


def context_limit(model: Any) -> int | None:
    """The model's context in tokens (`max_position_embeddings`, or GPT-2's `n_positions`); None when the config says
    none (then nothing is refused: the engines check the same fields)."""
    config = getattr(model, "config", None)
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return limit if isinstance(limit, int) and not isinstance(limit, bool) else None


# A probe is measured whole only when its question's first PREFIX_CHARS_PER_TOKEN * (limit + SLACK) characters fit: a 5 MB
# question is refused on its first 130 KB (8k context) instead of being tokenized whole (tens of seconds, gigabytes).
# 16 characters a token is beyond any text's average (English runs 4 to 5); a text of longer tokens is measured whole.
PREFIX_CHARS_PER_TOKEN = 16
# tokens the cut at the prefix's end can add (a word split in two) before the count proves anything about the whole
SLACK = 64


def screen_long(tokenizer: Any, probes: Sequence[Probe], limit: int) -> dict[str, int]:
    """The probes whose question alone, by its first characters, is longer than `limit` tokens, with the tokens counted
    in that prefix (a lower bound of what scoring them would put before the model); the others are not measured here.

    Example:
        >>> screen_long(tokenizer, [Probe("q", "short", "word " * 10**6, answers=("a",))], 8192)  # doctest: +SKIP
        {'q': 26214}
    """
    chars = PREFIX_CHARS_PER_TOKEN * (limit + SLACK)
    over = {}
    for p in probes:
        if len(p.question) <= chars:
            continue
        n = len(tokenizer(p.question[:chars], add_special_tokens=False)["input_ids"])
        if n > limit + SLACK:
            over[p.id] = n - SLACK
    return over


def over_limit(ids: Sequence[str | None], lengths: Sequence[int], limit: int) -> list[tuple[str, int]]:
    """The probes `(id, tokens)` whose request is longer than `limit` tokens (a request without a probe id is none's)."""
    return [(pid, n) for pid, n in zip(ids, lengths, strict=True) if pid is not None and n > limit]


def refuse_over(over: Sequence[tuple[str, int]], limit: int, what: str, where: str = "the model's context") -> None:
    """Raise `ProbeSetError` naming the probes in `over` (`over_limit`), before an engine runs anything; nothing when
    there are none. `what`: what the requests hold beside the question ("their answers")."""
    if over:
        listed = ", ".join(f"{pid} ({n} tokens)" for pid, n in over[:5])
        raise ProbeSetError(f"{len(over)} probe(s) do not fit {where} of {limit} tokens with {what}: {listed}"
                            f"{' ...' if len(over) > 5 else ''}. Remove them from the probe set, or shorten their text (or "
                            "lower max_new_tokens / behavior_max_new_tokens)")
