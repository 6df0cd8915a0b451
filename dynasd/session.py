"""Explorer sessions: one decoder per browser session, models shared and loaded once per process.

The app keeps only a session id in its (per-browser) state. Everything heavy lives here:
  PairCache        loads each model pair once and hands out one lock per pair; every model call runs under it,
                   so sessions sharing a pair take turns step by step (caches stay per decoder, never shared).
  Session          a decoder, its RunTrace and the settings it was built from; or a loaded trace to replay.
  SessionRegistry  bounded (max count) with a time-to-live; when full, the longest-idle session is evicted.

A failing model call marks only its own session failed; other sessions and the loaded models carry on.
"""
from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import Callable, Iterator

from .decoders import METHODS, RequestError, make_decoder
from .models import BUILTIN_PAIRS, PRESETS, ModelLoadError, ModelPair, load_pair
from .sampling import SamplingConfig
from .stopping import make_stop_policy
from .trace import RunTrace, StepTrace, TraceError
from .tree import parse_branching

CUSTOM = "custom"
MAX_NEW_TOKENS_LIMIT = 512


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

    @property
    def pair_key(self) -> str:
        return f"{self.target} + {self.draft}" if self.pair == CUSTOM else self.pair

    def normalised(self) -> "Settings":
        """Coerce UI values (sliders send floats) and check them; raises UserError."""
        try:
            s = replace(self, gamma=int(self.gamma), width=int(self.width), depth=int(self.depth),
                        max_new_tokens=int(self.max_new_tokens), seed=int(self.seed),
                        threshold=float(self.threshold), temperature=float(self.temperature),
                        top_p=float(self.top_p), dynamic_depth=bool(self.dynamic_depth),
                        target=(self.target or "").strip(), draft=(self.draft or "").strip(),
                        k_config=(self.k_config or "").strip())
        except (TypeError, ValueError) as exc:
            raise UserError(f"bad setting: {exc}") from exc
        if s.method not in METHODS:
            raise UserError(f"unknown method '{s.method}' (use {', '.join(METHODS)})")
        if not 1 <= s.max_new_tokens <= MAX_NEW_TOKENS_LIMIT:
            raise UserError(f"max new tokens must lie in [1, {MAX_NEW_TOKENS_LIMIT}], got {s.max_new_tokens}")
        if s.pair == CUSTOM and not (s.target and s.draft):
            raise UserError("a custom pair needs both a target and a draft model id or path")
        return s


def known_pairs() -> list[str]:
    return list(BUILTIN_PAIRS) + list(PRESETS)


class PairCache:
    """Model pairs by name, loaded once per process. `allow_custom=False` (public mode) refuses any pair that
    is not built in or a preset, so strangers cannot make the server download or open arbitrary models."""

    def __init__(self, loader: Callable[..., ModelPair] = load_pair, device: str = "auto", dtype: str = "auto",
                 allow_custom: bool = True, max_pairs: int = 3) -> None:
        self.loader = loader
        self.device = device
        self.dtype = dtype
        self.allow_custom = allow_custom
        self.max_pairs = max_pairs
        self._pairs: dict[str, ModelPair] = {}
        self._locks: dict[int, threading.Lock] = {}     # id(pair) -> lock: model calls on a pair take turns
        self._loading: dict[str, threading.Lock] = {}   # one per pair name: concurrent first uses load once
        self._guard = threading.Lock()

    def get(self, settings: Settings) -> ModelPair:
        key = settings.pair_key
        if settings.pair == CUSTOM and not self.allow_custom:
            raise UserError("custom models are turned off on this server; pick one of: " + ", ".join(known_pairs()))
        if settings.pair != CUSTOM and settings.pair not in known_pairs():
            raise UserError(f"unknown model pair '{settings.pair}' (known: {', '.join(known_pairs())})")
        with self._guard:
            if key in self._pairs:
                return self._pairs[key]
            loading = self._loading.setdefault(key, threading.Lock())
        with loading:
            with self._guard:
                if key in self._pairs:
                    return self._pairs[key]
            try:
                if settings.pair == CUSTOM:
                    pair = self.loader(target=settings.target, draft=settings.draft, device=self.device,
                                       dtype=self.dtype)
                else:
                    pair = self.loader(settings.pair, device=self.device, dtype=self.dtype)
            except ModelLoadError as exc:
                raise UserError(str(exc)) from exc
            with self._guard:
                while len(self._pairs) >= self.max_pairs:  # sessions still using an evicted pair keep it alive
                    oldest = next(iter(self._pairs))
                    self._pairs.pop(oldest)
                self._pairs[key] = pair
                self._locks.setdefault(id(pair), threading.Lock())
            return pair

    def lock_for(self, pair: ModelPair) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(id(pair), threading.Lock())

    def loaded(self) -> list[str]:
        with self._guard:
            return list(self._pairs)


