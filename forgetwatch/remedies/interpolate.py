"""Interpolation toward the base (WiSE-FT, Wortsman et al. 2022): θ(α) = θ_base + α (θ_ft − θ_base), no training.

`forgetwatch interpolate` scores the probes at each α of a grid against the base cache, beside a task measure, to show
what each step back toward the base buys in forgetting and costs in task skill. This module holds the torch side:

- `Interpolator` sets a fine-tuned model's weights to θ(α) in place, streaming the base's and the checkpoint's tensors
  one at a time from their safetensors files (never a second model in memory);
- `LoraScaler` scales a PEFT LoRA adapter by α (its `scaling`, the adapter's contribution; α = 0 is the base);
- `held_out_loss` is the task measure on a dataset the user names: mean negative log-likelihood per answer token;
- `save_interpolated` / `save_lora_merged` write θ(α) at the checkpoint's own precision (not the scoring one).

Example:
    >>> interp = Interpolator(model, base_dir="base/", tuned_dir="outputs/ckpt")  # doctest: +SKIP
    >>> interp.set(0.5)  # the model now holds the midpoint  # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .._io import read_jsonl
from ..errors import InterpolationError
from .alpha import DEFAULT_ALPHAS, MAX_ALPHAS, alpha_grid  # noqa: F401  (re-exported: the CLI and tests import them here)

__all__ = ["Interpolator", "LoraScaler", "InterpolationError", "alpha_grid", "held_out_loss", "load_task_data",
           "encode_task_rows", "check_lora_config", "save_interpolated", "save_lora_merged", "setting_differences",
           "DEFAULT_ALPHAS", "model_files"]

logger = logging.getLogger(__name__)



class _Tensors:
    """A model directory's safetensors weights by name, read one tensor at a time."""

    def __init__(self, directory: Path, what: str):
        self.directory = directory
        self._header: dict[str, tuple[str, tuple[int, ...]]] | None = None
        index = directory / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            self.files = {name: directory / f for name, f in weight_map.items()}
        elif (directory / "model.safetensors").is_file():
            from safetensors import safe_open

            with safe_open(directory / "model.safetensors", "pt") as f:
                self.files = {name: directory / "model.safetensors" for name in f.keys()}  # noqa: SIM118
        else:
            found = ", ".join(sorted(p.name for p in directory.iterdir())[:8]) if directory.is_dir() else "no such directory"
            raise InterpolationError(f"{what} {directory}: no safetensors weights (model.safetensors or its index) to "
                                     f"stream ({found}); save it with `save_pretrained` (safetensors is its default)")

    def shape(self, name: str) -> tuple[int, ...]:
        return self._meta()[name][1]

    def dtype(self, name: str) -> str:
        """The tensor's safetensors dtype ("F32", "BF16", ...)."""
        return self._meta()[name][0]

    def _meta(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Every tensor's dtype and shape, read from the headers with each file opened once (no tensor is read): the
        checks ask for them per tensor, and a file opened per question cost one open per tensor and check."""
        from safetensors import safe_open

        if self._header is None:
            header: dict[str, tuple[str, tuple[int, ...]]] = {}
            for path, names in self.by_file(list(self.files)).items():
                with safe_open(path, "pt") as f:
                    for name in names:
                        part = f.get_slice(name)
                        header[name] = (part.get_dtype(), tuple(part.get_shape()))
            self._header = header
        return self._header

    def get(self, name: str) -> torch.Tensor:
        """One tensor, read with its file opened for it alone: a file held open keeps every page read from it mapped,
        and the process's resident memory grew by both files over a pass (benchmarks/bench_interpolate_memory.py)."""
        with self._open(name) as f:
            return f.get_tensor(name)

    def _open(self, name: str):
        from safetensors import safe_open

        return safe_open(self.files[name], "pt")

    def by_file(self, names: Sequence[str]) -> dict[Path, list[str]]:
        out: dict[Path, list[str]] = {}
        for name in names:
            out.setdefault(self.files[name], []).append(name)
        return out


def _check_pair(base: _Tensors, tuned: _Tensors) -> None:
    """The two files hold the same tensors, with the same shapes, in dtypes interpolate reads: what makes θ(α) a model
    of the checkpoint's architecture. Checked on the files' headers (no tensor is read) before any scoring or writing."""
    for one, other in ((base, tuned), (tuned, base)):
        extra = sorted(set(one.files) - set(other.files))
        if extra:  # e.g. an untied lm_head in one and a tied one in the other: α = 0 would not be the base
            raise InterpolationError(f"{one.directory}: tensor {extra[0]!r} ({len(extra)} in all) is not in "
                                     f"{other.directory} (weights tied in one and not in the other?): not the same "
                                     "architecture; interpolate a fine-tune toward its own base")
    for name in tuned.files:
        for side in (base, tuned):
            kind = side.dtype(name)
            if kind.startswith("F8") or (kind.startswith("F") and kind not in _FLOATS):
                raise InterpolationError(f"{side.directory}: tensor {name!r} is {kind}: interpolate reads float64, "
                                         "float32, float16 and bfloat16 weights; dequantise the checkpoint")
        if base.shape(name) != tuned.shape(name):
            raise InterpolationError(f"{base.directory}: tensor {name!r} has shape {list(base.shape(name))}, the "
                                     f"checkpoint's is {list(tuned.shape(name))}: not the same architecture; interpolate "
                                     "a fine-tune toward its own base")


class Interpolator:
    """Sets `model` (loaded from the fine-tuned checkpoint) to θ_base + α (θ_ft − θ_base), in place.

    Both sides are read from their safetensors files in slices of rows, in float32, and the result cast into the
    parameter: memory is one model plus a slice of each file (at most `chunk` elements), each file opened for one tensor
    at a time. The two files must hold the same tensors with the same shapes, and every parameter must be one of them
    with its shape (tied weights count once); anything else is refused before any scoring, naming the tensor.

    Args:
        model: the fine-tuned model (its parameters are overwritten by `set`).
        base_dir, tuned_dir: the base model's and the checkpoint's directories.
        chunk: elements read from each file at a time (default 2**22: 16 MiB in float32).
    """

    def __init__(self, model: Any, base_dir: str | os.PathLike, tuned_dir: str | os.PathLike, chunk: int = 1 << 22):
        self.model, self.chunk = model, chunk
        self.base = _Tensors(Path(base_dir), "the base model")
        self.tuned = _Tensors(Path(tuned_dir), "the checkpoint")
        seen: set[int] = set()
        self.params: dict[str, torch.nn.Parameter] = {}
        for name, p in model.named_parameters(remove_duplicate=True):
            if p.data_ptr() not in seen:
                seen.add(p.data_ptr())
                self.params[name] = p
        _check_pair(self.base, self.tuned)
        missing = [n for n in self.params if n not in self.tuned.files]
        if missing:  # the files agree with each other, and the model does not read them under their own names
            raise InterpolationError(f"--model {self.tuned.directory}: the model's parameter {missing[0]!r} ({len(missing)} "
                                     f"of its {len(self.params)}) is not a tensor of its weight files: transformers renames "
                                     "or fuses this architecture's weights when it loads them (mixture-of-experts layers "
                                     "do), which interpolate does not follow. Merge the files with a tool that works on "
                                     "them (e.g. mergekit's linear merge at weights 1-α and α) and score each with "
                                     "`forgetwatch compare`")
        for name, p in self.params.items():
            kinds = {side.dtype(name) for side in (self.base, self.tuned)} - set(_FLOATS)
            if kinds or not p.is_floating_point():
                raise InterpolationError(f"--model {self.tuned.directory}: parameter {name!r} is "
                                         f"{', '.join(sorted(kinds)) or p.dtype} in the files (the model's {p.dtype}): "
                                         "interpolate reads float64, float32, float16 and bfloat16 weights; dequantise "
                                         "the checkpoint")
            if self.tuned.shape(name) != tuple(p.shape):
                raise InterpolationError(f"{self.tuned.directory}: tensor {name!r} has shape {list(self.tuned.shape(name))}, "
                                         f"the model's is {list(p.shape)}: not the same architecture; interpolate a "
                                         "fine-tune toward its own base")

    @torch.no_grad()
    def set(self, alpha: float) -> None:
        from safetensors import safe_open

        for name, p in self.params.items():
            if p.dim() == 0:
                p.data.copy_(_at(alpha, self.base, self.tuned, name).to(dtype=p.dtype, device=p.device))
                continue
            rows = p.shape[0]
            step = max(1, self.chunk // max(1, p.numel() // max(rows, 1)))
            for i in range(0, rows, step):
                # the files opened for one slice: a mapped file keeps every page read resident while it is open
                with safe_open(self.base.files[name], "pt") as fb, safe_open(self.tuned.files[name], "pt") as ft:
                    if alpha in (0, 1):  # exactly one side: no arithmetic
                        part = (ft if alpha == 1 else fb).get_slice(name)[i : i + step]
                    else:
                        part = fb.get_slice(name)[i : i + step].float().lerp_(ft.get_slice(name)[i : i + step].float(), alpha)
                    p.data[i : i + step].copy_(part.to(dtype=p.dtype, device=p.device))
                    del part


def _at(alpha: float, base: _Tensors, tuned: _Tensors, name: str) -> torch.Tensor:
    """θ(α) of one tensor, in float32: exactly the base at α = 0 and the checkpoint at α = 1; in between, made in place
    in the base's tensor (two tensors in memory, not five)."""
    if alpha == 1:
        return tuned.get(name).float()
    b = base.get(name).float()
    return b if alpha == 0 else b.lerp_(tuned.get(name).float(), alpha)


# What a model directory holds besides its weights, by name (`save_pretrained` of a model, its tokenizer and processor).
# Only these go into an interpolated model: the final checkpoint may be a trainer's output_dir, which also holds logs,
# lock files, the user's own files (a `.env`, data) and the record.
_MODEL_FILE_NAMES = frozenset({
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "spiece.model",
    "sentencepiece.bpe.model", "chat_template.json", "chat_template.jinja", "preprocessor_config.json",
    "processor_config.json",
})


def model_files(directory: str | os.PathLike) -> list[Path]:
    """The files of a model directory that are not its weights: those `save_pretrained` writes for the config, the
    tokenizer and the processor (`_MODEL_FILE_NAMES`, `*.tiktoken`), and the code files its config's `auto_map` names
    (remote code). Nothing else: a trainer's output_dir holds logs, locks and the user's own files beside them.

    Example:
        >>> [f.name for f in model_files("outputs/run")]  # doctest: +SKIP
        ['config.json', 'generation_config.json', 'tokenizer.json', 'tokenizer_config.json']
    """
    root = Path(directory)
    code: set[str] = set()
    try:
        auto_map = json.loads((root / "config.json").read_text()).get("auto_map") or {}
        for ref in auto_map.values():  # "modeling_x.ModelX", or ["tokenization_x.Tok", null]
            for r in ref if isinstance(ref, list) else [ref]:
                if isinstance(r, str) and "." in r:
                    code.add(r.split("--")[-1].rsplit(".", 1)[0] + ".py")
    except (OSError, ValueError, AttributeError):
        pass  # no config, or one without remote code
    return sorted(f for f in root.iterdir() if f.is_file() and (
        f.name in _MODEL_FILE_NAMES or f.name.endswith(".tiktoken") or f.name in code))


def save_interpolated(base_dir: str | os.PathLike, tuned_dir: str | os.PathLike, alpha: float,
                      out: str | os.PathLike) -> None:
    """Write θ(α) as a model directory at `out`: the checkpoint's files, its weights replaced by θ_base + α (θ_ft −
    θ_base), each tensor in the checkpoint's own dtype (whatever precision the probes were scored in), shard by shard
    as the checkpoint is sharded (memory: one shard). Tensors that are not floating point are the checkpoint's.

    Example:
        >>> save_interpolated("base/", "outputs/ckpt", 0.5, "outputs/ckpt-wise-0.5")  # doctest: +SKIP
    """
    import shutil

    from safetensors.torch import save_file

    base, tuned = _Tensors(Path(base_dir), "the base model"), _Tensors(Path(tuned_dir), "the checkpoint")
    _check_pair(base, tuned)
    out = Path(out)
    out.mkdir(parents=True)
    for f in model_files(tuned.directory):  # config, generation config, tokenizer: as the checkpoint has them
        shutil.copy2(f, out / f.name)
    if (tuned.directory / "model.safetensors.index.json").is_file():
        shutil.copy2(tuned.directory / "model.safetensors.index.json", out / "model.safetensors.index.json")
    from safetensors import safe_open

    for path, names in tuned.by_file(list(tuned.files)).items():
        with safe_open(path, "pt") as f:
            metadata = f.metadata() or {"format": "pt"}
        shard: dict[str, torch.Tensor] = {}
        for name in names:
            kind = tuned.dtype(name)
            if kind.startswith("F8"):
                raise InterpolationError(f"{path}: tensor {name!r} is {kind}: interpolate reads float64, float32, "
                                         "float16 and bfloat16 weights; dequantise the checkpoint")
            shard[name] = _at(alpha, base, tuned, name).to(_FLOATS[kind]) if kind in _FLOATS else tuned.get(name)
        save_file(shard, str(out / path.name), metadata=metadata)
        del shard


_FLOATS = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def save_lora_merged(base_dir: str | os.PathLike, adapter_dir: str | os.PathLike, alpha: float,
                     out: str | os.PathLike) -> None:
    """Write the base with a LoRA adapter merged in at scale α, as full weights in the base's own dtype. Loads the base
    once more, in float32 on the CPU, whatever the probes were scored in.

    Example:
        >>> save_lora_merged("base/", "outputs/adapter", 0.5, "outputs/merged-0.5")  # doctest: +SKIP
    """
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(base_dir)  # `dtype` in transformers 5, `torch_dtype` before
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), adapter_dir)
    LoraScaler(model).set(alpha)
    model.merge_and_unload().to(dtype).save_pretrained(out)


