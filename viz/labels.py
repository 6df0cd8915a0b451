"""Row labels drawn as a text trace beside the plot instead of as Plotly tick labels, and the margin they need.

Why: plotly.js measures every tick label each time it redraws a figure, about 0.7 ms a label in headless
Chromium on a 2-core machine. The verify mask of the default 44-node tree had 45 row and 46 column token labels:
~85 ms of a ~100 ms redraw, ~155 ms with automargin (which draws, measures and draws again). A text trace is laid
out without measuring: the whole mask redraws in ~18 ms. The price is that the margin holding the labels is
computed here from their length, since Plotly's automargin does not see a trace's text.
"""
from __future__ import annotations

import html

import plotly.graph_objects as go

CHAR_WIDTH = 0.62  # an average glyph's width as a share of the font size (a sans-serif font; digits and ␣ included)
PAD_PX = 8


def strided(count: int, most: int) -> list[int]:
    """At most about `most` of the indices 0..count-1: every k-th, the last k-th moved to the last index (so the
    end is marked, and no two labels are closer than k: "40" and "43" ran into each other on a phone)."""
    every = max(1, -(-count // most))
    kept = list(range(0, count, every))
    if len(kept) > 1 and kept[-1] != count - 1:
        kept[-1] = count - 1
    return kept


def label_width(labels: list[str], size: int) -> int:
    """Pixels the longest label takes at this font size (an estimate on the wide side: labels must not be cut)."""
    longest = max((len(html.unescape(label)) for label in labels), default=0)
    return int(longest * size * CHAR_WIDTH) + PAD_PX


# The labels sit on a hidden x axis laid over the plot's (range 0-1), at its left edge: Plotly hides a text point
# outside its axis' range, so they cannot sit left of the first column on the plot's own axis.
LABEL_AXIS = dict(overlaying="x", range=[0, 1], visible=False, fixedrange=True)


def row_label_trace(ys: list[float], labels: list[str], size: int, name: str = "row labels") -> go.Scatter:
    """Labels right-aligned at the plot's left edge for the rows at `ys`, drawn into the left margin (which
    `label_width` sizes). The layout needs `xaxis2=LABEL_AXIS`."""
    # rows named by their labels (a category axis) print their own name: the labels need not travel twice
    named = list(ys) == list(labels)
    return go.Scatter(x=[0] * len(ys), y=ys, xaxis="x2", text=None if named else labels,
                      texttemplate="%{y}" if named else None, mode="text", textposition="middle left",
                      textfont=dict(size=size), cliponaxis=False, showlegend=False, hoverinfo="skip", name=name)
