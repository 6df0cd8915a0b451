"""What Compare measured is kept per machine, pair, settings and prompt, newest first (measured_here.py): a run
quotes only a Compare that ran its method with its settings on its prompt; the Recipe menu shows a recipe's ratio
against ar only where a kept Compare ran exactly its settings, and stars a clear winner by ratio (its range above
every other's) from a machine that was not busy."""
import json

from dynasd.explorer.inputs import Settings
from dynasd.explorer.measure import measured_here
from dynasd.explorer.measure.measured_here import (
    KeptCompare,
    Measured,
    compare_file,
    compare_for,
    fastest_recipe_here,
    keep_compare,
    measured_recipe,
    prompt_key,
    read_compare,
    read_compares,
    recipe_here,
)
from dynasd.recipes import RECIPES

SD_RECIPE = next(label for label, values in RECIPES.items() if values["method"] == "sd")
MACHINE = "Some CPU (AVX2), 2 of 2 threads"


def compare(prompt: str = "hello", at: str = "2026-12-05 03:10", controls: dict | None = None, **rows) -> KeptCompare:
    """rows: method=(tokens/s, low, high) or (tokens/s, low, high, ratio, ratio_low, ratio_high)."""
    return KeptCompare(at, MACHINE, "embedded", controls or Settings().controls(),
                       [Measured(method, *numbers, pairs=6 if len(numbers) > 3 else 0)
                        for method, numbers in rows.items()], prompt=prompt, prompt_key=prompt_key(prompt),
                       load="load 0.5 on 2 threads")


def test_compares_are_kept_per_machine_pair_settings_and_prompt_newest_first(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNASD_CACHE", str(tmp_path))
    first = compare(ar=(10.5, 9.8, 11.2), sd=(14.0, 13.1, 14.9, 1.33, 1.25, 1.41))
    assert read_compare(MACHINE, "embedded") is None
    keep_compare(first)
    assert read_compare(MACHINE, "embedded") == first
    assert read_compare("Another CPU (AVX-512), 2 of 2 threads", "embedded") is None
    assert read_compare(MACHINE, "tiny-random") is None
    other_prompt = compare(prompt="count to ten", at="2026-12-05 03:20", ar=(10.0, 9.0, 11.0),
                           sd=(9.0, 8.0, 10.0, 0.9, 0.85, 0.95))
    keep_compare(other_prompt)
    again = compare(at="2026-12-05 03:30", ar=(10.5, 9.8, 11.2), sd=(15.0, 14.0, 16.0, 1.43, 1.35, 1.5))
    keep_compare(again)
    assert [k.measured_at for k in read_compares(MACHINE, "embedded")] == ["2026-12-05 03:30", "2026-12-05 03:20"], \
        "newest first; the same settings and prompt measured again replace the older Compare"
    controls = {**Settings().controls(), "method": "sd"}
    assert compare_for(MACHINE, "embedded", "sd", controls, "hello") == again
    assert compare_for(MACHINE, "embedded", "sd", controls, "count to ten") == other_prompt
    assert compare_for(MACHINE, "embedded", "sd", {**controls, "gamma": 6}, "hello") is None, "another chain"
    assert compare_for(MACHINE, "embedded", "sd", {**controls, "max_new_tokens": 128}, "hello") is None
    for index in range(measured_here.KEPT_COMPARES + 3):
        keep_compare(compare(prompt=f"prompt {index}", ar=(10.0, 9.0, 11.0)))
    assert len(read_compares(MACHINE, "embedded")) == measured_here.KEPT_COMPARES


def test_a_compare_kept_before_ratios_is_read_but_never_quoted(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNASD_CACHE", str(tmp_path))
    path = compare_file(MACHINE, "embedded")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"measured_at": "2026-12-01 00:00", "machine": MACHINE, "pair": "embedded",
                                "controls": Settings().controls(), "busy": "",
                                "rows": [{"method": "ar", "tokens_per_s": 10, "low": 9, "high": 11},
                                         {"method": "sd", "tokens_per_s": 14, "low": 13, "high": 15}]}))
    old = read_compare(MACHINE, "embedded")
    assert old is not None and old.row("sd").ratio is None
    assert compare_for(MACHINE, "embedded", "sd", {**Settings().controls(), "method": "sd"}, "hello") is None


def test_only_a_clear_winner_by_ratio_that_ran_the_recipes_settings_is_starred():
    clear = compare(ar=(10.5, 9.8, 11.2), sd=(14.0, 13.1, 14.9, 1.33, 1.25, 1.41))
    assert measured_recipe(clear, RECIPES[SD_RECIPE]) is clear.rows[1], "the default controls run sd with gamma 4"
    assert fastest_recipe_here(clear, RECIPES) == SD_RECIPE
    assert recipe_here([clear], RECIPES[SD_RECIPE]) == (clear, clear.rows[1])
    within_noise = compare(ar=(10.5, 9.8, 11.2), sd=(10.9, 10.0, 11.8, 1.04, 0.96, 1.12))
    assert fastest_recipe_here(within_noise, RECIPES) is None, "1 lies in sd's range: no clear winner"
    other_settings = compare(ar=(10.5, 9.8, 11.2), sd=(14.0, 13.1, 14.9, 1.33, 1.25, 1.41))
    other_settings.controls["gamma"] = 6  # Compare ran sd with gamma 6: not the recipe's chain of 4
    assert fastest_recipe_here(other_settings, RECIPES) is None and recipe_here([other_settings], RECIPES[SD_RECIPE]) \
        is None
    unpaired = compare(ar=(10.5, 9.8, 11.2), sd=(14.0, 13.1, 14.9))
    assert fastest_recipe_here(unpaired, RECIPES) is None, "without a ratio against ar nothing is starred"
    assert fastest_recipe_here(None, RECIPES) is None


def test_recipe_labels_claim_no_speed():
    """What is fastest depends on the CPU kind, weights and arithmetic: a label says what a recipe is, and the menu
    adds what was measured on this machine (ui/play.py)."""
    for label in RECIPES:
        assert "fastest" not in label.lower() and "×" not in label and "float32" not in label, label


def test_a_compare_keeps_how_long_it_took_and_the_next_one_says_it_up_front(tmp_path, monkeypatch):
    from dataclasses import replace

    from dynasd.explorer.measure.compare import how_long

    monkeypatch.setenv("DYNASD_CACHE", str(tmp_path))
    untimed = compare(ar=(10.0, 9.0, 11.0))
    keep_compare(untimed)
    assert how_long(read_compares(MACHINE, "embedded")) == "", "a Compare kept before its time was: nothing to say"
    timed = replace(compare(prompt="count to ten", at="2026-12-05 04:00", ar=(10.0, 9.0, 11.0)), seconds=41.6,
                    rounds=9)
    keep_compare(timed)
    kept = read_compares(MACHINE, "embedded")
    assert kept[0].seconds == 41.6, "its time travels through the kept file"
    assert how_long(kept) == "about 42 s (the last Compare here, 2026-12-05 04:00 UTC, took 42 s over 9 rounds)"
