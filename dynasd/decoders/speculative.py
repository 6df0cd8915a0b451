"""The speculative decoding loop: propose candidates, verify them in one target forward, walk the tree, commit.

One class covers every speculative method; they differ only in where the candidates come from (dynasd/sources/,
one protocol):
  sd       a chain (1, 1, ..., 1), drawn from the draft            -> standard speculative sampling
  mcsd     a static tree such as (4, 2, 2, 1), drawn from the draft -> multi-candidate speculative sampling
  ti-mcsd  level 1 from the *target's* own next-token distribution, e.g. the fork (w, 1, ..., 1). The longest
           accepted chain wins, which makes it lossy when w > 1 (the paper's method; see method.md section 4).
  pld      prompt lookup decoding (Saxena 2023), no draft model: a lookup chain when there is a match, else a plain
           target step (an empty tree).
  recycle  token recycling (Luo et al. 2024), no draft model: the target's own earlier top-k predictions walked
           through a static template (`shape`).
  dynamic  a draft tree grown anew every step where the draft's cumulative probability is highest (EAGLE-2-style,
           within a node budget; sources/dynamic_tree.py).
With prompt lookup on (sd / mcsd), a step whose last tokens occurred earlier in the context proposes what followed
them instead of the draft's tree, and skips the draft model for that step. With recycling on (`recycle=`, a
template), its candidates join the step's others in one tree, duplicates merged (sources/candidate_tree.py).

Per step:
  1. propose  every source proposes a tree under the last committed token; they become one tree.
  2. verify   one target forward over the committed tokens not yet cached + every node, under the tree mask,
              which yields the target distribution at every node.
  3. walk     from the root, accept or reject children (greedy comparison, or MCSS with every candidate tested
              against the q its source drew it from), then sample the bonus or correction token.
  4. commit   keep the accepted path in the target's cache; every source hears the outcome and keeps its own state.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..cache import CachedModel
from ..loading.feature_model import is_feature_draft
from ..loading.models import ModelPair
from ..options import DecoderOptions, draft_that_runs
from ..sampling import (
    WalkResult,
    argmax_rows,
    greedy_walk,
    logits_to_probs,
    mcss_walk,
    probs_at,
    sample_one,
    values_at,
)
from ..sources import (
    CandidateSource,
    CandidateTree,
    DraftTree,
    DynamicTree,
    Fallback,
    FeatureDraftTree,
    PromptLookup,
    StepOutcome,
    TargetReading,
    TargetRootedTree,
    TokenRecycling,
)
from ..stopping.decision_models import DecisionModel
from ..stopping.policies import make_stop_policy
from ..trace import NodeTrace, ResidualTrace, StepTrace, TreeGrowth
from ..tree import ROOT, TreeShape
from .base import Decoder, no_draft_model

RESIDUAL_TOP = 6  # a step's residual record keeps the 6 largest tokens of p, of q and of the residual
SOFTMAX_ROWS = 8  # target rows turned into probabilities at a time for the trace's p values at T = 0 (_node_traces)


@dataclass
class Verified:
    """The verify forward: `root_rows` committed tokens the target had not cached, then one row per tree node."""

    reading: TargetReading
    root_rows: int
    positions: list[int]                 # of the tree nodes
    argmax: list[int] | None             # per row, at temperature 0
    probs: torch.Tensor | None           # per row, warped, when sampling

    def row(self, context: int) -> int | None:
        """The row holding the target's distribution after `context` (None: a target-rooted tree's root, whose
        distribution the last step computed)."""
        if context == ROOT:
            return 0 if self.root_rows else None
        return self.root_rows + context


@dataclass
class Walked:
    walks: list[WalkResult]
    path: list[int]                      # accepted nodes, top-down
    committed: list[int]
    origins: list[str]
    final_parent: int | None
    final_p: float | None
    final_context: int                   # the node after which the target's distribution was last read
    final_probs: torch.Tensor | None     # that distribution after the walk's rejections (sampling)


class TreeDecoder(Decoder):
    """Every speculative method, as `options` describe it: `shape` is the draft's tree (pld: its lookup chain;
    recycle: its template); a lookup length turns prompt lookup on; `recycle` (a branching per level, e.g.
    (2, 1, 1, 1)) joins token recycling's tree to every step. The options' own checks (options.py) are all the
    checks there are, but the one only the pair can make (a feature draft it does not have).
    `decision_model`: one already loaded for the stop policy (make_decoder says why)."""

    def __init__(self, pair: ModelPair, options: DecoderOptions, decision_model: DecisionModel | None = None) -> None:
        super().__init__(pair, options)
        feature_draft = draft_that_runs(options, pair.default_draft_kind) == "features"
        if feature_draft and pair.feature_draft is None:
            raise ValueError(f"the pair '{pair.name}' has no feature draft")
        self.method = options.method
        branching = options.branching()  # none for dynamic: its tree is grown anew every step
        self.shape = TreeShape(branching, target_roots=options.method == "ti-mcsd") if branching else None
        self.without_replacement = not options.with_replacement
        self.dynamic_depth = options.dynamic_depth or options.stop != "none"  # a stop policy implies it
        self.stop = make_stop_policy(options.stop, options.threshold, options.decision_model, decision_model,
                                     pair.device)
        self.lookup = options.lookup_tokens
        self.lookup_min_ngram = options.lookup_ngram
        # the recycle method's shape is its template, as pld's is its lookup chain
        recycle = options.branching() if options.method == "recycle" else options.recycle
        self.recycle = TreeShape(tuple(recycle)) if recycle else None
        self.draft_model = pair.feature_draft if feature_draft else pair.draft
        self.sources = self._sources()
        self.target: CachedModel | None = None

    def _sources(self) -> list[CandidateSource]:
        """The step's sources, in test order: the draft's tree (or, when it matches, prompt lookup), then
        recycling. pld and recycle run no draft model."""
        lookup = PromptLookup(self.lookup, self.lookup_min_ngram, self.pair.device) if self.lookup else None
        recycled = TokenRecycling(self.recycle, self.pair.vocab_size, self.pair.device) if self.recycle else None
        if self.method in ("pld", "recycle"):
            return [s for s in (lookup, recycled) if s]
        if self.method == "dynamic":
            draft = DynamicTree(self.pair, self.draft_model, self.sampling, self.options.expand, self.options.depth,
                                self.options.nodes)
            return [s for s in (Fallback(lookup, draft) if lookup else draft, recycled) if s]
        tree = FeatureDraftTree if is_feature_draft(self.draft_model) else DraftTree
        draft = tree(self.pair, self.draft_model, self.shape, self.sampling, self.without_replacement,
                     self.dynamic_depth, self.stop)
        if self.shape.target_roots:
            draft = TargetRootedTree(draft, self.sampling)
        return [s for s in (Fallback(lookup, draft) if lookup else draft, recycled) if s]

    @property
    def lossless(self) -> bool:
        return all(source.lossless for source in self.sources)

    @property
    def draft_label(self) -> str:
        if not any(source.reads_draft_model for source in self.sources):
            return no_draft_model("; ".join(source.proposed_by for source in self.sources))
        if self.draft_model is self.pair.draft:
            return self.pair.draft_label
        return self.pair.feature_draft_label or "feature draft (reads the target's hidden states)"

    def max_step_tokens(self) -> int:
        return max(source.max_tokens for source in self.sources) + 1

    def _prefill(self) -> None:
        reads = any(source.reads_target_hidden for source in self.sources)
        self.target = CachedModel(self.pair.target, need_hidden=reads)
        reading = self._read_prompt()
        for source in self.sources:
            source.start(self.committed, reading, self.generator)

    def _extend(self, kept: int) -> None:
        self.target.crop(kept)
        reading = self._read_prompt()
        for source in self.sources:
            source.extend(self.committed, kept, reading)

    def _source_states(self) -> list[dict]:
        return [source.snapshot() for source in self.sources]

    def _restore_sources(self, states: list[dict]) -> None:
        if len(states) != len(self.sources):
            raise ValueError(f"the snapshot has {len(states)} source states for {len(self.sources)} sources")
        for source, state in zip(self.sources, states):
            source.restore(state, self.committed)

    def _read_prompt(self) -> TargetReading | None:
        """The target reads the committed tokens it has not cached: all of them when a tree is target-rooted (it
        needs the target's next-token distribution before the first step), otherwise all but the last, which is
        the first step's root."""
        target_rooted = any(source.target_rooted for source in self.sources)
        first = self.target.cached_len
        target_reads = self.committed[first:] if target_rooted else self.committed[first:-1]
        if not target_reads:
            return None
        every_row = any(source.reads_prompt_logits for source in self.sources)
        logits, hidden = self.target.forward(target_reads, [], None, [],
                                             keep_logits=len(target_reads) if every_row else 1,
                                             keep_hidden=len(target_reads) if self.target.need_hidden else 0)
        return TargetReading(first, list(target_reads), logits, hidden)

    # -- one step ----------------------------------------------------------------------------------------------
    def _step(self) -> StepTrace:
        context_len = len(self.committed)
        root_token = self.pair.token_strings(self.committed[-1:])[0]
        t0 = self._clock()
        tree = self._propose()
        t1 = self._clock()
        verified = self._verify(tree)
        t2 = self._clock()
        walked = self._walk(tree, verified)
        self._commit(tree, verified, walked)
        t3 = self._clock()  # what follows records the step for the views (p of every node): not the method's time
        return self._trace(tree, verified, walked, context_len, root_token, t1 - t0, t2 - t1, t3 - t2)

    def _propose(self) -> CandidateTree:
        room = self.max_new_tokens - len(self.run.new_token_ids)
        proposals = [source.propose(self.committed, room) for source in self.sources]
        return CandidateTree(proposals, self.pair.vocab_size, self.pair.device)

    def _verify(self, tree: CandidateTree) -> Verified:
        context_len = len(self.committed)
        chain = self.committed[self.target.cached_len:]
        positions = [context_len + level - 1 for level in tree.levels]
        logits, hidden = self.target.forward(chain, tree.tokens, tree.mask, positions,
                                             keep_logits=len(chain) + len(tree))
        reading = TargetReading(context_len - len(chain), chain + tree.tokens, logits, hidden)
        greedy = self.sampling.greedy
        return Verified(reading, len(chain), positions,
                        argmax=argmax_rows(logits) if greedy else None,  # the step's one host sync on the verify
                        probs=None if greedy else logits_to_probs(logits, self.sampling))

    def _walk(self, tree: CandidateTree, verified: Verified) -> Walked:
        def walk_from(node: int) -> WalkResult:
            if self.sampling.greedy:
                return greedy_walk(node, tree.children, tree.tokens, lambda c: verified.argmax[verified.row(c)])

            def target_probs(context: int) -> torch.Tensor:
                row = verified.row(context)
                return tree.root_probs if row is None else verified.probs[row]

            return mcss_walk(node, tree.draws, tree.tokens, target_probs, self.generator)

        if tree.target_rooted:  # every root's chain is tested; the longest accepted one is committed, root included
            roots = tree.roots()
            walks = [walk_from(root) for root in roots]
            best = max(range(len(roots)), key=lambda j: (len(walks[j].path), -j))
            path = [roots[best]] + walks[best].path
            return Walked(walks, path, [tree.tokens[i] for i in path], [tree.origins[i] for i in path],
                          None, None, walks[best].final_context, walks[best].final_probs)
        walk = walk_from(ROOT)
        row = verified.row(walk.final_context)
        if self.sampling.greedy:
            final = verified.argmax[row]
            final_p = None  # its p is for the views only: _trace reads it after the step's clock
        else:
            final = sample_one(walk.final_probs, self.generator)
            final_p = float(walk.final_probs[final])
        return Walked([walk], walk.path, [tree.tokens[i] for i in walk.path] + [final],
                      [tree.origins[i] for i in walk.path] + ["correction" if walk.final_had_children else "bonus"],
                      walk.final_context, final_p, walk.final_context, walk.final_probs)

    def _commit(self, tree: CandidateTree, verified: Verified, walked: Walked) -> None:
        self.committed += walked.committed
        self.target.keep_path(walked.path, len(self.committed))
        root_rows = verified.root_rows
        outcome = StepOutcome(committed=self.committed, reading=verified.reading, root_rows=root_rows,
                              accepted_rows=list(range(root_rows)) + [root_rows + i for i in walked.path],
                              next_logits=verified.reading.logits[verified.row(walked.final_context)],
                              next_probs=walked.final_probs)
        for index, source in enumerate(self.sources):
            source.update(outcome, tree.accepted_of(index, walked.path))

    # -- the trace ---------------------------------------------------------------------------------------------
    def _trace(self, tree: CandidateTree, verified: Verified, walked: Walked, context_len: int, root_token: str,
               draft_seconds: float, verify_seconds: float, accept_seconds: float) -> StepTrace:
        root_rows = verified.root_rows
        nodes = self._node_traces(tree, verified, walked)
        return StepTrace(
            index=self.steps_taken, context_len=context_len, nodes=nodes, max_nodes=tree.max_nodes,
            max_depth=tree.max_depth, live_depth=tree.depth, root_rows=root_rows, verify_mask=list(tree.mask_rows),
            position_ids=list(range(context_len - root_rows, context_len)) + verified.positions,
            accepted_path=walked.path, committed=walked.committed,
            committed_tokens=self.pair.token_strings(walked.committed), committed_origins=walked.origins,
            final_parent=walked.final_parent, final_p=self._final_p(verified, walked), root_token=root_token,
            stop_policy=self.stop.name if self.dynamic_depth else "none",
            threshold=self.stop.threshold if self.dynamic_depth else None, stop_scores=tree.stop_scores,
            draft_seconds=draft_seconds, verify_seconds=verify_seconds,
            accept_seconds=accept_seconds, draft_forwards=tree.draft_forwards, target_forwards=1,
            tested=[t.node for w in walked.walks for t in w.tests],
            residual=self._residual_trace(tree, verified, walked), growth=self._growth_trace(tree))

    def _final_p(self, verified: Verified, walked: Walked) -> float | None:
        """The committed correction or bonus token's probability: at T = 0 its target row's plain softmax, read here
        for the views (the walk took the argmax); when sampling, the walk's own."""
        if walked.final_p is not None or not self.sampling.greedy or walked.final_parent is None:
            return walked.final_p
        row = verified.row(walked.final_context)
        return float(torch.softmax(verified.reading.logits[row], -1)[walked.committed[-1]])

    @staticmethod
    def _growth_trace(tree: CandidateTree) -> TreeGrowth | None:
        """A dynamic tree's growth in the step's node indices (other sources' nodes may be merged in)."""
        for source, proposal in enumerate(tree.proposals):
            growth, local = proposal.growth, tree.local[source]
            if growth is not None and local:
                return replace(growth, nodes=[local[i] for i in growth.nodes],
                               expanded=[local[i] for i in growth.expanded],
                               left_out=[replace(d, parent=ROOT if d.parent == ROOT else local[d.parent])
                                         for d in growth.left_out])
        return None

    def _residual_trace(self, tree: CandidateTree, verified: Verified, walked: Walked) -> ResidualTrace | None:
        """p, q and the residual at the node where the walk's last rejection sent the correction token (T > 0).

        Recorded only then (at T = 0 greedy takes the target's argmax and there is no residual), over the few
        largest tokens of each distribution and the correction itself, so a trace stays compact."""
        walk = walked.walks[0]
        if self.sampling.greedy or tree.target_rooted or not walk.final_had_children or walk.final_probs is None:
            return None
        context = walk.final_context
        row = verified.row(context)
        p = tree.root_probs if row is None else verified.probs[row]
        groups = tree.draws(context)
        q = groups[0].q
        correction = walked.committed[-1]
        dists = (p, q, walk.final_probs)
        top = min(RESIDUAL_TOP, p.shape[-1])
        chosen = list({correction, *torch.cat([torch.topk(dist, top).indices for dist in dists]).tolist()})
        index = torch.tensor(chosen, device=p.device)
        p_at, q_at, residual_at = torch.stack([dist[index] for dist in dists]).tolist()  # one host read
        order = sorted(range(len(chosen)), key=lambda j: -p_at[j])
        ids = [chosen[j] for j in order]
        rejections = sum(not t.accepted and tree.parents[t.node] == context for t in walk.tests)
        return ResidualTrace(context=context, token_ids=ids, tokens=self.pair.token_strings(ids),
                             p=[p_at[j] for j in order], q=[q_at[j] for j in order],
                             residual=[residual_at[j] for j in order], rejections=max(rejections, 1))

    def _node_traces(self, tree: CandidateTree, verified: Verified, walked: Walked) -> list[NodeTrace]:
        """p and q of every node (warped distributions; plain softmax at temperature 0), its test and status."""
        if not len(tree):
            return []
        on_path = set(walked.path)
        tests = {t.node: t for w in walked.walks for t in w.tests}
        greedy = self.sampling.greedy
        logits = verified.reading.logits

        # One gather per distribution instead of a softmax per node.
        p_of: dict[int, float] = {}
        rows = [verified.row(parent) for parent in tree.parents]
        in_verify = [i for i, row in enumerate(rows) if row is not None]
        if in_verify and greedy:  # softmax a few rows at a time (a whole tree's, 45 x 49,152, is 9 MB more at
            # once), the values gathered on the device and read in one go
            nodes, values = [], []
            for start in range(0, logits.shape[0], SOFTMAX_ROWS):
                chunk = [i for i in in_verify if start <= rows[i] < start + SOFTMAX_ROWS]
                if chunk:
                    table = torch.softmax(logits[start:start + SOFTMAX_ROWS], -1)
                    values.append(values_at(table, [rows[i] - start for i in chunk], [tree.tokens[i] for i in chunk]))
                    nodes += chunk
            p_of.update(zip(nodes, torch.cat(values).tolist()))
        elif in_verify:
            p_of.update(zip(in_verify, probs_at(verified.probs, [rows[i] for i in in_verify],
                                                [tree.tokens[i] for i in in_verify])))
        roots = [i for i, row in enumerate(rows) if row is None]
        if roots:
            table = torch.softmax(tree.root_logits, -1) if greedy else tree.root_probs
            p_of.update(zip(roots, probs_at(table, [0] * len(roots), [tree.tokens[i] for i in roots])))
        q_of = tree.q_of(greedy)

        strings = self.pair.token_strings(tree.tokens)
        traces = []
        for i, origin in enumerate(tree.origins):
            test = tests.get(i)
            if i in on_path:
                status = "accepted"
            elif origin == "target_root" or (test is not None and test.accepted):
                status = "unchosen"  # a target root, or a passed test, on a chain that lost the selection
            elif test is not None:
                status = "rejected"
            elif not greedy and i in q_of and q_of[i] <= 0.0:
                status = "padding"
            else:
                status = "not_reached"
            traces.append(NodeTrace(
                token_id=tree.tokens[i], token=strings[i], parent=tree.parents[i], level=tree.levels[i],
                origin=origin, p=p_of[i], q=q_of.get(i), status=status,
                p_test=test.p if test else None, q_test=test.q if test else None, u=test.u if test else None))
        return traces
