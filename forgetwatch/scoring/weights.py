"""The weight files' fingerprint: which weights a local model directory holds, told without reading them all.

A base cache is keyed by the model's name or path; a model saved again at the same path (a fine-tune written over its
base, a directory replaced by another model of the same architecture) keeps both, and its old cache would be taken for
the new weights. So the key also holds, for a local directory, its weight files' fingerprint:

    {"files": {"model.safetensors": {"bytes": 538090408, "mtime": 1764248220.5}}, "sample": "9c1e0a7f3b2d4e61"}

`sample` hashes each file's name and size and `SAMPLES` blocks of `BLOCK` bytes spread evenly over it (the first holds a
safetensors header): about 1 MiB per file, whatever the model's size. Every weight of a re-saved model changes, so any
block tells it apart; a change to a small part of the weights can escape it, which `forgetwatch cache --hash-weights`
(every byte) does not. `mtime` is kept for the note only: `cp -r` or a Hub download writes new times over the same bytes,
so a new time with the same sample is said, never refused.

Example:
    >>> weights_fingerprint("models/base")  # doctest: +SKIP
    {'files': {'model.safetensors': {'bytes': 538090408, 'mtime': 1764248220.5}}, 'sample': '9c1e0a7f3b2d4e61'}
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["check_weight_files", "compare_weights", "weights_fingerprint"]

SAMPLES = 256  # blocks read per file: a re-save that changed 1% of the bytes escapes all of them with p = 0.99**256 = 8%
BLOCK = 4096
# what transformers, PEFT and llama.cpp save weights as; a checkpoint's optimizer.pt, scheduler.pt, rng_state.pth and
# training_args.bin are not the model
_SUFFIXES = (".safetensors", ".gguf")
_PREFIXES = ("pytorch_model", "adapter_model", "model")


def _is_weights(name: str) -> bool:
    return name.endswith(_SUFFIXES) or (name.endswith(".bin") and name.startswith(_PREFIXES))


def weights_fingerprint(path: str | os.PathLike) -> dict[str, Any] | None:
    """The fingerprint of the weight files in the directory `path` (not its subfolders), or None where there is no such
    directory or no weight file in it (a Hub id: its revision names the weights), or one cannot be read."""
    root = Path(path)
    try:
        if not root.is_dir():
            return None
        names = sorted(p.name for p in root.iterdir() if _is_weights(p.name) and p.is_file())
        if not names:
            return None
        h = hashlib.sha256()
        files = {}
        for name in names:
            with open(root / name, "rb") as f:  # through a symlink (a Hub snapshot's blobs): the bytes are what count
                st = os.fstat(f.fileno())
                files[name] = {"bytes": st.st_size, "mtime": round(st.st_mtime, 3)}
                h.update(f"{name}\0{st.st_size}\0".encode())
                last = max(st.st_size - BLOCK, 0)
                for offset in sorted({last * i // max(SAMPLES - 1, 1) for i in range(SAMPLES)}):
                    h.update(os.pread(f.fileno(), BLOCK, offset))
    except OSError:  # unreadable: the key says nothing of the weights, as before fingerprints existed
        return None
    return {"files": files, "sample": h.hexdigest()[:16]}


def _describe(fp: dict[str, Any]) -> str:
    files = fp.get("files") or {}
    total = sum(f.get("bytes", 0) for f in files.values() if isinstance(f, dict))
    times = [f.get("mtime") for f in files.values() if isinstance(f, dict) and isinstance(f.get("mtime"), (int, float))]
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(max(times))) if times else "?"
    return f"{len(files)} file(s), {total:,} bytes, written {when}"


def compare_weights(cached: Any, now: Any, where: str = "") -> tuple[str | None, str | None]:
    """Compare a cache key's weights fingerprint with the model's: `(difference, note)`.

    The difference (a line for `CacheMismatchError`) when the sampled bytes differ; a note when only the files' times do
    (a copy, or the same weights saved again). Nothing when either side has no fingerprint: a cache made before
    fingerprints existed, or a model not in a local directory, is compared as it was then."""
    if not isinstance(cached, dict) or not isinstance(now, dict):
        return None, None
    place = f" at {where}" if where else ""
    if cached.get("sample") != now.get("sample"):
        return (f"model.weights: the weight files{place} are not those this cache was made from (cache: {_describe(cached)}; "
                f"now: {_describe(now)}): other weights saved at the same path"), None
    times = lambda fp: {n: f.get("mtime") for n, f in (fp.get("files") or {}).items() if isinstance(f, dict)}  # noqa: E731
    if times(cached) != times(now):
        return None, (f"the weight files{place} were written again since this cache was made (cache: {_describe(cached)}; "
                      f"now: {_describe(now)}), with the same size and sampled bytes (a copy, or the same weights saved "
                      "again): the cache is used (the sample reads about 1 MiB per file; a cache made with "
                      "`forgetwatch cache --hash-weights` is compared on every byte)")
    return None, None


def check_weight_files(path: str | os.PathLike, what: str, error: type[Exception] = ValueError) -> None:
    """Refuse a model directory whose safetensors files are damaged (cut short by a full disk or a killed save, or not
    safetensors at all), naming the file, before anything is loaded or written: each file's header is read and checked
    against its size (no tensor is read).

    Example:
        >>> check_weight_files("outputs/run/checkpoint-30", "the checkpoint")  # doctest: +SKIP
        Traceback (most recent call last):
        ValueError: the checkpoint outputs/run/checkpoint-30/model.safetensors: a damaged safetensors file (...)
    """
    directory = Path(path)
    if not directory.is_dir():
        return
    from safetensors import safe_open

    for file in sorted(directory.glob("*.safetensors")):
        try:
            with safe_open(file, "pt"):
                pass
        except Exception as e:  # safetensors' own SafetensorError, or an OSError reading the file
            raise error(f"{what} {file}: a damaged safetensors file ({e}); save the model again, or point at an intact "
                        "copy") from None
