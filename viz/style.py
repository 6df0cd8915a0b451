"""One palette and one way to print a token, shared by every figure so a colour means the same thing everywhere.

Hues follow the token's fate: green = kept, red = rejected, grey = never looked at, blue = bonus, orange =
correction, purple = came from the target itself (target-initialized roots), teal = recycled from the target's
earlier predictions. Text backgrounds use light tints of the same hues so dark text stays readable on them.

Meaning never rests on colour alone: every status has a glyph (STATUS_GLYPHS: on the tree's markers, in the
legends and hovers, over the p bars) and the p bars a pattern. The colours that must be told apart by colour too
(accepted, rejected, not tested, not reached; the mask's four cells) differ in lightness as well as hue, so they
stay apart in greyscale and for deuteranopes and protanopes (tests/test_colour_vision.py simulates both).
"""
from __future__ import annotations

import json

import plotly.graph_objects as go

from dynasd.explorer.labels import MAX_LABEL_CHARS, show_token, visible_piece  # noqa: F401 - the views read them here
from dynasd.origins import ORIGINS
from dynasd.sampling import ACCEPT_RULE, REJECT_RULE, passes

# What every figure's toolbar offers: zoom, pan and a picture of the figure; nothing that sends it elsewhere (Plotly's
# logo links to its site, its cloud buttons upload the figure's data). A step is shared with the link beside the
# step slider.
FIGURE_CONFIG = {"displaylogo": False, "showSendToCloud": False, "showEditInChartStudio": False, "showLink": False}


class Figure(go.Figure):
    """A Plotly figure whose JSON carries FIGURE_CONFIG: Gradio's Plot hands a figure's `config` to Plotly as it is,
    so every figure of the app gets the same toolbar."""

    def to_json(self, *args, **kwargs) -> str:
        text = super().to_json(*args, **kwargs)
        return f'{text[:text.rindex("}")]}, "config": {json.dumps(FIGURE_CONFIG)}}}'


# Tree nodes (strong colours; markers on white).
# Lightness, dark to light: accepted (L* 33), rejected (60), not tested (77), not reached (90).
STATUS_COLORS: dict[str, str] = {
    "accepted": "#175a27",
    "rejected": "#f0643c",
    "not_reached": "#e3e3e3",
    "skipped": "#9cc9a5",
    "unchosen": "#9d7fd6",
    "padding": "#f2f2f2",
    "pending": "#6b6b6b",
    "bonus": "#3d84dc",
    "correction": "#f7b950",
    "target": "#1aa3b5",
}

# One glyph per status, in the fonts every browser has (no emoji).
STATUS_GLYPHS: dict[str, str] = {
    "accepted": "✓",
    "rejected": "✗",
    "not_reached": "⋯",
    "skipped": "–",
    "unchosen": "↷",
    "padding": "∅",
    "pending": "?",
    "bonus": "+",
    "correction": "↺",
    "target": "▸",
}
# The glyph's colour on a marker of that status: white on the dark fills, black on the light ones.
GLYPH_INK: dict[str, str] = {
    status: "white" if status in ("accepted", "pending", "bonus") else "#777" if status in ("not_reached", "padding")
    else "#111" for status in STATUS_COLORS}
# The p bars' fill pattern per status (Plotly's pattern shapes; "" = solid): on the tested statuses a learner must
# tell from accepted, few bars a step (each patterned bar costs the page an SVG pattern on every redraw; the
# untested ones, most bars of a wide tree, are told apart by their light fills and by the tree's glyphs).
STATUS_PATTERNS: dict[str, str] = {
    "accepted": "", "rejected": "x", "not_reached": "", "skipped": "", "unchosen": "/", "padding": "",
    "pending": "+", "bonus": "", "correction": "", "target": "",
}

