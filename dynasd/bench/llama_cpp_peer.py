"""llama.cpp as a peer in the bench: `--methods ar,llama.cpp` decodes with llama-cpp-python (an optional package,
the `peers` extra) on the very GGUF file the target was loaded from, so our decoders and the engine most people run
a GGUF with are measured in one run and one table.

It is plain autoregressive decoding, but in llama.cpp's own arithmetic (its quantized kernels) where our target
runs the weights dequantized to fp32: identity with `ar` is measured by the fidelity columns, not assumed.

How it is kept to the bench's fairness rules (command.py):
- the prompt's token ids are fed as they are (the chat template was applied once, by the bench, for every method);
- the timing window is wall time around the whole generation, prefill included, taken here as for hf-assisted;
  loading the model is outside it (once per bench run);
- llama.cpp's KV cells are emptied before every run: `Llama.generate` would reuse the longest prefix shared with
  the previous run's tokens (the same chat header, a second turn), and our decoders prefill every prompt whole;
- sampling: greedy at T = 0; at T > 0 a chain of llama.cpp's own samplers in our order (sampling.logits_to_probs):
  temperature, then top-k, then top-p on the tempered distribution, drawn with the run's seed (mod 2^32 - 1:
  llama.cpp's seeds are 32 bits and 2^32 - 1 asks for a random one). `Llama.generate` is not used because its
  chain applies top-p before temperature and adds a min-p stage (0.05 by default);
- it stops at the pair's end-of-sequence ids or the token budget, and its output is cut as every method's is
  (measure.truncate).

Counts: one llama.cpp decode per new token (the prompt's decode yields the first), so target forwards = new tokens
and tokens per target forward = 1.0, as for ar; it has no draft, so the draft fields are empty. The forward clock
does not see inside llama.cpp, so its whole window counts as "other" in the draft / verify / other split.
Conversations (`--turns 2`): every turn is one generation over the whole conversation so far, re-read from an
empty cache, as hf-assisted does.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from ..loading.models import embedded_gguf_path
from ..options import DecoderOptions
from .measure import Measured, truncate
from .specs import LLAMA_CPP, MethodSpec

SKIPPED = "llama.cpp: skipped (llama-cpp-python is not installed; pip install llama-cpp-python to compare)"
LLAMA_RANDOM_SEED = 0xFFFFFFFF  # llama.cpp's seeds are 32 bits, and this one means "pick one at random"
COUNTS = ("target_forwards = new tokens (one llama.cpp decode per token, the prompt's decode yielding the first), "
          "so tokens per target forward = 1.0 as for ar; no draft; every turn re-reads the whole conversation from "
          "an empty cache; timing window as for every method")


def llama_cpp_import_problem() -> str | None:
    """Why `llama_cpp` cannot be imported (not installed, or its native library fails to load), or None."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return "not installed"
    except (OSError, RuntimeError) as exc:  # the package is there but its shared library is not loadable
        return f"cannot load: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__}"
    return None


def without_unavailable_llama_cpp(specs: list[MethodSpec]) -> list[MethodSpec]:
    """The specs to run: llama.cpp's are dropped, with one line on stderr, when its package cannot be imported."""
    if not any(spec.method == LLAMA_CPP for spec in specs):
        return specs
    problem = llama_cpp_import_problem()
    if problem is None:
        return specs
    print(SKIPPED if problem == "not installed" else f"llama.cpp: skipped (llama-cpp-python {problem})",
          file=sys.stderr)
    return [spec for spec in specs if spec.method != LLAMA_CPP]


def runs_on_gguf(args: argparse.Namespace) -> bool:
    """Whether the pair's target is a GGUF file, judged from the arguments alone (before any model loads)."""
    if args.target:
        return Path(args.target).suffix == ".gguf"
    return args.pair in (None, "embedded")


def check_gguf_target(args: argparse.Namespace, specs: list[MethodSpec]) -> None:
    """llama.cpp reads the target's own GGUF file; any other pair is refused before a model loads."""
    if any(spec.method == LLAMA_CPP for spec in specs) and not runs_on_gguf(args):
        which = f"--target {args.target} is not one" if args.target else f"pair '{args.pair}' has none"
        raise ValueError(f"llama.cpp runs the target's GGUF file, and {which} (use --pair embedded or --target "
                         "FILE.gguf)")


def gguf_path(args: argparse.Namespace) -> Path:
    return Path(args.target).expanduser() if args.target else embedded_gguf_path()


