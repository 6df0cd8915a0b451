"""Every decoder option, written once: its default, type, range or choices, help text, the methods that read it,
its bench-spec key and its app label. Every surface is derived from this module:

  CLI        `add_option_arguments` gives each option a flag (`k_config` -> `--k-config`); `options_from_args`
  bench      a method spec's `key=value` sets the option whose `bench_key` is `key` (dynasd/bench/specs.py)
  explorer   one control per option (app.py), the explorer's Settings (dynasd/explorer/inputs.py)
  traces     `DecoderOptions.to_record()` is written into RunTrace.config["options"]; `options_of_run` reads it back

so a new option is one field of `DecoderOptions` and nothing else. The module also holds the model-pair flags
shared by the commands (`add_model_arguments`, `load_pair_from`).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from .loading.models import ARITHMETICS, DEFAULT_ARITHMETIC, DEFAULT_WEIGHTS, WEIGHT_MODES, load_pair
from .ranges import Float, Int
from .sampling import TEMPERATURE, TOP_K, TOP_P, SamplingConfig
from .stopping.policies import DEFAULT_DECISION_MODEL, DEFAULT_THRESHOLD, STOP_POLICIES
from .tree import TreeShape, parse_branching

METHODS = ("ar", "sd", "mcsd", "ti-mcsd", "pld", "recycle", "dynamic")
DRAFTING = ("sd", "mcsd", "ti-mcsd")        # methods that read the draft options
LOOKING_UP = ("sd", "mcsd", "pld", "recycle", "dynamic")  # methods with prompt lookup (draft-rooted trees)
RECYCLING = ("sd", "mcsd", "pld", "recycle", "dynamic")   # methods that can join Token Recycling (sources/recycling.py)
# "default": the pair's own choice (ModelPair.default_draft_kind), resolved when a decoder is made; the trace keeps
# the option as given, so that a saved run gives back its settings
DRAFT_KINDS = ("default", "tokens", "features")
# Defaults an option had before: records written then carry them for every method, also those that read none.
FORMER_DEFAULTS = {"draft_kind": "tokens"}
DEFAULT_PLD_TOKENS = 8                      # pld's chain when its lookup is 0
DEFAULT_RECYCLE = (4, 2, 1)                 # the recycle method's tree when its recycle option is unset
MCSD_TREE = (4, 2, 2, 1)                    # MCSD's static tree (Yang et al. 2024): the default k_config, and the
                                            # MCSD of the paper preset and the recipe
MAX_TREE_NODES = 256                        # the verify forward's largest tree, and a loaded trace's
MAX_SHAPE_CHARS = 200                       # a tree shape's text ("4,2,2,1")
MAX_REF_CHARS = 300                         # a model or decision-model reference (hub id or path)
MAX_SEED = 2**63 - 1
DEFAULT_MAX_NEW_TOKENS = 64                 # a run's token budget unless told: the app, the CLI, the bench
TREE_LIMIT = f"{MAX_TREE_NODES} is the tree-node limit"


class OptionsError(ValueError):
    """Bad decoder options; `problems` holds one line per problem, the message all of them."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = list(problems)


# ---------------------------------------------------------------------------------------------------------------
# kinds of value: how text or a UI value becomes the option's type, and what a valid value is

class Flag:
    TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")

    def coerce(self, raw, title: str) -> bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in self.TRUE + self.FALSE:
            return raw.strip().lower() in self.TRUE
        if isinstance(raw, int) and raw in (0, 1):
            return bool(raw)
        raise ValueError(f"{title} must be 1 or 0 (true or false), got {str(raw)[:30]!r}")

    def problem(self, value, title: str) -> str | None:
        return None if isinstance(value, bool) else f"{title} must be true or false, got {value!r}"


class Choice:
    def __init__(self, choices: tuple[str, ...]) -> None:
        self.choices = tuple(choices)

    def coerce(self, raw, title: str) -> str:
        return raw.strip() if isinstance(raw, str) else raw

    def problem(self, value, title: str) -> str | None:
        if value in self.choices and isinstance(value, str):
            return None
        shown = repr(value[:40]) if isinstance(value, str) else repr(value)[:40]
        return f"unknown {title} {shown} (use {', '.join(self.choices)})"


