"""The figures' own colours stay apart for the common colour-vision deficiencies and in greyscale.

Each set below holds colours a learner must tell apart by colour as well as by glyph: the tree's accepted,
rejected, not-tested and not-reached nodes, and the mask's four cells. Every pair is simulated (colorspacious:
Machado et al.'s deuteranopia and protanopia at full severity; greyscale = CIE L* alone) and must stay at least
MIN_DELTA_E apart in CAM02-UCS, where ~10 is a difference anyone sees at a glance. The other statuses (bonus,
correction, padding...) differ by shape and glyph, which tests/test_viz.py checks."""
import itertools

import numpy as np
import pytest
from colorspacious import cspace_convert, deltaE

from viz.mask import mask_figure
from viz.style import MASK_ACCEPTED, MASK_ATTENDS, MASK_BLOCKED, MASK_UNUSED, STATUS_COLORS, STATUS_GLYPHS

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


@pytest.fixture(scope="module")
def runs_for_colours(tiny_pair):
    from dynasd.decoders import make_decoder
    from dynasd.options import DecoderOptions

    run = make_decoder(tiny_pair, DecoderOptions(method="mcsd")).generate(tiny_pair.encode_prompt("hi"), 8)
    return run.steps[0]
