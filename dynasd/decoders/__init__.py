"""Decoders by method name. `make_decoder` is the one place that turns user options into a decoder."""
from __future__ import annotations

from ..models import ModelPair
from ..sampling import SamplingConfig
from ..stopping import StopPolicy
from ..tree import TreeShape
from .ar import ARDecoder
from .base import Decoder, RequestError
from .speculative import TreeDecoder

METHODS = ("ar", "sd", "mcsd", "ti-mcsd", "pld")
DEFAULT_PLD_TOKENS = 8
MAX_TREE_NODES = 256


def tree_shape_for(method: str, gamma: int = 4, k_config: tuple[int, ...] = (4, 2, 2, 1), width: int = 4,
                   depth: int = 4) -> TreeShape:
    """sd: a chain of gamma; mcsd: k_config; ti-mcsd: k_config if given explicitly, else the fork (width, 1*depth).
    (pld has no draft-model tree; make_decoder gives it the lookup chain.)"""
    if method == "sd":
        return TreeShape((1,) * gamma)
    if method == "mcsd":
        return TreeShape(tuple(k_config))
    if method == "ti-mcsd":
        return TreeShape((width,) + (1,) * depth, target_roots=True)
    raise ValueError(f"unknown method '{method}' (use {', '.join(METHODS)})")


def make_decoder(method: str, pair: ModelPair, sampling: SamplingConfig, seed: int = 0, gamma: int = 4,
                 k_config: tuple[int, ...] = (4, 2, 2, 1), width: int = 4, depth: int = 4,
                 ti_k_config: tuple[int, ...] | None = None, without_replacement: bool = True,
                 dynamic_depth: bool = False, stop: StopPolicy | None = None,
                 max_nodes: int = MAX_TREE_NODES, lookup: int = 0, lookup_min_ngram: int = 2,
                 feature_draft: bool = False) -> Decoder:
    if method == "ar":
        return ARDecoder(pair, sampling, seed)
    if lookup < 0 or lookup_min_ngram < 1:
        raise ValueError("prompt lookup length must be >= 0 and its n-gram size >= 1")
    if lookup > max_nodes:
        raise ValueError(f"prompt lookup of {lookup} tokens exceeds the tree limit of {max_nodes} nodes")
    if method == "pld":
        lookup = lookup or DEFAULT_PLD_TOKENS
        shape = TreeShape((1,) * lookup)
    elif method == "ti-mcsd" and ti_k_config:
        shape = TreeShape(tuple(ti_k_config), target_roots=True)
    else:
        shape = tree_shape_for(method, gamma, k_config, width, depth)
    if shape.num_nodes > max_nodes:
        raise ValueError(f"the tree has {shape.num_nodes} nodes; the limit is {max_nodes}")
    stop = stop or StopPolicy()
    return TreeDecoder(pair, sampling, shape, method, seed=seed, without_replacement=without_replacement,
                       dynamic_depth=dynamic_depth or stop.name != "none", stop=stop, lookup=lookup,
                       lookup_min_ngram=lookup_min_ngram, feature_draft=feature_draft)


__all__ = ["ARDecoder", "Decoder", "METHODS", "RequestError", "TreeDecoder", "make_decoder", "tree_shape_for"]
