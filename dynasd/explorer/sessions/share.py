"""Shareable links and shipped example traces.

A link carries the prompt, the step on show and every setting that differs from its default, as URL query
parameters; reading one back goes through Settings.normalised(), so a hand-edited link gets the same checks and
the same one-line message as the controls. The example traces in assets/examples replay at once, before
any model is loaded (a Space's first visitor sees a run immediately); they are loaded through trace.py like any
stranger's file.
"""
from __future__ import annotations

from pathlib import Path
from urllib.parse import urlencode

from ...models import ASSETS_DIR
from ...options import OPTIONS
from ...trace import RunTrace
from ..inputs import MAX_PROMPT_CHARS, RUN_FIELDS, Settings, UserError, check_prompt
from .session import load_trace

EXAMPLES_DIR = ASSETS_DIR / "examples"
SHARED_FIELDS = tuple(name for name in RUN_FIELDS if name not in ("target", "draft")) + tuple(OPTIONS)
MAX_LINK_STEP = 4096
MAX_QUERY_VALUE_CHARS = MAX_PROMPT_CHARS


def link_query(prompt: str, controls: dict, step: int | None = None) -> str:
    """The query string of a link to these settings and step: only values that differ from the defaults, so a
    link stays short and keeps working when an unrelated default changes. Custom models are never shared (a
    path on one machine means nothing on another)."""
    settings = Settings(**{k: v for k, v in controls.items() if k in RUN_FIELDS or k in OPTIONS}).normalised()
    defaults = Settings().controls()
    values = settings.controls()
    params = {"prompt": check_prompt(prompt)}
    for name in SHARED_FIELDS:
        if values[name] != defaults[name]:
            params[name] = str(values[name]).lower() if isinstance(values[name], bool) else str(values[name])
    if step is not None:
        params["step"] = str(int(step))
    return urlencode(params)


def settings_of_query(params: dict[str, str]) -> tuple[str | None, Settings | None, int | None]:
    """(prompt, settings, step) from a link's query parameters; (None, None, None) when it has none of ours.
    Unknown parameters (a Space adds its own) are ignored; a bad value of ours is one UserError."""
    ours = {k: v for k, v in params.items() if k in SHARED_FIELDS or k in ("prompt", "step")}
    if not ours:
        return None, None, None
    if any(len(str(v)) > MAX_QUERY_VALUE_CHARS for v in ours.values()):
        raise UserError("this link has a value that is too long")
    prompt = check_prompt(ours["prompt"]) if "prompt" in ours else None
    step = None
    if "step" in ours:
        try:
            step = int(ours["step"])
        except ValueError:
            raise UserError(f"this link's step must be a whole number, got '{str(ours['step'])[:20]}'") from None
        if not 0 <= step <= MAX_LINK_STEP:
            raise UserError(f"this link's step must lie in [0, {MAX_LINK_STEP}]")
    values = {}
    for name in SHARED_FIELDS:
        if name in ours:
            raw = ours[name]
            kind = type(OPTIONS[name].default) if name in OPTIONS else int
            values[name] = raw.lower() in ("1", "true", "yes", "on") if kind is bool else raw
    try:
        settings = Settings(**values).normalised()
    except UserError as exc:
        raise UserError(f"this link's settings are not valid: {exc}") from exc
    return prompt, settings, step


def example_traces() -> dict[str, Path]:
    """The shipped example traces by name (file stem), sorted."""
    if not EXAMPLES_DIR.is_dir():
        return {}
    return {path.stem: path for path in sorted(EXAMPLES_DIR.glob("*.json"))}


def load_example(name: str) -> RunTrace:
    """A shipped example trace, validated by trace.py like any other file; an unknown name is a UserError."""
    examples = example_traces()
    if name not in examples:
        raise UserError(f"no example trace named '{str(name)[:60]}' (there are: {', '.join(examples) or 'none'})")
    return load_trace(examples[name])
