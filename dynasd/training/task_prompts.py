"""Passage-task prompts: instructions that work on a text given in the prompt (summarise, translate, rewrite, ...).

Why: the draft agrees least with the target where the answer is built from a passage in the prompt (Spec-Bench
answers with draft v6: summarization 0.14, translation 0.10, against 0.50 on held-out questions), and question-style
training prompts never show it such contexts. These prompts put the target's own earlier answers (the training
shards) under a task instruction, so no outside text is needed; `train-draft --stage onpolicy
--onpolicy-prompt-source passage-tasks` has the draft answer them and the target label the answers.
"""
from __future__ import annotations

import random
from pathlib import Path

from .self_instruct import PLACEHOLDER
from .sequences import load_sequences, training_shards

# {passage}: one of the target's answers; {question}: the prompt that answer replied to.
TASK_TEMPLATES = (
    "Summarize the following text in two sentences.\n\n{passage}",
    "Write a one-sentence summary of this passage:\n{passage}",
    "Give a short title for the text below.\n\n{passage}",
    "List the key points of the following text as bullet points.\n\n{passage}",
    "Translate the following text into French.\n\n{passage}",
    "Translate the following text into German.\n\n{passage}",
    "Translate the following text into Spanish.\n\n{passage}",
    "Translate this text into Chinese:\n{passage}",
    "Rewrite the following text in simpler words.\n\n{passage}",
    "Rewrite this paragraph in a formal tone:\n{passage}",
    "Correct any grammar mistakes in the text below and return the corrected text.\n\n{passage}",
    "Extract every name, place, date and number mentioned in this text:\n{passage}",
    "Continue the following text with one more paragraph.\n\n{passage}",
    "Read the passage and answer the question.\n\nPassage: {passage}\n\nQuestion: {question}",
    "Using only the information below, answer: {question}\n\n{passage}",
)


def user_message(tokenizer, prompt_ids: list[int]) -> str | None:
    """The user's text inside a chat-templated prompt (None when the prompt is not one the template renders)."""
    text = tokenizer.decode(prompt_ids, skip_special_tokens=False)
    shell = tokenizer.apply_chat_template([{"role": "user", "content": PLACEHOLDER}], tokenize=False,
                                          add_generation_prompt=True)
    head, tail = shell.split(PLACEHOLDER)
    if not (text.startswith(head) and text.endswith(tail)):
        return None
    return text[len(head):len(text) - len(tail)].strip()


def passage_of(tokenizer, answer_ids: list[int], max_tokens: int) -> str:
    """An answer as a passage: at most `max_tokens`, cut after its last full sentence when there is one."""
    text = tokenizer.decode(answer_ids[:max_tokens], skip_special_tokens=True).strip()
    if len(answer_ids) > max_tokens:
        end = max(text.rfind(". "), text.rfind(".\n"))
        if end > len(text) // 2:
            text = text[:end + 1]
    return text


def passage_task_prompts(pair, data_dir: Path, count: int, seed: int, min_passage_tokens: int = 24,
                         max_passage_tokens: int = 160) -> list[list[int]]:
    """Up to `count` distinct chat-templated prompts, each a task template over one answer the target wrote in the
    training shards of `data_dir` (on-policy shards, '-onpolicy-' in the name, are skipped: those answers are the
    draft's). Seeded: the same seed and shards give the same prompts."""
    sources = [s for s in load_sequences(training_shards(data_dir))
               if len(s.ids) - s.answer_start >= min_passage_tokens]
    if not sources:
        raise FileNotFoundError(f"no answers of {min_passage_tokens}+ tokens in the training shards of {data_dir} "
                                "to build passage tasks from (run the generate stage first)")
    return passage_prompts_over(pair, sources, count, seed, max_passage_tokens)


def passage_prompts_over(pair, sources: list, count: int, seed: int, max_passage_tokens: int = 160) -> list[list[int]]:
    """Up to `count` distinct chat-templated prompts, each a task template over one answer of `sources` (Sequences
    whose answers are long enough to be passages). Seeded: the same seed and sources give the same prompts."""
    pick = random.Random(seed)
    pick.shuffle(sources)
    prompts, seen = [], set()
    for seq in sources:
        if len(prompts) == count:
            break
        template = pick.choice(TASK_TEMPLATES)
        question = user_message(pair.tokenizer, seq.ids[:seq.answer_start]) if "{question}" in template else ""
        if question is None:
            continue
        passage = passage_of(pair.tokenizer, seq.ids[seq.answer_start:], max_passage_tokens)
        prompt = pair.encode_prompt(template.format(passage=passage, question=question))
        if tuple(prompt) not in seen:
            seen.add(tuple(prompt))
            prompts.append(prompt)
    return prompts
