"""The figures' own colours stay apart for the common colour-vision deficiencies and in greyscale, and the text
panel's chips never differ by colour alone.

Each set below holds colours a learner must tell apart by colour as well as by glyph: the tree's accepted,
rejected, not-tested and not-reached nodes, and the mask's four cells. Every pair is simulated (colorspacious:
Machado et al.'s deuteranopia and protanopia at full severity; greyscale = CIE L* alone) and must stay at least
MIN_DELTA_E apart in CAM02-UCS, where ~10 is a difference anyone sees at a glance. The other statuses (bonus,
correction, padding...) differ by shape and glyph, which tests/test_viz.py checks. The text's chips (accepted draft,
correction, bonus, each of the step on show...) are many colours of a few hues, so each kind carries a second cue
(viz/text.py chip_cue: an underline's style, a glyph, a bold boxed chip), drawn on the chip and its legend entry by
the page's CSS (ui/page_scripts.py chip_css); in a real browser every legend entry looks different in greyscale."""
import itertools

import numpy as np
import pytest
from colorspacious import cspace_convert, deltaE
from test_browser import WAIT_S, browser  # noqa: F401  (the browser fixture)

from ui.page_scripts import chip_css
from viz.mask import mask_figure
from viz.style import MASK_ACCEPTED, MASK_ATTENDS, MASK_BLOCKED, MASK_UNUSED, STATUS_COLORS, STATUS_GLYPHS
from viz.text import ChipCue, chip_cue, text_color_map

MIN_DELTA_E = 12.0
TREE = {name: STATUS_COLORS[name] for name in ("accepted", "rejected", "skipped", "not_reached")}
MASK = {"blocked": MASK_BLOCKED, "attends": MASK_ATTENDS, "accepted path": MASK_ACCEPTED, "not drafted": MASK_UNUSED}


def srgb(hex_colour: str) -> np.ndarray:
    value = hex_colour.lstrip("#")
    return np.array([int(value[i:i + 2], 16) / 255 for i in (0, 2, 4)])


def seen(colour: np.ndarray, vision: str) -> np.ndarray:
    """The colour as a viewer with this vision sees it, in sRGB."""
    if vision == "greyscale":
        lightness = cspace_convert(colour, "sRGB1", "CIELab")[0]
        return np.clip(cspace_convert([lightness, 0.0, 0.0], "CIELab", "sRGB1"), 0, 1)
    space = {"name": "sRGB1+CVD", "cvd_type": vision, "severity": 100}
    return np.clip(cspace_convert(colour, space, "sRGB1"), 0, 1)


@pytest.mark.parametrize("vision", ["deuteranomaly", "protanomaly", "greyscale"])
@pytest.mark.parametrize("palette", [TREE, MASK], ids=["tree", "mask"])
def test_every_pair_of_colours_stays_apart(palette, vision):
    close = []
    for (a, colour_a), (b, colour_b) in itertools.combinations(palette.items(), 2):
        distance = float(deltaE(seen(srgb(colour_a), vision), seen(srgb(colour_b), vision), input_space="sRGB1"))
        if distance < MIN_DELTA_E:
            close.append(f"{a} vs {b}: {distance:.1f}")
    assert not close, f"{vision}: {close}"


def test_the_simulation_tells_apart_what_it_should():
    """The check itself: the old red and green (#d64541, #2e9e44) collapse for a deuteranope and in greyscale."""
    old = srgb("#d64541"), srgb("#2e9e44")
    for vision in ("deuteranomaly", "greyscale"):
        assert float(deltaE(*(seen(c, vision) for c in old), input_space="sRGB1")) < MIN_DELTA_E


def test_the_mask_draws_its_colours_from_the_palette_tested_here(runs_for_colours):
    """The figure's own colours: the mask's colour scale holds exactly the four colours checked above."""
    figure = mask_figure(runs_for_colours)
    scale = {colour for _, colour in figure.data[0].colorscale}
    assert scale == set(MASK.values())
    assert len(set(STATUS_GLYPHS.values())) == len(STATUS_GLYPHS) == len(STATUS_COLORS), "one glyph per status"