def setting_differences(base_dir: str | os.PathLike, model: Any, tokenizer: Any) -> list[str]:
    """What the scoring model (the checkpoint's tokenizer and generation settings) does differently from the base's own,
    in what changes a probe's result: the chat template, the special tokens, the vocabulary, the end tokens generation
    stops at. Every α is scored under the checkpoint's (they are what θ(α) ships with, and `--save-at` writes them), so
    where this is not empty α = 0 is the base's weights under other settings and its figures need not be zero.

    Example:
        >>> setting_differences("base/", model, tokenizer)  # doctest: +SKIP
        ['the chat template', "the end token ('<|im_end|>' against '</s>')"]
    """
    from transformers import AutoTokenizer, GenerationConfig

    base_dir = Path(base_dir)
    out = []
    try:
        base_tok = AutoTokenizer.from_pretrained(base_dir)
    except Exception:  # noqa: BLE001 (no tokenizer beside the base's weights, or one that will not load: this only warns)
        base_tok = None
    if base_tok is not None:
        if (base_tok.chat_template or None) != (tokenizer.chat_template or None):
            out.append("the chat template")
        for what, attr in (("end", "eos_token"), ("start", "bos_token")):
            a, b = getattr(tokenizer, attr, None), getattr(base_tok, attr, None)
            if a != b:
                out.append(f"the {what} token ({a!r} against {b!r})")
        if base_tok.get_vocab() != tokenizer.get_vocab():
            out.append(f"the vocabulary ({len(tokenizer)} tokens against {len(base_tok)})")
    if (base_dir / "generation_config.json").is_file():
        ends = GenerationConfig.from_pretrained(base_dir).eos_token_id
        now = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if _ids(ends) != _ids(now):  # 2 and [2] are one end token (trainers save either)
            out.append(f"generation's end token ids ({now!r} against {ends!r})")
    return out


