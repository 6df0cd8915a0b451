"""The candidate tree of one step, drawn left to right: the root (the last committed token) at the left, one
column per draft level, each node coloured by what verification decided about it.

Layout is a tidy tree computed here: leaves take evenly spaced rows in depth-first order and every parent sits
midway between its first and last child, so subtrees never overlap and siblings stay together. The bonus or
correction token the target adds after the walk is drawn as one more child of the node it was sampled after.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import plotly.graph_objects as go

from dynasd.origins import ORIGINS
from dynasd.trace import RunTrace, StepTrace
from dynasd.trace_semantics import (
    GREEDY,
    PASSED,
    SAMPLING,
    AcceptanceRule,
    drawn_status,
    final_token,
    node_rule,
    off_target_commit,
    step_rule,
)

from .style import (
    GLYPH_INK,
    LEGEND_ROOM,
    STATUS_COLORS,
    STATUS_GLYPHS,
    STATUS_NAMES,
    STATUS_SHORT,
    TOP_LEGEND,
    Figure,
    base_layout,
    fmt,
    show_token,
    test_lines,
)

ROOT = -1
STATUS_ORDER = ("accepted", "bonus", "correction", "target", "rejected", "unchosen", "skipped", "not_reached",
                "padding", "pending")
# A node's shape says which source proposed it (dynasd/origins.py); its colour says what the walk decided.
NODE_SYMBOLS = {origin.name: origin.symbol for origin in ORIGINS}
NODE_ORIGIN_NAMES = {origin.name: origin.source for origin in ORIGINS}
LABELS_UP_TO_ROWS = 80  # beyond this many leaf rows, token text stays in the hover only
GLYPHS_IN_MARKERS_FROM = 16  # marker size (px) from which a status glyph fits inside it; smaller: before the label
MAX_HEIGHT = 1000


def root_token(run: RunTrace, index: int) -> str | None:
    """The token the step grew its tree from (the last one committed before it)."""
    if index < 0 or index >= len(run.steps):
        return None
    return run.steps[index].root_token or None


def tree_graph(step: StepTrace) -> nx.DiGraph:
    """Nodes: ROOT, every tree node by index, ("left out", k) for a dynamic tree's draws the budget did not reach,
    and 'final' for the bonus/correction token. Edges in index order so children are visited in drafting order."""
    graph = nx.DiGraph()
    graph.add_node(ROOT, level=0)
    for i, node in enumerate(step.nodes):
        graph.add_node(i, level=node.level)
        graph.add_edge(node.parent, i)
    for k, draw in enumerate(step.growth.left_out if step.growth else []):
        graph.add_node(("left out", k), level=graph.nodes[draw.parent]["level"] + 1)
        graph.add_edge(draw.parent, ("left out", k))
    final = final_token(step)
    if final is not None:
        parent = final[2]
        graph.add_node("final", level=graph.nodes[parent]["level"] + 1)
        graph.add_edge(parent, "final")
    return graph


def tidy_layout(graph: nx.DiGraph) -> dict:
    """node -> (x, y): x = level, y = row (0 at the top)."""
    rows: dict = {}
    next_row = 0
    for node in nx.dfs_postorder_nodes(graph, ROOT):
        kids = list(graph.successors(node))
        if kids:
            rows[node] = (rows[kids[0]] + rows[kids[-1]]) / 2
        else:
            rows[node] = next_row
            next_row += 1
    return {node: (graph.nodes[node]["level"], rows[node]) for node in graph.nodes}


def _grown(step: StepTrace) -> dict[int, tuple[float, int]]:
    """node -> (cumulative draft probability, wave) for the nodes a dynamic tree grew."""
    growth = step.growth
    return {} if growth is None else {i: (v, w) for i, v, w in zip(growth.nodes, growth.values, growth.waves)}


def _hover(i: int, step: StepTrace, grown: dict[int, tuple[float, int]] | None = None) -> str:
    n = step.nodes[i]
    ratio = "–" if not n.q or n.p is None else f"{n.p / n.q:.3f}"  # p None: hidden until a guess
    lines = [f"<b>node {i}</b> · level {n.level} · {STATUS_SHORT[drawn_status(step, i)]}",
             f"token  {show_token(n.token, 24)}  (id {n.token_id})",
             f"origin {NODE_ORIGIN_NAMES[n.origin]}",
             f"p (target) {fmt(n.p)}",
             f"q (draft)  {fmt(n.q)}"]
    if n.status != "not_reached":  # the ratio the test reads; a node never tested has none to explain
        lines.append(f"p/q        {ratio}")
    if grown and i in grown:
        value, wave = grown[i]
        read = "read by the draft: its children could be drawn" if i in step.growth.expanded else \
            "not read by the draft (a last wave's node): a leaf"
        lines += [f"cumulative q {fmt(value)} (the product of q along its path)", f"drawn in wave {wave}; {read}"]
    chosen = target_choice(step, i) if n.status == "rejected" else None
    if chosen is not None:
        lines.append(chosen)
    tested = test_lines(n)
    if tested:
        lines += tested[:1] + ["p′, q′: p and q after the siblings tested before it were rejected",
                               "(the residual max(p − q, 0) and q without them, renormalised)"] + tested[1:]
    elif node_rule(n) is GREEDY:
        lines += [GREEDY.verdict(n.status in PASSED), f"(p and q do not decide at {GREEDY.short})"]
    return "<br>".join(lines)


def verdict_lines(node) -> list[str]:
    """A tested node's test for a hover, under the rule it met (trace_semantics.node_rule): p′, q′, u and
    u against min(1, p′/q′) when sampled (style.test_lines), whether it is the target's top token at T = 0."""
    if node_rule(node) is GREEDY:
        return [GREEDY.verdict(node.status in PASSED)]
    return test_lines(node)


