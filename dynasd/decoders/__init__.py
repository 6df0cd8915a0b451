"""Decoders from options. `make_decoder` is the one place that turns DecoderOptions into a decoder; `resume` turns
a decoder's snapshot (snapshot.py) back into one."""
from __future__ import annotations

from ..loading.models import ModelPair
from ..options import DecoderOptions
from ..stopping.decision_models import DecisionModel
from .ar import ARDecoder
from .base import Decoder, RequestError
from .snapshot import DecoderSnapshot
from .speculative import TreeDecoder


def make_decoder(pair: ModelPair, options: DecoderOptions, decision_model: DecisionModel | None = None) -> Decoder:
    """The decoder `options` describe, on `pair`. Raises OptionsError (a ValueError) for bad options and
    ValueError for what only the pair can refuse (no feature draft) or a decision model that is not there.

    `decision_model`: one already loaded for `options.stop` (stopping.load_decision_model), so a caller that makes
    many decoders reads it from disk once; by default the one `options.decision_model` names is loaded here.
    The run's trace records the options (RunTrace.config["options"]), so a saved run gives them back.
    """
    if options.method == "ar":
        return ARDecoder(pair, options)
    return TreeDecoder(pair, options, decision_model)


def resume(pair: ModelPair, snapshot: DecoderSnapshot, decision_model: DecisionModel | None = None) -> Decoder:
    """The decoder `snapshot` was taken of, on `pair`, ready for its next step (or, for a finished run, for
    continue_with). Needs no live cache: the caches are rebuilt by one prefill of the committed text.

    Its next StepTrace is the one the original decoder would have made: the same uniform draws, and the float
    values (p, q, scores) to float rounding, since a prefill computes the cached keys and values in other shapes
    than the steps did; so the same tokens, tests and statuses unless a test or an argmax falls within rounding
    (docs/method.md, section 11). `decision_model` as for make_decoder. Raises ValueError for a snapshot of
    another pair, device kind or format."""
    decoder = make_decoder(pair, DecoderOptions.from_record(snapshot.options), decision_model)
    decoder.restore(snapshot)
    return decoder


__all__ = ["ARDecoder", "Decoder", "DecoderSnapshot", "RequestError", "TreeDecoder", "make_decoder", "resume"]