def _ids(value: Any) -> frozenset:
    return frozenset(value if isinstance(value, (list, tuple)) else [] if value is None else [value])


_BASE_CHANGING_INITS = ("pissa", "olora", "corda", "loftq")


def check_lora_config(config: dict[str, Any], path: str | os.PathLike) -> None:
    """Refuse an adapter whose effect α cannot scale: only LoRA's update B A is scaled, so layers kept whole
    (`modules_to_save`), DoRA's magnitude, trained biases and trained token rows would stay as trained, and α = 0
    would not be the base.

    Example:
        >>> check_lora_config({"peft_type": "LORA", "use_dora": True}, "adapter_config.json")
        Traceback (most recent call last):
        forgetwatch.errors.InterpolationError: adapter_config.json: a DoRA adapter (use_dora): ... interpolate DIR instead
    """
    parts = []
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        parts.append(f"a {config.get('peft_type')} adapter, not LoRA")
    if config.get("use_dora"):
        parts.append("a DoRA adapter (use_dora)")
    if config.get("modules_to_save"):
        parts.append(f"layers trained whole (modules_to_save: {', '.join(map(str, config['modules_to_save']))})")
    if config.get("bias") not in (None, "none"):
        parts.append(f"trained biases (bias: {config['bias']})")
    if config.get("trainable_token_indices"):
        parts.append("trained token rows (trainable_token_indices)")
    init = config.get("init_lora_weights")
    if isinstance(init, str) and init.lower().startswith(_BASE_CHANGING_INITS):
        # PiSSA, OLoRA, CorDA and LoftQ take the adapter's start out of the base's weights: PEFT redoes that when it
        # loads the adapter, so α = 0 would be the base minus that start, not the base (measured: 4e-3 in the logits)
        raise InterpolationError(
            f"{path}: init_lora_weights {init!r} changes the base's weights when the adapter is loaded, so α = 0 would not "
            "be the base. Convert it to a plain LoRA first (save_pretrained(DIR, path_initial_model_for_weight_conversion="
            "INITIAL_ADAPTER_DIR)) and interpolate DIR, or merge it into full weights "
            "(model.merge_and_unload().save_pretrained(DIR)) and interpolate DIR instead")
    if parts:
        raise InterpolationError(f"{path}: {'; '.join(parts)}: α scales only LoRA's update B A, so the rest would stay as "
                                 "trained and α = 0 would not be the base. Merge it into full weights "
                                 "(model.merge_and_unload().save_pretrained(DIR)) and interpolate DIR instead")


