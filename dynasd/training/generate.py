"""`train-draft --stage generate` and `--stage label`: the training text the target writes or labels.

- generate: the target answers prompts in batches, greedily: prompts read by path (`--prompts`, TriviaQA questions
  and PIQA goals) or, with `--prompt-source self`, user instructions the target writes itself (self_instruct.py).
  A held-out share of the prompts is kept apart for measuring agreement.
- label: reference answers (PIQA solutions) read by the target teacher-forced, labelled with its argmax at every
  answer position: several times cheaper per token than generating.
Both write JSON Lines shards to `--out/data` and skip the shards already there, so a stopped run resumes.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

from tqdm import tqdm

from ..loading.models import load_pair
from .prompt_files import read_answer_pairs, read_train_prompts
from .self_instruct import TASK_OPENERS, sample_instructions, shard_seed
from .sequences import Sequence, load_sequences, save_sequences
from .teacher import generate_answers, teacher_forced

# a shard to write: (name, prompt count, a function making its encoded prompts)
Job = tuple[str, int, Callable[[], list[list[int]]]]


def generate_stage(args, log) -> None:
    data_dir = Path(args.out) / "data"
    # Inference only, so the fast kernels are welcome (the same answers to float rounding; on an AMD EPYC, where MKL
    # is slow, batches of 32 ran at ~200 instead of ~170 answer tokens/s).
    pair = load_pair(args.pair, device="cpu", dtype=args.gen_dtype)
    model, pad = pair.target, pair.pad_id
    jobs = self_instruct_jobs(args, pair, model) if args.prompt_source == "self" else prompt_file_jobs(args, pair)
    start, run_tokens = time.time(), 0
    bar = tqdm(total=sum(count for _, count, _ in jobs), desc="generate", unit="prompt")
    for name, count, make_prompts in jobs:
        path = data_dir / f"{name}.jsonl"
        if path.is_file():  # resumable: finished shards are kept
            bar.update(count)
            continue
        if args.gen_minutes and time.time() - start > 60 * args.gen_minutes:
            break
        # Similar lengths in one batch waste less padding.
        encoded = sorted(make_prompts(), key=len)
        seqs = []
        for i in range(0, len(encoded), args.gen_batch):
            answers = generate_answers(model, encoded[i:i + args.gen_batch], pad, set(pair.eos_token_ids),
                                       args.gen_max_new_tokens, args.gen_topk)
            seqs += answers
            run_tokens += sum(len(s.ids) - s.answer_start for s in answers)
            bar.update(len(encoded[i:i + args.gen_batch]))
            bar.set_postfix(answer_tokens=run_tokens, tok_per_s=round(run_tokens / (time.time() - start)))
        save_sequences(path, seqs)
        answer_tokens = sum(len(s.ids) - s.answer_start for s in seqs)
        log({"stage": "generate", "shard": name, "prompts": len(seqs), "answer_tokens": answer_tokens,
             "elapsed_s": round(time.time() - start, 1)})
    bar.close()


def prompt_file_jobs(args, pair) -> list[Job]:
    """Jobs for `--prompt-source files`: the prompts of `--prompts` in a seeded order, the first `--heldout` of
    them the held-out shard, then training shards of `--gen-prompts` (after `--gen-skip`, prompts an earlier run
    with the same seed already answered)."""
    texts = read_train_prompts(args.prompts)
    random.Random(args.seed).shuffle(texts)
    first = args.heldout + args.gen_skip
    chunks = [("heldout", texts[:args.heldout])]
    train_texts = texts[first:first + args.gen_prompts]
    chunks += [(f"{args.shard_prefix}-{i // args.shard_prompts:04d}", train_texts[i:i + args.shard_prompts])
               for i in range(0, len(train_texts), args.shard_prompts)]
    return [(name, len(chunk), lambda chunk=chunk: [pair.encode_prompt(t) for t in chunk]) for name, chunk in chunks]


def self_instruct_jobs(args, pair, model) -> list[Job]:
    """Jobs for `--prompt-source self`: first a held-out shard (`heldout-self`, never trained on: its prompts are
    excluded from all training shards), then training shards of instructions the target writes itself (see
    self_instruct.py), sampled only for shards still to be written. Prompts already in finished shards are excluded
    too, so a resumed run stays de-duplicated."""
    shards = -(-args.gen_prompts // args.shard_prompts)
    plan = [("heldout-self", args.self_heldout)] if args.self_heldout else []
    plan += [(f"{args.shard_prefix}-{i:04d}", min(args.shard_prompts, args.gen_prompts - i * args.shard_prompts))
             for i in range(shards)]
    seen: set[tuple[int, ...]] = set()
    for name, _ in plan:
        path = Path(args.out) / "data" / f"{name}.jsonl"
        if path.is_file():
            seen.update(tuple(s.ids[:s.answer_start]) for s in load_sequences([path]))

    def make(name: str, count: int) -> Callable[[], list[list[int]]]:
        openers = TASK_OPENERS if args.instruction_openers == "tasks" and name != "heldout-self" else ()
        return lambda: sample_instructions(pair, model, count, shard_seed(args.seed, name), seen, args.gen_batch,
                                           args.instruction_max_tokens, openers=openers)

    return [(name, count, make(name, count)) for name, count in plan]


def label_stage(args, log) -> None:
    """Teacher-forced data: reference answers read by the target in one batched forward (several times cheaper
    per token than generating), labelled with the target's argmax at every answer position. Prompts held out by
    the generate stage (same seed) are left out."""
    texts = read_train_prompts(args.prompts)
    random.Random(args.seed).shuffle(texts)
    heldout = set(texts[:args.heldout])
    pairs = [p for p in read_answer_pairs(args.prompts) if p[0] not in heldout]
    random.Random(args.seed + 1).shuffle(pairs)
    pair = load_pair(args.pair, device="cpu", dtype="fp32", fast_kernels=False)
    pad = pair.pad_id
    start, done = time.time(), 0
    chunk = args.shard_prompts * 4
    for shard, i in enumerate(tqdm(range(0, min(len(pairs), args.label_prompts), chunk), desc="label")):
        path = Path(args.out) / "data" / f"train-tf-{shard:04d}.jsonl"
        if path.is_file():
            continue
        if args.label_minutes and time.time() - start > 60 * args.label_minutes:
            break
        seqs = []
        for prompt, answer in pairs[i:i + chunk]:
            ids = pair.encode_prompt(prompt)
            answer_ids = pair.tokenizer(answer, add_special_tokens=False)["input_ids"][:args.gen_max_new_tokens]
            seqs.append(Sequence(ids + answer_ids, len(ids)))
        seqs = teacher_forced(pair.target, seqs, pad)
        save_sequences(path, seqs)
        done += sum(len(s.labels) for s in seqs)
        log({"stage": "label", "shard": path.name, "answer_tokens": done, "elapsed_s": round(time.time() - start, 1)})
