"""How a probe becomes text for the model: the prompt formats, versioned because they are part of the cache key.

Formats (the `Question:/Answer:` style of lm-evaluation-harness and OLMES):

    loglik      "Question: {q}\\nAnswer:" + " {choice}"             each option's text is scored
    letter      "Question: {q}\\n A. {c0}\\n B. {c1}\\nAnswer:"      the letters' next-token logits are compared
    generate    the letter prompt decoded greedily; with `cot`, an instruction asks for reasoning and a final
                line "Answer: X".
    short       short answers (generated, or teacher-forced with `short_mode="greedy_match"`): an instruction to
                answer with the answer only, then four fixed exemplars (generic questions that are no probe of
                any built-in suite) and the question:

                    Answer each question with the answer only: a name, a number or a short phrase.

                    Question: What is the capital of Canada?
                    Answer: Ottawa
                    ... (3 more)
                    Question: {q}
                    Answer:

                Instruct models answer in sentences when simply asked ("The capital of Italy is Rome."); the
                exemplars show the form wanted, for base and instruct models alike. With `cot`, the instruction
                asks for reasoning and a final "Answer:" line instead, without exemplars.

    behavior    behaviour probes (`instruct`, `comply`): the prompt as it is, the user turn of the chat template; with
                no template, the prompt then "\n\nResponse:".

With a chat template, the question (and the options, the instruction) is the user turn and the model's turn
starts right after the template's generation prompt; the short-answer exemplars become earlier user and
assistant turns.
"""

from __future__ import annotations

from ..answers import LETTERS
from ..probes.probe_set import Probe

# Bump when any text below changes: cached base results made with other prompts are then refused.
PROMPT_VERSION = 3

_COT_MCQ = ("Think step by step, then give your final answer on the last line as 'Answer: X', where X is the letter of the "
            "correct option.")
_COT_SHORT = "Think step by step, then give your final answer on the last line as 'Answer: <answer>'."
_DIRECT_MCQ = "Answer with the letter of the correct option."
_DIRECT_SHORT = "Answer each question with the answer only: a name, a number or a short phrase."
# (question, answer) shown before a short-answer question. Generic, and no probe of a built-in suite asks any of
# them (tests/scoring/test_prompts.py checks); a name, a number, a person and a year, so no one answer form is favoured.
SHORT_EXEMPLARS = (
    ("What is the capital of Canada?", "Ottawa"),
    ("How many legs does a spider have?", "8"),
    ("Who wrote the play Hamlet?", "William Shakespeare"),
    ("In which year did the First World War end?", "1918"),
)


def question_block(probe: Probe, with_letters: bool) -> str:
    text = f"Question: {probe.question}"
    if with_letters:
        text += "".join(f"\n{LETTERS[i]}. {c}" for i, c in enumerate(probe.choices))
    return text


def render_chat(tokenizer, user: str, system_prompt: str | None, shots: tuple[tuple[str, str], ...] = ()) -> str:
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for question, answer in shots:
        messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": user})
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


def short_answer_prompt(probe: Probe, tokenizer, chat: bool, system_prompt: str | None) -> str:
    """The few-shot prompt after which the model's bare answer to a short-answer probe starts (see the module doc)."""
    return _short_answer_text(probe.question, tokenizer, chat, system_prompt)


def short_answer_prefix(tokenizer, chat: bool, system_prompt: str | None) -> str:
    """The text every short-answer prompt starts with: the instruction and the exemplars (computed once when scoring)."""
    marker = "\x00"
    return _short_answer_text(marker, tokenizer, chat, system_prompt).split(marker)[0]


def _short_answer_text(question: str, tokenizer, chat: bool, system_prompt: str | None) -> str:
    shots = [(f"Question: {q}", a) for q, a in SHORT_EXEMPLARS]
    if chat:
        # the instruction opens the first user turn, so that a user's own system prompt stays as given
        first = (_DIRECT_SHORT + "\n\n" + shots[0][0], shots[0][1])
        return render_chat(tokenizer, f"Question: {question}", system_prompt, (first, *shots[1:]))
    blocks = [f"{q}\nAnswer: {a}" for q, a in shots] + [f"Question: {question}\nAnswer:"]
    return _DIRECT_SHORT + "\n\n" + "\n\n".join(blocks)


def behavior_prompt(probe: Probe, tokenizer, chat: bool, system_prompt: str | None) -> str:
    """A behaviour probe's prompt: the user's request as it is (its instructions are part of it)."""
    if chat:
        return render_chat(tokenizer, probe.question, system_prompt)
    return probe.question + "\n\nResponse:"


def generation_prompt(probe: Probe, tokenizer, chat: bool, cot: bool, system_prompt: str | None) -> str:
    """The prompt to decode greedily from, for generative scoring of either kind of probe."""
    mcq = probe.kind == "mcq"
    if not mcq and not cot:
        return short_answer_prompt(probe, tokenizer, chat, system_prompt)
    body = question_block(probe, with_letters=mcq)
    if cot:
        instruction = _COT_MCQ if mcq else _COT_SHORT
    else:
        instruction = _DIRECT_MCQ
    if chat:
        return render_chat(tokenizer, body + "\n" + instruction, system_prompt)
    if cot:
        return body + "\n" + instruction + "\nReasoning:"
    return body + "\nAnswer:"
