"""Model pairs, loaded once per process and shared by every session, and what a public server may load.

PairCache loads each pair once and hands out one lock per pair; every model call runs under it, so sessions
sharing a pair take turns step by step (caches stay per decoder, never shared). On a public server
(DYNASD_PUBLIC=1) strangers cannot make it download or open arbitrary models: only built-in pairs and presets,
or with DYNASD_MODEL_DIR the models inside that folder, and only the shipped decision models.
"""
from __future__ import annotations

import os
import threading
import weakref
from pathlib import Path
from typing import Callable

from ..loading.models import ModelLoadError, ModelPair, load_pair
from ..stopping.policies import shipped_decision_models
from .inputs import CUSTOM, Settings, UserError, known_pairs, one_line

# Every model or module built on behalf of a session (a pair, a stop policy's decision model) takes this lock, so
# sessions load one model at a time. What two builds share is torch's one global random generator; that is guarded
# where it is drawn from, for every caller, sessions or not: a seeded build holds
# dynasd.loading.models.SEEDED_BUILD_LOCK, and a decision model loads without drawing (tests/test_pair_threads.py).
MODEL_BUILD_LOCK = threading.Lock()
_CACHES: "weakref.WeakSet[PairCache]" = weakref.WeakSet()


def _release_locks_in_child() -> None:
    """A forked child (ZeroGPU runs every model call in one) has only the thread that forked, but a copy of every
    lock: one that another thread held at that moment would stay held forever in the child. Nothing in the child
    holds them yet, so they are released there. (Plain locks: any thread may release them.)"""
    locks = [MODEL_BUILD_LOCK]
    for cache in list(_CACHES):
        locks += [cache._guard, *cache._locks.values(), *cache._loading.values()]
    for lock in locks:
        if lock.locked():
            lock.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_release_locks_in_child)


def is_public(environ=os.environ) -> bool:
    return environ.get("DYNASD_PUBLIC", "") not in ("", "0", "false")


def pairs_from_env(environ=os.environ) -> "PairCache":
    """Public (DYNASD_PUBLIC=1): built-in pairs and presets only, or with DYNASD_MODEL_DIR also the models inside
    that folder, and the shipped decision models only. Otherwise anything, with local paths confined to
    DYNASD_MODEL_DIR when it is set."""
    model_dir = environ.get("DYNASD_MODEL_DIR", "") or None
    public = is_public(environ)
    return PairCache(allow_custom=not public or model_dir is not None, model_dir=model_dir, allow_hub=not public,
                     allow_decision_paths=not public)


class PairCache:
    """Model pairs by name, loaded once per process.

    `allow_custom=False` refuses any pair that is not built in or a preset, so strangers cannot make the server
    download or open arbitrary models. `model_dir` confines custom local models to one folder (symlinks and `..`
    are resolved first); with `allow_hub=False` as well, a custom model is always a name inside that folder, never
    a hub id: the public-server setting (DYNASD_PUBLIC=1 with DYNASD_MODEL_DIR). `allow_decision_paths=False`
    (public servers) allows only the decision models shipped in assets, by name, never a folder path."""

    def __init__(self, loader: Callable[..., ModelPair] = load_pair, device: str = "auto", dtype: str = "auto",
                 allow_custom: bool = True, max_pairs: int = 3, model_dir: str | Path | None = None,
                 allow_hub: bool = True, allow_decision_paths: bool = True) -> None:
        self.loader = loader
        self.device = device
        self.dtype = dtype
        self.allow_custom = allow_custom
        self.max_pairs = max_pairs
        self.model_dir = Path(model_dir).expanduser().resolve() if model_dir else None
        self.allow_hub = allow_hub
        self.allow_decision_paths = allow_decision_paths
        self._pairs: dict[str, ModelPair] = {}
        self._locks: dict[int, threading.Lock] = {}     # id(pair) -> lock: model calls on a pair take turns
        self._loading: dict[str, threading.Lock] = {}   # one per pair name while it loads: concurrent first uses
        self._guard = threading.Lock()
        _CACHES.add(self)

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

    def check_decision_model(self, reference: str | None) -> None:
        """Raises UserError for a decision model this server may not open (None is the shipped default)."""
        if reference is None or self.allow_decision_paths or reference in shipped_decision_models():
            return
        raise UserError("this server offers only its shipped decision models: " + ", ".join(shipped_decision_models()))

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
            raise UserError(f"cannot load model pair '{settings.pair_key[:120]}': {one_line(exc)}") from exc

    def lock_for(self, pair: ModelPair) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(id(pair), threading.Lock())

    def loaded(self) -> list[str]:
        with self._guard:
            return list(self._pairs)
