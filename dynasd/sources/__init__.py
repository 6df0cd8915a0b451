"""Candidate sources for the speculative loop, behind one protocol (base.py).

  origins.py        every candidate origin (draft, lookup, recycled, target_root) and how the views show it
  draft_tree.py     the draft model's tree, static or dynamic depth (sd, mcsd)
  target_roots.py   level 1 from the target's own distribution, the draft below (ti-mcsd)
  feature_draft.py  the draft tree of a draft that reads the target's hidden states
  prompt_lookup.py  the continuation of the last n-gram's earlier occurrence (pld, and with sd/mcsd)
  recycling.py      the target's own earlier top-k predictions, walked through a static template (recycle)
  candidate_tree.py the one tree a step verifies, made from every source's proposal

The classes are imported when first named (PEP 562), not with the package: dynasd/trace.py reads origins.py, and
the sources read the trace's records, so importing every source with the package would make the trace import
itself half-built.
"""
from __future__ import annotations

import importlib

_HOMES = {
    "CandidateSource": "base", "DraftRows": "base", "Fallback": "base", "Proposal": "base", "StepOutcome": "base",
    "TargetReading": "base", "CandidateTree": "candidate_tree", "DraftTree": "draft_tree",
    "FeatureDraftTree": "feature_draft", "TargetFeatures": "feature_draft", "PromptLookup": "prompt_lookup",
    "TokenRecycling": "recycling", "TargetRootedTree": "target_roots",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)

