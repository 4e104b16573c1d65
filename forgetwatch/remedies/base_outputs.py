"""The base model's own answers to a replay pool, made once and cached: the targets of self-distilled replay and
of the KL anchor.

For every pool prompt the base answers as it is scored (the option it ranks first for a multiple-choice question,
with the whole distribution over the options kept beside it; its own bare answer to a short-answer question; its
greedy answer in the chat template for an instruction, a harmless request or any unlabelled prompt of yours), and
one forward over the finished conversation keeps its top-k next-token log-probabilities at every position of the
answer. Replaying these answers trains the base's behaviour back (on-policy for the base, no labels needed); the
top-k log-probabilities let `forgetwatch.remedies.KLAnchor` pull the model toward the base without a second model in
memory.

The file is keyed like the base cache (model identity, tokenizer, pool fingerprint, how the answers were made):
loading it for another model, tokenizer or pool is refused with what differs, and an existing file is never
overwritten.

Example:
    >>> outs = make_base_outputs(model, tokenizer, "arc_easy,sciq", exclude=watch.probes, max_length=256)  # doctest: +SKIP
    >>> outs.save("base_outputs.parquet")  # doctest: +SKIP
    >>> rows = BaseOutputs.load("base_outputs.parquet").replay_rows()  # doctest: +SKIP
    >>> rows[0]["messages"][1]["content"]  # the base's own answer  # doctest: +SKIP
    'a magnet'
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._io import atomic_write, file_lock, read_jsonl
from ..options import default
from ..probes.probe_set import Probe
from ..probes.suites import load_probes
from ..scoring.models import architecture_id, free_memory, load_model, model_identity
from ..scoring.prompts import PROMPT_VERSION, question_block

__all__ = ["BaseOutputs", "load_or_make", "make_base_outputs", "outputs_key", "pool_probes", "tokenizer_identity"]

logger = logging.getLogger(__name__)

FORMAT = "forgetwatch-base-outputs/1"
_META_KEY = b"forgetwatch_base_outputs"
TOP_K = 20


def tokenizer_identity(tokenizer: Any) -> dict[str, Any]:
    """What must match for cached token ids to mean the same thing: the tokenizer's name, size and chat template.

    Example:
        >>> tokenizer_identity(tok)  # doctest: +SKIP
        {'name_or_path': '.../SmolLM2-135M-Instruct', 'vocab': 49152, 'chat_template': '5b1b1e0c3a7d'}
    """
    template = getattr(tokenizer, "chat_template", None) or ""
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False)
    # the name is kept to say what made the file; a local copy of the same tokenizer has another name and still matches
    return {"name_or_path": str(getattr(tokenizer, "name_or_path", "") or ""), "vocab": len(tokenizer),
            "vocab_sha": hashlib.sha256(vocab.encode()).hexdigest()[:12],
            "chat_template": hashlib.sha256(str(template).encode()).hexdigest()[:12] if template else None}


def outputs_key(model_ident: dict[str, Any], tokenizer: Any, prompts_fingerprint: str, n: int, top_k: int,
                max_new_tokens: int, max_length: int | None) -> dict[str, Any]:
    """The key of a base-outputs file (see the module doc)."""
    return {"format": FORMAT, "model": model_ident, "tokenizer": tokenizer_identity(tokenizer),
            "pool": {"fingerprint": prompts_fingerprint, "n": n},
            "making": {"top_k": top_k, "max_new_tokens": max_new_tokens, "max_length": max_length,
                       "prompt_version": PROMPT_VERSION}}


@dataclass
class BaseOutputs:
    """The base's answers to a pool, one row per kept prompt (see the module doc).

    Columns (lists, one entry per row): `id`, `category`, `kind` (mcq, short, prompt), `user` (the replayed user
    turn), `answer` (the base's answer), `option_probs` (multiple choice: the base's distribution over the options,
    else empty), `input_ids` (the conversation, as the chat template tokenizes it), `start` (the index of the
    answer's first token), `topk_ids` / `topk_logprobs` (arrays of shape (len(input_ids) - start, k): the base's
    top-k next-token log-probabilities predicting each answer token).
    """

    key: dict[str, Any]
    rows: list[dict[str, Any]]
    source: str = "base outputs"  # the file they were read from, for messages

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def categories(self) -> list[str]:
        return sorted({r["category"] for r in self.rows})

    def replay_rows(self) -> list[dict[str, Any]]:
        """Training examples whose targets are the base's answers, in the shapes `mix_replay` hands on: `messages`,
        `prompt` / `completion` (TRL's prompt-completion form) and plain `text` ("Question: ...\\nAnswer: ...")."""
        out = []
        for r in self.rows:
            user, answer = r["user"], r["answer"]
            out.append({"id": r["id"], "category": r["category"], "kind": r["kind"],
                        "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
                        "prompt": [{"role": "user", "content": user}],
                        "completion": [{"role": "assistant", "content": answer}],
                        "text": f"{user}\nAnswer: {answer}" if r["kind"] != "prompt" else f"{user}\n\n{answer}"})
        return out

    def check(self, model_ident: dict[str, Any] | None, tokenizer: Any, path: Any = "base outputs",
              pool: dict[str, Any] | None = None) -> None:
        """Refuse outputs made by another model or tokenizer (the anchor's log-probabilities would mean nothing), or,
        given `pool` (`{"fingerprint", "n"}`), for another pool."""
        from ..record.cache import diff_keys

        mine = {k: v for k, v in tokenizer_identity(tokenizer).items() if k != "name_or_path"}
        expect: dict[str, Any] = {"tokenizer": mine}
        found: dict[str, Any] = {"tokenizer": {k: (self.key.get("tokenizer") or {}).get(k) for k in mine}}
        if pool is not None:
            expect["pool"], found["pool"] = pool, self.key.get("pool")
        if model_ident is not None:
            # the name may differ (a local copy of the same model); the architecture may not
            expect["model"] = {"architecture": model_ident.get("architecture")}
            found["model"] = {"architecture": (self.key.get("model") or {}).get("architecture")}
            if expect["model"]["architecture"] is None:
                expect.pop("model"), found.pop("model")
        diffs = diff_keys(expect, found)
        if diffs:
            what = "for another pool" if all(d.startswith("pool") for d in diffs) else "by another model or tokenizer"
            raise ValueError(f"{path}: these base outputs were made {what}:\n  " + "\n  ".join(diffs)
                             + "\nmake them again with the base model you train from and this pool (`forgetwatch base-outputs "
                             "--model <base> --pool <pool> -o <new file>`), or point to the right file")

    # -- files ----------------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, overwrite: bool = False, _locked: bool = False) -> Path:
        """Write a Parquet file; an existing file is kept unless `overwrite` (it may be another run's cache)."""
        import contextlib

        import pyarrow as pa
        import pyarrow.parquet as pq

        path = Path(path)
        with contextlib.nullcontext() if _locked else file_lock(path):
            if path.exists() and not overwrite:
                raise FileExistsError(f"{path} exists: base outputs are never overwritten; remove it or choose another path")
            cols: dict[str, list] = {c: [] for c in ("id", "category", "kind", "user", "answer", "option_probs", "input_ids",
                                                     "start", "topk_ids", "topk_logprobs", "k")}
            for r in self.rows:
                for c in ("id", "category", "kind", "user", "answer", "start"):
                    cols[c].append(r[c])
                cols["option_probs"].append([float(x) for x in r["option_probs"]])
                cols["input_ids"].append([int(x) for x in r["input_ids"]])
                cols["topk_ids"].append(np.asarray(r["topk_ids"], np.int32).ravel().tolist())
                cols["topk_logprobs"].append(np.asarray(r["topk_logprobs"], np.float32).ravel().tolist())
                cols["k"].append(int(np.asarray(r["topk_ids"]).shape[-1]) if len(r["topk_ids"]) else 0)
            table = pa.table({**cols, "topk_ids": pa.array(cols["topk_ids"], pa.list_(pa.int32())),
                              "topk_logprobs": pa.array(cols["topk_logprobs"], pa.list_(pa.float32()))})
            table = table.replace_schema_metadata({_META_KEY: json.dumps(self.key).encode()})
            with atomic_write(path, "wb") as f:
                pq.write_table(table, f)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, expect: dict[str, Any] | None = None) -> BaseOutputs:
        """Read a file written by `save`; with `expect` (an `outputs_key`), refuse it unless the keys match."""
        import pyarrow.parquet as pq

        from ..record.cache import diff_keys

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no base outputs here; make them with `forgetwatch base-outputs --model <base> "
                                    f"--pool <pool> -o {path}`")
        try:
            table = pq.read_table(path)
            meta = table.schema.metadata or {}
            key = json.loads(meta[_META_KEY])
        except Exception as e:
            raise ValueError(
                f"{path}: not a forgetwatch base-outputs file ({e}); make one with `forgetwatch base-outputs`"
            ) from None
        if key.get("format") != FORMAT:
            raise ValueError(
                f"{path}: base outputs of format {key.get('format')!r}, this forgetwatch reads {FORMAT!r}; make them again"
            )
        if expect is not None:
            diffs = diff_keys(expect, key)
            if diffs:
                raise ValueError(f"{path}: these base outputs were made under another key:\n  " + "\n  ".join(diffs)
                                 + "\nremove the file (or choose another path) to make them again")
        data = table.to_pydict()
        rows = []
        for i in range(table.num_rows):
            k = data["k"][i]
            ids, lps = np.asarray(data["topk_ids"][i], np.int64), np.asarray(data["topk_logprobs"][i], np.float32)
            rows.append({"id": data["id"][i], "category": data["category"][i], "kind": data["kind"][i],
                         "user": data["user"][i], "answer": data["answer"][i], "option_probs": data["option_probs"][i],
                         "input_ids": data["input_ids"][i], "start": data["start"][i],
                         "topk_ids": ids.reshape(-1, k) if k else ids.reshape(0, 0),
                         "topk_logprobs": lps.reshape(-1, k) if k else lps.reshape(0, 0)})
        return cls(key, rows, source=str(path))


