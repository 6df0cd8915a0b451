"""`train-draft --stage onpolicy`: training text the draft writes itself, labelled by the target.

Why: in speculative decoding every drafted token after the first continues text the draft wrote itself, yet a
draft distilled on the target's own answers only ever saw the target's text. Training on the student's own
trajectories with the teacher's labels (DAgger; DistillSpec, Zhou et al. 2023, for speculative drafts) covers
those contexts. It is also ~3x cheaper per token than the generate stage (the draft was data-limited: 0.88
agreement on an early training shard, 0.47 held-out): the small draft writes, and the target only reads each
answer once, teacher-forced, in batched forwards.

Prompts are those of the training shards already in `--out/data` (the target answered them; the draft now writes
its own answers), so held-out prompts stay unseen; or, with `--onpolicy-prompt-source passage-tasks`, task
instructions over the target's answers in those shards (task_prompts.py). Labels: the target's argmax at every
answer position, plus its top-k log-probabilities with `--gen-topk` (the same soft targets as generated data).
"""
from __future__ import annotations

import random
import time
from pathlib import Path

import torch
from tqdm import tqdm

from ..loading.models import load_distilled_draft, load_pair
from .self_instruct import shard_seed
from .sequences import load_sequences, save_sequences, training_shards
from .task_prompts import passage_task_prompts
from .teacher import generate_answers, teacher_forced


def training_prompts(data_dir: Path) -> list[list[int]]:
    """The distinct prompts of the training shards, in a fixed order. On-policy shards of any round are left out:
    their prompts are training prompts again, or passage tasks that were never meant to be answered twice."""
    files = training_shards(data_dir)
    if not files:
        raise FileNotFoundError(f"no training shards in {data_dir} to take prompts from (run the generate stage first)")
    return [list(p) for p in sorted({tuple(s.ids[:s.answer_start]) for s in load_sequences(files)})]


def onpolicy_stage(args, log) -> None:
    if args.onpolicy_temperature < 0:
        raise ValueError("--onpolicy-temperature must be 0 (greedy) or positive")
    data_dir = Path(args.out) / "data"
    prefix = f"{args.shard_prefix}-onpolicy"
    pair = load_pair(args.pair, device="cpu", dtype="fp32", fast_kernels=False)
    if args.onpolicy_prompt_source == "passage-tasks":
        prompts = passage_task_prompts(pair, data_dir, args.onpolicy_prompts or 10 ** 9, args.seed)
    else:
        prompts = training_prompts(data_dir)
        random.Random(args.seed).shuffle(prompts)
        prompts = prompts[:args.onpolicy_prompts or None]
    draft = load_distilled_draft(pair.target, Path(args.onpolicy_draft)) if args.onpolicy_draft else pair.draft
    pad = pair.pad_id
    eos = set(pair.eos_token_ids)
    start, run_tokens = time.time(), 0
    bar = tqdm(total=len(prompts), desc="onpolicy", unit="prompt")
    for i in range(0, len(prompts), args.shard_prompts):
        name = f"{prefix}-{i // args.shard_prompts:04d}"
        chunk = sorted(prompts[i:i + args.shard_prompts], key=len)  # similar lengths waste less padding
        path = data_dir / f"{name}.jsonl"
        if path.is_file():  # resumable: finished shards are kept
            bar.update(len(chunk))
            continue
        if args.onpolicy_minutes and time.time() - start > 60 * args.onpolicy_minutes:
            break
        torch.manual_seed(shard_seed(args.seed, name))
        written = []
        for j in range(0, len(chunk), args.gen_batch):
            written += generate_answers(draft, chunk[j:j + args.gen_batch], pad, eos, args.gen_max_new_tokens,
                                        temperature=args.onpolicy_temperature)
            bar.update(len(chunk[j:j + args.gen_batch]))
        labelled = teacher_forced(pair.target, written, pad, topk=args.gen_topk)
        save_sequences(path, labelled)
        tokens = sum(len(s.labels) for s in labelled)
        # how often the draft's own sampled token was the target's choice: the agreement on this text
        agreed = sum(a == b for s in labelled for a, b in zip(s.ids[s.answer_start:], s.labels))
        run_tokens += tokens
        bar.set_postfix(answer_tokens=run_tokens, tok_per_s=round(run_tokens / (time.time() - start)))
        log({"stage": "onpolicy", "shard": name, "prompts": len(labelled), "answer_tokens": tokens,
             "sampled_is_target_argmax": round(agreed / max(tokens, 1), 4), "elapsed_s": round(time.time() - start, 1)})
    bar.close()