def target_choice(step: StepTrace, i: int) -> str | None:
    """What the target took at a rejected node's position instead: an accepted sibling, or the correction drawn
    after the node's parent (at T = 0 the target's top token there)."""
    node = step.nodes[i]
    sibling = next((j for j, other in enumerate(step.nodes)
                    if other.parent == node.parent and other.status == "accepted"), None)
    if sibling is not None:
        return f"the target kept node {sibling} here: {show_token(step.nodes[sibling].token, 24)}"
    final = final_token(step)
    if final is not None and final[2] == node.parent and final[1] == "correction":
        what = "drew from the residual" if step_rule(step) is SAMPLING else "took its top token"
        return f"the target {what} here: {show_token(final[0], 24)}"
    return None


def _left_out_hover(draw, sampled: bool) -> str:
    where = "the root" if draw.parent == ROOT else f"node {draw.parent}"
    what = ("never drawn: at T > 0 a child is drawn only once it is chosen" if sampled
            else f"the draft's next-ranked token there: {show_token(draw.token, 24)}")
    return (f"<b>left out</b>: one more child of {where}<br>ranked at {fmt(draw.value)} (its parent's cumulative q "
            f"times the draft's next-ranked probability there):<br>the budget went to draws ranked higher<br>{what}")


def _growth_traces(step: StepTrace, pos: dict, left_x: list, left_y: list, marker_size: int,
                   label_chars: int) -> list[go.Scatter]:
    """A dynamic tree's growth: a ring around every node the draft read (its children could be drawn), and the
    most valuable draws the node budget did not reach, hollow and dotted, where they would have hung."""
    growth = step.growth
    traces = [go.Scatter(x=left_x, y=left_y, mode="lines", name="left out (budget)", hoverinfo="skip",
                         showlegend=False, line=dict(color="#b0b0b0", width=1, dash="dot"))]
    expanded = [i for i in growth.expanded if i in pos]
    if expanded:
        traces.append(go.Scatter(
            x=[pos[i][0] for i in expanded], y=[pos[i][1] for i in expanded], mode="markers",
            name="read by the draft (expanded)", hoverinfo="skip",
            marker=dict(size=marker_size + 6, symbol="circle-open", color="#6a3fb5", line=dict(width=2))))
    if growth.left_out:
        keys = [("left out", k) for k in range(len(growth.left_out))]
        sampled = growth.left_out[0].token_id < 0
        traces.append(go.Scatter(
            x=[pos[key][0] for key in keys], y=[pos[key][1] for key in keys],
            mode="markers+text" if label_chars else "markers", name="left out: the budget did not reach it",
            text=["?" if sampled else show_token(d.token, label_chars) for d in growth.left_out],
            textposition="middle right", textfont=dict(color="#8a8a8a"),
            marker=dict(size=max(marker_size - 6, 6), symbol="circle-open", color="#9a9a9a", line=dict(width=1.5)),
            hovertext=[_left_out_hover(d, sampled) for d in growth.left_out],
            hoverinfo="text"))
    return traces


