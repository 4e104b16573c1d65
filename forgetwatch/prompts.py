"""How a probe becomes text for the model: the prompt formats, versioned because they are part of the cache key.

Formats (the `Question:/Answer:` style of lm-evaluation-harness and OLMES):

    loglik      "Question: {q}\\nAnswer:" + " {choice}"             each option's text is scored
    letter      "Question: {q}\\n A. {c0}\\n B. {c1}\\nAnswer:"      the letters' next-token logits are compared
    generate    the letter prompt, or "Question: {q}\\nAnswer:" for short answers, decoded greedily;
                with `cot`, an instruction asks for reasoning and a final line "Answer: X".

With a chat template, the question (and the options, the instruction) is the user turn and the model's turn
starts right after the template's generation prompt.
"""

from __future__ import annotations

from .answers import LETTERS
from .probes import Probe

# Bump when any text below changes: cached base results made with other prompts are then refused.
PROMPT_VERSION = 2

_COT_MCQ = "Think step by step, then give your final answer on the last line as 'Answer: X', where X is the letter of the correct option."
_COT_SHORT = "Think step by step, then give your final answer on the last line as 'Answer: <answer>'."
_DIRECT_MCQ = "Answer with the letter of the correct option."
_DIRECT_SHORT = "Answer with a short phrase or number only."


def question_block(probe: Probe, with_letters: bool) -> str:
    text = f"Question: {probe.question}"
    if with_letters:
        text += "".join(f"\n{LETTERS[i]}. {c}" for i, c in enumerate(probe.choices))
    return text


def render_chat(tokenizer, user: str, system_prompt: str | None) -> str:
    messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [{"role": "user", "content": user}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def loglik_request(probe: Probe, tokenizer, chat: bool, system_prompt: str | None) -> tuple[str, list[str]]:
    """(context, continuations) for scoring each option's text by log-likelihood."""
    if chat:
        return render_chat(tokenizer, question_block(probe, False), system_prompt), list(probe.choices)
    return question_block(probe, False) + "\nAnswer:", [" " + c for c in probe.choices]


def letter_prompt(probe: Probe, tokenizer, chat: bool, system_prompt: str | None) -> tuple[str, str]:
    """(context, separator before the letter) for comparing the option letters' next-token logits."""
    if chat:
        return render_chat(tokenizer, question_block(probe, True) + "\n" + _DIRECT_MCQ, system_prompt), ""
    return question_block(probe, True) + "\nAnswer:", " "


def generation_prompt(probe: Probe, tokenizer, chat: bool, cot: bool, system_prompt: str | None) -> str:
    """The prompt to decode greedily from, for generative scoring of either kind of probe."""
    mcq = probe.kind == "mcq"
    body = question_block(probe, with_letters=mcq)
    if cot:
        instruction = _COT_MCQ if mcq else _COT_SHORT
    else:
        instruction = _DIRECT_MCQ if mcq else _DIRECT_SHORT
    if chat:
        return render_chat(tokenizer, body + "\n" + instruction, system_prompt)
    if cot:
        return body + "\n" + instruction + "\nReasoning:"
    return body + "\nAnswer:"
