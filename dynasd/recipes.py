"""Named method configurations: the papers' settings and the ones measured fastest on some CPU, written once.

Why: the explorer has a dozen method controls, and the configurations worth seeing first (MCSD's static tree, the
DynaSD paper's target-initialized fork with and without a decision model, plain speculative sampling, prompt lookup,
and the fastest lossless settings in docs/benchmarks.md) are combinations a newcomer would not find alone. A recipe
is a dict of decoder-option overrides (dynasd/options.py names, typed values) that shape the method; the model pair,
prompt and sampling settings (the options of group "sampling") stay as they are. The app's Recipe menu, the bench's
paper preset and the bench's `recipe=KEY` method specs (scripts/gpu_check.sh names one) all read them here.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from .options import MCSD_TREE, OPTIONS, Shape
from .stopping.policies import DEFAULT_THRESHOLD  # DynaSD's hard decision threshold

# What every recipe starts from: full depth, no stop policy, no prompt lookup, the pair's default draft; each sets
# what makes it the recipe it is.
BASE = dict(dynamic_depth=False, stop="none", lookup=0, draft_kind="default")


@dataclass(frozen=True)
class Recipe:
    key: str        # its name on a command line (`dynasd recipes --spec KEY`)
    label: str      # its entry in the app's Recipe menu
    own: dict       # the decoder options that make it this recipe, over BASE

    @property
    def values(self) -> dict:
        return {**BASE, **self.own}

    def bench_spec(self) -> str:
        """The recipe as a bench method spec (`mcsd:k=2,1,1,1:stop=decision:th=0.4:lookup=8`): the values it
        sets itself, dynamic depth left to the stop policy that implies it."""
        method = self.own["method"]
        parts = [method]
        for name, value in self.own.items():
            o = OPTIONS[name]
            implied = name == "dynamic_depth" and self.own.get("stop", "none") != "none"
            if name != "method" and not implied and o.bench_key and o.read_by(method):
                parts.append(f"{o.bench_key}={o.record(value)}")
        return ":".join(parts)


ALL = [
    # A label says what a recipe is, never how fast: which one wins depends on the CPU kind, the weights and the
    # arithmetic (docs/benchmarks.md has where each was measured fastest and where not), and the app's Recipe menu
    # adds what Compare measured on the machine it runs on (ui/play.py: on_recipe_menu).
    Recipe("narrow-cpu",
           "Narrow tree for a CPU: two draft chains, prompt lookup, decision-model stop",
           dict(method="mcsd", k_config=(2, 1, 1, 1), dynamic_depth=True, stop="decision",
                threshold=DEFAULT_THRESHOLD, lookup=8)),
    Recipe("mcsd-paper", f"MCSD (Yang et al. 2024): a static {Shape.text(MCSD_TREE)} tree from the draft",
           dict(method="mcsd", k_config=MCSD_TREE)),
    Recipe("dynasd-fork", "DynaSD (Lu et al. 2024): target-initialized fork, 4 chains of 4 (lossy)",
           dict(method="ti-mcsd", width=4, depth=4)),
    Recipe("dynasd-decision", "DynaSD with dynamic depth: the fork, a decision model ends the chains (lossy)",
           dict(method="ti-mcsd", width=4, depth=4, dynamic_depth=True, stop="decision", threshold=DEFAULT_THRESHOLD)),
    # docs/benchmarks.md: as many tokens a step as the 44-node MCSD tree, with 16 nodes
    Recipe("dynamic", "Dynamic tree (EAGLE-2-style): 16 nodes grown where the draft is confident, 4 levels",
           dict(method="dynamic", nodes=16, depth=4, expand=4)),
    Recipe("sd", "Speculative sampling: one draft chain of 4", dict(method="sd", gamma=4)),
    Recipe("pld", "Prompt lookup decoding: no draft model",
           dict(method="pld", lookup=8)),
]
BY_KEY = {recipe.key: recipe for recipe in ALL}
RECIPES: dict[str, dict] = {recipe.label: recipe.values for recipe in ALL}  # the app's menu: label -> values


def recipe_values(name: str) -> dict:
    """The option values a recipe sets; raises ValueError with the known names for an unknown one."""
    try:
        return dict(RECIPES[name])
    except KeyError:
        raise ValueError(f"unknown recipe '{name}' (known: {'; '.join(RECIPES)})") from None


# -- `dynasd recipes` ----------------------------------------------------------------------------------------------

def recipe_from_file(path: str | Path) -> Recipe:
    """A recipe written by `dynasd best-tree --out` (its key, label and own options as text); the options are
    checked as any others (a ValueError names the bad one)."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
        key, label, own = record["key"], record["label"], record["own"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a recipe file ({type(exc).__name__}: {exc})") from exc
    if not isinstance(own, dict) or "method" not in own:
        raise ValueError(f"{path}: a recipe's options must be an object with a method")
    typed = {name: OPTIONS[name].coerce(value) if name in OPTIONS else value for name, value in own.items()}
    unknown = sorted(set(typed) - set(OPTIONS))
    if unknown:
        raise ValueError(f"{path}: unknown options {unknown}")
    return Recipe(str(key), str(label), typed)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--spec", metavar="KEY", choices=list(BY_KEY),
                        help="print only this recipe's bench method spec (for scripts)")
    parser.add_argument("--file", default=None, help="print the bench spec of a recipe file (dynasd best-tree --out)")


def execute(args: argparse.Namespace) -> int:
    """Every recipe as `key  bench spec  label`, or one recipe's spec alone."""
    if args.spec:
        print(BY_KEY[args.spec].bench_spec())
        return 0
    if args.file:
        print(recipe_from_file(args.file).bench_spec())
        return 0
    for recipe in ALL:
        print(f"{recipe.key:16} {recipe.bench_spec():48} {recipe.label}")
    return 0
