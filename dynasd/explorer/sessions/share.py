"""Shareable links and shipped example traces.

A link carries the prompt, the step on show and every setting that changes the run, as URL query parameters: the
model pair, the token budget and every option its method reads (dynasd/options.py's table says which), defaults
included, so that the link makes the same run after a default has changed; the options its method does not read
cannot change the run and stay out. Reading one back goes through Settings.normalised(), so a hand-edited link
gets the same checks and the same one-line message as the controls; an option the link's method does not read (a
link made before this rule) is ignored. The example traces in assets/examples replay at once, before
any model is loaded (a Space's first visitor sees a run immediately); they are loaded through trace.py like any
stranger's file.
"""
from __future__ import annotations

from pathlib import Path
from urllib.parse import urlencode

from ...loading.models import ASSETS_DIR
from ...options import OPTIONS
from ...trace import RunTrace
from ..inputs import MAX_PROMPT_CHARS, RUN_FIELDS, Settings, UserError, check_prompt
from .session import load_trace

EXAMPLES_DIR = ASSETS_DIR / "examples"
RUN_SETTINGS = tuple(name for name in RUN_FIELDS if name not in ("target", "draft"))  # a custom pair's paths: no
SHARED_FIELDS = RUN_SETTINGS + tuple(OPTIONS)  # every parameter a link may hold, whatever its method
MAX_LINK_STEP = 4096
MAX_QUERY_VALUE_CHARS = MAX_PROMPT_CHARS


def run_settings(method: str) -> tuple[str, ...]:
    """The settings that change a run of `method`: the model pair, the token budget and every option the method
    reads. Custom models are never shared (a path on one machine means nothing on another)."""
    return RUN_SETTINGS + tuple(name for name, option in OPTIONS.items() if option.read_by(method))


def link_query(prompt: str, controls: dict, step: int | None = None) -> str:
    """The query string of a link to these settings and step: every setting that changes the run (run_settings),
    and only those."""
    settings = Settings(**{k: v for k, v in controls.items() if k in RUN_FIELDS or k in OPTIONS}).normalised()
    values = settings.controls()
    params = {"prompt": check_prompt(prompt)}
    for name in run_settings(settings.method):
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
    for name in run_settings(str(ours.get("method", OPTIONS["method"].default)).strip()):
        if name in ours:
            raw = ours[name]
            kind = type(OPTIONS[name].default) if name in OPTIONS else int
            values[name] = raw.lower() in ("1", "true", "yes", "on") if kind is bool else raw
    if "method" in ours:
        values["method"] = ours["method"]
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