# -- making them --------------------------------------------------------------------------------------------
def pool_probes(pool: Any, exclude: Any = None) -> list[Probe]:
    """The pool as probes: suite names (every probe of them but the excluded ones), a probe file, a `ProbeSet`, or a
    JSONL / list of unlabelled prompts (`{"prompt": "...", "category": "...", "id": optional}`), which become
    harmless-request probes (answered by generation in the chat template)."""

    if isinstance(exclude, (str, os.PathLike)):
        exclude = load_probes(str(exclude))  # suite names or a probe file, as `forgetwatch base-outputs --exclude` takes
    excluded = set(exclude.ids if hasattr(exclude, "ids") else exclude or ())
    if isinstance(pool, (str, os.PathLike)):
        path = Path(pool)
        if path.is_file():
            rows = [(f"{path} line {i}", r) for i, r in read_jsonl(path, hint="one prompt or probe per line", objects=True)]
            if rows and "kind" in rows[0][1]:
                pool = load_probes(str(path))
            else:
                pool = _prompt_probes(rows)
        else:
            pool = load_probes(str(pool))
    elif isinstance(pool, (list, tuple)) and pool and isinstance(pool[0], dict):
        pool = _prompt_probes([(f"pool row {i}", r) for i, r in enumerate(pool)])
    probes = [p for p in pool if p.id not in excluded]
    if not probes:
        raise ValueError("the pool is empty (after holding out the monitored probes)")
    return probes


