"""The decoder options table (dynasd/options.py) is the one owner of every option: each value is checked with one
clear line, and every surface (CLI, bench specs, app controls, trace records) is derived from it, so an option
added to the table without being wired somewhere fails here."""
import math
from dataclasses import replace

import pytest

from dynasd.bench import specs as bench_specs
from dynasd.cli import build_parser
from dynasd.options import (
    MAX_TREE_NODES,
    METHODS,
    OPTIONS,
    Choice,
    DecoderOptions,
    Flag,
    Float,
    Int,
    OptionsError,
    Ref,
    Shape,
    options_from_args,
    options_of_run,
)
from dynasd.recipes import RECIPES


def bad_values(option) -> list:
    """Values a user could send that this option must refuse (as text or UI values)."""
    kind = option.kind
    if isinstance(kind, Int):
        return [kind.low - 1, "x", 2.5, float("nan")] + ([kind.high + 1] if kind.high is not None else [])
    if isinstance(kind, Float):
        return [kind.low if kind.open_low else kind.low - 0.5, kind.high + 0.5, "x", float("inf")]
    if isinstance(kind, Choice):
        return ["nope", 5]
    if isinstance(kind, Shape):
        return ["0", "4,x", "2,-1", "1," * 150 + "1", [4, 2]]
    if isinstance(kind, Flag):
        return ["maybe", 2]
    if isinstance(kind, Ref):
        return [5, "x" * 400]
    raise AssertionError(f"{option.name}: a kind of value this test does not know")


def non_default(option):
    """(method, value): a valid value other than the default, and a method that reads the option."""
    kind, method = option.kind, next(m for m in option.methods if m != "ar") if option.methods != ("ar",) else "ar"
    if option.name == "method":
        return "sd", "sd"
    if isinstance(kind, Int):
        return method, option.default + 1
    if isinstance(kind, Float):
        return method, 0.5 if option.default != 0.5 else 0.25
    if isinstance(kind, Choice):
        return method, next(c for c in kind.choices if c != option.default)
    if isinstance(kind, Shape):
        return method, (2, 2, 1)
    if isinstance(kind, Flag):
        return method, not option.default
    return method, "decision-smollm2-soft"


@pytest.mark.parametrize("name", list(OPTIONS))
def test_every_value_an_option_refuses_is_one_clear_line(name):
    option = OPTIONS[name]
    for bad in bad_values(option):
        with pytest.raises(OptionsError) as info:
            DecoderOptions.parse({name: bad})
        assert len(info.value.problems) == 1 and "\n" not in str(info.value), (name, bad, info.value.problems)
        problem = info.value.problems[0]
        assert option.title in problem or "tree shape" in problem or "branching factor" in problem, problem
        assert len(problem) < 240, problem


@pytest.mark.parametrize("name", list(OPTIONS))
def test_a_wrong_typed_value_is_refused_by_validate_too(name):
    """Python callers construct DecoderOptions directly: validate() checks what parse() would have."""
    option = OPTIONS[name]
    wrong = {Int: 1.5, Float: "0.5", Choice: 3, Shape: "4,2", Flag: 1, Ref: 7}[type(option.kind)]
    with pytest.raises(OptionsError, match=option.title):
        DecoderOptions(**{name: wrong}).validate()


def test_the_defaults_are_valid_and_every_problem_is_reported_at_once():
    DecoderOptions().validate()
    with pytest.raises(OptionsError) as info:
        DecoderOptions.parse(dict(gamma=0, k_config="4,0", temperature=11, stop="later", lookup=-1, seed=-1,
                                  colour="red"))
    assert len(info.value.problems) == 7 and str(info.value) == "; ".join(info.value.problems)
    assert "unknown option 'colour'" in info.value.problems


def test_limits_are_written_once_and_say_why():
    assert all(OPTIONS[name].kind.high == MAX_TREE_NODES for name in ("gamma", "width", "depth", "lookup"))
    with pytest.raises(OptionsError, match="prompt lookup must lie in \\[0, 256\\] \\(256 is the tree-node limit\\)"):
        DecoderOptions(method="sd", lookup=257).validate()
    for options, nodes in ((DecoderOptions(k_config=(16, 16)), 272), (DecoderOptions(method="ti-mcsd", width=64,
                                                                                      depth=8), 576),
                           (DecoderOptions(method="sd", gamma=256), None), (DecoderOptions(method="pld"), None)):
        if nodes is None:
            options.validate()
        else:
            with pytest.raises(OptionsError, match=f"the tree has {nodes} nodes; the limit is {MAX_TREE_NODES}"):
                options.validate()
    with pytest.raises(OptionsError, match="the limit is"):  # arithmetic only: no tree is built first
        DecoderOptions.parse({"k_config": "99999,99999,99999"}).validate()