class LoraScaler:
    """Scales every LoRA adapter of a PEFT model by α: its update `B A · scaling` becomes `α · B A · scaling`, so α = 0 is
    the base model and α = 1 the adapter as trained; nothing is copied."""

    def __init__(self, model: Any):
        from peft.tuners.lora import LoraLayer

        self.layers = [(m, dict(m.scaling)) for m in model.modules() if isinstance(m, LoraLayer)]
        if not self.layers:
            raise InterpolationError("the adapter holds no LoRA layers; interpolate supports LoRA adapters and full weights")

    def set(self, alpha: float) -> None:
        for module, scaling in self.layers:
            for name, value in scaling.items():
                module.scaling[name] = value * alpha


class TaskData(list):
    """The rows of a task set, with where each came from (for messages that name it): a file's line, a dataset's row."""

    def __init__(self, path: Path | str, unit: str = "line"):
        super().__init__()
        self.path, self.lines, self.unit = path, [], unit


def _task_row_ok(row: dict[str, Any]) -> bool:
    return bool((isinstance(row.get("text"), str) and row["text"].strip()) or (
        isinstance(row.get("messages"), list) and row["messages"] and isinstance(row["messages"][-1], dict)
        and row["messages"][-1].get("role") == "assistant") or (
        isinstance(row.get("prompt"), str) and isinstance(row.get("completion"), str) and row["completion"]))