def _prompt_probes(rows: Sequence[tuple[str, Any]]) -> list[Probe]:
    out = []
    for where, r in rows:
        if not isinstance(r, dict) or not isinstance(r.get("prompt"), str) or not r["prompt"].strip():
            raise ValueError(f"{where}: needs a `prompt` (the user's request, a non-empty string) and a `category`")
        if "category" not in r:
            raise ValueError(f"{where}: needs a `category` (replay is drawn by category)")
        pid = str(r.get("id") or "prompt-" + hashlib.sha256(r["prompt"].encode()).hexdigest()[:12])
        out.append(Probe(pid, "comply", r["prompt"], category=str(r["category"]), source="prompts"))
    return out


def make_base_outputs(model: Any, tokenizer: Any, pool: Any, *, exclude: Any = None, max_length: int | None = None,
                      top_k: int = TOP_K, max_new_tokens: int = 128, batch_size: int = default("batch_size"),
                      progress: bool = False) -> BaseOutputs:
    """The base's answers and top-k log-probabilities for every pool prompt (see the module doc).

    Args:
        model: the base model (before any training step), any causal LM.
        tokenizer: its tokenizer; needs a chat template (replay trains conversations).
        pool: suite names, a probe file or `ProbeSet`, or unlabelled prompts (see `pool_probes`).
        exclude: probes (or ids) never to use: the monitored ones.
        max_length: the trainer's `max_length`: a prompt longer than it is refused (naming it); an answer that would
            pass it is cut there.
        top_k: how many next-token log-probabilities to keep per answer token.
        max_new_tokens: the generation budget of generated answers; one that does not end within it is left out
            (replaying a cut answer would teach stopping mid-sentence), and counted in a warning.
    """
    from ..scoring.score import ScoringConfig, score_probes

    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("base outputs are conversations: the tokenizer has no chat template (set one, e.g. from the "
                         "instruct model the base comes from)")
    if not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"`top_k` must be a positive integer, got {top_k!r}")
    probes, users = _pool_users(pool, exclude)
    if len(probes) > 5000:
        logger.warning("forgetwatch: making the base's answers to %d pool prompts (one scoring pass and one forward each); "
                       "a smaller pool, e.g. `arc_easy:200,sciq:200`, is made in a fraction of the time", len(probes))
    _check_prompt_lengths(tokenizer, probes, users, max_length)
    config = ScoringConfig(mcq_mode="loglik", short_mode="generate", behavior_max_new_tokens=max_new_tokens,
                           batch_size=batch_size)
    results = score_probes(model, tokenizer, probes, config, progress=progress, desc="forgetwatch: base outputs")
    rows, runaways, invalid = [], 0, 0
    for i, p in enumerate(probes):
        option_probs: list[float] = []
        if p.kind == "mcq":
            scores = np.asarray(results.option_scores[i], np.float64)
            option_probs = (np.exp(scores - scores.max()) / np.exp(scores - scores.max()).sum()).tolist()
            answer = p.choices[int(np.argmax(scores))]
        elif p.kind == "short":
            answer = results.prediction[i]
            if not answer:
                invalid += 1
                continue
        else:
            if results.stopped is not None and results.stopped[i] == 0:
                runaways += 1
                continue
            answer = results.generation[i]
        kind = p.kind if p.kind in ("mcq", "short") else "prompt"
        rows.append({"id": p.id, "category": p.category, "kind": kind, "user": users[i], "answer": answer,
                     "option_probs": option_probs})
    if runaways or invalid:
        logger.warning("forgetwatch: base outputs leave out %d answers that did not end within %d tokens and %d short "
                       "answers the base gave none to", runaways, max_new_tokens, invalid)
    _add_topk(model, tokenizer, rows, top_k, max_length, batch_size)
    key = outputs_key(model_identity(model), tokenizer, _fingerprint(probes, users), len(probes), top_k, max_new_tokens,
                      max_length)
    return BaseOutputs(key, rows)


