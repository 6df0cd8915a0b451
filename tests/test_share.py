"""A shared link carries every setting that changes the run and only those, for every method: the model pair, the
token budget and every option the method reads (dynasd/options.py's table), defaults included, so the link makes
the same run after a default has changed; an option the method does not read changes nothing and stays out, and a
link that holds one (made before this rule) opens without it. Reading a link back gives the same settings."""
from urllib.parse import parse_qsl

import pytest

from dynasd.explorer.inputs import Settings, UserError
from dynasd.explorer.sessions import share
from dynasd.options import METHODS, OPTIONS, Choice, Flag, Ref, Shape
from dynasd.ranges import Float, Int

PROMPT = "why is the sky blue?"


def another(name: str):
    """A valid value of option `name` other than its default, written as a control holds it."""
    option = OPTIONS[name]
    kind, default = option.kind, option.default
    if isinstance(kind, Flag):
        return not default
    if isinstance(kind, Choice):
        return next(choice for choice in kind.choices if choice != default)
    if isinstance(kind, Shape):
        return "3,1" if default == (2, 1) else "2,1"
    if isinstance(kind, Ref):
        return "decision-smollm2-soft"
    if isinstance(kind, Int):
        return default + 1 if kind.high is None or default < kind.high else default - 1
    if isinstance(kind, Float):
        return round((default + kind.high) / 2, 3) if default < kind.high else round((kind.low + default) / 2, 3)
    raise AssertionError(f"no other value for {name}: a new kind of option needs one here")


def read_by(method: str) -> set[str]:
    return {name for name, option in OPTIONS.items() if method in option.methods}


def controls_of(method: str, **changed) -> dict:
    """The page's controls for a run of `method` on tiny-random, with `changed` set."""
    settings = Settings(**{"pair": "tiny-random", "max_new_tokens": 32, "method": method, **changed})
    return settings.normalised().controls()


def params(controls: dict, step: int | None = 3) -> dict[str, str]:
    return dict(parse_qsl(share.link_query(PROMPT, controls, step), keep_blank_values=True))


@pytest.mark.parametrize("method", METHODS)
def test_a_link_carries_every_setting_its_method_reads_and_reads_back_the_same_settings(method):
    changed = {name: another(name) for name in OPTIONS if name != "method"}  # the hidden controls changed too
    link = params(controls_of(method, **changed))
    assert set(link) == {"prompt", "step", "pair", "max_new_tokens"} | read_by(method)
    prompt, settings, step = share.settings_of_query(link)
    runs_the_same = {name: value for name, value in changed.items() if name in read_by(method)}
    assert (prompt, step) == (PROMPT, 3)
    assert settings == Settings(pair="tiny-random", max_new_tokens=32, method=method, **runs_the_same).normalised()


@pytest.mark.parametrize("method", METHODS)
def test_each_setting_that_changes_a_run_changes_its_link_and_no_other_setting_does(method):
    plain = params(controls_of(method))
    assert params(controls_of(method) | {"max_new_tokens": 33}) != plain
    assert params(controls_of(method) | {"pair": "embedded"}) != plain
    for name in set(OPTIONS) - {"method"}:
        changed = params(controls_of(method, **{name: another(name)}))
        assert (changed != plain) == (name in read_by(method)), name


def test_a_link_says_the_defaults_it_runs_with():
    link = params(Settings().controls(), step=None)
    assert {"k_config": "4,2,2,1", "seed": "0", "max_new_tokens": "64", "method": "mcsd"}.items() <= link.items()
    assert "gamma" not in link and "step" not in link


def test_an_older_link_with_an_option_its_method_does_not_read_opens_without_it():
    prompt, settings, _ = share.settings_of_query({"prompt": "x", "method": "sd", "gamma": "6", "k_config": "2,2"})
    assert settings == Settings(method="sd", gamma=6).normalised()
    with pytest.raises(UserError, match="unknown method"):
        share.settings_of_query({"prompt": "x", "method": "nope"})
