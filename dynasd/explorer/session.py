"""Explorer sessions: one decoder per browser session, models shared and loaded once per process.

The app keeps only a session id in its (per-browser) state. Everything heavy lives here:
  PairCache        loads each model pair once and hands out one lock per pair; every model call runs under it,
                   so sessions sharing a pair take turns step by step (caches stay per decoder, never shared).
  Session          a decoder, its RunTrace and the settings it was built from; or a loaded trace to replay.
  SessionRegistry  bounded (max count) with a time-to-live; when full, the longest-idle session is evicted.

A failing model call marks only its own session failed; other sessions and the loaded models carry on.
Everything a user can send is checked here before any model is touched: the app shows the UserError's message.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import threading
import time
import types
import typing
import uuid
from dataclasses import dataclass, fields, is_dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

from ..decoders import MAX_TREE_NODES, METHODS, RequestError, make_decoder, tree_shape_for
from ..models import BUILTIN_PAIRS, PRESETS, ModelLoadError, ModelPair, load_pair
from ..sampling import SamplingConfig
from ..stopping import make_stop_policy
from ..trace import NODE_ORIGINS, RunTrace, StepTrace, TraceError
from ..tree import parse_branching

CUSTOM = "custom"
MAX_NEW_TOKENS_LIMIT = 512
MAX_PROMPT_CHARS = 20_000      # far above any context limit in tokens; refused before the tokenizer runs
MAX_SHAPE_CHARS = 200          # the k-config text box
MAX_MODEL_REF_CHARS = 300      # hub id or path of a custom model
MAX_SEED = 2**63 - 1
MAX_LOOKUP = 16              # looked-up tokens per step (the verify forward grows with them)
MAX_TRACE_STEPS = 4096         # a loaded trace; the app itself never makes more than MAX_NEW_TOKENS_LIMIT


# torch's default RNG is one per process. The seeded tiny-random pair is built by reseeding it, and any module
# construction (a decision model for a stop policy) draws from it: done in two threads at once, tiny-random gets
# other weights. Every model or module built on behalf of a session takes this lock.
MODEL_BUILD_LOCK = threading.Lock()


class UserError(ValueError):
    """Something the user can fix (bad setting, empty prompt, unknown model); the message is shown as is."""


@dataclass(frozen=True)
class Settings:
    """Every control of the explorer that shapes a run. Frozen and comparable: a change starts a new run."""

    pair: str = "embedded"
    target: str = ""
    draft: str = ""
    method: str = "mcsd"
    gamma: int = 4
    k_config: str = "4,2,2,1"
    width: int = 4
    depth: int = 4
    dynamic_depth: bool = False
    stop: str = "none"
    threshold: float = 0.4
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    seed: int = 0
    top_k: int = 0
    lookup: int = 0      # prompt lookup: most looked-up tokens per step (sd, mcsd; pld: 0 means 8); 0 = off
    feature_draft: bool = False  # sd/mcsd/ti-mcsd draw from the pair's feature draft (dynasd/feature_draft.py)

    @property
    def pair_key(self) -> str:
        return f"{self.target} + {self.draft}" if self.pair == CUSTOM else self.pair

    def normalised(self) -> "Settings":
        """Coerce UI values (sliders send floats) and check every one of them; raises UserError.

        Caps come before anything is built from a value: a gamma of 10**9 must not allocate a 10**9-level tree
        just to be told it is too big."""
        for name in ("pair", "method", "stop"):
            if not isinstance(getattr(self, name), str):
                raise UserError(f"bad setting: {name} must be a string")
        for name in ("target", "draft", "k_config"):
            if not isinstance(getattr(self, name), (str, type(None))):
                raise UserError(f"bad setting: {name} must be text")
        try:
            s = replace(self, gamma=_as_int("gamma", self.gamma), width=_as_int("width", self.width),
                        depth=_as_int("depth", self.depth), top_k=_as_int("top-k", self.top_k),
                        lookup=_as_int("prompt lookup", self.lookup),
                        max_new_tokens=_as_int("max new tokens", self.max_new_tokens),
                        seed=_as_int("seed", self.seed), threshold=_as_float("threshold", self.threshold),
                        temperature=_as_float("temperature", self.temperature),
                        top_p=_as_float("top-p", self.top_p), dynamic_depth=bool(self.dynamic_depth),
                        feature_draft=bool(self.feature_draft),
                        target=(self.target or "").strip(), draft=(self.draft or "").strip(),
                        k_config=(self.k_config or "").strip())
        except (TypeError, ValueError, OverflowError) as exc:
            raise UserError(f"bad setting: {exc}") from exc
        if s.method not in METHODS:
            raise UserError(f"unknown method '{s.method[:40]}' (use {', '.join(METHODS)})")
        if not 1 <= s.max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
            raise UserError(f"max new tokens must lie in [1, {MAX_NEW_TOKENS_LIMIT}], got {s.max_new_tokens}")
        for name, number in (("gamma", s.gamma), ("width", s.width), ("depth", s.depth)):
            if not 1 <= number <= MAX_TREE_NODES:
                raise UserError(f"{name} must lie in [1, {MAX_TREE_NODES}], got {number}")
        if len(s.k_config) > MAX_SHAPE_CHARS:
            raise UserError(f"the tree shape is {len(s.k_config)} characters long; the limit is {MAX_SHAPE_CHARS}")
        if not 0 <= s.lookup <= MAX_LOOKUP:
            raise UserError(f"prompt lookup must lie in [0, {MAX_LOOKUP}], got {s.lookup}")
        if not 0 <= s.seed <= MAX_SEED:
            raise UserError(f"seed must lie in [0, 2^63 - 1], got {s.seed}")
        if not 0.0 <= s.threshold <= 1.0:
            raise UserError(f"threshold must lie in [0, 1], got {s.threshold}")
        try:
            SamplingConfig(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
        except ValueError as exc:
            raise UserError(str(exc)) from exc
        if s.pair == CUSTOM:
            if not (s.target and s.draft):
                raise UserError("a custom pair needs both a target and a draft model id or path")
            if max(len(s.target), len(s.draft)) > MAX_MODEL_REF_CHARS:
                raise UserError(f"a model id or path may have at most {MAX_MODEL_REF_CHARS} characters")
        return s


def _as_int(name: str, value) -> int:
    """An integer from a UI value: 3, 3.0 and "3" are fine; 3.5, NaN, inf, True and "x" are not."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{name} must be a whole number, got {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"{name} must be a whole number, got {value!r}")
        return int(value)
    if isinstance(value, str):
        value = value.strip()
        if len(value) > 30:
            raise ValueError(f"{name} must be a whole number, got {value[:30]!r}...")
        return _as_int(name, float(value)) if "." in value or "e" in value.lower() else int(value)
    return int(value)