def _pool_users(pool: Any, exclude: Any) -> tuple[list[Probe], list[str]]:
    """The pool's probes and the user turn each is replayed with (the question as it is scored, without letters)."""
    probes = pool_probes(pool, exclude)
    return probes, [p.question if p.is_behavior else question_block(p, with_letters=False) for p in probes]


def _fingerprint(probes: Sequence[Probe], users: Sequence[str]) -> str:
    text = "\n".join(f"{p.id}\t{p.category}\t{u}\t{p.choices}" for p, u in zip(probes, users, strict=True))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _check_prompt_lengths(tokenizer, probes: Sequence[Probe], users: Sequence[str], max_length: int | None) -> None:
    if max_length is None:
        return
    too_long = []
    for p, u in zip(probes, users, strict=True):
        n = len(_chat_ids(tokenizer, [{"role": "user", "content": u}], generation_prompt=True))
        if n >= max_length:
            too_long.append(f"{p.id} ({n} tokens)")
    if too_long:
        shown = ", ".join(too_long[:5]) + (f" and {len(too_long) - 5} more" if len(too_long) > 5 else "")
        raise ValueError(f"{len(too_long)} pool prompts are as long as max_length={max_length} or longer: {shown}; their "
                         "answers would be cut away in training. Raise max_length or leave those prompts out of the pool")


