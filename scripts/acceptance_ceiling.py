"""Ceiling on tokens per target forward at T = 0 for any draft tree, from the draft's ranks of the target's tokens.

Why: at T = 0 a node is accepted only when its token is the target's greedy token, so along the accepted path the
draft sees exactly the target's own answer. Scoring the draft teacher-forced on the target's greedy answers thus
gives, at every answer position, the rank of the target's token among the draft's candidates, and from those ranks
alone the tokens per target forward of decoding with: a chain of depth D (sd with gamma D: exactly), or any tree
whose nodes have at most k children and whose depth is at most D (at most that: only the full k-ary tree, k^D
nodes, reaches it). With prompt lookup, steps whose context has a match propose the looked-up chain instead, as
the engine does (dynasd/lookup.py). A goal the ceiling rules out needs a better draft, not a better tree.

    .venv/bin/python scripts/acceptance_ceiling.py --prompts ../shared/bench/spec_bench_questions.jsonl --limit 3 \
        --threads 2
"""
from __future__ import annotations

import argparse

import torch
from draft_agreement import greedy_answer  # this folder (a script's folder is on sys.path)

from dynasd.loading.models import load_pair
from dynasd.lookup import NgramIndex
from dynasd.options import DEFAULT_MAX_NEW_TOKENS
from dynasd.prompts import select_prompts


@torch.inference_mode()
def draft_ranks(draft, prompt: list[int], answer: list[int]) -> list[int]:
    """Per answer position, how many tokens the draft ranks above the target's token (0: its top choice)."""
    ids = torch.tensor([prompt + answer[:-1]])
    logits = draft(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, len(prompt) - 1:].float()
    chosen = logits.gather(1, torch.tensor(answer)[:, None])
    return (logits > chosen).sum(-1).tolist()


def tokens_per_forward(runs: list[tuple[list[int], list[int], list[int]]], width: int, depth: int, lookup: int,
                       ngram: int = 2) -> float:
    """Decode every answer again, step by step: a step accepts the looked-up tokens that match (when the context
    has a match) or the run of following positions whose ranks are below `width` (at most `depth`), then adds the
    target's own token. Tokens per step = tokens per target forward."""
    tokens = steps = 0
    for prompt, answer, ranks in runs:
        index = NgramIndex(min_ngram=ngram, max_ngram=max(ngram, 3))  # as the engine builds it
        done = 0
        while done < len(answer):
            proposal = index.propose(prompt + answer[:done], min(lookup, len(answer) - done)) if lookup else []
            accepted = 0
            if proposal:
                while accepted < len(proposal) and proposal[accepted] == answer[done + accepted]:
                    accepted += 1
            else:
                while (accepted < depth and done + accepted < len(answer) and ranks[done + accepted] < width):
                    accepted += 1
            done += accepted + 1
            steps += 1
        tokens += len(answer)
    return tokens / max(steps, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--prompts", required=True, help="Spec-Bench-style JSON Lines")
    parser.add_argument("--categories", default="")
    parser.add_argument("--limit", type=int, default=1, help="prompts per category")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument("--widths", default="1,2,4,8", help="most children per node")
    parser.add_argument("--depths", default="4,8")
    parser.add_argument("--lookup", type=int, default=8, help="prompt lookup length for the second column (0: none)")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    widths = [int(w) for w in args.widths.split(",")]
    depths = [int(d) for d in args.depths.split(",")]
    pair = load_pair(args.pair, device="cpu", fast_kernels=False)
    prompts = select_prompts(args.prompts, [c for c in args.categories.split(",") if c] or None, args.limit)
    runs = []
    for prompt in prompts:
        ids = pair.encode_prompt(prompt["text"])
        answer = greedy_answer(pair.target, ids, args.max_new_tokens, pair.eos_token_ids)
        runs.append((ids, answer, draft_ranks(pair.draft, ids, answer)))
    ranks = [r for _, _, rs in runs for r in rs]
    print(f"Target token within the draft's top k ({len(ranks)} answer positions, {len(runs)} prompts):")
    print("| k | " + " | ".join(str(k) for k in widths) + " |")
    print("|---" * (len(widths) + 1) + "|")
    print("| share | " + " | ".join(f"{sum(r < k for r in ranks) / len(ranks):.3f}" for k in widths) + " |")
    print("\nTokens per target forward at T = 0, at most (k = 1: exactly; sd with gamma = depth):")
    print(f"| children per node | depth | draft only | with lookup {args.lookup} |")
    print("|---|---|---|---|")
    for width in widths:
        for depth in depths:
            print(f"| {width} | {depth} | {tokens_per_forward(runs, width, depth, 0):.2f} | "
                  f"{tokens_per_forward(runs, width, depth, args.lookup):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