_NAMES = {
    "accepted": "accepted",
    "rejected": "rejected",
    "not_reached": "not reached: below a node not accepted",
    "skipped": "not tested: a sibling was accepted first",
    "unchosen": "passed, other chain won",
    "padding": "padding (q = 0)",
    "pending": "drafted, not tested yet",
    "bonus": "bonus (target's own token)",
    "correction": "correction (after a rejection)",
    "target": "target token (AR)",
}
STATUS_NAMES: dict[str, str] = {status: f"{STATUS_GLYPHS[status]} {name}" for status, name in _NAMES.items()}
# In a hover, where the legend has said the rest: the name before its explanation ("⋯ not reached"); every update
# sends one hover per node.
STATUS_SHORT: dict[str, str] = {status: name.split(":")[0].split(" (")[0] for status, name in STATUS_NAMES.items()}

# Generated text: a light tint per origin, and a saturated one for the tokens of the step on show. Candidate
# origins bring their own (dynasd/origins.py); the target's own tokens are coloured here.
# gr.HighlightedText paints these at 50% opacity, so the "tints" are mid-strength colours and the tokens of the
# step on show use darker shades of the same hue.
_TARGET_TOKENS: dict[str, tuple[str, str, str]] = {  # origin -> (label, tint, strong)
    "correction": ("correction", "#f7a65a", "#d9650b"),
    "bonus": ("bonus", "#6fa9e8", "#1f5fb0"),
    "target": ("target (AR)", "#62cbd8", "#11808e"),
}
ORIGIN_NAMES: dict[str, str] = {**{o.name: o.label for o in ORIGINS},
                                **{name: label for name, (label, _, _) in _TARGET_TOKENS.items()}}
ORIGIN_TINTS: dict[str, str] = {**{o.name: o.tint for o in ORIGINS},
                                **{name: tint for name, (_, tint, _) in _TARGET_TOKENS.items()}}
ORIGIN_STRONG: dict[str, str] = {**{o.name: o.strong for o in ORIGINS},
                                 **{name: strong for name, (_, _, strong) in _TARGET_TOKENS.items()}}
THIS_STEP = " · this step"

# Mask cells.
MASK_BLOCKED = "#ffffff"
MASK_ATTENDS = "#5b8bd6"
MASK_ACCEPTED = STATUS_COLORS["accepted"]
MASK_UNUSED = "#cfcfcf"
SLICE_OUTLINE = "#d64541"

FONT = "Inter, system-ui, sans-serif"
def fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def test_lines(node) -> list[str]:
    """A tested node's acceptance test for a hover, in the one naming every view uses: p′, q′ (what the test used),
    u, and the rule it met (sampling.ACCEPT_RULE). No lines for a node without a sampled test."""
    if node.u is None or node.p_test is None or not node.q_test:
        return []
    accepted = passes(node.u, node.p_test, node.q_test)
    return [f"test: p′ {fmt(node.p_test)} · q′ {fmt(node.q_test)} · u {fmt(node.u)}",
            f"{ACCEPT_RULE if accepted else REJECT_RULE} → {'accept' if accepted else 'reject'}"]


def base_layout(title: str, height: int) -> dict:
    """Layout shared by all figures. The empty template keeps each figure small and quick to build (a named
    Plotly template adds ~6 kB and ~25 ms per figure); plotly.js defaults already give a white plot."""
    return dict(
        # the title sits at the top, below the 30 px strip where Gradio draws the plot's label and Plotly its
        # toolbar; legends go just above the plot, axis labels below it
        title=dict(text=title, x=0.01, xanchor="left", yref="container", y=1.0, yanchor="top", pad=dict(t=34),
                   font=dict(size=15)),
        height=height, template="none", font=dict(family=FONT, size=12, color="#222"),
        paper_bgcolor="white", plot_bgcolor="white",
        margin=dict(l=10, r=10, t=100, b=10), hoverlabel=dict(font=dict(family="monospace", size=12)),
    )


# Legends go below the plot: above it they collided with multi-line titles and, on a phone, with the toolbar.
TOP_LEGEND = dict(orientation="h", x=0, xanchor="left", y=0, yanchor="bottom", yref="container",
                  font=dict(size=11))
LEGEND_ROOM = 70  # bottom margin (px) that keeps two or three legend rows clear of the axis labels