def build_decoder(pair: ModelPair, settings: Settings, method: str | None = None):
    """A decoder from explorer settings; every configuration problem becomes a UserError."""
    try:
        stop = make_stop_policy(settings.stop, settings.threshold)
        sampling = SamplingConfig(temperature=settings.temperature, top_p=settings.top_p)
        k_config = parse_branching(settings.k_config) if (method or settings.method) == "mcsd" else (4, 2, 2, 1)
        if settings.gamma < 1 or settings.width < 1 or settings.depth < 1:
            raise ValueError("gamma, width and depth must be at least 1")
        return make_decoder(method or settings.method, pair, sampling, seed=settings.seed, gamma=settings.gamma,
                            k_config=k_config, width=settings.width, depth=settings.depth,
                            dynamic_depth=settings.dynamic_depth, stop=stop)
    except ValueError as exc:
        raise UserError(str(exc)) from exc


class Session:
    """One browser session's decoder and run. Methods are called with `self.lock` held by the registry user."""

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
        if not prompt or not prompt.strip():
            raise UserError("the prompt is empty: type something or pick an example")
        pair = pairs.get(settings)
        decoder = build_decoder(pair, settings)
        with pairs.lock_for(pair):
            try:
                ids = pair.encode_prompt(prompt)
                decoder.start(ids, settings.max_new_tokens, prompt)
            except RequestError as exc:
                raise UserError(str(exc)) from exc
            except Exception as exc:  # a broken model must not take the app down; this session is marked
                self.reset()
                self.error = _failure("prefill", exc)
                raise SessionFailed(self.error) from exc
        self.reset()
        self.settings, self.prompt, self.pair, self.decoder, self.run = settings, prompt, pair, decoder, decoder.run
        return self.run

    def step(self, pairs: PairCache) -> StepTrace:
        if self.error:
            raise SessionFailed(self.error)
        if self.decoder is None or self.run is None:
            raise UserError("nothing to step: press Step or Run to start a run")
        if self.done:
            raise UserError("the run is finished; press Reset (or Step again) to start a new one")
        with pairs.lock_for(self.pair):
            try:
                return self.decoder.step()
            except Exception as exc:
                self.error = _failure("step", exc)
                raise SessionFailed(self.error) from exc

    def load(self, run: RunTrace) -> None:
        self.reset()
        self.run, self.replay = run, True


class SessionFailed(RuntimeError):
    """A model call failed inside one session; the message says so and how to recover."""


def _failure(what: str, exc: Exception) -> str:
    detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return f"the model call failed during {what} ({type(exc).__name__}: {detail}); press Reset to start over"


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
    if not prompt or not prompt.strip():
        raise UserError("the prompt is empty: type something or pick an example")
    pair = pairs.get(settings)
    lock = pairs.lock_for(pair)
    for method in methods:
        decoder = build_decoder(pair, settings, method)
        try:
            with lock:
                decoder.start(pair.encode_prompt(prompt), settings.max_new_tokens, prompt)
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


def load_trace(path: str) -> RunTrace:
    from .trace import load_run

    try:
        return load_run(path)
    except (TraceError, OSError) as exc:
        raise UserError(f"cannot load that trace: {exc}") from exc
