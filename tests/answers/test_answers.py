"""Answer extraction and checking: concrete generations, in memory, no model."""

from __future__ import annotations

import pytest

from forgetwatch import answers
from forgetwatch.answers import (
    LETTERS,
    extract_final_answer,
    extract_letter,
    extract_number,
    extract_short_answer,
    is_correct_short,
    mcq_reward,
    normalize_answer,
    parse_math_answer,
    short_answer_reward,
)


def test_all_is_pinned():
    assert answers.__all__ == [
        "LETTERS",
        "MATCH_MODES",
        "extract_letter",
        "extract_final_answer",
        "extract_short_answer",
        "normalize_answer",
        "extract_number",
        "parse_math_answer",
        "is_correct_short",
        "short_answer_reward",
        "mcq_reward",
        "probe_reward",
    ]
    assert LETTERS == "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


# -- extract_letter ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # answer lines
        ("Answer: C", 2),
        ("answer: C", 2),
        ("ANSWER: D", 3),
        ("Answer: (B)", 1),
        ("Answer: [B]", 1),
        ("The answer is (C)", 2),
        ("The correct answer is C.", 2),
        ("**Answer:** C", 2),
        ("**Answer: C**", 2),
        ("Answer: **C**", 2),
        ("**Answer**: D", 3),
        ("The answer is: A", 0),
        ("Final answer: B) Paris", 1),
        ("The answer is option C", 2),
        ("Answer - B", 1),
        ("My answer would be D.", 3),
        (r"Final: $\boxed{B}$", 1),
        # an answer line makes "A" a choice even before a space
        ("The answer is A because it is the largest.", 0),
        # several answer lines: the last one wins
        ("Answer: A\nWait, let me re-check.\nAnswer: D", 3),
        ("I first thought the answer is B, but the answer is C.", 2),
        ("A) is wrong and B) is wrong. Answer: C", 2),
        # reasoning before the answer line is ignored, even if it opens with a letter
        ("B. Hmm, no.\nThe answer is D", 3),
        # leading letter
        ("C", 2),
        ("C.", 2),
        ("(C)", 2),
        ("C) 42", 2),
        (" C: 42", 2),
        ("  D\nbecause 4 > 3", 3),
        ("**B**", 1),
        ("[A]", 0),
        ("A", 0),
        ("A.", 0),
        ("A: cats", 0),
        ("A)", 0),
        # full-width letters are folded by NFKC
        ("Answer: \uff23", 2),
    ],
)
def test_extract_letter(text, expected):
    assert extract_letter(text, num_choices=4) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "I don't know.",
        # the article "A" in prose is not option A
        "A cat is a small mammal.",
        "A good answer requires thought.",
        "(A cat)",
        # neither is the pronoun "I" (and it is out of range anyway)
        "I think so.",
        # letters beyond k are invalid, on their own and on answer lines
        "E",
        "E) 5",
        "Answer: E",
        "The answer is (F).",
        # lowercase letters are never choices, even after "answer:"
        "answer: b",
        "b",
        "c) 42",
        "The answer is a bit unclear.",
        # the letter must be a word of its own
        "Answer: Canada",
        "Answers: C",
        "BC",
        "Cats are nice.",
        # "answer" then a newline is not an answer line
        "The answer\nA cat",
    ],
)
def test_extract_letter_none(text):
    assert extract_letter(text, num_choices=4) is None


def test_extract_letter_out_of_range_answer_line_does_not_override_valid_one():
    # Out-of-range letters never match, so an earlier valid answer line still counts.
    assert extract_letter("Answer: B\nAnswer: E", num_choices=4) == 1


@pytest.mark.parametrize(("k", "text", "expected"), [(2, "B", 1), (2, "C", None), (5, "Answer: E", 4), (26, "Z", 25)])
def test_extract_letter_respects_num_choices(k, text, expected):
    assert extract_letter(text, num_choices=k) == expected


@pytest.mark.parametrize("k", [0, 27, -1, True, 2.0])
def test_extract_letter_rejects_bad_num_choices(k):
    with pytest.raises(ValueError, match="`num_choices`"):
        extract_letter("A", num_choices=k)


