"""`train-feature-draft --stage text`: the feature draft's training text, written once and kept as compact token ids
(token_store.py) in a committed folder, so that no later run has to write it again.

Why the target writes it (`--text-writer target`): its greedy answers are the text a feature draft meets when the
target verifies, and the engine's kernels make them in the arithmetic `ar` runs. The 3-layer token draft writes ~6x
faster (`--text-writer draft`), but its greedy answers fall into loops, text the target never writes. Everything
derived from the text (the target's states, argmax and top-k) is recomputed by the features stage, many rows a
forward. Prompts cycle through SHARD_KINDS: the TriviaQA and PIQA files (`--prompts`, in a seeded order; the first
`--heldout` kept apart), instructions the target writes itself (self_instruct.py) and passage tasks
(task_prompts.TASK_TEMPLATES) over answers already written, which carry a source passage as Spec-Bench's
summarisation and translation do. With `--text-source local` the shards (`train-local-NNNN`) hold tasks over text
found on the machine instead (local_text.py): long passages to summarise or read from, sentences to translate into
English. No benchmark prompt is ever used here. Each shard's prompts follow from its index
and the seed, so a stopped run resumes where it stopped (finished shards are skipped) and writes the same text.
"""
from __future__ import annotations

import random
import time
from pathlib import Path

from ..loading.models import load_pair
from .local_text import english_passages, foreign_sentences, local_task_texts
from .prompt_files import read_train_prompts
from .self_instruct import TASK_OPENERS, sample_instructions, shard_seed
from .task_prompts import passage_prompts_over
from .teacher import generate_answers
from .token_store import load_token_shards, save_token_shard, token_shards

HELDOUT, FILES, SELF, PASSAGES = "heldout", "prompt files", "self-instruct", "passage tasks"
# Shard i is SHARD_KINDS[i % 6]. Self-instruct shards cost ~5x a prompt-file shard's time per token (the target
# samples its instructions first), so they come once in six.
SHARD_KINDS = (PASSAGES, FILES, SELF, FILES, FILES, FILES)
PASSAGE_TOKENS = (24, 160)  # answers shorter than this are no passage; longer ones are cut to a sentence end
LOCAL_PREFIX = "train-local-"  # the shards of --text-source local (never a passage task's source)


def text_stage(args, log) -> None:
    folder = Path(args.text)
    if args.text_source == "local":
        return local_text_stage(args, log, folder)
    # The writer runs on the engine's kernels: the target's text is then what `ar` writes in its default arithmetic.
    pair = load_pair(args.pair, device="cpu")
    writer = pair.target if args.text_writer == "target" else pair.draft
    if writer is None:
        raise ValueError(f"the pair '{args.pair}' has no token draft to write the text")
    texts = read_train_prompts(args.prompts)
    random.Random(args.seed).shuffle(texts)
    held, train = texts[:args.heldout], iter(texts[args.heldout:])
    started, written = time.time(), 0
    for index in range(args.text_shards + 1):
        kind = HELDOUT if index == 0 else SHARD_KINDS[index % len(SHARD_KINDS)]
        name = HELDOUT if index == 0 else f"train-{index - 1:04d}"
        file_prompts = held if index == 0 else \
            [next(train, None) for _ in range(args.shard_prompts)] if kind == FILES else []
        path = folder / f"{name}.npz"
        if path.is_file():
            continue
        if args.text_minutes and time.time() - started > 60 * args.text_minutes:
            break
        if kind == PASSAGES:
            own = [p for p in token_shards(folder, "train-") if not p.name.startswith(LOCAL_PREFIX)]
            prompts = passage_prompts(pair, own, args.shard_prompts, args.seed + index)
        elif kind == SELF:
            prompts = sample_instructions(pair, pair.target, args.shard_prompts, shard_seed(args.seed, name), set(),
                                          batch=args.text_batch, openers=TASK_OPENERS)
        else:
            prompts = [pair.encode_prompt(t) for t in file_prompts if t is not None]
        if not prompts:
            break
        written += write_shard(args, log, pair, writer, path, prompts, kind, written, started)


def write_shard(args, log, pair, writer, path: Path, prompts: list[list[int]], kind: str, written: int,
                started: float) -> int:
    """Answer `prompts` with `writer` (batches of similar length), keep the ids in `path`; the answer tokens."""
    prompts = sorted(prompts, key=len)  # similar lengths in one batch waste less padding
    seqs = []
    for i in range(0, len(prompts), args.text_batch):
        seqs += generate_answers(writer, prompts[i:i + args.text_batch], pair.pad_id, set(pair.eos_token_ids),
                                 args.text_max_new_tokens, temperature=args.text_temperature)
    save_token_shard(path, seqs)
    answer_tokens = sum(len(s.ids) - s.answer_start for s in seqs)
    log({"stage": "text", "shard": path.stem, "kind": kind, "prompts": len(seqs), "answer_tokens": answer_tokens,
         "tokens_per_s": round((written + answer_tokens) / (time.time() - started), 1)})
    return answer_tokens


def local_text_stage(args, log, folder: Path) -> None:
    """`--text-shards` shards `train-local-NNNN` of tasks over text found on this machine (local_text.py), the
    target answering; shard i draws its tasks from seed + i, so a stopped run resumes with the same prompts."""
    pair = load_pair(args.pair, device="cpu")
    passages, sentences = english_passages(), foreign_sentences()
    log({"stage": "text", "source": "local", "passages": len(passages), "sentences": len(sentences)})
    started, written = time.time(), 0
    for index in range(args.text_shards):
        path = folder / f"{LOCAL_PREFIX}{index:04d}.npz"
        if path.is_file():
            continue
        if args.text_minutes and time.time() - started > 60 * args.text_minutes:
            break
        texts = local_task_texts(args.shard_prompts, args.seed + index, passages, sentences)
        prompts = [pair.encode_prompt(t) for t in texts]
        written += write_shard(args, log, pair, pair.target, path, prompts, "local", written, started)


def passage_prompts(pair, shards: list[Path], count: int, seed: int) -> list[list[int]]:
    """Up to `count` passage-task prompts over the answers already in `shards` (task_prompts.passage_prompts_over)."""
    low, high = PASSAGE_TOKENS
    sources = [s for s in load_token_shards(shards) if len(s.ids) - s.answer_start >= low]
    return passage_prompts_over(pair, sources, count, seed, high)
