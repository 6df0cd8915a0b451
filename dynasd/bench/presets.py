"""Bench presets: a named setting of the bench's own flags, for reproducing a paper's evaluation in one flag.

A preset only sets defaults: a flag given on the command line keeps its value. The flags a preset may set default
to None in the parser, so "not given" is told from "given the default value"; `apply_preset` fills in the
preset's value, else the bench's own default, and says what it chose.

Prompt paths in a preset are relative to the working directory and are only defaults of the bench command (the
repository is usually checked out beside a `shared/` folder holding the prompt sets); nothing else reads them.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ..options import DEFAULT_MAX_NEW_TOKENS, MCSD_TREE, Shape
from ..recipes import BY_KEY
from .specs import DEFAULT_METHODS

# The bench's defaults for the flags presets may set (the parser's defaults are None).
BENCH_DEFAULTS = {"prompts": None, "categories": None, "turns": 1, "temperatures": None,
                  "max_new_tokens": DEFAULT_MAX_NEW_TOKENS, "methods": DEFAULT_METHODS}

MT_BENCH = "writing,roleplay,reasoning,math,coding,extraction,stem,humanities"
# The paper's methods beside this project's: MCSD's static tree, the fork (ti-mcsd, 4 chains of 4 draft tokens)
# with and without the hard decision model at 0.4 (DynaSD), sd, and the narrow-tree recipe, the fastest lossless one
# measured on a CPU with float32 weights (dynasd/recipes.py).
PAPER_METHODS = ",".join(["ar", "sd", *(BY_KEY[key].bench_spec() for key in ("mcsd-paper", "dynasd-fork",
                                                                                "dynasd-decision", "narrow-cpu"))])


@dataclass(frozen=True)
class Preset:
    description: str
    values: dict = field(default_factory=dict)


PRESETS = {
    "dynasd-paper": Preset(
        "the DynaSD paper's evaluation (Lu et al. 2024): MT-bench, both turns, and TriviaQA, T = 0.7, 200 new "
        f"tokens; MCSD {Shape.text(MCSD_TREE)} and the fork with and without the decision model beside sd and the "
        "fastest recipe",
        {"prompts": ["../shared/bench/spec_bench_questions.jsonl",
                     "triviaqa=../shared/train_prompts/trivia_qa_questions.json"],
         "categories": MT_BENCH + ",triviaqa", "turns": 2, "temperatures": "0.7", "max_new_tokens": 200,
         "methods": PAPER_METHODS}),
}


def apply_preset(args: argparse.Namespace) -> list[str]:
    """Fill every preset-able flag the command line left unset, from `args.preset` then the bench's defaults.
    Returns what the preset chose, as flags, to print (empty without a preset). Idempotent."""
    name = getattr(args, "preset", None)
    if name is not None and name not in PRESETS:
        raise ValueError(f"unknown preset '{name}' (known: {', '.join(PRESETS)})")
    chosen = PRESETS[name].values if name else {}
    said = []
    for key, default in BENCH_DEFAULTS.items():
        if getattr(args, key, None) is not None:
            continue
        value = chosen.get(key, default)
        setattr(args, key, value)
        if key in chosen:
            shown = " ".join(value) if isinstance(value, list) else str(value)
            said.append(f"--{key.replace('_', '-')} {shown}")
    if getattr(args, "prompts", None) is None:
        raise ValueError("give --prompts FILE (Spec-Bench JSON Lines, or a TriviaQA-style JSON list) or a --preset")
    return said
