"""Benchmark and training prompts, and conversations.

Prompt files are read by path: Spec-Bench JSON Lines (question_id, category, turns: one user message per turn; the
MT-bench questions have two), or TriviaQA/PIQA-style JSON lists of objects with 'question' or 'goal', whose
category is the file's name unless it is given as `CATEGORY=PATH`. A conversation goes on with `follow_up_ids`:
the tokens that follow the model's own answer (the chat template's end of turn, the next user message, the next
assistant header), so a decoder can continue from its caches instead of re-reading the whole conversation.
"""
from __future__ import annotations

import json
from pathlib import Path

# Stands in for the answer when the chat template is rendered: what follows it is the follow-up's text.
ANSWER_MARK = "\u0001DYNASD-ANSWER\u0001"


def split_source(source: str | Path) -> tuple[str | None, Path]:
    """'CATEGORY=PATH' -> (CATEGORY, PATH); a plain path -> (None, PATH)."""
    text = str(source)
    category, sep, path = text.partition("=")
    if sep and category and "/" not in category and not Path(text).exists():
        return category, Path(path)
    return None, Path(text)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read prompts file '{path}': {exc.strerror}") from exc


def _read_json_list(path: Path, category: str | None) -> list[dict]:
    """A TriviaQA/PIQA-style file: one single-turn prompt per object, numbered from 1 in file order."""
    try:
        items = json.loads(_read_text(path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(items, list):
        raise ValueError(f"{path}: expected a JSON list of objects with 'question' or 'goal'")
    prompts = []
    for number, obj in enumerate(items, 1):
        text = (obj.get("question") or obj.get("goal")) if isinstance(obj, dict) else None
        if not isinstance(text, str):
            raise ValueError(f"{path}: item {number} has no 'question' or 'goal' text")
        prompts.append({"id": number, "category": category or path.stem, "text": text, "turns": [text]})
    return prompts


def read_prompts(path: str | Path, limit: int | None = None, categories: list[str] | None = None) -> list[dict]:
    """The prompts of one file: each a dict with id, category, text (the first user message) and turns (every user
    message, in order). `path` may be 'CATEGORY=PATH' (the category of a JSON list's prompts)."""
    category, path = split_source(path)
    if path.suffix == ".json":
        prompts = _read_json_list(path, category)
    else:
        prompts = []
        for number, line in enumerate(_read_text(path).splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                turns = obj["turns"]
                text = turns[0]
            except (json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: expected a JSON object with a 'turns' list") from exc
            if not all(isinstance(t, str) for t in turns):
                raise ValueError(f"{path}:{number}: every turn must be text")
            prompts.append({"id": obj.get("question_id", number), "category": category or obj.get("category", ""),
                            "text": text, "turns": list(turns)})
    if categories:
        prompts = [p for p in prompts if p["category"] in categories]
    return prompts[:limit] if limit else prompts


def select_prompts(path: str | Path | list, categories: list[str] | None, limit: int | None) -> list[dict]:
    """Per category, the first `limit` prompts by question_id; categories in the order given (or of the files).
    `path` may be a list of files (each a path or 'CATEGORY=PATH'), read in order."""
    paths = path if isinstance(path, (list, tuple)) else [path]
    everything = [p for source in paths for p in read_prompts(source)]
    prompts = [p for p in everything if not categories or p["category"] in categories]
    order = categories or list(dict.fromkeys(p["category"] for p in prompts))
    missing = [c for c in order if not any(p["category"] == c for p in prompts)]
    if missing:
        known = ", ".join(dict.fromkeys(p["category"] for p in everything))
        raise ValueError(f"no prompts in category {', '.join(missing)} (categories in the file: {known})")
    chosen = []
    for category in order:
        group = sorted((p for p in prompts if p["category"] == category), key=lambda p: (str(type(p["id"])), p["id"]))
        chosen += group[:limit] if limit else group
    if any(not t.strip() for p in chosen for t in p["turns"]):
        raise ValueError("a selected prompt is empty")
    return chosen


def follow_up_ids(tokenizer, messages: list[dict], answer_ids: list[int], eos_ids, chat: bool = True) -> list[int]:
    """The tokens that continue a conversation after the model's last answer (`answer_ids`, the tokens it kept):
    the chat template's end of that assistant turn, the next user message (`messages[-1]`) and the header of the
    next assistant turn. `messages` are the conversation's messages, the last answer's included (its content is
    not read: the template is rendered with a mark in its place, so the answer's tokens stay as generated rather
    than re-tokenized from text). Without the chat template the next message follows on a new line.

    Why: a decoder that continues from its caches (Decoder.continue_with) needs only these tokens, and the
    conversation it decodes is then exactly prompt + answer + these, turn after turn."""
    user = messages[-1]["content"]
    if not chat or not getattr(tokenizer, "chat_template", None):
        return [int(i) for i in tokenizer("\n" + user + "\n", add_special_tokens=False)["input_ids"]]
    marked = [dict(m) for m in messages]
    marked[-2] = {"role": "assistant", "content": ANSWER_MARK}
    text = tokenizer.apply_chat_template(marked, add_generation_prompt=True, tokenize=False)
    if text.count(ANSWER_MARK) != 1:
        raise ValueError("the chat template does not show the assistant's answer once: cannot go on from it")
    after = text[text.index(ANSWER_MARK) + len(ANSWER_MARK):]
    ids = [int(i) for i in tokenizer(after, add_special_tokens=False)["input_ids"]]
    # An answer that ended with its end-of-turn token already holds what the template closes the turn with.
    if answer_ids and answer_ids[-1] in eos_ids and ids and ids[0] == answer_ids[-1]:
        ids = ids[1:]
    return ids