@dataclass(frozen=True)
class _Sizes:
    """How big a tree is drawn: row pitch, marker and label size shrink together so ~100-node trees (64+ leaves)
    still fit and read; a label must fit in its column before the next level's markers, so deep trees get shorter
    labels; past LABELS_UP_TO_ROWS leaf rows token text stays in the hover only."""

    pitch: int
    marker: int
    text: int
    label_chars: int
    show_text: bool

    @property
    def glyphs_inside(self) -> bool:
        return self.marker >= GLYPHS_IN_MARKERS_FROM

    def label(self, token: str, status: str) -> str:
        shown = show_token(token, self.label_chars)
        return shown if self.glyphs_inside else f"{STATUS_GLYPHS[status]}{shown}"

    @property
    def mode(self) -> str:
        return "markers+text" if self.show_text else "markers"


def _sizes(graph: nx.DiGraph) -> _Sizes:
    leaves = sum(1 for node in graph.nodes if graph.out_degree(node) == 0)
    pitch, marker, text = (30, 26, 12) if leaves <= 20 else (22, 16, 11) if leaves <= 40 else (14, 9, 9)
    depth_levels = max((graph.nodes[node]["level"] for node in graph.nodes), default=0)
    label_chars = 10 if depth_levels <= 2 else 8 if depth_levels <= 3 else 6
    return _Sizes(pitch, marker, text, label_chars, leaves <= LABELS_UP_TO_ROWS)


def tree_figure(step: StepTrace, root_label: str | None = None, lossy: bool = False) -> go.Figure:
    graph = tree_graph(step)
    pos = tidy_layout(graph)
    sizes = _sizes(graph)
    on_path = set(step.accepted_path) | {ROOT}
    final = final_token(step)
    if final is not None and final[2] in on_path:
        on_path.add("final")  # the bonus/correction token extends the committed path
    traces, left_x, left_y = _edge_traces(graph, pos, on_path)
    if step.growth is not None:
        traces += _growth_traces(step, pos, left_x, left_y, sizes.marker, sizes.label_chars if sizes.show_text else 0)
    traces.append(_root_trace(pos, root_label, sizes.marker))
    marked = []  # (xs, ys, status) of every node drawn, for the status glyphs inside the markers
    by_status: dict[str, list] = {}
    for i in range(len(step.nodes)):
        by_status.setdefault(drawn_status(step, i), []).append(i)
    grown = _grown(step)
    for status in STATUS_ORDER:
        if status in ("bonus", "correction", "target"):
            if final is not None and final[1] == status:
                traces.append(_final_trace(step, final, pos["final"], sizes))
                marked.append(([pos["final"][0]], [pos["final"][1]], status))
        elif by_status.get(status):
            members = by_status[status]
            traces.append(_node_trace(step, members, status, pos, sizes, on_path, grown))
            marked.append(([pos[i][0] for i in members], [pos[i][1] for i in members], status))
    if sizes.glyphs_inside and marked:
        traces.append(_glyph_trace(marked, sizes.marker))
    return Figure(data=traces, layout=_tree_layout(step, pos, sizes, lossy, empty=not step.nodes and final is None))


