"""The speculative decoding loop: draft a token tree, verify it in one target forward, walk it, commit.

One class covers every speculative method; they differ only in where the tree comes from:
  sd       a chain (1, 1, ..., 1), drawn from the draft            -> standard speculative sampling
  mcsd     a static tree such as (4, 2, 2, 1), drawn from the draft -> multi-candidate speculative sampling
  ti-mcsd  level 1 from the *target's* own next-token distribution, e.g. the fork (w, 1, ..., 1). The longest
           accepted chain wins, which makes it lossy when w > 1 (the paper's method; see method.md section 4).
  pld      prompt lookup decoding (Saxena 2023), no draft model: a lookup chain when there is a match, else a plain
           target step (an empty tree).
With prompt lookup on (sd / mcsd), a step whose last tokens occurred earlier in the context proposes what followed
them, as a chain with one-hot q, and skips the draft model for that step (dynasd/lookup.py).
With a feature draft (`feature_draft=True`, dynasd/feature_draft.py) the draft also reads the target's hidden state
of the previous position: the verify returns the target's hidden states, those of committed tokens are kept until
the draft has read them, and tree nodes get their parent's draft hidden state instead.

Per step:
  1. draft    level by level, one draft forward per level; with dynamic depth a stop policy may end the tree
              early, and the live tree is then the first levels of the largest tree (a top-left mask slice).
  2. verify   one target forward over the committed tokens not yet cached + every live node, under the tree
              mask, which yields the target distribution at every node.
  3. walk     from the root, accept or reject children (greedy comparison or MCSS), then sample the bonus or
              correction token; keep the accepted path in both KV caches and drop the rest.

Cache invariant between steps: the target (and, up to nodes it never saw, the draft) holds every committed token
but the last one for draft-rooted trees, and every committed token for target-rooted trees.
"""
from __future__ import annotations

import time

import torch

from ..cache import CachedModel
from ..feature_draft import TargetFeatures, is_feature_draft
from ..lookup import NgramIndex
from ..models import ModelPair, head_token_ids
from ..sampling import (SamplingConfig, WalkResult, argmax_rows, draw_candidates, greedy_walk, logits_to_probs,
                        mcss_walk, sample_one)
from ..stopping import StopPolicy
from ..trace import LevelScores, NodeTrace, StepTrace
from ..tree import ROOT, TreeShape, ancestor_mask
from .base import Decoder


class DraftedTree:
    """The candidates of one step and the draft distributions they were drawn from.

    `shape`/`mask` are the largest tree of the step's source (the draft model's shape, or the lookup chain) and its
    ancestor mask; the live tree is their first `depth` levels.
    """

    def __init__(self, shape: TreeShape, mask: torch.Tensor, mask_rows: list[str], source: str) -> None:
        self.shape, self.mask, self.mask_rows, self.source = shape, mask, mask_rows, source
        self.tokens: list[int] = []
        self.depth = 0
        self.fed_nodes = 0                      # nodes the draft has seen (their keys/values are cached)
        self.rows: dict[int, tuple[int, int]] = {}  # context -> (block index, row) into the blocks below
        self.logits_blocks: list[torch.Tensor] = []
        self.probs_blocks: list[torch.Tensor | None] = []
        self.stop_scores: list[LevelScores] = []

    def add_block(self, contexts: list[int], logits: torch.Tensor, probs: torch.Tensor | None) -> None:
        block = len(self.logits_blocks)
        self.logits_blocks.append(logits)
        self.probs_blocks.append(probs)
        for row, context in enumerate(contexts):
            self.rows[context] = (block, row)

    def probs(self, context: int) -> torch.Tensor:
        block, row = self.rows[context]
        return self.probs_blocks[block][row]

    def logits(self, context: int) -> torch.Tensor:
        block, row = self.rows[context]
        return self.logits_blocks[block][row]


