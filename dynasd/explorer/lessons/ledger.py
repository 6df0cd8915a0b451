"""The KV-cache ledger: for each step, which rows (positions) of the target's and the draft's KV caches the step's
forwards wrote, which stayed (the accepted path), which were cropped, which committed token is still pending (not
cached: the bonus or correction, fed first by the next step) and where the next step starts.

Why: "how can a tree be verified in one forward, and what happens to the rejected branches' keys and values?" is
answered by bookkeeping the decoders do silently (cache.py: `forward`, `keep_path`). The ledger is derived from the
trace alone, so it works on replayed and example traces; tests/test_ledger.py checks it against the decoders' real
cache lengths after every step of every method. It follows one uninterrupted turn: a follow-up turn or a decoder
resumed from a snapshot recomputes its caches (docs/ARCHITECTURE.md) and starts the draft's bookkeeping again.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...options import draft_that_ran
from ...origins import DRAFT, TARGET_ROOT
from ...trace import RunTrace, StepTrace

DRAFTING_METHODS = ("sd", "mcsd", "ti-mcsd", "dynamic")  # the methods whose tree comes from a draft model
DRAFT_READS = (DRAFT.name, TARGET_ROOT.name)  # nodes the draft reads: its own, and ti-mcsd's level 1 below them


@dataclass(frozen=True)
class CacheRows:
    """One model's KV cache across one step, in rows (= positions of committed tokens, then tree nodes)."""

    model: str          # "target" or "draft"
    before: int         # committed tokens cached when the step began
    chain: int          # committed tokens the step fed first (causal), from row `before`
    tree: int           # tree nodes the step fed, from row `before + chain`
    kept: int           # of those tree rows, the accepted path's, moved down to follow the committed text
    after: int          # committed tokens cached when the step ended: where the next step's forward starts
    committed: int      # committed tokens (prompt included) when the step ended

    @property
    def cropped(self) -> int:
        return self.tree - self.kept

    @property
    def pending(self) -> int:
        """Committed tokens not cached yet (the bonus or correction token, and any the model did not read). At a
        run's end the trace's tokens stop at its length limit while the cache may hold the whole accepted path."""
        return max(0, self.committed - self.after)


@dataclass(frozen=True)
class StepLedger:
    index: int
    target: CacheRows
    draft: CacheRows | None   # None: the method runs no draft model (ar, pld, recycle)
    draft_ran: bool = False   # False on a step whose candidates came from prompt lookup alone (the draft waited)


def _uses_draft(run: RunTrace) -> bool:
    return run.method in DRAFTING_METHODS


def draft_fed_nodes(step: StepTrace) -> list[int]:
    """The tree nodes the draft read this step (their keys and values were in its cache before the commit): every
    node above the deepest level (a static or early-stopped tree), or the nodes a dynamic tree expanded."""
    if step.growth is not None:
        return sorted(step.growth.expanded)
    own = [i for i, node in enumerate(step.nodes) if node.origin in DRAFT_READS]  # recycled nodes join below
    deepest = max((step.nodes[i].level for i in own), default=0)
    return [i for i in own if step.nodes[i].level < deepest]


def _target_rows(step: StepTrace) -> CacheRows:
    before = step.context_len - step.root_rows
    return CacheRows("target", before, step.root_rows, len(step.nodes), len(step.accepted_path),
                     step.context_len + len(step.accepted_path), step.context_len + len(step.committed))


def run_ledger(run: RunTrace) -> list[StepLedger]:
    """The ledger of every step of `run`."""
    ledger: list[StepLedger] = []
    draft_len = None
    feature = _uses_draft(run) and draft_that_ran(run.method, run.config, run.draft_label) == "features"
    previous_end = None
    for step in run.steps:
        target = _target_rows(step)
        draft = None
        ran = False
        if _uses_draft(run):
            if draft_len is None or step.context_len != previous_end:  # a new turn: the draft caught up
                draft_len = step.context_len - 1
            ran = any(node.origin == DRAFT.name for node in step.nodes)
            if ran:
                # the draft reads every committed token it has not cached (the root included), then its tree's
                # upper levels; a target-rooted tree's level 1 is the target's, read by the draft with level 2
                fed = draft_fed_nodes(step)
                kept = 0 if feature else sum(1 for i in step.accepted_path if i in set(fed))
                chain = step.context_len - draft_len
                draft = CacheRows("draft", draft_len, chain, len(fed), kept, step.context_len + kept,
                                  target.committed)
            else:
                draft = CacheRows("draft", draft_len, 0, 0, 0, draft_len, target.committed)
            draft_len = draft.after
        previous_end = target.committed
        ledger.append(StepLedger(step.index, target, draft, ran))
    return ledger


def ledger_markdown(entry: StepLedger, verdict: bool = True) -> str:
    """The step's ledger in words. Without its `verdict` (a guess pending: predict, then reveal) only what the step
    wrote, which is known before the walk: what stayed, what was cropped and what waits uncached tell how many
    tokens it committed."""
    t = entry.target
    wrote = (f"**Step {entry.index}, target:** rows 0–{t.before - 1} were cached; the verify wrote "
             + (f"{t.chain} committed row(s) (from row {t.before}) and " if t.chain else "") + f"{t.tree} tree row(s)")
    if not verdict:
        return _before_the_verdict(entry, wrote)
    lines = [wrote + f"; {t.kept} (the accepted path) stayed, {t.cropped} were cropped. "
             f"The cache now ends at row {t.after}"
             + (f"; {t.pending} committed token(s) wait uncached (the bonus or correction), and the next step's "
                "forward starts with them." if t.pending else "; nothing is pending: the next step starts with "
                "its tree.")]
    return "\n\n".join(lines + [_draft_line(entry, revealed=True)])


def _before_the_verdict(entry: StepLedger, wrote: str) -> str:
    return "\n\n".join([wrote + ". Which of them stay (the accepted path) and which are cropped is this step's "
                         "verdict: it shows with the reveal.", _draft_line(entry, revealed=False)])


def _draft_line(entry: StepLedger, revealed: bool) -> str:
    """The draft's cache in this step; what stayed of it and where it ends only once the verdict is `revealed`."""
    d = entry.draft
    if d is None:
        return "No draft model: its cache does not exist for this method."
    if not entry.draft_ran:
        catching_up = f" and catches up {d.pending} token(s) next time it drafts" if revealed else ""
        return f"**Draft:** it did not run (prompt lookup gave the candidates); its cache stays at row {d.after}" \
               f"{catching_up}."
    read = (f"**Draft:** it read {d.chain} committed row(s) from row {d.before} and {d.tree} tree row(s) (the "
            "deepest level is drawn, never read); ")
    if not revealed:
        return read + "what stays shows with the reveal."
    return read + (f"{d.kept} stayed, {d.cropped} were cropped; it ends at row {d.after}, {d.pending} committed "
                   "token(s) behind.")
