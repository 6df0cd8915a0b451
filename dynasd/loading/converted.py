"""A GGUF checkpoint converted once to transformers' own format, kept in the cache folder.

Why: transformers reads a GGUF file with the `gguf` package's pure-Python reader, three times per load (config,
tokenizer, weights), walks its tensor-name tables once per tensor and converts the tokenizer from the file's
vocabulary: ~20-60 s of CPU for the 135M embedded target on 2 cores, at every start of the app, every CLI run and
every test process. The one conversion reads the file once (`_gguf_read_once`): 8 s instead of 20 s on a Space's
first start. Saved as config.json + model.safetensors + tokenizer files, the same model loads in a second or
two, with the same weights bit for bit (float32 holds every dequantized GGUF value exactly) and the same tokenizer.

The folder is keyed by the file's content and the transformers version that converted it, written in a private
folder and renamed into place whole, so a process stopped mid-way never leaves a half-written conversion that
another would load; one left behind by a process that is gone is removed by the next conversion.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import os
import shutil
import threading
from pathlib import Path

import torch
import transformers.utils.logging as hf_logging
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..kernels.block_weights import saved_key
from ..kernels.compile import process_runs
from .embedded import cache_dir

# How the folder is written; a change of it is a new key, so an older conversion is never read as this one.
FORMAT = "2: a tied output layer saved as the embedding"
COMPLETE = "model.safetensors"  # written last of the folder's files, and the folder is renamed into place whole
_READ_ONCE = threading.Lock()  # one conversion at a time swaps gguf's functions (two would restore each other's)


def converted_folder(gguf_file: Path) -> Path:
    key = hashlib.sha256()
    with open(gguf_file, "rb") as file:
        for block in iter(lambda: file.read(1 << 22), b""):
            key.update(block)
    key.update(importlib.metadata.version("transformers").encode())
    key.update(FORMAT.encode())
    return cache_dir() / "converted" / f"{gguf_file.stem}-{key.hexdigest()[:16]}"


@functools.lru_cache(maxsize=8)  # hashing the file costs ~0.1 s; a process asks once per load
def _folder_of(gguf_file: Path, size: int, mtime_ns: int) -> Path:
    return converted_folder(gguf_file)


def converted_weights(gguf_file: Path) -> Path:
    """The converted checkpoint's float32 weights (safetensors) of the GGUF file `gguf_file` (converted already)."""
    stat = gguf_file.stat()
    return _folder_of(gguf_file, stat.st_size, stat.st_mtime_ns) / COMPLETE


def load_converted(gguf_file: Path, dtype):
    """(model, tokenizer) of the GGUF file `gguf_file`, converted on the first load and read from the cache after."""
    stat = gguf_file.stat()
    folder = _folder_of(gguf_file, stat.st_size, stat.st_mtime_ns)
    if not (folder / COMPLETE).is_file():
        _convert(gguf_file, folder)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype)
    return model, tokenizer


SLICE_ROWS = 2048  # rows read at a time by saved_rows: a few MB of float32


def saved_rows(weights: Path, keys: list[str], ids) -> torch.Tensor | None:
    """Rows `ids` (sorted) of the first tensor of `keys` that the safetensors file `weights` holds, or None where
    it holds none of them. Read slice by slice, each through a mapping closed at once: a model loaded from the
    same file maps it too, and rows read through the model's mapping would stay in the process's memory as long as
    the model lives (for the embedded target's embedding ~80-113 MB)."""
    key = saved_key(weights, keys)
    if key is None:
        return None
    with safe_open(str(weights), framework="pt") as file:
        rows = file.get_slice(key).get_shape()[0]
    ids = torch.as_tensor(ids, dtype=torch.long)
    parts = []
    for start in range(0, rows, SLICE_ROWS):
        inside = ids[(ids >= start) & (ids < start + SLICE_ROWS)]
        if inside.numel():
            with safe_open(str(weights), framework="pt") as file:
                parts.append(file.get_slice(key)[start:start + SLICE_ROWS][inside - start])
    return torch.cat(parts)


def _convert(gguf_file: Path, folder: Path) -> None:
    hf_logging.disable_progress_bar()
    folder.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(folder.parent)
    private = folder.parent / f"{folder.name}.part-{os.getpid()}"
    shutil.rmtree(private, ignore_errors=True)
    with _gguf_read_once():
        where, name = str(gguf_file.parent), gguf_file.name
        AutoTokenizer.from_pretrained(where, gguf_file=name).save_pretrained(str(private))
        model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    # transformers refuses save_pretrained on a model read from GGUF (it counts as quantized); the config and the
    # float32 weights are all there is to save. A tied output layer is saved once, as the embedding: saved as
    # `lm_head.weight` (what safetensors' save_model keeps), every load built a random embedding of 113 MB before
    # tying it (a load's peak 539 -> 428 MB).
    model.config.quantization_config = None
    model.config.save_pretrained(str(private))
    model.generation_config.save_pretrained(str(private))
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    output, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if output is not None and embedding is not None and output.weight is embedding.weight:
        del state[next(name for name, module in model.named_modules() if module is output) + ".weight"]
    save_file(state, str(private / COMPLETE), metadata={"format": "pt"})
    try:
        os.rename(private, folder)
    except OSError:  # another process published the same conversion first: keep that one
        shutil.rmtree(private, ignore_errors=True)


@contextlib.contextmanager
def _gguf_read_once():
    """While converting, transformers' three reads of the file (config, tokenizer, weights) share one `GGUFReader`,
    and the tensor-name table of an architecture is built once instead of once per module (397 times for the
    embedded target). Both are pure functions of their arguments and the file does not change meanwhile, so the
    weights and tokenizer come out as transformers' own unshared load makes them (tests/test_converted.py compares
    them bit for bit); measured 20.2 s -> 8.4 s. transformers imports both names from `gguf` at each call, which is
    where they are swapped, and only for this block."""
    import gguf

    with _READ_ONCE:
        reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        gguf.GGUFReader = functools.lru_cache(maxsize=None)(reader)
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def _remove_abandoned(parent: Path) -> None:
    for part in parent.glob("*.part-*"):
        if not process_runs(part.name.rpartition(".part-")[2]):
            shutil.rmtree(part, ignore_errors=True)
