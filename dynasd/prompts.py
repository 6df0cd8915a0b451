"""Benchmark and training prompts from Spec-Bench-style JSON Lines files (question_id, category, turns)."""
from __future__ import annotations

import json
from pathlib import Path


def read_prompts(path: str | Path, limit: int | None = None, categories: list[str] | None = None) -> list[dict]:
    """Spec-Bench JSON Lines: the first turn of each question is the user message."""
    prompts = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"cannot read prompts file '{path}': {exc.strerror}") from exc
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            text = obj["turns"][0]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
            raise ValueError(f"{path}:{number}: expected a JSON object with a 'turns' list") from exc
        if categories and obj.get("category") not in categories:
            continue
        prompts.append({"id": obj.get("question_id", number), "category": obj.get("category", ""), "text": text})
    return prompts[:limit] if limit else prompts


def select_prompts(path: str | Path, categories: list[str] | None, limit: int | None) -> list[dict]:
    """Per category, the first `limit` prompts by question_id; categories in the order given (or of the file)."""
    prompts = read_prompts(path, categories=categories)
    order = categories or list(dict.fromkeys(p["category"] for p in prompts))
    missing = [c for c in order if not any(p["category"] == c for p in prompts)]
    if missing:
        known = ", ".join(dict.fromkeys(p["category"] for p in read_prompts(path)))
        raise ValueError(f"no prompts in category {', '.join(missing)} (categories in the file: {known})")
    chosen = []
    for category in order:
        group = sorted((p for p in prompts if p["category"] == category), key=lambda p: (str(type(p["id"])), p["id"]))
        chosen += group[:limit] if limit else group
    if any(not p["text"].strip() for p in chosen):
        raise ValueError("a selected prompt is empty")
    return chosen
