"""A decoder's state as data: what a run needs to go on in another process.

Why: on a ZeroGPU Space every model call runs in a forked child process; nothing it changes in Python objects
reaches the serving process, only its pickled return value does. So a session keeps its decoder as a
`DecoderSnapshot` (plain ints, floats, strings, lists, dicts and bytes: no tensor, no model) and every call
rebuilds the decoder from it (`dynasd.decoders.resume`). The KV caches are not in it: `resume` rebuilds them with
one prefill of the committed text, which costs one forward instead of the cache's bytes (45 KB a token for the
embedded target in float32). What cannot be rebuilt from the committed text is here: the random generator's
state and each candidate source's own state (sources/base.py, `CandidateSource.snapshot`).

A snapshot is pickled only between the processes of one server: like any pickle it must never be read from a
stranger (a shared run is a JSON trace, dynasd/trace.py).
"""
from __future__ import annotations

import hashlib
import json
import pickle
from dataclasses import dataclass, field

SNAPSHOT_FORMAT = "dynasd-snapshot/1"


def state_fingerprint(pair: str, options: dict, turn: int, steps: int, max_new_tokens: int, prompt_ids: list[int],
                      committed: list[int], generator_state: bytes) -> str:
    """A short hash of what makes two decoders' next steps the same: the pair, the options, where the run stands
    (turn, steps, committed text) and the random generator. Sources' states are left out: given all of these
    they follow from the same history, and hashing them would cost a device read per call."""
    header = json.dumps([SNAPSHOT_FORMAT, pair, options, turn, steps, max_new_tokens, prompt_ids, committed],
                        sort_keys=True, separators=(",", ":"))
    digest = hashlib.blake2b(header.encode(), digest_size=16)
    digest.update(generator_state)
    return digest.hexdigest()


@dataclass(frozen=True)
class DecoderSnapshot:
    """Everything a decoder needs to go on from between two steps, as plain picklable CPU data.

    options          DecoderOptions.to_record(): `resume` makes the decoder from them with make_decoder
    pair, device     the pair's name and device kind: a snapshot resumes on the same pair, on the same kind of
                     device (a CPU generator's state does not fit a CUDA generator)
    prompt_ids ... seconds   the run's header, as RunTrace holds it (`prompt` is its prompt text; `steps` counts
                     the steps taken, so the next StepTrace's index is `steps`)
    committed        every committed token: the prompt, the run's tokens and any a step committed past the run's
                     end (the caches hold them; continue_with drops them)
    generator_state  torch.Generator.get_state() of the decoder's generator, as bytes
    sources          each candidate source's state (CandidateSource.snapshot), in the decoder's source order
    """

    options: dict
    pair: str
    device: str
    prompt_ids: list[int]
    new_token_ids: list[int]
    prompt: str
    max_new_tokens: int
    finished: str
    turn: int
    steps: int
    seconds: float
    committed: list[int]
    generator_state: bytes
    sources: list[dict] = field(default_factory=list)
    format: str = SNAPSHOT_FORMAT

    @property
    def fingerprint(self) -> str:
        """Decoder.fingerprint() of a decoder at exactly this state: a caller that still holds a live decoder
        with this fingerprint may step it instead of resuming (the caches are the only difference)."""
        return state_fingerprint(self.pair, self.options, self.turn, self.steps, self.max_new_tokens,
                                 self.prompt_ids, self.committed, self.generator_state)

    @property
    def nbytes(self) -> int:
        """Its size as pickled, for reporting what crosses a process boundary."""
        return len(pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL))

    @property
    def done(self) -> bool:
        return bool(self.finished)