def test_a_method_refuses_the_options_it_does_not_read_and_for_method_drops_them():
    mixed = DecoderOptions(method="ti-mcsd", gamma=7, lookup=4, k_config=(2, 2), width=2)
    with pytest.raises(OptionsError) as info:
        mixed.validate()
    assert info.value.problems == ["ti-mcsd takes no gamma (it is for sd)",
                                   "ti-mcsd takes no tree shape (it is for mcsd)",
                                   "ti-mcsd takes no prompt lookup (it is for sd, mcsd, pld, recycle, dynamic)"]
    kept = mixed.for_method()
    assert kept.validate() == DecoderOptions(method="ti-mcsd", width=2)
    assert mixed.for_method("sd") == DecoderOptions(method="sd", gamma=7, lookup=4)
    assert DecoderOptions(method="ar", temperature=0.5, seed=3).validate().branching() == ()


def test_each_method_builds_its_own_tree():
    assert DecoderOptions(method="sd", gamma=3).branching() == (1, 1, 1)
    assert DecoderOptions(k_config=(3, 2)).branching() == (3, 2)
    assert DecoderOptions(method="ti-mcsd", width=3, depth=2).branching() == (3, 1, 1)
    assert DecoderOptions(method="ti-mcsd", ti_k_config=(2, 4, 1)).branching() == (2, 4, 1)
    assert DecoderOptions(method="pld").branching() == (1,) * 8  # pld's lookup 0 means 8
    assert DecoderOptions(method="pld", lookup=5).branching() == (1,) * 5
    with pytest.raises(OptionsError, match="at least one draft level after its roots"):
        DecoderOptions(method="ti-mcsd", ti_k_config=(3,)).validate()


# -- every surface is derived from the table ----------------------------------------------------------------------

def test_every_option_has_a_cli_flag_in_generate_and_bench():
    parser = build_parser()
    generate, bench = (parser._subparsers._group_actions[0].choices[c] for c in ("generate", "bench"))
    for name, option in OPTIONS.items():
        for command, sub in (("generate", generate), ("bench", bench)):
            if command == "bench" and name == "method":
                continue  # the bench names its methods in --methods
            action = next((a for a in sub._actions if option.flag in a.option_strings), None)
            assert action is not None and action.dest == name, (command, name)
            assert option.help.split(":")[0] in (action.help or ""), (command, name)


def test_every_option_a_method_reads_has_a_bench_key_for_it():
    for name, option in OPTIONS.items():
        if option.methods == METHODS:  # read by every method: the bench sets it for all (--temperatures, --seed)
            assert option.bench_key is None, name
            continue
        assert option.bench_key, name
        for method in option.methods:
            assert bench_specs.spec_option(method, option.bench_key) is option, (method, name)
            assert option.bench_key in bench_specs.METHOD_OPTIONS[method]
        assert option.bench_key in bench_specs.OPTION_HELP
    for method in METHODS:  # no key sets two options of one method
        keys = [o.bench_key for o in OPTIONS.values() if o.bench_key and o.read_by(method)]
        assert len(keys) == len(set(keys)), method


def test_every_option_has_an_app_control_with_its_label_range_and_help():
    import app
    from ui.controls import CONTROL_NAMES

    assert set(OPTIONS) <= set(CONTROL_NAMES)
    demo = app.build_app("tiny-random")
    parameters = {p["parameter_name"]: p for p in demo.get_api_info()["named_endpoints"]["/step"]["parameters"]}
    for name, option in OPTIONS.items():
        assert parameters[name]["label"] == option.label, name
        assert parameters[name]["parameter_has_default"], f"{name}: an API client may leave it out"
        assert parameters[name]["parameter_default"] == option.record(option.default), name
    for name, option in OPTIONS.items():
        if option.widget == "slider":
            low, high, _ = option.ui_range
            kind = option.kind
            assert kind.low <= low <= option.default <= high, name
            assert kind.high is None or high <= kind.high, name
        if option.widget == "radio" or (option.widget == "dropdown" and isinstance(option.kind, Choice)):
            assert isinstance(option.kind, Choice), name


@pytest.mark.parametrize("name", list(OPTIONS))
def test_every_option_survives_a_trace_record(name):
    method, value = non_default(OPTIONS[name])
    options = DecoderOptions(**{"method": method, name: value}).validate()
    record = options.to_record()
    assert DecoderOptions.from_record(record) == options
    assert options_of_run(method, {"branching": [1], "options": record}) == options
    assert all(v is None or isinstance(v, (str, int, float, bool)) for v in record.values()), "JSON values"
    assert DecoderOptions.from_record({k: v for k, v in record.items() if k != name}) == replace_default(options,
                                                                                                        name)


