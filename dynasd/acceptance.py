"""How far a run's drafts got, position by position: the acceptance metrics every view and the bench report.

One acceptance rate hides a draft whose later positions collapse: 60% overall can be 90% at position 1 and 20%
at position 4, and the two call for different trees (deep chains pay only when late positions hold). So a run is
read per draft position, under the names vLLM reports:
  mean acceptance length      tokens committed per target forward (RunTrace.summary, the bench): vLLM's and
                              llama.cpp's name for it; 1 + the per-position sum below when every step drafts
  per-position acceptance     for position k: the share of drafts whose accepted path reached k (vLLM's rate; it
                              falls with k, and its sum is the candidates accepted per draft)
  conditional acceptance      for position k: of the drafts whose walk got to position k with a candidate there,
                              the share that accepted one: the chance the draft is right at k once it was right
                              before k, which says how deep a tree is worth growing
  accepted lengths            the histogram: drafts that accepted 0, 1, 2, ... candidates
A *draft* is a step that proposed candidates (ar steps and pld steps without a match are none); a *position* is
the depth of a proposed candidate on the accepted path: a target-initialized tree's roots are the target's own
tokens, not positions.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .trace import PROPOSED_ORIGINS, StepTrace
from .tree import ROOT


@dataclass
class Acceptance:
    """The acceptance counts of a run's steps (the figures' and the bench's one source)."""

    histogram: list[int] = field(default_factory=list)  # histogram[a]: drafts that accepted a candidates
    proposed: int = 0                                    # candidates proposed, over every draft
    accepted: int = 0                                    # candidates accepted
    reached: list[int] = field(default_factory=list)    # reached[k - 1]: drafts whose walk got to position k
    passed: list[int] = field(default_factory=list)     # passed[k - 1]: drafts that accepted a candidate at k

    @property
    def drafts(self) -> int:
        return sum(self.histogram)

    @property
    def per_position(self) -> list[float]:
        return per_position_acceptance(self.histogram)

    @property
    def conditional(self) -> list[float]:
        return [passed / reached for passed, reached in zip(self.passed, self.reached)]

    def add(self, step: StepTrace) -> None:
        proposed = sum(node.origin in PROPOSED_ORIGINS for node in step.nodes)
        if not proposed:
            return
        kept = sum(step.nodes[i].origin in PROPOSED_ORIGINS for i in step.accepted_path)
        self.histogram += [0] * (kept + 1 - len(self.histogram))
        self.histogram[kept] += 1
        self.proposed += proposed
        self.accepted += kept
        for position, accepted in enumerate(_positions_walked(step)):
            if position == len(self.reached):
                self.reached.append(0)
                self.passed.append(0)
            self.reached[position] += 1
            self.passed[position] += accepted


def acceptance_of(steps: list[StepTrace]) -> Acceptance:
    acceptance = Acceptance()
    for step in steps:
        acceptance.add(step)
    return acceptance


def _positions_walked(step: StepTrace) -> list[bool]:
    """Down the accepted path: at each context with proposed children, whether the walk accepted one of them (the
    list ends at the first position where none was accepted)."""
    proposed_children: dict[int, set[int]] = {}
    for i, node in enumerate(step.nodes):
        if node.origin in PROPOSED_ORIGINS:
            proposed_children.setdefault(node.parent, set()).add(i)
    walked: list[bool] = []
    context = ROOT
    for next_node in step.accepted_path + [None]:
        kids = proposed_children.get(context, set())
        if kids:
            walked.append(next_node in kids)
            if next_node not in kids:
                break
        if next_node is None:
            break
        context = next_node
    return walked


def per_position_acceptance(histogram: list[int]) -> list[float]:
    """For draft position k = 1, 2, ...: the share of drafts whose accepted path reached k, from histogram[a] =
    drafts that accepted a candidates (vLLM's per-position acceptance rate). It falls with k; the sum over k is
    the mean number of candidates accepted per draft."""
    drafts = sum(histogram)
    if not drafts:
        return []
    return [sum(histogram[k:]) / drafts for k in range(1, len(histogram))]


def add_histograms(histograms: list[list[int]]) -> list[int]:
    total: list[int] = []
    for histogram in histograms:
        total += [0] * (len(histogram) - len(total))
        for accepted, count in enumerate(histogram):
            total[accepted] += count
    return total