def _edge_traces(graph: nx.DiGraph, pos: dict, on_path: set) -> tuple[list[go.Scatter], list, list]:
    """The plain edges and the committed path's, and the coordinates of the left-out draws' edges (drawn with
    the growth)."""
    plain_x: list = []
    plain_y: list = []
    path_x: list = []
    path_y: list = []
    left_x: list = []
    left_y: list = []
    for parent, child in graph.edges:
        xs, ys = (path_x, path_y) if (parent in on_path and child in on_path) else (plain_x, plain_y)
        if isinstance(child, tuple):
            xs, ys = left_x, left_y
        (x0, y0), (x1, y1) = pos[parent], pos[child]
        xs += [x0, x1, None]
        ys += [y0, y1, None]
    return [go.Scatter(x=plain_x, y=plain_y, mode="lines", name="edge", hoverinfo="skip",
                       line=dict(color="#c8c8c8", width=1.2), showlegend=False),
            go.Scatter(x=path_x, y=path_y, mode="lines", name="committed path", hoverinfo="skip",
                       line=dict(color=STATUS_COLORS["accepted"], width=4))], left_x, left_y


def _root_trace(pos: dict, root_label: str | None, marker_size: int) -> go.Scatter:
    root_text = show_token(root_label) if root_label is not None else "last prompt token"
    return go.Scatter(
        x=[0], y=[pos[ROOT][1]], mode="markers+text", name="root", textposition="bottom center",
        text=[show_token(root_label) if root_label is not None else "prompt"],
        marker=dict(size=marker_size + 4, color="#333333", symbol="square"),
        hovertext=[f"<b>root</b>: {root_text}<br>the last committed token;<br>level-1 candidates follow it"],
        hoverinfo="text", showlegend=False)


# short lines: a hover wider than the plot is cut at its edge (a phone)
FINAL_WHY = {"bonus": "every child was accepted (or there were none):<br>the target adds one token for free",
             "correction": "a child was rejected: sampled from<br>the residual max(p − q, 0), renormalised",
             "target": "autoregressive: the target's own next token"}
GREEDY_WHY = {**FINAL_WHY, "correction": f"no child was the target's top token:<br>{GREEDY.correction} is "
                                         "committed instead"}


def _final_hover(step: StepTrace, token: str, status: str, after: str) -> str:
    """Where the token after the walk came from, under the rule the step's walk applied (trace_semantics.step_rule);
    a step that tested nothing (ar, an empty tree) does not say which, so both are named with their conditions."""
    rule = step_rule(step)
    origin = "correction" if status == "correction" else "bonus"
    if rule is SAMPLING:
        how, why = f"sampled after {after}", FINAL_WHY[status]
    elif rule is GREEDY:
        how, why = f"{getattr(GREEDY, origin)} after {after}", GREEDY_WHY[status]
    else:
        how = (f"after {after}: {getattr(GREEDY, origin)} at {GREEDY.short},<br>{getattr(SAMPLING, origin)} at "
               f"{SAMPLING.short}")
        why = FINAL_WHY[status]
    # final_p is the probability under the distribution the token came from: for a correction when sampling that
    # is the residual, not the target's p, so it is named as the rule names it
    named = _correction_p(rule) if status == "correction" else "p (target)"
    return (f"<b>{status}</b> token {show_token(token, 24)}<br>{how}"
            + ("" if step.final_p is None else f"<br>with {named} = {fmt(step.final_p)}") + f"<br>{why}")


def _correction_p(rule: AcceptanceRule | None) -> str:
    return rule.correction_p if rule is not None else f"{GREEDY.correction_p} or {SAMPLING.correction_p}"


def _final_trace(step: StepTrace, final: tuple, at: tuple, sizes: _Sizes) -> go.Scatter:
    """The token the target adds after the walk (bonus, correction or, for ar, its own), as a star."""
    token, status, parent = final
    after = "the root" if parent == ROOT else f"node {parent}"
    return go.Scatter(
        x=[at[0]], y=[at[1]], mode=sizes.mode, name=STATUS_NAMES[status],
        text=[sizes.label(token, status)], textposition="middle right",
        marker=dict(size=sizes.marker, color=STATUS_COLORS[status], symbol="star", line=dict(color="#222", width=1)),
        hovertext=[_final_hover(step, token, status, after)], hoverinfo="text")