# -- extract_final_answer / extract_short_answer -----------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Answer: Paris", "Paris"),
        ("reasoning...\nAnswer: Paris.", "Paris"),
        ("Final answer: Sunset Boulevard", "Sunset Boulevard"),
        ("**Answer:** Sunset Boulevard", "Sunset Boulevard"),
        ("Answer: **Paris**", "Paris"),
        ("answer: paris", "paris"),
        ("So the answer is 42.", "42"),
        ("The final answer is: Everest", "Everest"),
        ("Answer:\n\n  Rome  ", "Rome"),
        ("Natalia sold 48 + 24 = 72 clips.\n#### 72", "72"),
        ("#### $1,234", "$1,234"),
        ("#### -5", "-5"),
        (r"Thus $\boxed{18}$.", "18"),
        (r"\boxed{\frac{3}{4}}", r"\frac{3}{4}"),
        (r"Answer: $\boxed{7}$", "7"),
        ("Answer: $18$", "18"),
        ("Answer: 3.5", "3.5"),
        # the last one wins
        ("Answer: Paris\nHmm, no.\nAnswer: Lyon", "Lyon"),
        ("The answer is 5. Let me double-check: yes, the answer is 6.", "6"),
        (r"\boxed{1} then \boxed{2}", "2"),
        ("#### 10\nActually the answer is 12", "12"),
        # a Markdown heading is not GSM8K's "####"
        ("#### 1. Setup\nAnswer: 9", "9"),
    ],
)
def test_extract_final_answer(text, expected):
    assert extract_final_answer(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Paris",
        "I am not sure about this one.",
        "#### Step 2: add the numbers",
        "#### 1. Understand the problem",
        "Answers vary.",
        r"\boxed{",
        "Answer:   ",
    ],
)
def test_extract_final_answer_none(text):
    assert extract_final_answer(text) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Paris", "Paris"),
        ("  Paris  ", "Paris"),
        ("\n\n Sunset Boulevard\nQuestion: next one", "Sunset Boulevard"),
        ("Answer: Paris", "Paris"),
        ("**Answer:** Paris", "Paris"),
        ("Paris. It is the capital.", "Paris"),
        ("", None),
        (" \n\t\n", None),
    ],
)
def test_extract_short_answer_direct(text, expected):
    assert extract_short_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Paris is in France.\nAnswer: Paris", "Paris"),
        ("Paris", None),
        ("The answer is Rome.", "Rome"),
    ],
)
def test_extract_short_answer_cot(text, expected):
    assert extract_short_answer(text, cot=True) == expected


# -- normalize_answer --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Paris", "paris"),
        ("  The Beatles  ", "beatles"),
        ("A Tale of Two Cities", "tale of two cities"),
        ("an apple", "apple"),
        ("Theatre", "theatre"),  # articles only as whole words
        ("Sunset-Boulevard!", "sunset boulevard"),
        ("Sunset   Blvd.", "sunset blvd"),
        ("U.S.A.", "usa"),
        ("Smith's", "smiths"),
        ("Smith\u2019s", "smiths"),
        ("1,234", "1234"),
        ("3.5", "3.5"),
        ("Hello, world", "hello world"),
        ("\uff30\uff41\uff52\uff49\uff53", "paris"),  # full-width, folded by NFKC
        ("Zo\u00eb", "zo\u00eb"),
        ("\u00ab Caf\u00e9 \u00bb", "caf\u00e9"),  # unicode punctuation
        ("(the) [end]", "end"),
        ("The", ""),
        ("", ""),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


# -- extract_number ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 1,234.", 1234.0),
        ("$18.00", 18.0),
        ("$18", 18.0),
        ("18.", 18.0),
        ("-5", -5.0),
        ("\u22125", -5.0),  # U+2212 MINUS SIGN
        ("-3.5", -3.5),
        (".5", 0.5),
        ("#### 72", 72.0),
        (r"\boxed{3/4}", 0.75),
        (r"\boxed{\frac{3}{4}}", 0.75),
        (r"\dfrac{1}{8}", 0.125),
        ("18 dollars", 18.0),
        ("50%", 50.0),
        ("1,234,567.89", 1234567.89),
        # no answer line: the last number
        ("4 apples and 7 pears make 11 fruits", 11.0),
        ("1, 2, 3", 3.0),
        # an answer line wins over later numbers, and its first number is taken
        ("Answer: 18 dollars (2 hours x 9 per hour)", 18.0),
        ("The answer is 42.\nI used 3 steps.", 42.0),
        ("48 / 2 = 24, 24 + 48 = 72\n#### 72\n(took 5 min)", 72.0),
        # an answer line without a number falls back to the last number
        ("We get 12 in total.\nAnswer: twelve", 12.0),
        # not fractions or numbers: dates, versions, words with digits
        ("On 3/4/2020 she had 5 cats", 5.0),
        ("version 1.5.2", 1.5),
        ("H2O has 3 atoms", 3.0),
    ],
)
def test_extract_number(text, expected):
    assert extract_number(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["", "no number here", "Answer: Paris", "x2 and y3", "3/4/2020", "1/0"])