def colour_only(cues: dict[str, ChipCue]) -> list[str]:
    """The pairs of chip kinds whose only difference is their colour."""
    return [f"{a} vs {b}" for (a, cue_a), (b, cue_b) in itertools.combinations(cues.items(), 2) if cue_a == cue_b]


def rgba_prefix(hex_colour: str) -> str:
    """How gr.HighlightedText paints a label's colour in the page: an inline rgba background."""
    red, green, blue = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red}, {green}, {blue},"


def test_no_two_kinds_of_text_chip_differ_by_colour_alone():
    colours = text_color_map()
    assert len(set(colours.values())) == len(colours), "the page finds a chip's kind by its colour"
    assert not colour_only({label: chip_cue(label) for label in colours})
    css = chip_css()
    for label, colour in colours.items():
        rules = [rule for rule in css.splitlines() if rgba_prefix(colour) in rule]
        assert all(":is(.token, .legend-item)" in rule for rule in rules), "a cue shows on the chip and in the legend"
        cue = chip_cue(label)
        assert (f"underline {cue.underline} " in css) if cue.underline else not any("underline" in r for r in rules)
        assert any(f'content: "{cue.glyph}"' in rule for rule in rules) == bool(cue.glyph), label
        assert any("font-weight: 700; outline" in rule for rule in rules) == cue.this_step, label


def test_the_chip_check_finds_two_kinds_told_apart_by_colour_only():
    same = ChipCue("solid", "", False)
    assert colour_only({"accepted draft": same, "correction": same, "bonus": ChipCue(None, "+", False)}) == [
        "accepted draft vs correction"]


@pytest.mark.browser
def test_in_greyscale_every_chip_in_the_texts_legend_looks_different_and_each_chip_like_its_entry(
        browser, explorer_url):  # noqa: F811
    """The page as a learner without colour sees it (CSS grayscale on the whole page): after steps with accepted
    drafts, corrections and bonus tokens, each legend entry's drawn cue differs from every other's, and each token
    carries its entry's cue."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.05)
    browser.get(explorer_url)
    browser.execute_script("document.documentElement.style.filter = 'grayscale(1)'")
    wait.until(ready.element_to_be_clickable((By.ID, "step-btn")))
    for index in range(4):
        browser.find_element(By.ID, "step-btn").click()
        wait.until(lambda _, index=index: f"Step {index} took" in browser.find_element(By.ID, "status").text)
    cue_js = """
      const cue = (e) => { const s = getComputedStyle(e), after = getComputedStyle(e, '::after');
        return [s.textDecorationLine, s.textDecorationStyle, after.content, s.outlineStyle].join(' '); };
      const legend = [...document.querySelectorAll('#dynasd-text .legend-item')].map(
        (e) => [e.textContent.trim(), e.style.backgroundColor, cue(e)]);
      const tokens = [...document.querySelectorAll('#dynasd-text .token')].map(
        (e) => [e.style.backgroundColor, cue(e)]);
      return [legend, tokens];"""
    legend, tokens = browser.execute_script(cue_js)
    kinds = {name for name, _, _ in legend}
    assert len(kinds) >= 4 and any(name.endswith(" · this step") for name in kinds), kinds
    drawn = {name: look for name, _, look in legend}
    assert len(set(drawn.values())) == len(drawn), drawn
    entry = {background: look for _, background, look in legend}
    unlike = {(entry[background], look) for background, look in tokens if entry[background] != look}
    assert not unlike, f"each chip as its legend entry: {unlike}"


@pytest.fixture(scope="module")
def runs_for_colours(tiny_pair):
    from dynasd.decoders import make_decoder
    from dynasd.options import DecoderOptions

    run = make_decoder(tiny_pair, DecoderOptions(method="mcsd")).generate(tiny_pair.encode_prompt("hi"), 8)
    return run.steps[0]