def _as_float(name: str, value) -> float:
    if isinstance(value, bool) or value is None or (isinstance(value, str) and len(value) > 30):
        raise ValueError(f"{name} must be a number, got {str(value)[:30]!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return number


def check_prompt(prompt) -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise UserError("the prompt is empty: type something or pick an example")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise UserError(f"the prompt has {len(prompt)} characters; the limit is {MAX_PROMPT_CHARS}")
    return prompt


def known_pairs() -> list[str]:
    return list(BUILTIN_PAIRS) + list(PRESETS)


class PairCache:
    """Model pairs by name, loaded once per process.

    `allow_custom=False` refuses any pair that is not built in or a preset, so strangers cannot make the server
    download or open arbitrary models. `model_dir` confines custom local models to one folder (symlinks and `..`
    are resolved first); with `allow_hub=False` as well, a custom model is always a name inside that folder, never
    a hub id: the public-server setting (DYNASD_PUBLIC=1 with DYNASD_MODEL_DIR)."""

    def __init__(self, loader: Callable[..., ModelPair] = load_pair, device: str = "auto", dtype: str = "auto",
                 allow_custom: bool = True, max_pairs: int = 3, model_dir: str | Path | None = None,
                 allow_hub: bool = True) -> None:
        self.loader = loader
        self.device = device
        self.dtype = dtype
        self.allow_custom = allow_custom
        self.max_pairs = max_pairs
        self.model_dir = Path(model_dir).expanduser().resolve() if model_dir else None
        self.allow_hub = allow_hub
        self._pairs: dict[str, ModelPair] = {}
        self._locks: dict[int, threading.Lock] = {}     # id(pair) -> lock: model calls on a pair take turns
        self._loading: dict[str, threading.Lock] = {}   # one per pair name while it loads: concurrent first uses
        self._guard = threading.Lock()

    def model_ref(self, ref: str) -> str:
        """The reference to hand to the loader; raises UserError for a path outside `model_dir`."""
        if self.model_dir is None:
            return ref
        path = Path(ref).expanduser()
        looks_local = path.suffix == ".gguf" or ref.startswith((".", "/", "~")) or path.exists()
        if self.allow_hub and not looks_local:
            return ref  # a hub id
        resolved = (path if path.is_absolute() else self.model_dir / path).resolve()
        if not resolved.is_relative_to(self.model_dir):
            raise UserError(f"'{ref}' is outside the server's model folder: custom models must be folders or "
                            ".gguf files inside it" + ("" if self.allow_hub else " (hub ids are turned off)"))
        if not resolved.exists():
            raise UserError(f"there is no model named '{ref}' in the server's model folder")
        return str(resolved)

    def get(self, settings: Settings) -> ModelPair:
        key = settings.pair_key
        if settings.pair == CUSTOM and not self.allow_custom:
            raise UserError("custom models are turned off on this server; pick one of: " + ", ".join(known_pairs()))
        if settings.pair != CUSTOM and settings.pair not in known_pairs():
            raise UserError(f"unknown model pair '{settings.pair[:60]}' (known: {', '.join(known_pairs())})")
        with self._guard:
            if key in self._pairs:
                return self._pairs[key]
            loading = self._loading.setdefault(key, threading.Lock())
        try:
            with loading:
                with self._guard:
                    if key in self._pairs:
                        return self._pairs[key]
                with MODEL_BUILD_LOCK:
                    pair = self._load(settings)
                with self._guard:
                    while len(self._pairs) >= self.max_pairs:  # sessions still using an evicted pair keep it
                        self._pairs.pop(next(iter(self._pairs)))
                    self._pairs[key] = pair
                    self._locks.setdefault(id(pair), threading.Lock())
                return pair
        finally:
            with self._guard:  # failed names must not pile up (every mistyped model id would leave a lock)
                if self._loading.get(key) is loading and not loading.locked():
                    del self._loading[key]

    def _load(self, settings: Settings) -> ModelPair:
        try:
            if settings.pair == CUSTOM:
                extra = {} if self.model_dir is None else {"allowed_root": self.model_dir}
                return self.loader(target=self.model_ref(settings.target), draft=self.model_ref(settings.draft),
                                   device=self.device, dtype=self.dtype, **extra)
            return self.loader(settings.pair, device=self.device, dtype=self.dtype)
        except UserError:
            raise
        except ModelLoadError as exc:
            raise UserError(str(exc)) from exc
        except Exception as exc:  # a corrupt file can fail anywhere inside transformers; the server stays up
            raise UserError(f"cannot load model pair '{settings.pair_key[:120]}': {_one_line(exc)}") from exc

    def lock_for(self, pair: ModelPair) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(id(pair), threading.Lock())

    def loaded(self) -> list[str]:
        with self._guard:
            return list(self._pairs)


def decoder_options(settings: Settings, method: str | None = None) -> dict:
    """make_decoder's keyword arguments from explorer settings, checked without any model (so a bad tree shape
    is refused before a model is loaded); every configuration problem becomes a UserError."""
    method = method or settings.method
    try:
        builds_a_module = settings.stop in ("decision", "cumulative")  # they load a decision model
        with MODEL_BUILD_LOCK if builds_a_module else contextlib.nullcontext():
            stop = make_stop_policy(settings.stop, settings.threshold)
        sampling = SamplingConfig(temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p)
        k_config = parse_branching(settings.k_config) if method == "mcsd" else (4, 2, 2, 1)
        if method not in ("ar", "pld"):  # pld's chain is capped by MAX_LOOKUP
            nodes = tree_shape_for(method, settings.gamma, k_config, settings.width, settings.depth).num_nodes
            if nodes > MAX_TREE_NODES:
                raise ValueError(f"the tree has {nodes} nodes; the limit is {MAX_TREE_NODES}")
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    return dict(method=method, sampling=sampling, seed=settings.seed, gamma=settings.gamma, k_config=k_config,
                width=settings.width, depth=settings.depth, dynamic_depth=settings.dynamic_depth, stop=stop,
                lookup=settings.lookup if method in ("sd", "mcsd", "pld") else 0,
                feature_draft=settings.feature_draft and method in ("sd", "mcsd", "ti-mcsd"))


def build_decoder(pair: ModelPair, settings: Settings, method: str | None = None):
    """A decoder from explorer settings; every configuration problem becomes a UserError."""
    options = decoder_options(settings, method)
    try:
        return make_decoder(options.pop("method"), pair, options.pop("sampling"), **options)
    except ValueError as exc:
        raise UserError(str(exc)) from exc


def encode(pair: ModelPair, prompt: str) -> list[int]:
    try:
        return pair.encode_prompt(prompt)
    except Exception as exc:  # e.g. lone surrogates from an API client
        raise UserError(f"the tokenizer cannot read this prompt ({_one_line(exc)})") from exc


class Session:
    """One browser session's decoder and run. Methods are called with `self.lock` held by the registry user.

    States: empty (no run) -> running a run (decoder set) -> finished (decoder released, run kept on show), or
    failed (`error` set, decoder released): a failed session refuses to step until reset() or a new run with
    other settings; a loaded trace is a finished run with no decoder (`replay`)."""

    def __init__(self, session_id: str) -> None:
        self.id = session_id
        self.lock = threading.RLock()
        self.created = self.last_used = time.monotonic()
        self.settings: Settings | None = None
        self.prompt: str = ""
        self.pair: ModelPair | None = None
        self.decoder = None
        self.run: RunTrace | None = None
        self.replay = False          # the run came from a trace file; there is no decoder to step
        self.error: str | None = None  # set when a model call failed; cleared by reset()
        self.stop_requested = False
        self.running = False           # a Run stream is in progress (it takes self.lock one step at a time)

    def touch(self) -> None:
        self.last_used = time.monotonic()

    @property
    def busy(self) -> bool:
        if self.running:
            return True
        if self.lock.acquire(blocking=False):
            self.lock.release()
            return False
        return True

    @property
    def done(self) -> bool:
        return self.run is not None and bool(self.run.finished)

    def matches(self, settings: Settings, prompt: str) -> bool:
        return not self.replay and self.run is not None and self.settings == settings and self.prompt == prompt

    def reset(self) -> None:
        self.decoder = self.run = self.settings = self.pair = None
        self.prompt, self.replay, self.error, self.stop_requested = "", False, None, False

    def start(self, pairs: PairCache, settings: Settings, prompt: str) -> RunTrace:
        """Build the decoder and prefill the prompt. Raises UserError for anything the user can fix; the
        previous run stays on show until the new one has started."""
        settings = settings.normalised()
        prompt = check_prompt(prompt)
        decoder_options(settings)  # refuse a bad shape or sampling setting before loading any model
        pair = pairs.get(settings)
        decoder = build_decoder(pair, settings)
        ids = encode(pair, prompt)
        with pairs.lock_for(pair):
            try:
                decoder.start(ids, settings.max_new_tokens, prompt)
            except RequestError as exc:
                raise UserError(str(exc)) from exc
            except Exception as exc:  # a broken model must not take the app down; this session is marked
                self.reset()
                self.settings, self.prompt = settings, prompt
                self.error = _failure("prefill", exc)
                raise SessionFailed(self.error) from exc
        self.reset()
        self.settings, self.prompt, self.pair, self.decoder, self.run = settings, prompt, pair, decoder, decoder.run
        return self.run

    def step(self, pairs: PairCache) -> StepTrace:
        if self.error:
            raise SessionFailed(self.error)
        if self.replay:
            raise UserError("this run was loaded from a trace file: there is no model to step (press Reset)")
        if self.done:
            raise UserError("the run is finished; press Reset (or Step again) to start a new one")
        if self.decoder is None or self.run is None:
            raise UserError("nothing to step: press Step or Run to start a run")
        with pairs.lock_for(self.pair):
            try:
                step = self.decoder.step()
            except Exception as exc:
                # The decoder may be half way through a step (caches and committed tokens out of line): it is
                # dropped, its memory with it; the steps so far stay on show.
                self.error = _failure("step", exc)
                self.decoder = None
                raise SessionFailed(self.error) from exc
        if self.done:
            self.decoder = None  # the KV caches are not needed to show a finished run
        return step

    def load(self, run: RunTrace) -> None:
        self.reset()
        self.run, self.replay = run, True


class SessionFailed(RuntimeError):
    """A model call failed inside one session; the message says so and how to recover."""


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    detail = text.splitlines()[0][:200] if text else ""
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def _failure(what: str, exc: Exception) -> str:
    return f"the model call failed during {what} ({_one_line(exc)}); press Reset to start over"


class SessionRegistry:
    """Sessions by id, at most `max_sessions`, each dropped `ttl_s` seconds after its last use."""

    def __init__(self, max_sessions: int = 64, ttl_s: float = 3600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self.clock = clock
        self._sessions: dict[str, Session] = {}
        self._guard = threading.Lock()

    def __len__(self) -> int:
        with self._guard:
            return len(self._sessions)

    def __contains__(self, session_id: str) -> bool:
        with self._guard:
            return session_id in self._sessions

    def get(self, session_id: str | None) -> Session:
        """The session with this id, or a new one (new id) when it is unknown or expired."""
        with self._guard:
            now = self.clock()
            self._expire(now)
            session = self._sessions.get(session_id or "")
            if session is None:
                self._make_room()
                session = Session(uuid.uuid4().hex)
                session.created = now
                self._sessions[session.id] = session
            session.last_used = now
            return session

    def drop(self, session_id: str | None) -> None:
        with self._guard:
            self._sessions.pop(session_id or "", None)

    def _expire(self, now: float) -> None:
        for sid in [sid for sid, s in self._sessions.items() if now - s.last_used > self.ttl_s and not s.busy]:
            del self._sessions[sid]

    def _make_room(self) -> None:
        while len(self._sessions) >= self.max_sessions:
            idle = [s for s in self._sessions.values() if not s.busy]
            if not idle:
                raise UserError("the server is busy (every session slot is in use); try again in a minute")
            del self._sessions[min(idle, key=lambda s: s.last_used).id]


def compare_methods(pairs: PairCache, settings: Settings, prompt: str,
                    methods: tuple[str, ...] = METHODS) -> Iterator[tuple[str, RunTrace]]:
    """The same prompt and settings through each method, one after another (yields as each finishes).
    Each run holds the pair's lock one step at a time, so other sessions keep stepping meanwhile."""
    settings = settings.normalised()
    prompt = check_prompt(prompt)
    for method in methods:
        decoder_options(settings, method)
    pair = pairs.get(settings)
    lock = pairs.lock_for(pair)
    ids = encode(pair, prompt)
    for method in methods:
        decoder = build_decoder(pair, settings, method)
        try:
            with lock:
                decoder.start(ids, settings.max_new_tokens, prompt)
            while not decoder.done:
                with lock:
                    decoder.step()
        except RequestError as exc:
            raise UserError(str(exc)) from exc
        except UserError:
            raise
        except Exception as exc:
            raise SessionFailed(_failure(f"the {method} run", exc)) from exc
        yield method, decoder.run


# ---------------------------------------------------------------------------------------------------------------
# trace files from strangers: trace.load_run checks size, JSON and the schema's shape; the checks below add the
# value types and bounds the figures rely on, so a loaded trace either shows or is refused with a reason.

def load_trace(path) -> RunTrace:
    from ..trace import load_run

    if not isinstance(path, (str, Path)):
        raise UserError("cannot load that trace: expected a file")
    try:
        run = load_run(path)
    except (TraceError, OSError) as exc:
        raise UserError(f"cannot load that trace: {exc}") from exc
    except RecursionError as exc:
        raise UserError("cannot load that trace: it is nested too deeply") from exc
    except Exception as exc:  # the loader must only ever say no; anything else is reported, not raised
        raise UserError(f"cannot load that trace: malformed ({_one_line(exc)})") from exc
    try:
        check_trace(run)
    except TraceError as exc:
        raise UserError(f"cannot load that trace: {exc}") from exc
    return run


def settings_of_trace(run: RunTrace) -> Settings | None:
    """The explorer settings a loaded trace was made with, so its controls can be shown (and Step then starts a
    new run like it). None when the trace's config does not describe valid settings (a hand-edited file).

    max_new_tokens is not in a trace: a run that ended on length gives it; otherwise the default stays."""
    config = run.config if isinstance(run.config, dict) else {}
    values: dict = {"method": run.method}
    if run.pair in known_pairs():
        values["pair"] = run.pair
    elif " + " in run.pair:  # a custom pair is named "<target> + <draft>"
        target, _, draft = run.pair.partition(" + ")
        values.update(pair=CUSTOM, target=target, draft=draft)
    for name in ("temperature", "top_p", "top_k", "seed", "dynamic_depth", "stop", "threshold", "lookup",
                 "feature_draft"):
        if config.get(name) is not None:
            values[name] = config[name]
    branching = config.get("branching")
    if isinstance(branching, list) and branching:
        if run.method == "sd":
            values["gamma"] = len(branching)
        elif run.method == "mcsd":
            values["k_config"] = ",".join(str(b) for b in branching)
        elif run.method == "ti-mcsd":
            values.update(width=branching[0], depth=len(branching) - 1)
    if run.finished == "length":
        values["max_new_tokens"] = len(run.new_token_ids)
    try:
        return Settings(**values).normalised()
    except (UserError, TypeError):
        return None


def check_trace(run: RunTrace) -> None:
    """Every field has its declared type and the tree of every step is one the app can draw; raises TraceError."""
    _check_value(run, RunTrace, "trace")
    _expect(len(run.steps) <= MAX_TRACE_STEPS, f"the trace has {len(run.steps)} steps; the limit is {MAX_TRACE_STEPS}")
    for step in run.steps:
        where = f"step {step.index}"
        n = len(step.nodes)
        _expect(n <= MAX_TREE_NODES, f"{where} has {n} nodes; the limit is {MAX_TREE_NODES}")
        _expect(0 <= step.max_nodes <= MAX_TREE_NODES and 0 <= step.live_depth <= step.max_depth <= MAX_TREE_NODES,
                f"{where}: bad tree size")
        levels = [0] * n
        for i, node in enumerate(step.nodes):
            levels[i] = 1 if node.parent == -1 else levels[node.parent] + 1
            _expect(node.level == levels[i], f"{where}: node {i} is on level {levels[i]}, not {node.level}")
            _expect(node.origin in NODE_ORIGINS, f"{where}: node {i} has a bad origin")
            for name in ("p", "q", "p_test", "q_test", "u"):
                value = getattr(node, name)
                _expect(value is None or (math.isfinite(value) and -1e-6 <= value <= 1.0 + 1e-6),
                        f"{where}: node {i} has {name} outside [0, 1]")
        path = step.accepted_path
        _expect(all(step.nodes[b].parent == a for a, b in zip([-1] + path, path)),
                f"{where}: the accepted path is not a chain from the root")
        _expect(step.final_parent is None or -1 <= step.final_parent < n, f"{where}: bad final_parent")
        _expect(all(0 <= t for t in step.committed), f"{where}: negative token id")


def _expect(cond: bool, message: str) -> None:
    if not cond:
        raise TraceError(message)


@functools.lru_cache(maxsize=None)
def _type_hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _check_value(value, annotation, where: str) -> None:
    """`value` has the type `annotation` (a dataclass, int, float, str, bool, dict, None, list[...], X | None)."""
    if is_dataclass(annotation):
        _expect(isinstance(value, annotation), f"{where}: expected {annotation.__name__}")
        hints = _type_hints(annotation)
        for f in fields(annotation):
            _check_value(getattr(value, f.name), hints[f.name], f"{where}.{f.name}")
        return
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        for option in args:
            try:
                _check_value(value, option, where)
                return
            except TraceError:
                pass
        raise TraceError(f"{where}: unexpected {type(value).__name__}")
    if origin is list:
        _expect(isinstance(value, list), f"{where}: expected a list")
        for i, item in enumerate(value):
            _check_value(item, args[0], f"{where}[{i}]")
        return
    if annotation is type(None):
        _expect(value is None, f"{where}: expected null")
    elif annotation is float:  # JSON writes 1.0 as 1
        _expect(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
                f"{where}: expected a finite number")
    elif annotation is int:
        _expect(isinstance(value, int) and not isinstance(value, bool), f"{where}: expected an integer")
    elif annotation in (str, bool, dict):
        _expect(isinstance(value, annotation), f"{where}: expected {annotation.__name__}")


def process_rss_mb() -> float:
    """Resident memory of this process (Linux), for the soak figures and the memory test."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


_heap_trimmer: threading.Thread | None = None


def start_heap_trimmer(every_s: float = 30.0) -> bool:
    """Hand memory that glibc keeps after Python frees it back to the OS, every `every_s` seconds (once per process).

    Why: without it the server's RSS grew by ~43 MB over 500 abandoned sessions while the Python heap grew < 1 MB
    (scripts/soak.py --memory-only); with it RSS stays flat. Returns False where the C library is not glibc.
    """
    global _heap_trimmer
    if _heap_trimmer is not None:
        return True
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False

    def trim_forever() -> None:
        while True:
            time.sleep(every_s)
            trim(0)

    _heap_trimmer = threading.Thread(target=trim_forever, name="heap-trimmer", daemon=True)
    _heap_trimmer.start()
    return True