def test_extract_number_none(text):
    assert extract_number(text) is None


# -- is_correct_short --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prediction", "answers", "expected"),
    [
        ("Paris", ["Paris"], True),
        ("paris.", ["Paris"], True),
        ("The Paris", ["Paris"], True),
        ("Sunset Blvd", ["Sunset Boulevard", "Sunset Blvd"], True),
        ("Sunset-Boulevard", "Sunset Boulevard", True),
        ("Paris, France", ["Paris"], False),
        ("It is Paris", ["Paris"], False),
        ("Lyon", ["Paris"], False),
        (None, ["Paris"], False),
        ("", ["Paris"], False),
        ("The", ["The"], False),  # normalises to nothing; matches no alias
    ],
)
def test_is_correct_short_exact(prediction, answers, expected):
    assert is_correct_short(prediction, answers) is expected
    assert is_correct_short(prediction, answers, match="exact") is expected


@pytest.mark.parametrize(
    ("prediction", "answers", "expected"),
    [
        ("Paris", ["Paris"], True),
        ("It is Paris, I think", ["Paris"], True),
        ("Paris, France", ["Paris"], True),
        ("I'd say Sunset-Boulevard.", ["Sunset Boulevard"], True),
        ("Parisian cuisine", ["Paris"], False),  # whole words only
        ("Lyon", ["Paris"], False),
        (None, ["Paris"], False),
    ],
)
def test_is_correct_short_contains(prediction, answers, expected):
    assert is_correct_short(prediction, answers, match="contains") is expected


def test_contains_is_more_lenient_than_exact():
    cases = [("It is Paris", ["Paris"]), ("Paris", ["Paris"]), ("Lyon", ["Paris"]), ("Paris or Lyon", ["Lyon"])]
    for prediction, answers_ in cases:
        if is_correct_short(prediction, answers_, match="exact"):
            assert is_correct_short(prediction, answers_, match="contains")
    assert is_correct_short("Paris or Lyon", ["Lyon"], match="contains")
    assert not is_correct_short("Paris or Lyon", ["Lyon"], match="exact")


@pytest.mark.parametrize(
    ("prediction", "answers", "expected"),
    [
        ("72", ["72"], True),
        ("$1,234.00", ["1234"], True),
        ("The answer is 72.", ["72"], True),
        ("0.75", ["3/4"], True),
        (r"\frac{3}{4}", ["0.75"], True),
        ("72.00", ["72"], True),
        ("72.001", ["72"], False),
        ("-5", ["5"], False),
        ("0", ["0"], True),
        ("seventy-two", ["72"], False),
        (None, ["72"], False),
        ("Natalia sold 72", ["Natalia sold 48/2 = 24 clips in May.\n#### 72"], True),  # a full GSM8K solution
        ("18", ["twenty", "18"], True),  # an alias without a number is skipped
    ],
)
def test_is_correct_short_numeric(prediction, answers, expected):
    assert is_correct_short(prediction, answers, numeric=True) is expected


def test_is_correct_short_errors():
    with pytest.raises(ValueError, match="`match`"):
        is_correct_short("Paris", ["Paris"], match="fuzzy")
    with pytest.raises(ValueError, match="`answers`"):
        is_correct_short("Paris", [])
    with pytest.raises(ValueError, match="`answers`.*numeric"):
        is_correct_short("72", ["seventy-two"], numeric=True)


# -- rewards -----------------------------------------------------------------------------------------------