def _node_trace(step: StepTrace, members: list[int], status: str, pos: dict, sizes: _Sizes, on_path: set,
                grown: dict) -> go.Scatter:
    """The nodes the walk gave one status: shaped by their source, ringed dark on the committed path."""
    return go.Scatter(
        x=[pos[i][0] for i in members], y=[pos[i][1] for i in members], mode=sizes.mode, name=STATUS_NAMES[status],
        text=[sizes.label(step.nodes[i].token, status) for i in members], textposition="middle right",
        marker=dict(size=sizes.marker, color=STATUS_COLORS[status],
                    symbol=[NODE_SYMBOLS[step.nodes[i].origin] for i in members],
                    line=dict(color=["#222" if i in on_path else "white" for i in members], width=1.5)),
        hovertext=[_hover(i, step, grown) for i in members], hoverinfo="text", customdata=members)


def _glyph_trace(marked: list[tuple[list, list, str]], marker_size: int) -> go.Scatter:
    """Each drawn node's status glyph inside its marker: the meaning never by colour alone."""
    xs = [x for part, _, _ in marked for x in part]
    ys = [y for _, part, _ in marked for y in part]
    glyphs = [STATUS_GLYPHS[status] for part, _, status in marked for _ in part]
    ink = [GLYPH_INK[status] for part, _, status in marked for _ in part]
    return go.Scatter(x=xs, y=ys, text=glyphs, mode="text", name="status glyphs", textposition="middle center",
                      hoverinfo="skip", showlegend=False, textfont=dict(size=max(marker_size - 12, 10), color=ink))


def _tree_title(step: StepTrace, lossy: bool) -> str:
    accepted = len(step.accepted_path)
    # two short lines rather than one long one, which a phone-wide panel cut off
    title = (f"Step {step.index}: {len(step.nodes)} candidates<br>{accepted} accepted, "
             f"{len(step.committed)} token{'s' if len(step.committed) != 1 else ''} committed")
    if lossy:
        title += "<br>LOSSY method: the text may differ from the target's"  # own line: never cut off
    if step.growth is not None:
        g = step.growth
        # short enough for a phone-wide panel: the legend and the hovers say the rest
        title += f"<br>grown: {len(g.nodes)}/{g.budget} nodes, {max(g.waves, default=0)} waves, {len(g.expanded)} read"
    return title


def _off_target_annotations(step: StepTrace, pos: dict, lossy: bool) -> list[dict]:
    """A lossy method's commit that is not the target's top token, pointed at."""
    departed = off_target_commit(step) if lossy else None
    if departed is None:
        return []
    chosen, top = departed
    x, y = pos[chosen]
    return [dict(
        x=x, y=y, ax=40, ay=-30, showarrow=True, arrowhead=2, arrowcolor=STATUS_COLORS["correction"],
        font=dict(color=STATUS_COLORS["correction"], size=11), bgcolor="rgba(255,255,255,0.85)",
        text=(f"committed {show_token(step.nodes[chosen].token, 12)} (p = {fmt(step.nodes[chosen].p)}),<br>"
              f"not the target's top {show_token(step.nodes[top].token, 12)} (p = {fmt(step.nodes[top].p)})"),
        name="off-target commit")]


def _tree_layout(step: StepTrace, pos: dict, sizes: _Sizes, lossy: bool, empty: bool) -> dict:
    depth = max((x for x, _ in pos.values()), default=0)
    rows = max((y for _, y in pos.values()), default=0) + 1
    layout = base_layout(_tree_title(step, lossy),
                         height=int(min(MAX_HEIGHT, max(300, 150 + LEGEND_ROOM + rows * sizes.pitch))))
    layout["font"] = dict(layout["font"], size=sizes.text)
    layout.update(
        legend=TOP_LEGEND, margin=dict(l=10, r=10, b=LEGEND_ROOM, t=100),
        annotations=_off_target_annotations(step, pos, lossy),
        xaxis=dict(tickmode="array", tickvals=list(range(depth + 1)),
                   ticktext=["root"] + [f"level {lvl}" if lvl <= step.live_depth else "target's token"
                                        for lvl in range(1, depth + 1)],
                   range=[-0.6, depth + 1.1], showgrid=False, zeroline=False, automargin=True),
        yaxis=dict(visible=False, autorange="reversed"))
    if empty:
        layout["annotations"] = [dict(text="no candidates this step", showarrow=False, x=0.5, y=0.5,
                                      xref="paper", yref="paper")]
    return layout