def _chat_ids(tokenizer, messages: list[dict[str, str]], generation_prompt: bool = False) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=generation_prompt)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def _add_topk(model, tokenizer, rows: list[dict[str, Any]], top_k: int, max_length: int | None, batch_size: int) -> None:
    """Tokenize each conversation as the trainer will, and keep the base's top-k log-probabilities over its answer."""
    import torch

    from ..scoring.forward import model_device, pad_token_id, untouched

    for r in rows:
        messages = [{"role": "user", "content": r["user"]}, {"role": "assistant", "content": r["answer"]}]
        prompt = _chat_ids(tokenizer, messages[:1], generation_prompt=True)
        full = _chat_ids(tokenizer, messages)
        if full[: len(prompt)] != prompt:
            raise ValueError(f"pool prompt {r['id']!r}: the chat template does not render the conversation as the prompt "
                             "followed by the answer, so the answer's tokens cannot be located")
        if max_length is not None:
            full = full[:max_length]
        r["input_ids"], r["start"] = full, len(prompt)
    device, pad = model_device(model), pad_token_id(tokenizer)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]["input_ids"]), reverse=True)
    with untouched(model), torch.no_grad():
        for b in range(0, len(order), batch_size):
            batch = [rows[i] for i in order[b: b + batch_size]]
            width = max(len(r["input_ids"]) for r in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for j, r in enumerate(batch):
                ids[j, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
                mask[j, : len(r["input_ids"])] = 1
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
            logp = torch.log_softmax(logits, dim=-1)
            for j, r in enumerate(batch):
                # position t predicts token t + 1: the answer's tokens start..end-1 are predicted at start-1..end-2
                span = logp[j, r["start"] - 1: len(r["input_ids"]) - 1]
                values, indices = span.topk(top_k, dim=-1)
                r["topk_ids"], r["topk_logprobs"] = indices.cpu().numpy().astype(np.int32), values.cpu().numpy()


def load_or_make(path: str | os.PathLike, model: Any, tokenizer: Any, pool: Any, *, dtype: str = "float32",
                 **kwargs: Any) -> BaseOutputs:
    """The outputs at `path` when they were made for this model, tokenizer and pool; else made now and saved there
    (a file made for something else is refused, never overwritten).

    `model` is the base model, or its name or path: then it is loaded (in `dtype`) only when the outputs must be made.

    Example:
        >>> outs = load_or_make("base_outputs.parquet", "smollm2", tok, "arc_easy:200,sciq:200")  # doctest: +SKIP
    """

    path = Path(path)
    # held while checking and making: runs sharing one file wait for the first to make it, then read it
    with file_lock(path, timeout=-1):
        if path.is_file():
            outs = BaseOutputs.load(path)
            if isinstance(model, (str, os.PathLike)):
                from transformers import AutoConfig

                ident = {"architecture": architecture_id(AutoConfig.from_pretrained(str(model)))}
            else:
                ident = model_identity(model)
            probes, users = _pool_users(pool, kwargs.get("exclude"))
            outs.check(ident, tokenizer, path, pool={"fingerprint": _fingerprint(probes, users), "n": len(probes)})
            made_at = (outs.key.get("making") or {}).get("max_length")
            wanted = kwargs.get("max_length")
            if made_at is not None and (wanted is None or made_at < wanted):
                logger.warning("forgetwatch: %s was made with max_length=%s, below this run's %s: answers cut there stay "
                               "cut (the anchor sees only their first tokens); make the file again to use the longer "
                               "length", path, made_at, wanted)
            return outs
        loaded = isinstance(model, (str, os.PathLike))
        if loaded:
            model, _ = load_model(str(model), dtype=dtype)
        try:
            outs = make_base_outputs(model, tokenizer, pool, **kwargs)
        finally:
            if loaded:
                del model
                free_memory()
        outs.save(path, _locked=True)
        outs.source = str(path)
        return outs