class Shape:
    """A tree shape such as (4, 2, 2, 1), written "4,2,2,1"; `optional`: None (written "") means not set."""

    def __init__(self, optional: bool = False) -> None:
        self.optional = optional

    def coerce(self, raw, title: str) -> tuple[int, ...] | None:
        if isinstance(raw, tuple) or (raw is None and self.optional):
            return raw  # already a shape (or not set); problem() checks it
        if not isinstance(raw, str):
            raise ValueError(f"{title} must be text such as 4,2,2,1, got a {type(raw).__name__}")
        text = raw.strip()
        if self.optional and not text:
            return None
        if len(text) > MAX_SHAPE_CHARS:
            raise ValueError(f"the tree shape is {len(text)} characters long; the limit is {MAX_SHAPE_CHARS}")
        return parse_branching(text)

    def problem(self, value, title: str) -> str | None:
        if value is None and self.optional:
            return None
        if not (isinstance(value, tuple) and value and all(isinstance(k, int) and not isinstance(k, bool)
                                                           for k in value)):
            return f"{title} must be a tuple of whole numbers such as (4, 2, 2, 1), got {value!r}"[:200]
        if any(k < 1 for k in value):
            return f"every branching factor must be at least 1, got '{self.text(value)}'"
        return None

    @staticmethod
    def text(value: tuple[int, ...] | None) -> str:
        return "" if value is None else ",".join(str(k) for k in value)


class Ref:
    """A folder or a name (a decision model); None (written "") means the default."""

    def coerce(self, raw, title: str) -> str | None:
        if raw is None:
            return None
        if not isinstance(raw, str):
            raise ValueError(f"{title} must be text, got a {type(raw).__name__}")
        return raw.strip() or None

    def problem(self, value, title: str) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            return f"{title} must be text, got {value!r}"
        if len(value) > MAX_REF_CHARS:
            return f"{title} may have at most {MAX_REF_CHARS} characters"
        return None


# ---------------------------------------------------------------------------------------------------------------
# the table

@dataclass(frozen=True)
class Option:
    """One decoder option as data. `name` and `default` come from its DecoderOptions field.

    methods    the methods that read it; a method that does not read an option refuses a non-default value
    title      how messages name it ("prompt lookup must lie in ...")
    bench_key  its key in a bench method spec (`mcsd:k=4,2,2,1`), None when the bench sets it for every method
    label      the app control's label; `group` its accordion; `widget` and `ui_range` (low, high, step) its kind
    """

    kind: Any
    help: str
    methods: tuple[str, ...]
    title: str
    label: str
    group: str
    widget: str
    bench_key: str | None = None
    ui_range: tuple[float, float, float] | None = None
    name: str = ""
    default: Any = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def coerce(self, raw):
        """The typed value from text (CLI, bench spec), a UI value or a record; ValueError names the option."""
        value = self.kind.coerce(raw, self.title)
        problem = self.kind.problem(value, self.title)
        if problem:
            raise ValueError(problem)
        return value

    def record(self, value):
        """JSON for a trace record and the app's controls: a shape as "4,2,2,1", an unset shape or reference as ""."""
        if isinstance(self.kind, Shape):
            return Shape.text(value)
        if isinstance(self.kind, Ref):
            return value or ""
        return value

    def read_by(self, method: str) -> bool:
        return method in self.methods

    def described(self) -> str:
        """The help text with the methods that read it, as the CLI and the bench print it."""
        return self.help if self.methods == METHODS else f"{', '.join(self.methods)}: {self.help}"


def option(default, kind, help_text: str, methods: tuple[str, ...], title: str, label: str, group: str, widget: str,
           bench_key: str | None = None, ui_range: tuple | None = None):
    """A DecoderOptions field and its Option: the one place an option is written."""
    return field(default=default, metadata={"option": Option(kind, help_text, methods, title, label, group, widget,
                                                             bench_key, ui_range)})


