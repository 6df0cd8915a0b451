"""What this machine measured is kept per machine and pair, and the Recipe menu marks a recipe only when a kept
Compare ran exactly its settings and found it the clear winner (its tokens / s range above every other's)."""
from dynasd.explorer.inputs import Settings
from dynasd.explorer.measure.measured_here import (
    KeptCompare,
    Measured,
    fastest_recipe_here,
    keep_compare,
    measured_recipe,
    read_compare,
)
from dynasd.recipes import RECIPES

SD_RECIPE = next(label for label, values in RECIPES.items() if values["method"] == "sd")


def compare(**rows) -> KeptCompare:
    return KeptCompare("2026-12-05 03:10", "Some CPU (AVX2), 2 of 2 threads", "embedded", Settings().controls(),
                       [Measured(method, rate, low, high) for method, (rate, low, high) in rows.items()])


def test_a_kept_compare_reads_back_for_its_machine_and_pair_only(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNASD_CACHE", str(tmp_path))
    kept = compare(ar=(10.5, 9.8, 11.2), sd=(14.0, 13.1, 14.9))
    assert read_compare(kept.machine, kept.pair) is None
    keep_compare(kept)
    assert read_compare(kept.machine, kept.pair) == kept
    assert read_compare("Another CPU (AVX-512), 2 of 2 threads", kept.pair) is None
    assert read_compare(kept.machine, "tiny-random") is None


def test_only_a_clear_winner_that_ran_the_recipes_settings_is_marked():
    clear = compare(ar=(10.5, 9.8, 11.2), sd=(14.0, 13.1, 14.9))
    assert measured_recipe(clear, RECIPES[SD_RECIPE]) is clear.rows[1], "the default controls run sd with gamma 4"
    assert fastest_recipe_here(clear, RECIPES) == SD_RECIPE
    within_noise = compare(ar=(10.5, 9.8, 11.2), sd=(10.9, 10.0, 11.8))
    assert fastest_recipe_here(within_noise, RECIPES) is None
    other_settings = compare(ar=(10.5, 9.8, 11.2), sd=(14.0, 13.1, 14.9))
    other_settings.controls["gamma"] = 6  # Compare ran sd with gamma 6: not the recipe's chain of 4
    assert fastest_recipe_here(other_settings, RECIPES) is None
    assert fastest_recipe_here(None, RECIPES) is None
