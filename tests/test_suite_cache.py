"""The test session keeps what it caches in a temporary folder of its own (tests/conftest.py), so that nothing a
test measures or writes is read back later by the app as this machine's: no measurement is kept in the user's
cache folder (the session also checks it at its end), and what makes the suite fast (compiled kernels, the
embedded target's conversion) is still found."""
from __future__ import annotations

import tempfile
from pathlib import Path

from conftest import SESSION_CACHE, USER_CACHE, measurements_in

from dynasd.explorer.costs import cost
from dynasd.explorer.measure.measured_here import KeptCompare, Measured, keep_compare, read_compare
from dynasd.kernels.compile import kernel_cache
from dynasd.loading.embedded import cache_dir, cached_gguf_path


def test_the_session_caches_in_a_temporary_folder_not_the_users():
    assert SESSION_CACHE.resolve().is_relative_to(Path(tempfile.gettempdir()).resolve())
    assert cache_dir().resolve().is_relative_to(SESSION_CACHE.resolve())
    assert not cache_dir().resolve().is_relative_to(USER_CACHE.resolve())


def test_what_the_explorer_keeps_lands_in_the_session_cache_and_the_users_is_untouched(tiny_pair):
    before = measurements_in(USER_CACHE)
    measured = cost.MeasuredCosts({1: 0.01, 4: 0.02}, "2026-12-05 03:10", "by hand", "Some CPU",
                                  conditions=cost.Conditions(0.1, 1, 1.0, 1.0))
    cost.keep_costs(cost.costs_file(tiny_pair), measured)
    kept = KeptCompare("2026-12-05 03:10", "Some CPU (AVX2), 2 of 2 threads", "tiny-random", {},
                       [Measured("ar", 10.0, 9.0, 11.0)])
    keep_compare(kept)
    assert cost.read_kept_costs(cost.costs_file(tiny_pair)).timings == measured.timings
    assert read_compare(kept.machine, kept.pair) == kept
    assert cost.costs_file(tiny_pair).resolve().is_relative_to(SESSION_CACHE.resolve())
    assert measurements_in(USER_CACHE) == before


def test_the_users_compiled_kernels_and_converted_target_are_still_found():
    """Kernels built by `make setup` are there to load (a rebuild costs ~15 s a kernel), unless the user named a
    kernel folder of their own; conversions and the extracted GGUF are linked, never copied or written."""
    kernels = kernel_cache()
    if kernels.resolve().is_relative_to(SESSION_CACHE.resolve()):
        assert {p.name for p in (USER_CACHE / "kernels").glob("*.so")} <= {p.name for p in kernels.glob("*.so")}
    for folder in (USER_CACHE / "converted").glob("*"):
        if (folder / "model.safetensors").is_file():
            assert (cache_dir() / "converted" / folder.name / "model.safetensors").is_file()
    assert cached_gguf_path().is_file() or not cached_gguf_path(USER_CACHE).is_file()