@dataclass(frozen=True)
class DecoderOptions:
    """Everything that shapes a decoder. Construct with typed values; `parse` builds one from text or UI values.
    `validate()` raises OptionsError listing every problem (make_decoder calls it)."""

    method: str = option(
        "mcsd", Choice(METHODS), "decoding method: ar (the target alone), sd (a draft chain), mcsd (a draft tree), "
        "ti-mcsd (target-initialized chains, lossy when width > 1), pld (prompt lookup, no draft model), "
        "recycle (Token Recycling: the target's own earlier predictions, no draft model), dynamic (a draft tree grown "
        "each step where the draft's cumulative probability is highest, EAGLE-2-style)",
        METHODS, "method", "Method", "method", "radio")
    gamma: int = option(
        4, Int(1, MAX_TREE_NODES, TREE_LIMIT), "draft chain length", ("sd",), "gamma", "γ: draft chain length",
        "method", "slider", "gamma", (1, 12, 1))
    k_config: tuple[int, ...] = option(
        MCSD_TREE, Shape(), "tree shape: children per node at each level, e.g. 4,2,2,1 or 2,2,2,2,2", ("mcsd",),
        "tree shape", "Tree shape (k-config)", "method", "textbox", "k")
    width: int = option(
        4, Int(1, MAX_TREE_NODES, TREE_LIMIT), "number of target-initialized chains", ("ti-mcsd",), "width",
        "Width: target-initialized chains", "method", "slider", "w", (1, 16, 1))
    depth: int = option(
        4, Int(1, MAX_TREE_NODES, TREE_LIMIT), "ti-mcsd: draft tokens per chain; dynamic: the deepest level (one "
        "draft forward per level)", ("ti-mcsd", "dynamic"), "depth", "Depth: draft tokens per chain (ti-mcsd), "
        "deepest level (dynamic)", "method", "slider", "d", (1, 12, 1))
    nodes: int = option(
        16, Int(1, MAX_TREE_NODES, TREE_LIMIT), "the dynamic tree's node budget: each of its depth waves draws "
        "the nodes/depth most probable next candidates anywhere in the tree", ("dynamic",), "node budget",
        "Node budget (dynamic)", "method", "slider", "nodes", (1, 64, 1))
    expand: int = option(
        4, Int(1, MAX_TREE_NODES, TREE_LIMIT), "the dynamic tree's expansion top-k: the most children one node may "
        "get", ("dynamic",), "expansion top-k", "Expansion top-k: most children per node (dynamic)", "method",
        "slider", "topk", (1, 8, 1))
    ti_k_config: tuple[int, ...] | None = option(
        None, Shape(optional=True), "a general static target-initialized shape instead of width and depth, e.g. "
        "2,4,4,1,1 (level 1 from the target, the rest from the draft)", ("ti-mcsd",), "target-initialized shape",
        "Target-initialized shape (ti-mcsd; empty = width and depth)", "advanced", "textbox", "k")
    with_replacement: bool = option(
        False, Flag(), "draw siblings with replacement (lossless either way; without is the default)",
        ("mcsd", "ti-mcsd"), "with replacement", "Draw siblings with replacement", "advanced", "checkbox",
        "replacement")
    lookup: int = option(
        0, Int(0, MAX_TREE_NODES, TREE_LIMIT), "prompt lookup: when the last n-gram occurred earlier in the context, "
        "propose up to this many tokens that followed it instead of running the draft model (0 = off; pld: 0 "
        f"means {DEFAULT_PLD_TOKENS}; at most {MAX_TREE_NODES}, the tree-node limit: a looked-up chain is verified "
        "like a tree)", LOOKING_UP, "prompt lookup", "Prompt lookup (sd, mcsd, pld; 0 = off)", "method", "slider",
        "lookup", (0, 16, 1))
    lookup_ngram: int = option(
        2, Int(1, 32), "prompt lookup: the shortest n-gram that may match", LOOKING_UP, "prompt lookup n-gram",
        "Prompt lookup: shortest matching n-gram", "advanced", "slider", "ngram", (1, 8, 1))
    recycle: tuple[int, ...] | None = option(
        None, Shape(optional=True), "Token Recycling: a tree of the target's own earlier top-k predictions, children "
        "per node at each level, e.g. 4,2,1, verified with the other candidates (empty = off; the recycle method "
        f"uses {','.join(map(str, DEFAULT_RECYCLE))} when empty)", RECYCLING, "token recycling",
        "Token Recycling tree (empty = off)", "advanced", "textbox", "recycle")
    draft_kind: str = option(
        "default", Choice(DRAFT_KINDS), "default (the pair's own: its feature draft where it ships a trained one, "
        "else its token draft), tokens (the pair's token draft) or features (its feature draft, which also reads "
        "the target's hidden state of the previous token, EAGLE-style; dynasd/loading/feature_model.py); lossless "
        "either way",
        DRAFTING, "draft kind", "Draft (sd, mcsd, ti-mcsd)", "method", "radio", "draft")
    dynamic_depth: bool = option(
        False, Flag(), "let a stop policy end drafting early (a stop policy other than none implies it)", DRAFTING,
        "dynamic depth", "Dynamic depth (let a stop policy end drafting)", "dynamic", "checkbox", "dyn")
    stop: str = option(
        "none", Choice(STOP_POLICIES), "stop policy (dynasd/stopping/policies.py): confidence stops when the draft's "
        "top probability falls below the threshold; decision asks a trained classifier; cumulative multiplies the "
        "predictions along each chain", DRAFTING, "stop policy", "Stop policy", "dynamic", "dropdown", "stop")
    threshold: float = option(
        DEFAULT_THRESHOLD, Float(0.0, 1.0), "stop-policy threshold: drafting goes on while some tip scores at "
        "least this",
        DRAFTING, "threshold", "Threshold", "dynamic", "slider", "th", (0.0, 1.0, 0.05))
    decision_model: str | None = option(
        None, Ref(), "decision model for stop=decision or cumulative: a shipped one by name (assets/"
        f"decision-*) or a folder of a trained one (default: {DEFAULT_DECISION_MODEL})", DRAFTING, "decision model",
        "Decision model (stop = decision or cumulative)", "advanced", "dropdown", "decision")
    temperature: float = option(
        0.0, TEMPERATURE, "sampling temperature (0 = greedy)", METHODS, "temperature",
        "Temperature (0 = greedy)", "sampling", "slider", None, (0.0, 2.0, 0.05))
    top_p: float = option(
        1.0, TOP_P, "nucleus sampling: keep the most probable tokens up to this mass "
        "(1 = off)", METHODS, "top-p", "Top-p", "sampling", "slider", None, (0.05, 1.0, 0.05))
    top_k: int = option(
        0, TOP_K, "keep only the k most probable tokens (0 = off)", METHODS, "top-k", "Top-k (0 = off)", "sampling",
        "slider", None, (0, 200, 1))
    seed: int = option(
        0, Int(0, MAX_SEED, "2^63 - 1"), "seed of the random draws (generate --runs: seed..seed+N-1; bench: prompt i "
        "is decoded with seed+i)", METHODS, "seed", "Seed", "sampling", "number")

    # -- from and to the surfaces ------------------------------------------------------------------------------
    @classmethod
    def parse(cls, values: Mapping[str, Any]) -> "DecoderOptions":
        """Options from text or UI values by name (missing ones keep their defaults); every value is checked on its
        own (type, range, choices) and every problem reported at once. Method-level checks are validate()'s."""
        problems, typed = [], {}
        for name, raw in values.items():
            if name not in OPTIONS:
                problems.append(f"unknown option '{str(name)[:40]}'")
                continue
            try:
                typed[name] = OPTIONS[name].coerce(raw)
            except ValueError as exc:
                problems.append(str(exc))
        if problems:
            raise OptionsError(problems)
        return cls(**typed)

    def to_record(self) -> dict:
        """JSON-ready, for RunTrace.config["options"]; `from_record` gives the same options back."""
        return {o.name: o.record(getattr(self, o.name)) for o in OPTIONS.values()}

    @classmethod
    def from_record(cls, record) -> "DecoderOptions":
        """Options from `to_record`'s dict, validated; options missing from an older record keep their defaults."""
        if not isinstance(record, dict):
            raise OptionsError(["the recorded options are not an object"])
        options = cls.parse(record)
        # an option a method does not read, recorded at a default it has since changed from, is that default
        stale = [name for name, former in FORMER_DEFAULTS.items()
                 if getattr(options, name) == former and not OPTIONS[name].read_by(options.method)]
        options = replace(options, **{name: OPTIONS[name].default for name in stale})
        options.validate()
        return options

    def values(self) -> dict:
        return {o.name: getattr(self, o.name) for o in OPTIONS.values()}

    # -- what a method makes of them ---------------------------------------------------------------------------
    def for_method(self, method: str | None = None) -> "DecoderOptions":
        """These options for `method` (default: their own): the options it does not read go back to their
        defaults. For surfaces that hold every option at once (the app's controls, the bench's command line)."""
        method = method or self.method
        return replace(self, method=method, **{o.name: o.default for o in OPTIONS.values() if not o.read_by(method)})

    def branching(self) -> tuple[int, ...]:
        """The method's largest static tree: sd a chain of gamma; mcsd k_config; ti-mcsd ti_k_config when given,
        else the fork (width, 1 * depth); pld the lookup chain; ar and dynamic none."""
        if self.method == "sd":
            return (1,) * self.gamma
        if self.method == "mcsd":
            return self.k_config
        if self.method == "ti-mcsd":
            return self.ti_k_config or (self.width,) + (1,) * self.depth
        if self.method == "pld":
            return (1,) * self.lookup_tokens
        if self.method == "recycle":
            return self.recycle or DEFAULT_RECYCLE
        return ()  # ar, and dynamic: its tree is grown anew every step (`nodes`, `depth`, `expand`)

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    @property
    def lookup_tokens(self) -> int:
        """Most looked-up tokens per step: pld's 0 means DEFAULT_PLD_TOKENS."""
        if self.method == "pld" and not self.lookup:
            return DEFAULT_PLD_TOKENS
        return self.lookup

    def problems(self) -> list[str]:
        """Every problem, one line each: each value on its own, then (when those are fine) the method's."""
        problems = [p for o in OPTIONS.values() if (p := o.kind.problem(getattr(self, o.name), o.title))]
        if problems:
            return problems
        for o in OPTIONS.values():
            if not o.read_by(self.method) and getattr(self, o.name) != o.default:
                problems.append(f"{self.method} takes no {o.title} (it is for {', '.join(o.methods)})")
        if self.method == "ti-mcsd" and self.ti_k_config is not None and len(self.ti_k_config) < 2:
            problems.append("a target-initialized tree needs at least one draft level after its roots")
        branching = self.branching()
        if branching:
            nodes = TreeShape(branching).num_nodes  # arithmetic only: no tree is built to be told it is too big
            if nodes > MAX_TREE_NODES:
                problems.append(f"the tree has {nodes} nodes; the limit is {MAX_TREE_NODES}")
        return problems

    def validate(self) -> "DecoderOptions":
        problems = self.problems()
        if problems:
            raise OptionsError(problems)
        return self