def _task_row_refused(where: str, unit: str, at: int, row: dict[str, Any]) -> InterpolationError:
    return InterpolationError(f"{where}, {unit} {at}: a task example needs `text`, or `messages` ending with the "
                              "assistant's answer, or `prompt` and `completion`; this row has "
                              f"{', '.join(sorted(row)) or 'nothing'}")


def load_task_data(path: str | os.PathLike, max_examples: int | None = None, split: str = "test") -> list[dict[str, Any]]:
    """A held-out task set: rows with `text`, or `messages` (chat, the last one the assistant's answer), or `prompt` and
    `completion`, from a JSONL file, or from a dataset `datasets` loads (a directory `save_to_disk` wrote, a local
    dataset directory, or a Hub name) at `split`. Every row is checked before any scoring; a bad one is refused with its
    line (its row, in a dataset).

    Example:
        >>> rows = load_task_data("held_out.jsonl", max_examples=100)  # doctest: +SKIP
        >>> rows = load_task_data("trl-lib/tldr", split="validation")  # a Hub dataset  # doctest: +SKIP
    """
    text = str(path)
    path = Path(path)
    if path.is_file():
        rows = TaskData(path)
        source = ((lineno, row) for lineno, row in read_jsonl(path, InterpolationError, objects=True))
    elif path.suffix in (".jsonl", ".json") or (not path.exists() and (text.startswith((".", "/", "~")) or text.count("/") > 1)):
        raise InterpolationError(f"--task-data {path}: no such file (a JSONL of held-out examples: text, messages, or "
                                 "prompt + completion; or a dataset directory or Hub name, with --task-split)")
    else:
        dataset = _load_task_dataset(text, split)
        rows = TaskData(f"{text} ({split})", unit="row")
        source = enumerate(dataset)
    for at, row in source:
        if not _task_row_ok(row):
            raise _task_row_refused(str(rows.path), rows.unit, at, row)
        rows.append(row)
        rows.lines.append(at)
        if max_examples and len(rows) >= max_examples:
            break
    if not rows:
        raise InterpolationError(f"--task-data {rows.path}: no examples")
    return rows