class TreeDecoder(Decoder):
    def __init__(self, pair: ModelPair, sampling: SamplingConfig, shape: TreeShape, method: str, seed: int = 0,
                 without_replacement: bool = True, dynamic_depth: bool = False,
                 stop: StopPolicy | None = None, lookup: int = 0, lookup_min_ngram: int = 2,
                 feature_draft: bool = False) -> None:
        super().__init__(pair, sampling, seed)
        if feature_draft and pair.feature_draft is None:
            raise ValueError(f"the pair '{pair.name}' has no feature draft")
        if shape.target_roots and shape.depth < 2:
            raise ValueError("a target-initialized tree needs at least one draft level after its roots")
        if lookup < 0:
            raise ValueError(f"prompt lookup length must be 0 (off) or positive, got {lookup}")
        if method == "pld" and not lookup:
            raise ValueError("pld needs a prompt lookup length")
        if lookup and shape.target_roots:
            raise ValueError("prompt lookup works with draft-rooted trees (sd, mcsd), not ti-mcsd")
        self.method = method
        self.shape = shape
        self.without_replacement = without_replacement
        self.dynamic_depth = dynamic_depth
        self.stop = stop or StopPolicy()
        self.lookup = lookup
        self.lookup_min_ngram = lookup_min_ngram
        self.draft_model = pair.feature_draft if feature_draft else pair.draft
        # pld never runs the draft model, so it never needs the target's features either
        self.reads_features = is_feature_draft(self.draft_model) and method != "pld"
        # Built once for the largest tree; every step slices it (level-major order makes slices valid trees).
        self.max_mask, self.max_mask_rows = self._mask_of(shape)
        self.draft_head_ids = head_token_ids(self.draft_model)
        self.lookup_shape = TreeShape((1,) * lookup) if lookup else None
        if self.lookup_shape:
            self.lookup_mask, self.lookup_mask_rows = self._mask_of(self.lookup_shape)

    def _mask_of(self, shape: TreeShape) -> tuple[torch.Tensor, list[str]]:
        mask = ancestor_mask(shape.parents)
        return mask.to(self.pair.device), ["".join("1" if v else "0" for v in row) for row in mask.tolist()]

    @property
    def lossless(self) -> bool:
        return not self.shape.target_roots or self.shape.branching[0] == 1

    @property
    def draft_label(self) -> str:
        if self.draft_model is self.pair.draft:
            return self.pair.draft_label
        return self.pair.feature_draft_label or "feature draft (reads the target's hidden states)"

    def config(self) -> dict:
        return {**super().config(), "branching": list(self.shape.branching),
                "target_roots": self.shape.target_roots, "without_replacement": self.without_replacement,
                "dynamic_depth": self.dynamic_depth, "stop": self.stop.name, "threshold": self.stop.threshold,
                "lookup": self.lookup, "lookup_min_ngram": self.lookup_min_ngram,
                "feature_draft": self.draft_model is not self.pair.draft}

    def max_step_tokens(self) -> int:
        return max(self.shape.depth, self.lookup) + 1

    # -- prefill -----------------------------------------------------------------------------------------------
    def _prefill(self) -> None:
        reads = self.reads_features
        self.target = CachedModel(self.pair.target, need_hidden=reads)
        self.draft = CachedModel(self.draft_model, need_hidden=self.stop.needs_hidden or reads)
        self.features = (TargetFeatures(self.pair.target.config.hidden_size, self.pair.dtype, self.pair.device)
                         if reads else None)
        self.ngrams = NgramIndex(min_ngram=self.lookup_min_ngram, max_ngram=max(self.lookup_min_ngram, 3))
        # Target-rooted trees need the target's next-token distribution before the first step, so the target
        # reads the whole prompt; otherwise the last prompt token is the first step's root.
        target_reads = self.committed if self.shape.target_roots else self.committed[:-1]
        if target_reads:
            logits, hidden = self.target.forward(target_reads, [], None, [], keep_logits=1,
                                                 keep_hidden=len(target_reads) if reads else 0)
            if reads:  # before the draft's prefill, which reads them
                self.features.append(0, hidden)
            if self.shape.target_roots:
                self._set_root_distribution(logits[-1], None)
        if len(self.committed) > 1 and self.method != "pld":  # pld never runs the draft model
            self.draft.forward(self.committed[:-1], [], None, [], keep_logits=1,
                               features=self._features_of_chain(0, len(self.committed) - 1))

    def _features_of_chain(self, first: int, count: int) -> torch.Tensor | None:
        """A feature draft's feature rows for committed tokens first .. first + count - 1 (None for other drafts)."""
        return self.features.inputs_for(first, count) if self.features is not None else None

    def _set_root_distribution(self, logits: torch.Tensor, residual: torch.Tensor | None) -> None:
        self.root_logits = logits
        if not self.sampling.greedy:
            self.root_probs = residual if residual is not None else logits_to_probs(logits, self.sampling)

    # -- 1. draft ----------------------------------------------------------------------------------------------
    def _candidates(self, logits: torch.Tensor, probs: torch.Tensor | None, k: int,
                    replacement: bool) -> list[int]:
        """k candidates per row, parent-major: greedy takes the top-k, sampling draws from the warped q."""
        if self.sampling.greedy:
            return argmax_rows(logits) if k == 1 else torch.topk(logits, k, dim=-1).indices.flatten().tolist()
        return draw_candidates(probs, k, replacement, self.generator).flatten().tolist()

    def _stop_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """The draft's plain softmax for the stop policy. With a reduced head, over its tokens only: the others
        have probability 0, and the policies read the largest probabilities and the entropy, so the scores are
        the same (to float rounding) at a third of the cost (~0.3-0.6 ms per draft call for 49,152 -> 16,384)."""
        if self.draft_head_ids is not None:
            logits = logits.index_select(-1, self.draft_head_ids)
        return torch.softmax(logits, dim=-1)

    def _lookup_tree(self, proposal: list[int]) -> DraftedTree:
        """A chain of looked-up tokens; q is one-hot on each (the proposal is deterministic)."""
        tree = DraftedTree(self.lookup_shape, self.lookup_mask, self.lookup_mask_rows, "lookup")
        tree.tokens, tree.depth = list(proposal), len(proposal)
        vocab = self.pair.vocab_size
        rows = torch.arange(len(proposal), device=self.pair.device)
        ids = torch.tensor(proposal, device=self.pair.device)
        logits = torch.full((len(proposal), vocab), float("-inf"), device=self.pair.device)
        logits[rows, ids] = 0.0
        probs = None if self.sampling.greedy else (logits == 0).float()
        tree.add_block([ROOT] + list(range(len(proposal) - 1)), logits, probs)
        return tree

    def _draft(self) -> DraftedTree:
        if self.lookup:
            room = self.max_new_tokens - len(self.run.new_token_ids)  # looked-up tokens past it would be cut
            proposal = self.ngrams.propose(self.committed, min(self.lookup, room))
            if proposal:
                return self._lookup_tree(proposal)
        if self.method == "pld":  # no match: a plain target step (an empty tree)
            return DraftedTree(self.lookup_shape, self.lookup_mask, self.lookup_mask_rows, "lookup")
        shape = self.shape
        tree = DraftedTree(shape, self.max_mask, self.max_mask_rows, "draft")
        self.stop.start_tree()
        base_pos = len(self.committed)  # position of every level-1 node
        pending = self.committed[self.draft.cached_len:]
        warp = (lambda lg: None) if self.sampling.greedy else (lambda lg: logits_to_probs(lg, self.sampling))
        replacement = not self.without_replacement
        parent_logits = parent_hidden = None
        if not shape.target_roots:
            parent_logits, parent_hidden = self.draft.forward(
                pending, [], None, [], keep_logits=1,
                features=self._features_of_chain(self.draft.cached_len, len(pending)))
            tree.add_block([ROOT], parent_logits, warp(parent_logits))
            pending = []
        for level in range(1, shape.depth + 1):
            k = shape.branching[level - 1]
            if level == 1 and shape.target_roots:
                probs = None if self.sampling.greedy else self.root_probs[None]
                tree.tokens += self._candidates(self.root_logits[None], probs, k, replacement=False)
            else:
                block = tree.probs_blocks[-1]
                tree.tokens += self._candidates(parent_logits, block, k, replacement)
            tree.depth = level
            if level == shape.depth:
                break
            if self.dynamic_depth and parent_logits is not None:
                parent_scores = self.stop.scores(self._stop_probs(parent_logits), parent_hidden)
                tip_scores = [s for s in parent_scores for _ in range(k)]
                keep = self.stop.keep_drafting(tip_scores)
                tree.stop_scores.append(LevelScores(level, tip_scores, keep))
                if not keep:
                    break
            nodes = shape.nodes_at(level)
            features = None
            if self.features is not None:
                # A node reads its parent's state: the draft's own for draft nodes (the target has not read them),
                # the target's for the root of a target-rooted tree. Children are parent-major, k per parent.
                parents = self.features.inputs_for(base_pos, 1) if level == 1 and shape.target_roots else parent_hidden
                features = torch.cat([self.features.inputs_for(self.draft.cached_len, len(pending)),
                                      parents.repeat_interleave(k, dim=0)])
            parent_logits, parent_hidden = self.draft.forward(
                pending, tree.tokens[nodes.start:nodes.stop], self.max_mask[nodes.start:nodes.stop, :nodes.stop],
                [base_pos + level - 1] * len(nodes), keep_logits=len(nodes), features=features)
            pending = []
            tree.fed_nodes = nodes.stop
            tree.add_block(list(nodes), parent_logits, warp(parent_logits))
        return tree

    # -- 3. walk -----------------------------------------------------------------------------------------------
    def _walk(self, start: int, tree: DraftedTree, target_row, target_probs, argmax: list[int]) -> WalkResult:
        shape = tree.shape
        depth = tree.depth

        def children(node: int) -> list[int]:
            level = 0 if node == ROOT else shape.levels[node]
            return shape.children[node] if level < depth else []

        if self.sampling.greedy:
            return greedy_walk(start, children, tree.tokens, lambda c: argmax[target_row(c)])

        def target_dist(c: int) -> torch.Tensor:
            return self.root_probs if target_row(c) is None else target_probs[target_row(c)]

        return mcss_walk(start, children, tree.tokens, target_dist, tree.probs, self.without_replacement,
                         self.generator)

    # -- one step ----------------------------------------------------------------------------------------------
    def _step(self) -> StepTrace:
        cfg = self.sampling
        context_len = len(self.committed)
        root_token = self.pair.token_strings(self.committed[-1:])[0]
        draft_forwards_before = self.draft.forwards
        t0 = time.perf_counter()
        tree = self._draft()
        t1 = time.perf_counter()
        shape = tree.shape

        # 2. verify: the root row (committed token not yet cached, draft-rooted trees only) + every live node.
        live = shape.level_starts[tree.depth]
        chain = self.committed[self.target.cached_len:]
        positions = [context_len + level - 1 for level in shape.levels[:live]]
        root_rows = len(chain)
        target_logits, target_hidden = self.target.forward(chain, tree.tokens, tree.mask[:live, :live], positions,
                                                           keep_logits=root_rows + live)
        argmax = argmax_rows(target_logits)  # the step's one host sync on the verify output
        t2 = time.perf_counter()

        def target_row(context: int) -> int | None:
            if context == ROOT:
                return 0 if root_rows else None  # target-rooted: the distribution kept from the last step
            return root_rows + context

        target_probs = None if cfg.greedy else logits_to_probs(target_logits, cfg)
        if shape.target_roots:
            self.prev_root_logits, self.prev_root_probs = self.root_logits, getattr(self, "root_probs", None)
            roots = list(shape.nodes_at(1))
            walks = [self._walk(r, tree, target_row, target_probs, argmax) for r in roots]
            best = max(range(len(roots)), key=lambda j: (len(walks[j].path), -j))
            walk = walks[best]
            path = [roots[best]] + walk.path
            committed = [tree.tokens[i] for i in path]
            origins = ["target_root"] + ["draft"] * len(walk.path)
            final_parent = final_p = None
            self._set_root_distribution(target_logits[target_row(walk.final_context)], walk.final_probs)
        else:
            walks = [self._walk(ROOT, tree, target_row, target_probs, argmax)]
            walk = walks[0]
            path = walk.path
            row = target_row(walk.final_context)
            if cfg.greedy:
                final = argmax[row]
                final_p = float(torch.softmax(target_logits[row], -1)[final])
            else:
                final = sample_one(walk.final_probs, self.generator)
                final_p = float(walk.final_probs[final])
            committed = [tree.tokens[i] for i in path] + [final]
            origins = [tree.source] * len(path) + ["correction" if walk.final_had_children else "bonus"]
            final_parent = walk.final_context
        self.committed += committed
        self.target.keep_path(path, len(self.committed))
        if self.features is None:
            self.draft.keep_path([i for i in path if i < tree.fed_nodes], len(self.committed))
        else:
            # The draft read the accepted nodes with its own states as features; the target's are better, so it
            # reads them again (with the next step's first forward) and keeps none of this step's nodes.
            kept_rows = torch.tensor(list(range(root_rows)) + [root_rows + i for i in path], dtype=torch.long,
                                     device=target_hidden.device)
            self.features.append(context_len - root_rows, target_hidden.index_select(0, kept_rows))
            self.draft.keep_path([], len(self.committed))
            self.features.drop_before(self.draft.cached_len - 1)

        nodes = self._node_traces(tree, live, walks, path, target_row, target_logits, target_probs)
        return StepTrace(
            index=len(self.run.steps), context_len=context_len, nodes=nodes, max_nodes=shape.num_nodes,
            max_depth=shape.depth, live_depth=tree.depth, root_rows=root_rows,
            verify_mask=[row[:live] for row in tree.mask_rows[:live]],
            position_ids=list(range(context_len - root_rows, context_len)) + positions, accepted_path=path,
            committed=committed, committed_tokens=self.pair.token_strings(committed), committed_origins=origins,
            final_parent=final_parent, final_p=final_p, root_token=root_token,
            stop_policy=self.stop.name if self.dynamic_depth else "none",
            threshold=self.stop.threshold if self.dynamic_depth else None, stop_scores=tree.stop_scores,
            draft_seconds=t1 - t0, verify_seconds=t2 - t1, accept_seconds=time.perf_counter() - t2,
            draft_forwards=self.draft.forwards - draft_forwards_before, target_forwards=1)

    def _node_traces(self, tree: DraftedTree, live: int, walks: list[WalkResult], path: list[int], target_row,
                     target_logits: torch.Tensor, target_probs: torch.Tensor | None) -> list[NodeTrace]:
        """p and q of every node (warped distributions; plain softmax at temperature 0), its test and status."""
        shape, tokens = tree.shape, tree.tokens
        on_path = set(path)
        tests = {t.node: t for w in walks for t in w.tests}
        parents = shape.parents[:live]
        greedy = self.sampling.greedy

        # One gather per distribution block instead of a softmax per node.
        token_ids = torch.tensor(tokens[:live], device=target_logits.device)
        p_of: dict[int, float] = {}
        target_rows = [target_row(parents[i]) for i in range(live)]
        in_verify = [i for i in range(live) if target_rows[i] is not None]
        if in_verify:
            table = torch.softmax(target_logits, -1) if greedy else target_probs
            rows = torch.tensor([target_rows[i] for i in in_verify], device=table.device)
            p_of.update(zip(in_verify, table[rows, token_ids[in_verify]].tolist()))
        roots = [i for i in range(live) if target_rows[i] is None]
        if roots:
            table = torch.softmax(self.prev_root_logits, -1) if greedy else self.prev_root_probs
            p_of.update(zip(roots, table[token_ids[roots]].tolist()))
        q_of: dict[int, float] = {}
        for block, logits in enumerate(tree.logits_blocks):
            kids = [i for i in range(live) if tree.rows.get(parents[i], (None,))[0] == block]
            if kids:
                table = torch.softmax(logits, -1) if greedy else tree.probs_blocks[block]
                rows = torch.tensor([tree.rows[parents[i]][1] for i in kids], device=table.device)
                q_of.update(zip(kids, table[rows, token_ids[kids]].tolist()))

        strings = self.pair.token_strings(tokens)
        traces = []
        for i in range(live):
            test = tests.get(i)
            target_root = shape.target_roots and shape.levels[i] == 1
            if i in on_path:
                status = "accepted"
            elif target_root or (test is not None and test.accepted):
                status = "unchosen"  # a target root, or a passed test, on a chain that lost the selection
            elif test is not None:
                status = "rejected"
            elif not greedy and i in q_of and q_of[i] <= 0.0:
                status = "padding"
            else:
                status = "not_reached"
            traces.append(NodeTrace(
                token_id=tokens[i], token=strings[i], parent=parents[i], level=shape.levels[i],
                origin="target_root" if target_root else tree.source, p=p_of[i], q=q_of.get(i), status=status,
                p_test=test.p if test else None, q_test=test.q if test else None, u=test.u if test else None))
        return traces