OPTIONS: dict[str, Option] = {f.name: replace(f.metadata["option"], name=f.name, default=f.default)
                              for f in fields(DecoderOptions)}


def tree_of_run(method: str, config: dict) -> TreeShape | None:
    """The largest tree of a run (None: ar, or a config that does not say), from its trace config."""
    try:
        options = options_of_run(method, config)
    except (OptionsError, TypeError, ValueError):
        return None
    branching = options.branching()
    return TreeShape(branching, target_roots=options.method == "ti-mcsd") if branching else None


def options_of_run(method: str, config: dict) -> DecoderOptions:
    """The options a run was made with, from its RunTrace.config: the "options" record every decoder writes, or for
    a trace saved before there was one, the decoder's own description it had then (its names: branching, lookup,
    lookup_min_ngram, without_replacement, feature_draft...). Raises OptionsError."""
    if not isinstance(config, dict):
        raise OptionsError(["the trace's config is not an object"])
    if "options" in config:
        return DecoderOptions.from_record(config["options"])
    record = {"method": method, **{name: config[name] for name in ("temperature", "top_p", "top_k", "seed")
                                   if name in config}}
    if method in DRAFTING:
        record.update(stop=config.get("stop", "none"), threshold=config.get("threshold", DEFAULT_THRESHOLD),
                      dynamic_depth=config.get("dynamic_depth", False),
                      draft_kind="features" if config.get("feature_draft") else "tokens")
    if method in LOOKING_UP:
        record.update(lookup=config.get("lookup", 0), lookup_ngram=config.get("lookup_min_ngram", 2))
    if method in ("mcsd", "ti-mcsd"):
        record["with_replacement"] = not config.get("without_replacement", True)
    branching = config.get("branching")
    if isinstance(branching, list) and branching:
        if method == "sd":
            record["gamma"] = len(branching)
        elif method == "mcsd":
            record["k_config"] = Shape.text(branching)
        elif method == "ti-mcsd" and len(branching) > 1 and set(branching[1:]) == {1}:
            record.update(width=branching[0], depth=len(branching) - 1)
        elif method == "ti-mcsd":
            record["ti_k_config"] = Shape.text(branching)
    return DecoderOptions.from_record(record)