def _load_task_dataset(name: str, split: str) -> Any:
    """A split of a dataset `datasets` can load: `save_to_disk`'s directory, a local dataset directory, a Hub name."""
    import datasets

    path = Path(name)
    try:
        if path.is_dir() and ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file()):
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise InterpolationError(f"--task-data {name}: no split {split!r}; it has {', '.join(loaded)}: "
                                             "choose one with --task-split")
                loaded = loaded[split]
            return loaded
        return datasets.load_dataset(name, split=split)
    except InterpolationError:
        raise
    except Exception as e:  # noqa: BLE001 (datasets raises many kinds: missing, unknown split, no network, bad files)
        raise InterpolationError(f"--task-data {name}: cannot load it as a dataset at split {split!r} ({type(e).__name__}: "
                                 f"{e}); give a JSONL file of held-out examples, a dataset directory, or a Hub dataset "
                                 "name, and the split with --task-split") from None


def encode_task_rows(tokenizer: Any, rows: Sequence[dict[str, Any]], max_length: int = 1024,
                     source: str | os.PathLike | None = None) -> list[tuple[list[int], int]]:
    """Each row as (token ids cut at `max_length`, index of its first answer token), every one checked before any
    scoring: a chat row needs the tokenizer's chat template, rendered with the prompt as a prefix of the conversation
    (refused with the row's line otherwise). A row whose answer starts beyond the cut has no token to score: it is left
    out, as training cuts it, with a warning (refused when every row is).

    Example:
        >>> encode_task_rows(tokenizer, [{"prompt": "2 + 2 =", "completion": " 4"}])  # doctest: +SKIP
        [([17, 489, 17, 426, 604], 4)]
    """
    lines = getattr(rows, "lines", None) or list(range(1, len(rows) + 1))
    unit = getattr(rows, "unit", "line")
    where = getattr(rows, "path", None) or source or "--task-data"
    pairs, cut = [], []
    for row, line in zip(rows, lines, strict=True):
        if "messages" in row and not getattr(tokenizer, "chat_template", None):
            raise InterpolationError(f"{where}, {unit} {line}: a chat row (messages) needs the checkpoint's chat template, "
                                     "and its tokenizer has none: give text, or prompt and completion, rows instead, or "
                                     "save the tokenizer with its chat template")
        try:
            ids, start = _encode(tokenizer, row, max_length)
        except (ValueError, TypeError, KeyError) as e:
            raise InterpolationError(f"{where}, {unit} {line}: the tokenizer cannot encode this row ({e})") from None
        if start >= len(ids) or len(ids) < 2:  # cut away, as training cuts it: no answer token to score
            cut.append((line, start))
            continue
        pairs.append((ids, start))
    if not pairs:
        line, start = cut[0]
        raise InterpolationError(f"{where}: no row keeps any of its answer within --task-max-length {max_length} ({unit} "
                                 f"{line}: the answer starts at token {start}): raise --task-max-length")
    if cut:
        logger.warning("forgetwatch: %s: %d of %d task rows have no answer token within --task-max-length %d (first: "
                       "%s %d) and are left out of the task loss, as training cuts them", where, len(cut), len(rows),
                       max_length, unit, cut[0][0])
    return pairs


