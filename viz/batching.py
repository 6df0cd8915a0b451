"""Rows and batches: the measured forward time against its rows (relative to one row), and the MODELLED speed-up
over ar against a server's batch size (dynasd/explorer/measure/batching.py), one above the other."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dynasd.explorer.measure.batching import RowCost, memory_bound_rows

from .style import STATUS_COLORS, TOP_LEGEND, base_layout


def batching_figure(cost: RowCost, points: list[tuple[int, float]]) -> go.Figure:
    rows = sorted(cost.calibration)
    one = cost.calibration[1]
    figure = make_subplots(rows=2, cols=1, vertical_spacing=0.22, subplot_titles=(
        "Measured: forward time by rows (× one row)", "MODEL: speed-up over ar by batch size"))
    figure.add_trace(go.Scatter(x=rows, y=[cost.calibration[r] / one for r in rows], mode="markers+lines",
                                name="measured on this device", marker=dict(size=9, color="#4a78c2"),
                                hovertemplate="%{x} rows: %{y:.2f}× one row<extra></extra>"), 1, 1)
    figure.add_trace(go.Scatter(x=rows, y=[cost.forward_s(r) / one for r in rows], mode="lines",
                                name="line fit a + b·rows", line=dict(color="#999", dash="dot")), 1, 1)
    bound = memory_bound_rows(cost.calibration)
    figure.add_vrect(x0=1, x1=max(bound, 1.0001), fillcolor="#dfe9f7", opacity=0.6, line_width=0, row=1, col=1,
                     annotation_text="memory-bound", annotation_position="top left")
    batches, speedups = [b for b, _ in points], [s for _, s in points]
    figure.add_trace(go.Scatter(x=batches, y=speedups, mode="markers+lines", name="modelled speed-up",
                                line=dict(color=STATUS_COLORS["correction"], dash="dash"),
                                hovertemplate="batch %{x}: %{y:.2f}× (model)<extra></extra>"), 2, 1)
    figure.add_hline(y=1.0, line=dict(color="#222", width=1), row=2, col=1, annotation_text="ar (1×)",
                     annotation_position="bottom right")
    layout = base_layout("Rows and batches", height=640)
    layout.update(legend=TOP_LEGEND, margin=dict(l=10, r=10, t=90, b=80))
    figure.update_layout(layout)
    figure.update_xaxes(type="log", dtick=0.30103, automargin=True)
    figure.update_xaxes(title="rows in one forward", row=1, col=1)
    figure.update_xaxes(title="batch size (model)", row=2, col=1)
    figure.update_yaxes(title="× one row", gridcolor="#eee", automargin=True, rangemode="tozero", row=1, col=1)
    figure.update_yaxes(title="speed-up (model)", gridcolor="#eee", automargin=True, rangemode="tozero", row=2,
                        col=1)
    figure.update_annotations(font=dict(size=12))
    return figure