# Every feature draft's label (ModelPair.feature_draft_label, the decoder's) says so: a trace of draft kind "default"
# read without its pair is told by its draft_label which draft it ran.
FEATURE_DRAFT_MARK = "feature draft"


def draft_that_runs(options: DecoderOptions, default_kind: str = "tokens") -> str:
    """The kind of draft these options run, "features" (the pair's feature draft) or "tokens": "features" asked
    for, or "default" on a pair whose default draft kind (ModelPair.default_draft_kind) is "features" (the
    embedded pair's); "tokens" for a method that runs no draft model."""
    kind = default_kind if options.draft_kind == "default" else options.draft_kind
    return "features" if OPTIONS["draft_kind"].read_by(options.method) and kind == "features" else "tokens"


def draft_that_ran(method: str, config: dict, draft_label: str = "") -> str:
    """The kind of draft whose forwards a run's were (draft_that_runs): "features" (it reads the target's hidden
    states) or "tokens"; its options say so, or, for draft kind "default", its draft label does; a trace whose
    options cannot be read ran a token draft (the only kind it had)."""
    try:
        options = options_of_run(method, config)
    except OptionsError:
        return "tokens"
    return draft_that_runs(options, "features" if FEATURE_DRAFT_MARK in draft_label else "tokens")


# ---------------------------------------------------------------------------------------------------------------
# the command line

