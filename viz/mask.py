"""The verify mask of one step: which earlier positions each verified position may attend to.

Rows are the positions the target scores in its one forward (the root row, when the last committed token is not
cached yet, then every tree node); columns are what they may look at. All committed context is visible to every
row, so it is collapsed into one labelled column. Tree nodes see themselves and their ancestors only, which is
what lets many candidate continuations share one forward without seeing each other.

Axes are categories named by their labels (`id·token`, unique by the id): two nodes with the same token keep two
rows, and a cell's hover names its row and column exactly as the axes do, with the cell's meaning in words. Rows
are labelled by a text trace (viz/labels.py: Plotly's tick labels cost ~0.7 ms each per redraw); columns repeat
the rows' order, so they carry every other node id. Meaning never rests on colour alone: the accepted path's cells
carry a ✓ and the max mask's undrafted cells a dot.
With dynamic depth the figure shows the mask of the largest tree, the step's live slice outlined inside it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from dynasd.options import tree_of_run
from dynasd.trace import RunTrace, StepTrace
from dynasd.tree import ancestor_mask

from .labels import LABEL_AXIS, label_width, row_label_trace, strided
from .style import (
    LEGEND_ROOM,
    MASK_ACCEPTED,
    MASK_ATTENDS,
    MASK_BLOCKED,
    MASK_UNUSED,
    SLICE_OUTLINE,
    TOP_LEGEND,
    Figure,
    base_layout,
    show_token,
)

BLOCKED, ATTENDS, ACCEPTED_ROW, UNUSED = 0, 1, 2, 3  # cell values; UNUSED = in the max mask, not drafted
CELL_NAMES = {BLOCKED: "blocked", ATTENDS: "attends", ACCEPTED_ROW: "✓ accepted path attends",
              UNUSED: "· max mask, not drafted"}
# What a cell's hover says after "may attend:": one short word a cell (a blocked cell's "no" is 5 bytes of JSON;
# the default 45 x 46 mask's words ~11 kB), since the hover cannot map a cell's code to words by itself.
CELL_WORDS = {BLOCKED: "no", ATTENDS: "yes", ACCEPTED_ROW: "yes (accepted path)", UNUSED: "not drafted (max mask)"}
WORDS_UP_TO_CELLS = 64 * 64  # beyond, the hover gives the cell's code and the legend its meaning
MAX_MASK_NODES = 512
MAX_ROW_LABELS = 64  # row labels at most (every k-th row beyond)
MAX_COLUMN_TICKS = 24  # every other node id of the default 44-node tree: ~13 px apart on a phone
MAX_PATTERN_MARKS = 400  # the ✓ and · marks drawn over cells at most (a text point each)
MASK_LABEL_CHARS = 8  # row labels: longer tokens are cut (the tree's hover has them in full)
CELL_HOVER = "<b>%{y}</b> → %{x}<br>may attend: %{text}<extra></extra>"
CODE_HOVER = "<b>%{y}</b> → %{x}<br>cell %{z} (0 blocked · 1 attends · 2 accepted path · 3 not drafted)<extra></extra>"


def max_mask_rows(run: RunTrace, expected_nodes: int | None = None) -> list[str] | None:
    """The largest tree's ancestor mask, rebuilt from the options a run records (None when the run has no tree,
    or they do not describe the tree the steps used)."""
    shape = tree_of_run(run.method, run.config)
    if shape is None or shape.num_nodes > MAX_MASK_NODES:
        return None
    if expected_nodes is not None and shape.num_nodes != expected_nodes:
        return None
    return ["".join("1" if v else "0" for v in row) for row in ancestor_mask(shape.parents).tolist()]


@dataclass
class MaskView:
    z: list[list[int]]       # rows x columns of cell values (BLOCKED, ATTENDS, ACCEPTED_ROW, UNUSED)
    row_labels: list[str]
    root_rows: int           # rows (and columns) before the tree block
    tree_offset: int         # column of tree node 0 (= 1 + root_rows: the context band comes first)
    live: int                # live tree nodes
    size: int                # tree nodes drawn (live, or the max tree's)
    shows_max: bool


def mask_view(step: StepTrace, max_rows: list[str] | None = None, show_max: bool | None = None,
              root_label: str | None = None) -> MaskView:
    live = len(step.nodes)
    if show_max is None:
        show_max = max_rows is not None and (step.live_depth < step.max_depth or step.stop_policy != "none")
    if show_max and (max_rows is None or len(max_rows) < live):
        show_max = False
    size = len(max_rows) if show_max else live
    root_rows = step.root_rows
    offset = 1 + root_rows
    accepted = set(step.accepted_path)

    def tree_cell(row: int, col: int) -> int:
        if row < live and col < live:
            return ATTENDS if step.verify_mask[row][col] == "1" else BLOCKED
        return UNUSED if max_rows[row][col] == "1" else BLOCKED

    z: list[list[int]] = []
    for r in range(root_rows):  # committed tokens fed with the tree: causal among themselves
        z.append([ATTENDS] + [ATTENDS if c <= r else BLOCKED for c in range(root_rows)] + [BLOCKED] * size)
    for i in range(size):
        on = ACCEPTED_ROW if i in accepted else ATTENDS if i < live else UNUSED
        z.append([on] + [on] * root_rows
                 + [ACCEPTED_ROW if (i in accepted and tree_cell(i, j) == ATTENDS) else tree_cell(i, j)
                    for j in range(size)])

    # unique names (they are the axis categories): the last root row is the root, earlier ones count back from it
    last = f"root {show_token(root_label, MASK_LABEL_CHARS)}" if root_label is not None else "root"
    root_names = [last if r == root_rows - 1 else f"root−{root_rows - 1 - r}" for r in range(root_rows)]
    node_names = []
    for i in range(size):
        if i < live:
            mark = "✓ " if i in accepted else ""
            node_names.append(f"{mark}{i}·{show_token(step.nodes[i].token, MASK_LABEL_CHARS)}")
        else:
            node_names.append(f"{i}·–")
    return MaskView(z=z, row_labels=root_names + node_names,
                    root_rows=root_rows, tree_offset=offset, live=live, size=size, shows_max=show_max)


def column_names(view: MaskView) -> list[str]:
    """The columns' categories, as the hover names them: the context band, then the rows' own labels (a column is
    the position its row scores)."""
    return ["ctx", *view.row_labels]


def _column_ticks(view: MaskView, names: list[str]) -> tuple[list[str], list[str]]:
    """The context column, the root column(s), then every k-th tree node by id (the rows spell the tokens out)."""
    ids = strided(view.size, MAX_COLUMN_TICKS)
    roots = names[1:view.tree_offset]
    return (["ctx", *roots, *(names[view.tree_offset + i] for i in ids)],
            ["ctx", *(["root"] if view.root_rows else []), *[""] * max(view.root_rows - 1, 0), *(str(i) for i in ids)])


def _pattern_traces(view: MaskView, names: list[str], tick_size: int) -> list[go.Scatter]:
    """Marks that say without colour what a cell is: ✓ on the accepted path's cells, a dot on the max mask's
    undrafted ones (up to MAX_PATTERN_MARKS of each)."""
    traces = []
    for value, glyph, color in ((ACCEPTED_ROW, "✓", "white"), (UNUSED, "·", "#555")):
        cells = [(r, c) for r, row in enumerate(view.z) for c, v in enumerate(row) if v == value]
        if not cells or len(cells) > MAX_PATTERN_MARKS:
            continue
        traces.append(go.Scatter(x=[names[c] for _, c in cells], y=[view.row_labels[r] for r, _ in cells],
                                 mode="text", text=[glyph] * len(cells), hoverinfo="skip", showlegend=False,
                                 textfont=dict(size=max(tick_size, 9), color=color), name=f"{CELL_NAMES[value]} marks"))
    return traces


def mask_figure(step: StepTrace, max_rows: list[str] | None = None, show_max: bool | None = None,
                root_label: str | None = None) -> go.Figure:
    """`root_label`: the last committed token (see viz.tree.root_token); root rows are labelled with it."""
    view = mask_view(step, max_rows, show_max, root_label)
    rows, cols = len(view.z), len(view.z[0]) if view.z else 0
    names = column_names(view)
    colorscale = [[0.0, MASK_BLOCKED], [1 / 6, MASK_BLOCKED], [1 / 6, MASK_ATTENDS], [0.5, MASK_ATTENDS],
                  [0.5, MASK_ACCEPTED], [5 / 6, MASK_ACCEPTED], [5 / 6, MASK_UNUSED], [1.0, MASK_UNUSED]]
    small = rows * cols <= 50 * 50
    words = rows * cols <= WORDS_UP_TO_CELLS
    # uint8 cells: plotly.py sends numpy arrays as base64 typed arrays, ~1.4 bytes a cell instead of ~3
    heat = dict(z=np.asarray(view.z, dtype=np.uint8).reshape(rows, cols), x=names, y=view.row_labels, zmin=0,
                zmax=3, colorscale=colorscale, showscale=False, xgap=1 if small else 0, ygap=1 if small else 0,
                name="mask", hovertemplate=CELL_HOVER if words else CODE_HOVER)
    if words:  # an object array: Plotly checks a nested list cell by cell (~4 ms for 2,000 cells), sent the same
        heat["text"] = np.array([[CELL_WORDS[v] for v in row] for row in view.z], dtype=object)
    tick_size = 12 if max(rows, cols) <= 24 else 10 if max(rows, cols) <= 48 else 8
    yticks = strided(len(view.row_labels), MAX_ROW_LABELS)
    ytext = [view.row_labels[i] for i in yticks]
    traces = [go.Heatmap(**heat), row_label_trace(ytext, ytext, tick_size), *_pattern_traces(view, names, tick_size),
              *_swatches(view)]
    shapes, annotations = _separator_and_slice(step, view, rows)

    xticks, xtext = _column_ticks(view, names)
    cached = step.context_len - view.root_rows
    # the column order in a short line of the title, which spans the figure (a long axis title would be cut)
    title = (f"{mask_title(step, view)}<br><span style='font-size:11px'>columns: context ({cached} tokens), "
             "root, nodes</span>")
    layout = base_layout(title, height=int(min(900, max(300, 190 + LEGEND_ROOM + rows * 15))))
    # fixed margins (no automargin: it draws the figure twice): the row labels on the left, below the plot the
    # column ticks (turned upright), the axis title and the legend
    bottom = LEGEND_ROOM + label_width(xtext, tick_size) + 22
    layout.update(
        shapes=shapes, annotations=annotations, legend=TOP_LEGEND,
        margin=dict(l=label_width(ytext, tick_size) + 6, r=10, b=bottom, t=100),
        xaxis=dict(type="category", tickmode="array", tickvals=xticks, ticktext=xtext, tickangle=-90,
                   showgrid=False, zeroline=False, range=[-0.5, cols - 0.5], tickfont=dict(size=tick_size),
                   # short: a long axis title is cut at the figure's edges when the plot is narrow (a phone)
                   title=dict(text="attends to", font=dict(size=11), standoff=4)),
        xaxis2=LABEL_AXIS,
        yaxis=dict(type="category", showticklabels=False, ticks="", autorange="reversed", showgrid=False,
                   zeroline=False),
        hoverlabel=dict(font=dict(family="monospace", size=12), align="left"))
    return Figure(data=traces, layout=layout)


def _swatches(view: MaskView) -> list[go.Scatter]:
    """Legend entries for the discrete colours (the unused one only where the figure shows the deepest tree)."""
    swatch = {ATTENDS: MASK_ATTENDS, ACCEPTED_ROW: MASK_ACCEPTED, BLOCKED: MASK_BLOCKED, UNUSED: MASK_UNUSED}
    return [go.Scatter(x=[None], y=[None], mode="markers", name=CELL_NAMES[value],
                       marker=dict(symbol="square", size=12, color=color, line=dict(color="#999", width=1)))
            for value, color in swatch.items() if value != UNUSED or view.shows_max]


def _separator_and_slice(step: StepTrace, view: MaskView, rows: int) -> tuple[list[dict], list[dict]]:
    """A dotted line between the context band (and root rows) and the tree block, and, where the figure shows the
    deepest tree, the live slice outlined and named (shapes on category axes are placed by the categories' index)."""
    shapes = [dict(type="line", x0=view.tree_offset - 0.5, x1=view.tree_offset - 0.5, y0=-0.5, y1=rows - 0.5,
                   line=dict(color="#777", width=1, dash="dot"), name="tree-block-start")]
    if not (view.shows_max and view.live):
        return shapes, []
    top = view.root_rows
    shapes.append(dict(type="rect", name="live slice", x0=view.tree_offset - 0.5, x1=view.tree_offset + view.live - 0.5,
                       y0=top - 0.5, y1=top + view.live - 0.5, line=dict(color=SLICE_OUTLINE, width=3)))
    return shapes, [dict(x=view.tree_offset + view.live - 0.5, y=top + view.live - 0.5, xanchor="left",
                         yanchor="top", showarrow=False, font=dict(color=SLICE_OUTLINE, size=12),
                         text=f"live slice: {step.live_depth} of {step.max_depth} levels, "
                              f"{view.live} of {view.size} nodes")]


def mask_title(step: StepTrace, view: MaskView) -> str:
    """Counts the rows the target really scored: the root rows and the live nodes. With dynamic depth the figure
    draws the largest tree's mask too, but those extra rows were never sent to the target."""
    scored = view.root_rows + view.live
    if not view.live:
        return (f"Step {step.index}: verify mask, no candidates<br>the target took a plain step "
                f"({max(scored, 1)} row)")
    title = f"Step {step.index}: verify mask<br>{scored} rows scored in one target forward"
    if view.shows_max and view.live < view.size:
        title += f" ({view.live} of {view.size} nodes drafted)"
    return title