def _chat(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_short_answer_reward_strings_and_conversations():
    completions = ["Answer: Paris", _chat("The capital is Lyon.\nAnswer: Lyon"), "no idea", _chat("Answer: Paris")]
    solution = ["Paris", "Paris", "Paris", ["Paris", "City of Light"]]
    assert short_answer_reward(completions, solution) == [1.0, 0.0, 0.0, 1.0]


def test_short_answer_reward_conversation_reads_last_message():
    completion = [{"role": "assistant", "content": "Answer: Lyon"}, {"role": "assistant", "content": "Answer: Paris"}]
    multimodal = [{"role": "assistant", "content": [{"type": "text", "text": "Answer: "}, {"type": "text", "text": "Paris"}]}]
    assert short_answer_reward([completion, multimodal], ["Paris", "Paris"]) == [1.0, 1.0]


def test_short_answer_reward_per_example_kwargs():
    # As GRPOTrainer passes dataset columns: one value per completion.
    completions = ["#### 72", "Answer: 72 clips", "Paris", "It is Paris, of course"]
    rewards = short_answer_reward(
        completions,
        solution=["72", "72", ["Paris"], "Paris"],
        numeric=[True, True, False, False],
        cot=[True, True, False, False],
        match=["exact", "exact", "exact", "contains"],
    )
    assert rewards == [1.0, 1.0, 1.0, 1.0]


def test_short_answer_reward_scalar_kwargs_and_direct_mode():
    assert short_answer_reward(["18", "$18.00", "17"], ["18"] * 3, numeric=True, cot=False) == [1.0, 1.0, 0.0]
    # Without cot, the first line is the answer; with cot, a missing final answer is invalid (0.0).
    assert short_answer_reward(["Paris\nAnswer: Lyon"], ["Paris"], cot=False) == [1.0]
    assert short_answer_reward(["Paris"], ["Paris"], cot=True) == [0.0]


def test_short_answer_reward_accepts_numeric_gold_and_skips_missing_gold():
    assert short_answer_reward(["Answer: 72", "Answer: 5"], [72, None], numeric=True) == [1.0, None]


def test_short_answer_reward_ignores_trainer_kwargs_and_logs():
    logged: dict[str, list] = {}
    metrics: dict[str, float] = {}
    rewards = short_answer_reward(
        prompts=["q1", "q2"],
        completions=["Answer: 7", "I give up"],
        completion_ids=[[1], [2]],
        solution=["7", "7"],
        numeric=[True, True],
        trainer_state=object(),
        log_extra=logged.__setitem__,
        log_metric=metrics.__setitem__,
        category=["math", "math"],  # an unrelated dataset column
    )
    assert rewards == [1.0, 0.0]
    assert logged == {"short_answer": ["7", None]}
    assert metrics == {"forgetwatch/short_answer_invalid": 0.5}


def test_short_answer_reward_length_errors():
    with pytest.raises(ValueError, match="`solution`"):
        short_answer_reward(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="`numeric`"):
        short_answer_reward(["a", "b"], ["a", "b"], numeric=[True])


def test_mcq_reward_strings_and_conversations():
    completions = ["Answer: (B)", _chat("B"), _chat("A cat."), "The answer is D", "E"]
    # gold as letters and as indices (like Probe.gold)
    assert mcq_reward(completions, ["B", 1, "A", 2, "E"], num_choices=5) == [1.0, 1.0, 0.0, 0.0, 1.0]


def test_mcq_reward_per_example_num_choices():
    completions = ["C", "C", "Answer: E"]
    assert mcq_reward(completions, ["C", "C", "E"], num_choices=[4, 3, 5]) == [1.0, 1.0, 1.0]
    assert mcq_reward(["C"], ["B"], num_choices=[3]) == [0.0]


def test_mcq_reward_num_choices_from_choices_column():
    choices = [["x", "y"], ["x", "y", "z"]]
    # "C" is out of range for 2 options (invalid), valid for 3.
    assert mcq_reward(["C", "C"], ["B", "C"], choices=choices) == [0.0, 1.0]
    # one shared option list serves every completion
    assert mcq_reward(["B", "C"], [1, 2], choices=["x", "y", "z"]) == [1.0, 1.0]


def test_mcq_reward_without_num_choices_reads_any_letter():
    assert mcq_reward(["Answer: F", "Answer: F"], ["F", 0]) == [1.0, 0.0]


def test_mcq_reward_gold_forms_and_skips():
    assert mcq_reward(["C", "C", "C"], ["c", "(C)", None], num_choices=4) == [1.0, 1.0, None]


def test_mcq_reward_logs():
    logged: dict[str, list] = {}
    metrics: dict[str, float] = {}
    mcq_reward(
        ["B", "A cat", "Answer: D"], [1, 0, 3], num_choices=4, log_extra=logged.__setitem__, log_metric=metrics.__setitem__
    )
    assert logged == {"mcq": ["B", None, "D"]}
    assert metrics["forgetwatch/mcq_invalid"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("gold", ["E", "AB", "", 4, -1, True, 1.0])
def test_mcq_reward_bad_gold(gold):
    with pytest.raises((ValueError, TypeError)):
        mcq_reward(["A"], [gold], num_choices=4)


def test_mcq_reward_num_choices_length_error():
    with pytest.raises(ValueError, match="`num_choices`"):
        mcq_reward(["A", "B"], ["A", "B"], num_choices=[4])


def test_rewards_match_trl_call_convention():
    # GRPOTrainer._calculate_rewards calls reward_func(prompts=..., completions=..., completion_ids=..., **columns)
    # with each column as a per-completion list, plus trainer_state/log_extra/log_metric.
    inputs = [
        {"prompt": "2+2?", "solution": "4", "numeric": True},
        {"prompt": "Capital of France?", "solution": "Paris", "numeric": False},
    ]
    keys = [k for k in inputs[0] if k not in ("prompt", "completion", "completion_ids")]
    reward_kwargs = {k: [ex[k] for ex in inputs] for k in keys}
    reward_kwargs.update(trainer_state=None, log_extra=lambda c, v: None, log_metric=lambda n, v: None)
    out = short_answer_reward(
        prompts=[ex["prompt"] for ex in inputs],
        completions=[_chat("2+2=4\nAnswer: 4"), _chat("Answer: Paris")],
        completion_ids=[[1], [2]],
        **reward_kwargs,
    )
    assert out == [1.0, 1.0]


@pytest.mark.parametrize("conversational", [False, True])
def test_rewards_run_inside_a_real_grpo_trainer(tmp_path, tokenizer, tiny_model, conversational):
    # One GRPO step with the tiny random model: the rewards must accept what TRL really passes, and their
    # invalid rate must reach the trainer's logs.
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    calls: list[tuple[list, dict, list]] = []

    def spy(completions, solution, **kwargs):
        rewards = short_answer_reward(completions, solution, **kwargs)
        calls.append((list(completions), kwargs, rewards))
        return rewards

    spy.__name__ = "short_answer"
    question = "What is 2+2?"
    prompt = [{"role": "user", "content": question}] if conversational else question
    dataset = Dataset.from_dict({"prompt": [prompt] * 4, "solution": ["4"] * 4, "numeric": [True, True, False, False]})
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        max_steps=1,
        report_to=[],
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
    )
    trainer = GRPOTrainer(model=tiny_model, processing_class=tokenizer, reward_funcs=[spy], args=args, train_dataset=dataset)
    trainer.train()

    (completions, kwargs, rewards), *_ = calls
    assert isinstance(completions[0], list if conversational else str)
    # A column arrives as one value per completion (prompts are sampled and repeated, so order varies).
    assert len(kwargs["numeric"]) == 4 and all(isinstance(v, bool) for v in kwargs["numeric"])
    assert rewards == short_answer_reward(completions, ["4"] * 4, numeric=kwargs["numeric"])
    logs = trainer.state.log_history[0]
    assert "rewards/short_answer/mean" in logs
    assert 0.0 <= logs["forgetwatch/short_answer_invalid"] <= 1.0


# -- replies of a real instruct model (SmolLM2-135M-Instruct, greedy, captured verbatim) ----------------------


@pytest.mark.parametrize(
    ("reply", "extracted"),
    [
        ("The capital of Italy is Rome.", "The capital of Italy is Rome"),  # a sentence stays a sentence
        ("The USS Kormal (LAS-1)", "The USS Kormal"),
        ("Denmark, 1992", "Denmark, 1992"),
        ("The New York City Menswear Museum", "The New York City Menswear Museum"),
        (
            "A sabii is a carnivorous mammal that is native to the Americas",
            "A sabii is a carnivorous mammal that is native to the Americas",
        ),
        (" Oscar Wilde", "Oscar Wilde"),
        (" 1.5 x 10^15 meters", "1.5 x 10^15 meters"),
        ("A: A: Oslo", "Oslo"),  # few-shot labels echoed
        ('The answer is "Rome", which is the capital of Italy.', "Rome"),
        ("**Answer:** *Paris*", "Paris"),
        ("Rome. It is the capital of Italy.", "Rome"),
        ("So the correct answer would be: Lisbon", "Lisbon"),
        ("Rome because it is the capital", "Rome"),
        ("\u201cJupiter\u201d", "Jupiter"),
        # abbreviations are not sentence ends
        ("St. Louis", "St. Louis"),
        ("U.S. Army", "U.S. Army"),
        ("Dr. No", "Dr. No"),
        ("Oslo. It is in Norway.", "Oslo"),
        ("Washington, D.C.", "Washington, D.C"),
    ],
)
def test_extract_short_answer_from_instruct_replies(reply, extracted):
    assert extract_short_answer(reply) == extracted


@pytest.mark.parametrize(
    ("reply", "aliases", "exact", "contains"),
    [
        ("The capital of Italy is Rome.", ["Rome"], False, True),
        ("The answer is Rome.", ["Rome"], True, True),
        ("Rome, which is the capital of Italy.", ["Rome"], True, True),
        ("The USS Kormal (LAS-1)", ["USS Kormal"], True, True),  # article and parenthesis dropped
        ("Denmark, 1992", ["Denmark"], False, True),
        ("Parisian cafes", ["Paris"], False, False),
    ],
)
def test_matching_instruct_replies(reply, aliases, exact, contains):
    answer = extract_short_answer(reply)
    assert is_correct_short(answer, aliases, match="exact") is exact
    assert is_correct_short(answer, aliases, match="contains") is contains


def test_numeric_sentences_are_checked_with_math_verify():
    # "A week is approximately 7 days." was the model's whole reply to a numeric question
    assert is_correct_short(extract_short_answer("A week is approximately 7 days."), ["7"], numeric=True)
    assert is_correct_short("18 dollars (2 x 9)", ["18"], numeric=True)  # the trailing clause is not the answer
    assert parse_math_answer("Paris") == []
    assert is_correct_short(r"$\frac{3}{4}$", ["0.75"], numeric=True)


@pytest.mark.parametrize("match", ["exact", "contains"])
@pytest.mark.parametrize(("prediction", "gold", "expected"), [("-5", "5", False), ("5", "-5", False), ("-5", "-5", True),
                                                                ("\u22125", "-5", True), ("-0.5", "0.5", False)])
def test_a_minus_sign_survives_every_mode(match, prediction, gold, expected):
    assert is_correct_short(prediction, [gold], match=match) is expected
    assert is_correct_short(prediction, [gold], numeric=True) is expected
    assert is_correct_short(f"it is {prediction} degrees", [gold], match="contains") is expected


def test_normalize_keeps_a_minus_but_not_a_hyphen():
    assert normalize_answer("-5") == "-5" and normalize_answer("(-5)") == "-5"
    assert normalize_answer("1-2") == "1 2" and normalize_answer("Jean-Paul") == "jean paul"
    assert normalize_answer(".5") == ".5" != normalize_answer("5")


def test_probe_reward_scores_each_row_by_its_kind():
    """Replayed probes in a GRPO batch: multiple-choice rows by the letter, short-answer rows by the answer; columns
    given per completion follow their rows, and each kind logs its own invalid rate."""
    logged = {}
    completions = ["B. Paris", "Answer: 12", "Paris", "Answer: C", ""]
    got = answers.probe_reward(
        completions, solution=["B", "12", ["Paris", "paris city"], "A", "12"], kind=["mcq", "short", "short", "mcq", "short"],
        numeric=[False, True, False, False, True], cot=[False, True, False, False, False], num_choices=[4, None, None, 3, None],
        log_metric=logged.__setitem__, log_extra=lambda *a: pytest.fail("a per-kind column log would be misaligned"))
    assert got == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert logged == {"forgetwatch/mcq_invalid": 0.0, "forgetwatch/short_answer_invalid": pytest.approx(1 / 3)}
    assert answers.probe_reward(["7"], solution=["7"], numeric=True, cot=False) == [1.0]  # no `kind` column: short answers
