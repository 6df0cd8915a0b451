"""What a user can send the explorer, and how it is checked: the run settings (model pair, token budget and every
decoder option), the prompt, and the settings a loaded trace was made with.

Everything here is checked before any model is touched; a problem is a UserError whose message the app shows.
"""
from __future__ import annotations

from dataclasses import field, make_dataclass, replace
from typing import Any

from ..loading.models import BUILTIN_PAIRS, PRESETS
from ..options import (
    DEFAULT_MAX_NEW_TOKENS,
    MAX_REF_CHARS,
    METHODS,
    OPTIONS,
    DecoderOptions,
    Int,
    OptionsError,
    options_of_run,
)
from ..trace import RunTrace

CUSTOM = "custom"              # the pair control's value for a target and draft named by the user
MAX_NEW_TOKENS_LIMIT = 512
MAX_PROMPT_CHARS = 20_000      # far above any context limit in tokens; refused before the tokenizer runs
NEW_TOKENS = Int(1, MAX_NEW_TOKENS_LIMIT)
RUN_FIELDS = {"pair": "embedded", "target": "", "draft": "", "max_new_tokens": DEFAULT_MAX_NEW_TOKENS}


class UserError(ValueError):
    """Something the user can fix (bad setting, empty prompt, unknown model); the message is shown as is."""


def known_pairs() -> list[str]:
    return list(BUILTIN_PAIRS) + list(PRESETS)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, at most 200 characters ("" when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else ""


def one_line(exc: BaseException) -> str:
    """An exception as one line a user can read: its type and the first line of its message."""
    detail = first_line(exc)
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


class _SettingsMethods:
    """What Settings (below) can do; its fields are RUN_FIELDS and one per decoder option."""

    @property
    def pair_key(self) -> str:
        return f"{self.target} + {self.draft}" if self.pair == CUSTOM else self.pair

    @property
    def options(self) -> DecoderOptions:
        """The decoder options (of normalised settings), every one of them: `for_method()` keeps the method's."""
        return DecoderOptions(**{name: getattr(self, name) for name in OPTIONS})

    def controls(self) -> dict:
        """The value of every control of the app for these settings (a shape as its text)."""
        return {**{name: getattr(self, name) for name in RUN_FIELDS},
                **{name: o.record(getattr(self, name)) for name, o in OPTIONS.items()}}

    def normalised(self) -> "Settings":
        """Coerce UI values (sliders send floats, text boxes text) and check every one of them; raises UserError
        naming every problem. The method's own checks run on the options it reads (the others are hidden
        controls), and caps come before anything is built from a value: a gamma of 10**9 must not allocate a
        10**9-level tree just to be told it is too big."""
        problems: list[str] = []
        run: dict[str, Any] = {}
        if isinstance(self.pair, str):
            run["pair"] = self.pair
        else:
            problems.append("pair must be a string")
        for name in ("target", "draft"):
            value = getattr(self, name)
            if isinstance(value, (str, type(None))):
                run[name] = (value or "").strip()
            else:
                problems.append(f"{name} must be text")
        try:
            run["max_new_tokens"] = _checked(NEW_TOKENS, self.max_new_tokens, "max new tokens")
        except ValueError as exc:
            problems.append(str(exc))
        options = None
        try:
            options = DecoderOptions.parse({name: getattr(self, name) for name in OPTIONS})
            options.for_method().validate()
        except OptionsError as exc:
            problems += exc.problems
        if run.get("pair") == CUSTOM:
            if not (run.get("target") and run.get("draft")):
                problems.append("a custom pair needs both a target and a draft model id or path")
            elif max(len(run["target"]), len(run["draft"])) > MAX_REF_CHARS:
                problems.append(f"a model id or path may have at most {MAX_REF_CHARS} characters")
        if problems:
            raise UserError("; ".join(problems))
        return replace(self, **run, **options.values())


Settings = make_dataclass(
    "Settings", [(name, Any, field(default=default)) for name, default in RUN_FIELDS.items()]
    + [(name, Any, field(default=o.default)) for name, o in OPTIONS.items()],
    bases=(_SettingsMethods,), frozen=True)
Settings.__module__ = __name__
Settings.__doc__ = """Every control of the explorer that shapes a run: the model pair, the token budget and each decoder
option (its fields are generated from dynasd/options.py, so a new option is a new setting without an edit here).
Frozen and comparable: a change starts a new run. Built from raw control values; `normalised()` checks them."""


def _checked(kind: Int, value, title: str) -> int:
    number = kind.coerce(value, title)
    problem = kind.problem(number, title)
    if problem:
        raise ValueError(problem)
    return number


def check_prompt(prompt) -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise UserError("the prompt is empty: type something or pick an example")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise UserError(f"the prompt has {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}")
    return prompt


def settings_of_trace(run: RunTrace) -> Settings | None:
    """The settings a loaded trace was made with, so its controls can be shown (and Step then starts a new run
    like it). None when the trace does not describe valid settings (a hand-edited file).

    max_new_tokens is not in a trace: a run that ended on length gives it; otherwise the default stays."""
    try:
        options = options_of_run(run.method, run.config)
    except OptionsError:
        return None
    values: dict = {}
    if run.pair in known_pairs():
        values["pair"] = run.pair
    elif " + " in run.pair:  # a custom pair is named "<target> + <draft>"
        target, _, draft = run.pair.partition(" + ")
        values.update(pair=CUSTOM, target=target, draft=draft)
    if run.finished == "length":
        values["max_new_tokens"] = len(run.new_token_ids)
    try:
        return Settings(**values, **options.values()).normalised()
    except UserError:
        return None


def check_methods(settings: Settings, methods: tuple[str, ...] = METHODS) -> None:
    """Every method's options checked before any model loads or runs (a UserError naming the method), so a bad
    option fails a Compare at once instead of after the methods before it ran."""
    for method in methods:
        try:
            settings.options.for_method(method).validate()
        except OptionsError as exc:
            raise UserError(f"{method}: {exc}") from exc