class LlamaCppPeer:
    """One llama.cpp model, loaded once per bench run, and the dynasd pair whose tokenizer and end-of-sequence ids
    every output is read with (the same GGUF, so the same token ids)."""

    def __init__(self, path: Path, pair, n_threads: int) -> None:
        import llama_cpp

        self.pair = pair
        # The target's own context limit, the bound our decoders have, so every conversation they can decode fits
        # (its KV cells take memory: 180 MiB at 8192 positions for the embedded model).
        self.n_ctx = pair.context_limit
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=self.n_ctx, n_threads=n_threads,
                                   n_threads_batch=n_threads, n_gpu_layers=-1 if pair.device.type == "cuda" else 0,
                                   verbose=False)
        self.eos_ids = frozenset(pair.eos_token_ids)

    @classmethod
    def load(cls, args: argparse.Namespace, pair) -> LlamaCppPeer:
        return cls(gguf_path(args), pair, torch.get_num_threads())  # the threads our methods run with (--threads)

    def close(self) -> None:
        self.llm.close()

    def _sampler_chain(self, options: DecoderOptions):
        import llama_cpp

        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        sampling = options.sampling
        if sampling.greedy:
            stages = [llama_cpp.llama_sampler_init_greedy()]
        else:
            stages = [llama_cpp.llama_sampler_init_temp(sampling.temperature)]
            if sampling.top_k:
                stages.append(llama_cpp.llama_sampler_init_top_k(sampling.top_k))
            if sampling.top_p < 1.0:
                stages.append(llama_cpp.llama_sampler_init_top_p(sampling.top_p, 1))
            stages.append(llama_cpp.llama_sampler_init_dist(options.seed % LLAMA_RANDOM_SEED))
        for stage in stages:
            llama_cpp.llama_sampler_chain_add(chain, stage)  # the chain owns its stages from here on
        return chain

    def generate(self, ids: list[int], max_new_tokens: int, options: DecoderOptions) -> list[int]:
        """New token ids after `ids`, from an empty cache: the prompt in one evaluation, then one per token."""
        import llama_cpp

        if len(ids) + max_new_tokens > self.n_ctx:
            raise ValueError(f"llama.cpp: {len(ids)} prompt tokens + {max_new_tokens} new tokens exceed the "
                             f"context of {self.n_ctx}")
        chain = self._sampler_chain(options)
        try:
            llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.llm.ctx), True)
            self.llm.reset()  # n_tokens = 0: nothing of an earlier run is read again
            self.llm.eval(ids)
            new: list[int] = []
            while True:
                token = int(llama_cpp.llama_sampler_sample(chain, self.llm.ctx, -1))
                new.append(token)
                if len(new) >= max_new_tokens or token in self.eos_ids:
                    return new
                self.llm.eval([token])
        finally:
            llama_cpp.llama_sampler_free(chain)

    def run(self, options: DecoderOptions, ids: list[int], max_new_tokens: int) -> Measured:
        """One timed generation: the same window as every method, around the whole call."""
        started = time.perf_counter()
        new = self.generate(ids, max_new_tokens, options)
        seconds = time.perf_counter() - started
        token_ids, finished = truncate(new, max_new_tokens, self.eos_ids)
        return Measured(token_ids, self.pair.decode(token_ids), seconds, target_forwards=len(token_ids),
                        accepted_draft_levels=None, attempted_draft_levels=None, finished=finished, lossless=True,
                        context_ids=list(ids))

    def run_conversation(self, options: DecoderOptions, ids: list[int], max_new_tokens: int,
                         follow_ups=()) -> list[Measured]:
        """A conversation, one Measured per turn: each later turn re-reads the whole conversation so far (its own
        earlier answers included), as run_hf_assisted_conversation does."""
        turns: list[Measured] = []
        for turn in range(1 + len(follow_ups)):
            if turn:
                context = ids + turns[-1].token_ids
                extra, _ = follow_ups[turn - 1](context, turns[-1].token_ids)
                ids = context + list(extra)
            turns.append(self.run(options, ids, max_new_tokens))
        return turns


def meta(specs: list[MethodSpec], pair) -> dict:
    """What meta.json records about llama.cpp when it runs."""
    if not any(spec.method == LLAMA_CPP for spec in specs):
        return {}
    import llama_cpp

    return {"llama_cpp": {"version": llama_cpp.__version__, "n_threads": torch.get_num_threads(),
                          "n_ctx": pair.context_limit, "counts": COUNTS}}
