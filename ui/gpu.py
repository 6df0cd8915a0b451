"""ZeroGPU: on a Hugging Face ZeroGPU Space every model call must run inside `spaces.GPU`; elsewhere the
decorator changes nothing. The `spaces` module is looked up once, when this module is imported."""
from __future__ import annotations

import os

from dynasd.explorer.inputs import MAX_NEW_TOKENS_LIMIT

try:  # a Hugging Face ZeroGPU Space: every model call must run inside spaces.GPU (elsewhere it changes nothing)
    import spaces
except ImportError:
    spaces = None

# The GPU time a handler asks ZeroGPU for, from the run's length: a shorter request is scheduled sooner, one that
# runs out is cut off. 0.1 s a token is several times a token's cost on a GPU for the embedded pair, and the base
# covers loading a pair inside the GPU process (a pair other than the one loaded at start-up).
GPU_BASE_S, GPU_S_PER_TOKEN, GPU_MAX_S = 20, 0.1, 300


def on_gpu(runs: int = 0, seconds: int | None = None):
    """The decorator for a handler that runs models: `spaces.GPU` when the `spaces` package is importable, the
    handler itself otherwise. Its duration covers one Step (`runs=0`), `runs` runs of the requested length, or a
    fixed number of `seconds` (the losslessness check's many one-step samples)."""
    if spaces is None:
        return lambda handler: handler

    def duration(*args, max_new_tokens=MAX_NEW_TOKENS_LIMIT, **controls) -> int:
        if seconds is not None:
            return seconds
        tokens = max_new_tokens if isinstance(max_new_tokens, (int, float)) else MAX_NEW_TOKENS_LIMIT
        return int(min(GPU_MAX_S, GPU_BASE_S + runs * GPU_S_PER_TOKEN * max(1, tokens)))

    return spaces.GPU(duration=duration)


def on_zero_gpu(environ=os.environ) -> bool:
    """Whether this process is a ZeroGPU Space (the variable its runtime sets; `spaces` is then importable)."""
    return spaces is not None and environ.get("SPACES_ZERO_GPU", "") not in ("", "0", "false")
