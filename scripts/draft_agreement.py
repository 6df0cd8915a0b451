"""Top-1 agreement of distilled drafts with the target on the target's own greedy answers to benchmark prompts.

Why: held-out agreement from training (assets/draft-smollm2/MODEL_CARD.md) is measured on prompts like the training
prompts; what a user gets from `sd` depends on agreement on *their* prompts. This reads Spec-Bench-style prompts,
lets the target answer greedily once, and scores every given draft folder teacher-forced on those answers (the draft
sees the prompt and the target's answer so far, and must predict the target's next token), per category and overall.

    .venv/bin/python scripts/draft_agreement.py --prompts ../shared/bench/spec_bench_questions.jsonl --limit 1 \
        --drafts assets/draft-smollm2 --threads 2
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dynasd.bench import select_prompts  # noqa: E402
from dynasd.models import load_distilled_draft, load_pair  # noqa: E402


@torch.inference_mode()
def greedy_answer(target, prompt: list[int], max_new_tokens: int, eos_ids) -> list[int]:
    out = target.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=sorted(eos_ids),
                          pad_token_id=min(eos_ids))
    return out[0, len(prompt):].tolist()


@torch.inference_mode()
def matches(draft, prompt: list[int], answer: list[int]) -> torch.Tensor:
    """1 where the draft's argmax after prompt + answer[:i] is answer[i]."""
    logits = draft(input_ids=torch.tensor([prompt + answer[:-1]])).logits[0, len(prompt) - 1:]
    return (logits.argmax(-1) == torch.tensor(answer)).float()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="embedded")
    parser.add_argument("--drafts", default="", help="comma-separated draft folders (default: the pair's own draft)")
    parser.add_argument("--prompts", required=True, help="Spec-Bench-style JSON Lines")
    parser.add_argument("--categories", default="")
    parser.add_argument("--limit", type=int, default=1, help="prompts per category")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pair = load_pair(args.pair, device="cpu", fast_kernels=False)
    drafts = {"pair draft": pair.draft}
    for folder in filter(None, args.drafts.split(",")):
        drafts[folder] = load_distilled_draft(pair.target, Path(folder)).eval()
    prompts = select_prompts(args.prompts, [c for c in args.categories.split(",") if c] or None, args.limit)
    scores: dict[str, dict[str, list[torch.Tensor]]] = {name: defaultdict(list) for name in drafts}
    for prompt in prompts:
        ids = pair.encode_prompt(prompt["text"])
        answer = greedy_answer(pair.target, ids, args.max_new_tokens, pair.eos_token_ids)
        for name, draft in drafts.items():
            scores[name][prompt["category"]].append(matches(draft, ids, answer))
    categories = list(dict.fromkeys(p["category"] for p in prompts))
    print("| draft | " + " | ".join(categories) + " | all (tokens) |")
    print("|---" * (len(categories) + 2) + "|")
    for name, by_category in scores.items():
        cells = [f"{torch.cat(by_category[c]).mean().item():.3f}" for c in categories]
        every = torch.cat([t for c in categories for t in by_category[c]])
        print(f"| {name} | " + " | ".join(cells) + f" | **{every.mean().item():.3f}** ({every.numel()}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
