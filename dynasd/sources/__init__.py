"""Candidate sources for the speculative loop, behind one protocol (base.py).

  draft_tree.py     the draft model's tree, static or dynamic depth (sd, mcsd)
  dynamic_tree.py   a draft tree grown each step by cumulative draft probability (dynamic)
  target_roots.py   level 1 from the target's own distribution, the draft below (ti-mcsd)
  feature_draft.py  the draft tree of a draft that reads the target's hidden states
  prompt_lookup.py  the continuation of the last n-gram's earlier occurrence (pld, and with sd/mcsd)
  recycling.py      the target's own earlier top-k predictions, walked through a static template (recycle)
  candidate_tree.py the one tree a step verifies, made from every source's proposal
"""
from .base import CandidateSource, DraftRows, Fallback, Proposal, StepOutcome, TargetReading
from .candidate_tree import CandidateTree
from .draft_tree import DraftTree
from .dynamic_tree import DynamicTree
from .feature_draft import FeatureDraftTree, TargetFeatures
from .prompt_lookup import PromptLookup
from .recycling import TokenRecycling
from .target_roots import TargetRootedTree

__all__ = ["CandidateSource", "CandidateTree", "DraftRows", "DraftTree", "DynamicTree", "Fallback", "FeatureDraftTree",
           "PromptLookup", "Proposal", "StepOutcome", "TargetFeatures", "TargetReading", "TargetRootedTree",
           "TokenRecycling"]
