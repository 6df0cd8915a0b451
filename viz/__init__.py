"""Plotly figure builders: pure functions from traces (dynasd.trace) and measured results to figures and text."""
from .compare import compare_figure, compare_table
from .decisions import pq_figure, stop_figure
from .mask import mask_figure, mask_view, max_mask_rows
from .text import step_story, text_color_map, text_spans
from .timeline import TOKENS_PER_S, summary_markdown, timeline_figure
from .tree import root_token, tree_figure

__all__ = ["TOKENS_PER_S", "compare_figure", "compare_table", "mask_figure", "mask_view", "max_mask_rows",
           "pq_figure", "root_token", "step_story", "stop_figure", "summary_markdown", "text_color_map",
           "text_spans", "timeline_figure", "tree_figure"]
