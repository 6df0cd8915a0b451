"""Training prompts read by path: TriviaQA- and PIQA-style JSON files (lists of objects with 'question' or 'goal';
PIQA's also carry a 'correct_answer'), or folders of them.

Why a module of its own: `train-draft` (generate, label) and `train-decision` read the same files, and no training
command finds them by itself: the caller names them (`--prompts`), so a checkout runs the same wherever it lies.
"""
from __future__ import annotations

import json
from pathlib import Path


def json_files(paths: list[str | Path]) -> list[Path]:
    """The JSON files named by `paths`: files as given, folders as their *.json files in name order."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files += sorted(path.glob("*.json"))
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"no prompts at '{path}'")
    return files


def read_train_prompts(paths: list[str | Path]) -> list[str]:
    """Prompt texts from JSON files (a list of objects with 'question' or 'goal'), or folders of them."""
    texts = []
    for file in json_files(paths):
        for obj in json.loads(file.read_text(encoding="utf-8")):
            text = obj.get("question") or obj.get("goal") if isinstance(obj, dict) else obj
            if isinstance(text, str) and text.strip():
                texts.append(text.strip())
    if not texts:
        raise ValueError(f"no prompts found in {', '.join(map(str, paths))}")
    return texts


def read_answer_pairs(paths: list[str | Path]) -> list[tuple[str, str]]:
    """(prompt, reference answer) pairs, e.g. PIQA goals with their correct solution."""
    pairs = []
    for file in json_files(paths):
        for obj in json.loads(file.read_text(encoding="utf-8")):
            if isinstance(obj, dict) and isinstance(obj.get("correct_answer"), str):
                prompt = obj.get("question") or obj.get("goal")
                if prompt and obj["correct_answer"].strip():
                    pairs.append((prompt.strip(), obj["correct_answer"].strip()))
    return pairs