@torch.no_grad()
def held_out_loss(model: Any, tokenizer: Any, rows: Sequence[dict[str, Any]] | Sequence[tuple[list[int], int]],
                  max_length: int = 1024, batch_size: int = 8) -> float:
    """Mean negative log-likelihood per answer token (nats) of `rows` (`load_task_data`, or `encode_task_rows`' pairs):
    the whole text for `text` rows, the answer only for `messages` (the last turn) and `prompt` + `completion` rows."""
    from ..scoring.forward import model_device, pad_token_id

    pairs = list(rows) if rows and isinstance(rows[0], tuple) else encode_task_rows(tokenizer, rows, max_length)
    device = model_device(model)
    pad = pad_token_id(tokenizer)
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        for i in range(0, len(pairs), batch_size):
            batch = pairs[i : i + batch_size]
            width = max(len(ids) for ids, _ in batch)
            ids = torch.full((len(batch), width), pad, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            labels = torch.full((len(batch), width), -100, dtype=torch.long)
            for j, (tokens, start) in enumerate(batch):
                ids[j, : len(tokens)] = torch.tensor(tokens)
                mask[j, : len(tokens)] = 1
                labels[j, start : len(tokens)] = torch.tensor(tokens[start:])
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
            logp = torch.log_softmax(logits[:, :-1], dim=-1)
            target = labels[:, 1:].to(device)
            keep = target != -100
            nll = -logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            total += float(nll[keep].sum())
            count += int(keep.sum())
    finally:
        model.train(was_training)
    return total / count if count else float("nan")


def _encode(tokenizer: Any, row: dict[str, Any], max_length: int) -> tuple[list[int], int]:
    """(token ids, index of the first answer token)."""
    if "text" in row:
        ids = tokenizer(row["text"], add_special_tokens=True)["input_ids"][:max_length]
        return ids, 1
    if "messages" in row:
        prompt = tokenizer.apply_chat_template(row["messages"][:-1], add_generation_prompt=True, tokenize=False)
        whole = tokenizer.apply_chat_template(row["messages"], tokenize=False)
        if not whole.startswith(prompt):  # the answer's span is found by the prompt's length: it must be a prefix
            raise ValueError("the chat template does not render the prompt (with its generation prompt) as a prefix of "
                             "the whole conversation, so the answer's tokens cannot be found; give prompt and "
                             "completion rows instead")
    else:
        prompt, whole = row["prompt"], row["prompt"] + row["completion"]
    start = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    ids = tokenizer(whole, add_special_tokens=False)["input_ids"][:max_length]
    return ids, min(start, len(ids))
