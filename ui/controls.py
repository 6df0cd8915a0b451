"""The page's controls by name: which exist, which follow the method, which a recipe sets, and the Settings they
make."""
from __future__ import annotations

from dynasd.explorer.inputs import CUSTOM, RUN_FIELDS, Settings, known_pairs
from dynasd.options import METHODS, OPTIONS

from . import state

CUSTOM_RECIPE = "custom (set by hand)"  # the Recipe box's value once a method control is changed by hand
# Every control that shapes a run, by name: the run's own (pair, target, draft, max_new_tokens), then one per
# decoder option (dynasd/options.py). Handlers take them as keyword arguments of these names, which are also the
# API's parameter names; a loaded trace or a recipe updates them in this order.
CONTROL_NAMES = tuple(RUN_FIELDS) + tuple(OPTIONS)
# controls shown only for the methods that read them (draft_kind follows the pair: on_pair_change)
SHOWN_BY_METHOD = tuple(name for name, o in OPTIONS.items() if o.methods != METHODS and name != "draft_kind")
# the controls a recipe may set: changing one by hand turns the Recipe box to "custom"
RECIPE_CONTROLS = tuple(name for name, o in OPTIONS.items() if o.group != "sampling")


def settings_from(controls: dict) -> Settings:
    return Settings(**controls).normalised()


def pair_choices() -> list[str]:
    return known_pairs() + ([CUSTOM] if state.PAIRS.allow_custom else [])