def add_option_arguments(p: argparse.ArgumentParser, exclude: tuple[str, ...] = ()) -> None:
    """One flag per option (`k_config` -> `--k-config`), with its default and help."""
    for o in OPTIONS.values():
        if o.name in exclude:
            continue
        shown = o.record(o.default)
        help_text = o.described() + ("" if shown is None or shown == "" else f" (default: {shown})")
        if isinstance(o.kind, Flag):
            p.add_argument(o.flag, action=argparse.BooleanOptionalAction, default=o.default, help=o.described())
        elif isinstance(o.kind, Choice):
            p.add_argument(o.flag, default=o.default, choices=o.kind.choices, help=help_text)
        elif isinstance(o.kind, (Int, Float)):
            p.add_argument(o.flag, type=int if isinstance(o.kind, Int) else float, default=o.default,
                           help=help_text)
        else:  # shapes and references stay text until options_from_args, which says what is wrong with them
            p.add_argument(o.flag, default=o.record(o.default), help=help_text)


def options_from_args(args: argparse.Namespace, **overrides) -> DecoderOptions:
    """The options the command line sets (flags a command does not have keep their defaults), not yet validated
    for the method: validate() or make_decoder does that."""
    values = {name: getattr(args, name) for name in OPTIONS if hasattr(args, name)}
    return DecoderOptions.parse({**values, **overrides})


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pair", default=None, help="embedded (default), tiny-random, or a preset name")
    p.add_argument("--target", default=None, help="target model: hub id, local folder or .gguf file")
    p.add_argument("--draft", default=None, help="draft model: hub id, local folder or .gguf file")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu or cuda")
    p.add_argument("--dtype", default="auto", help="fp32 (default), bf16 or fp16")
    p.add_argument("--weights", default=DEFAULT_WEIGHTS, choices=WEIGHT_MODES,
                   help="how a GGUF target's weights are held on CPU: gguf (default: the file's 4- and 8-bit blocks, "
                        "where this CPU has AVX-512 or AVX2; the same values, a fifth of the bytes) or fp32 "
                        "(transformers' float32 copy)")
    p.add_argument("--arithmetic", default=DEFAULT_ARITHMETIC, choices=ARITHMETICS,
                   help="what block weights compute in on CPU: int8 (default: each row quantized to 8-bit blocks, "
                        "exact integer products, so a verify row costs a fraction of a float32 one; ar uses it too) "
                        "or float32 (the expanded weights times the float rows)")


def load_pair_from(args: argparse.Namespace, fast_kernels: bool = True, compiled_kernel: bool = True,
                   weights: str | None = None, arithmetic: str | None = None):
    return load_pair(args.pair, args.target, args.draft, device=args.device, dtype=args.dtype,
                     fast_kernels=fast_kernels, compiled_kernel=compiled_kernel,
                     weights=weights or getattr(args, "weights", DEFAULT_WEIGHTS),
                     arithmetic=arithmetic or getattr(args, "arithmetic", DEFAULT_ARITHMETIC))
