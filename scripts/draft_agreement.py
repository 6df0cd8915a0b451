"""Top-1 agreement of distilled drafts with the target on the target's own greedy answers to benchmark prompts.

Why: held-out agreement from training (assets/draft-smollm2/MODEL_CARD.md) is measured on prompts like the
training prompts; what a user gets from `sd` depends on agreement on *their* prompts. This reads Spec-Bench-style
prompts, lets the target answer greedily once, and scores every given draft folder teacher-forced on those answers
(the draft sees the prompt and the target's answer so far, and must predict the target's next token), per category
and overall.
A feature draft (dynasd/loading/feature_model.py) gets two rows: depth 1 (it reads the target's states, as a tree's
first level does) and depth 2 (its own state from the position before, as every deeper level does).

    .venv/bin/python scripts/draft_agreement.py --prompts ../shared/bench/spec_bench_questions.jsonl --limit 1 \
        --drafts assets/draft-smollm2 --threads 2
"""
from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import torch

from dynasd.loading.feature_model import is_feature_draft
from dynasd.loading.models import WEIGHT_MODES, load_distilled_draft, load_pair
from dynasd.options import DEFAULT_MAX_NEW_TOKENS
from dynasd.prompts import select_prompts
from dynasd.training.agreement import agreement
from dynasd.training.feature_data import target_features
from dynasd.training.feature_training import agreement as feature_agreement
from dynasd.training.sequences import Sequence


@torch.inference_mode()
def greedy_answer(target, prompt: list[int], max_new_tokens: int, eos_ids) -> list[int]:
    out = target.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=sorted(eos_ids),
                          pad_token_id=min(eos_ids))
    return out[0, len(prompt):].tolist()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--drafts", default="", help="comma-separated draft folders (default: the pair's own draft)")
    parser.add_argument("--prompts", required=True, help="Spec-Bench-style JSON Lines")
    parser.add_argument("--categories", default="")
    parser.add_argument("--limit", type=int, default=1, help="prompts per category")
    parser.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--weights", default="fp32", choices=WEIGHT_MODES,
                        help="whose greedy answers are scored: the float32 target's (default) or the target "
                             "computing from its GGUF blocks (dynasd/kernels/block_weights.py)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pair = load_pair(args.pair, device="cpu", fast_kernels=False)
    # The drafts are scored as stock modules either way; only the answers come from the chosen target.
    answering = (pair.target if args.weights == "fp32"
                 else load_pair(args.pair, device="cpu", weights=args.weights).target)
    drafts = {"pair draft": pair.draft}
    if pair.feature_draft is not None:
        drafts["pair feature draft"] = pair.feature_draft
    for folder in filter(None, args.drafts.split(",")):
        drafts[folder] = load_distilled_draft(pair.target, Path(folder)).eval()
    prompts = select_prompts(args.prompts, [c for c in args.categories.split(",") if c] or None, args.limit)
    # The target's greedy answer is its argmax at every answer position: the sequences are their own labels.
    answered: dict[str, list[Sequence]] = defaultdict(list)
    for prompt in prompts:
        ids = pair.encode_prompt(prompt["text"])
        answer = greedy_answer(answering, ids, args.max_new_tokens, pair.eos_token_ids)
        answered[prompt["category"]].append(Sequence(ids + answer, len(ids)))
    every = [seq for seqs in answered.values() for seq in seqs]
    pad = pair.pad_id
    print("| draft | " + " | ".join(answered) + " | all (tokens) |")
    print("|---" * (len(answered) + 2) + "|")
    tokens = sum(len(s.ids) - s.answer_start for s in every)
    for name, draft in drafts.items():
        if is_feature_draft(draft):
            head = getattr(draft.lm_head, "rows", draft.lm_head).weight
            vocab = getattr(draft.lm_head, "token_ids", torch.arange(head.shape[0]))
            states = {category: target_features(pair.target, seqs, topk=1) for category, seqs in answered.items()}
            every_states = [s for seqs in states.values() for s in seqs]
            for depth in (0, 1):
                cells = [f"{feature_agreement(draft, seqs, head, vocab, pad)[depth]:.3f}" for seqs in states.values()]
                total = feature_agreement(draft, every_states, head, vocab, pad)[depth]
                print(f"| {name} (depth {depth + 1}) | " + " | ".join(cells) + f" | **{total:.3f}** ({tokens}) |")
            continue
        cells = [f"{agreement(draft, seqs, seqs, pad):.3f}" for seqs in answered.values()]
        print(f"| {name} | " + " | ".join(cells) + f" | **{agreement(draft, every, every, pad):.3f}** ({tokens}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