def replace_default(options, name):
    return replace(options, **{name: OPTIONS[name].default})


def test_a_record_that_is_not_one_is_refused():
    for bad in ([], "x", {"gamma": "many"}, {"nonsense": 1}):
        with pytest.raises(OptionsError):
            DecoderOptions.from_record(bad)


# -- the bench's spec syntax means what the CLI's flags mean --------------------------------------------------------

EQUIVALENT = [
    ("sd:gamma=3", ["--method", "sd", "--gamma", "3"]),
    ("mcsd:k=4,2,2,1:stop=confidence:th=0.3", ["--k-config", "4,2,2,1", "--stop", "confidence", "--threshold", "0.3"]),
    ("mcsd+dyn", ["--stop", "confidence"]),
    ("mcsd:replacement=1:lookup=4:ngram=1", ["--with-replacement", "--lookup", "4", "--lookup-ngram", "1"]),
    ("mcsd:dyn=1", ["--dynamic-depth"]),
    ("ti-mcsd:w=2:d=3", ["--method", "ti-mcsd", "--width", "2", "--depth", "3"]),
    ("ti-mcsd:k=2,4,1:replacement=1", ["--method", "ti-mcsd", "--ti-k-config", "2,4,1", "--with-replacement"]),
    ("pld:lookup=5:ngram=1", ["--method", "pld", "--lookup", "5", "--lookup-ngram", "1"]),
    ("sd:draft=features:stop=decision:decision=decision-smollm2-soft",
     ["--method", "sd", "--draft-kind", "features", "--stop", "decision", "--decision-model", "decision-smollm2-soft"]),
    ("ar", ["--method", "ar"]),
]


@pytest.mark.parametrize("spec, flags", EQUIVALENT, ids=[s for s, _ in EQUIVALENT])
def test_a_bench_spec_is_the_same_options_as_the_equivalent_flags(spec, flags):
    parser = build_parser()
    base = options_from_args(parser.parse_args(["bench", "--prompts", "x"]))
    from_spec = bench_specs.decoder_options(base, bench_specs.parse_method(spec))
    from_flags = options_from_args(parser.parse_args(["generate", *flags])).validate()
    assert from_spec == from_flags


def test_recipes_are_valid_option_overrides():
    for name, values in RECIPES.items():
        assert set(values) <= set(OPTIONS), name
        assert all(OPTIONS[key].group != "sampling" for key in values), f"{name}: a recipe leaves sampling alone"
        options = DecoderOptions(**values).validate()
        assert options == DecoderOptions.parse({k: OPTIONS[k].record(v) for k, v in values.items()}), name


def test_a_recipe_written_once_is_the_same_configuration_in_the_app_the_bench_and_the_scripts(tiny_pair, capsys):
    """The app's menu sets RECIPES' values; the bench runs `Recipe.bench_spec()`, written out or named as
    `recipe=KEY` (scripts/gpu_check.sh), and `dynasd recipes --spec` prints it: each must make the same decoder."""
    from dynasd import cli
    from dynasd.bench.presets import PAPER_METHODS
    from dynasd.decoders import make_decoder
    from dynasd.recipes import ALL

    for recipe in ALL:
        in_the_app = make_decoder(tiny_pair, DecoderOptions(**recipe.values).validate())
        spec = bench_specs.parse_method(recipe.bench_spec())
        in_the_bench = make_decoder(tiny_pair, bench_specs.decoder_options(DecoderOptions(), spec))
        made = lambda d: (d.method, d.shape and d.shape.branching, d.dynamic_depth, d.stop.name,  # noqa: E731
                          d.stop.threshold, d.lookup, d.without_replacement, d.recycle,
                          d.draft_model is tiny_pair.draft, d.options.nodes, d.options.depth, d.options.expand)
        assert made(in_the_bench) == made(in_the_app), recipe.key
        assert bench_specs.parse_method(f"recipe={recipe.key}") == spec
        assert cli.main(["recipes", "--spec", recipe.key]) == 0
        assert capsys.readouterr().out.strip() == recipe.bench_spec()
    assert all(recipe.bench_spec() in PAPER_METHODS for recipe in ALL if recipe.key not in ("pld", "sd", "dynamic"))


def test_ui_values_are_coerced_like_the_app_sends_them():
    options = DecoderOptions.parse(dict(gamma=3.0, width="2", threshold="0.25", with_replacement="true",
                                        k_config=" 3, 2 ,1 ", ti_k_config="", decision_model="  "))
    assert (options.gamma, options.width, options.threshold, options.with_replacement) == (3, 2, 0.25, True)
    assert (options.k_config, options.ti_k_config, options.decision_model) == ((3, 2, 1), None, None)
    assert math.isclose(DecoderOptions.parse({"temperature": 1}).temperature, 1.0)
