"""Self-instruct prompts (Magpie, Xu et al. 2024): the target writes the user instructions itself.

An instruction-tuned model given only its chat template up to the start of a user turn continues with something a
user might ask, in the variety it was tuned on (writing, code, maths, advice, ...). Sampling those instructions and
then answering them greedily gives distillation data from the target alone: no external text is needed.
"""
from __future__ import annotations

import random
import zlib

import torch

PLACEHOLDER = "@@DYNASD-USER-MESSAGE@@"

# Left free, a small target mostly writes short "Can you ...?" questions. Starting the user turn with a generic task
# word steers it towards the imperative, longer tasks people give assistants (and benchmarks measure): writing,
# code, maths, translation, text to summarise or extract from, role play. The target still writes the rest.
TASK_OPENERS = (
    "Write", "Compose", "Draft", "Rewrite", "Edit", "Create", "Generate", "Design", "Outline", "Suggest",
    "Explain", "Describe", "Discuss", "Compare", "Analyze", "Evaluate", "Identify", "Classify", "List",
    "Summarize the following", "Read the passage below and", "Given the following", "Extract", "Translate",
    "Solve", "Calculate", "Prove", "If", "Write a Python function", "Implement", "Debug the following code",
    "Imagine you are", "Pretend to be", "Help me", "Can you", "Please", "What", "How", "Why",
)


def user_turn_prefix(tokenizer) -> list[int]:
    """Token ids of the chat template up to where a user message begins: a conversation with a placeholder user
    message rendered by the tokenizer's own template and cut at the placeholder (system prompt and turn markers
    included, whatever the model's template writes)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": PLACEHOLDER}], tokenize=False,
                                         add_generation_prompt=False)
    if PLACEHOLDER not in text:
        raise ValueError("the chat template does not render the user message verbatim")
    return list(tokenizer(text[:text.index(PLACEHOLDER)], add_special_tokens=False)["input_ids"])


def shard_seed(seed: int, shard_name: str) -> int:
    """Each shard samples from its own seed (from --seed and its name), so a resumed run redraws the same shards."""
    return zlib.crc32(f"{seed}/{shard_name}".encode())


@torch.inference_mode()
def sample_instructions(pair, model, count: int, seed: int, seen: set[tuple[int, ...]], batch: int = 32,
                        max_new_tokens: int = 64, top_p: float = 0.95, max_rounds: int | None = None,
                        openers: tuple[str, ...] = ()) -> list[list[int]]:
    """Up to `count` chat-templated prompts (`pair.encode_prompt`) whose user message the target wrote: sampled at
    T = 1 with nucleus `top_p` from `user_turn_prefix` (followed, with `openers`, by one of them drawn per batch),
    cut at the end of the turn (or `max_new_tokens`), stripped, non-empty and not in `seen` (prompt ids; the new
    ones are added to it). Seeded: same seed and `seen`, same prompts."""
    turn_start = user_turn_prefix(pair.tokenizer)
    pick = random.Random(seed)
    end_ids = set(pair.eos_token_ids)
    pad = pair.pad_id
    prompts: list[list[int]] = []
    rounds = max_rounds or 2 * -(-count // batch) + 2  # duplicates and empty turns are redrawn, within reason
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for _ in range(rounds):
            opener = pair.tokenizer(pick.choice(openers), add_special_tokens=False)["input_ids"] if openers else []
            prefix = torch.tensor([turn_start + opener])
            ids = prefix.expand(batch, -1)
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                 temperature=1.0, top_p=top_p, top_k=0, max_new_tokens=max_new_tokens,
                                 pad_token_id=pad, eos_token_id=sorted(end_ids))
            for row in out[:, len(turn_start):].tolist():
                turn = next((row[:i] for i, tok in enumerate(row) if tok in end_ids), row)
                text = pair.tokenizer.decode(turn, skip_special_tokens=True).strip()
                prompt = pair.encode_prompt(text) if text else None
                if prompt is not None and tuple(prompt) not in seen:
                    seen.add(tuple(prompt))
                    prompts.append(prompt)
                    if len(prompts) == count:
                        return prompts
    return prompts
