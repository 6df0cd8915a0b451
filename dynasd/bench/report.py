"""The benchmark's HTML report: Plotly charts of summary.json and the table behind them, in one file.

`figures(summary)` is pure (summary rows in, Plotly figures out); `write_report` adds the page around them.
plotly.js is embedded once (the report then opens offline) or loaded from the CDN.
"""
from __future__ import annotations

import html
from pathlib import Path

import plotly.express as px
import plotly.graph_objects as go

REFERENCE = "ar"


def _rows(summary: list[dict], temperature: float) -> list[dict]:
    return [r for r in summary if r["temperature"] == temperature]


TIME_PARTS = (("draft forwards", "draft_seconds", "#4c78a8"), ("target forwards", "verify_seconds", "#f58518"),
              ("everything else", "other_seconds", "#bab0ac"))


def method_colors(methods: list[str]) -> dict[str, str]:
    """One color per method, the same in every chart."""
    palette = px.colors.qualitative.Plotly + px.colors.qualitative.D3
    return {m: palette[i % len(palette)] for i, m in enumerate(methods)}


def _grouped_bars(rows: list[dict], value: str, methods: list[str], categories: list[str],
                  text_format: str, colors: dict[str, str]) -> list[go.Bar]:
    bars = []
    for method in methods:
        by_category = {r["category"]: r[value] for r in rows if r["method"] == method}
        ys = [by_category.get(c) for c in categories]
        bars.append(go.Bar(name=method, x=categories, y=ys, marker_color=colors[method],
                           text=[None if y is None else format(y, text_format) for y in ys], textposition="outside"))
    return bars


def figures(summary: list[dict]) -> list[tuple[str, go.Figure]]:
    """(title, figure) pairs: per temperature, speedup and tokens per target forward by category, acceptance,
    the time split, and (T=0) the share of tokens that differ from ar."""
    methods = list(dict.fromkeys(r["method"] for r in summary))
    categories = list(dict.fromkeys(r["category"] for r in summary if r["category"] != "all")) + ["all"]
    colors = method_colors(methods)
    out = []
    for temperature in sorted({r["temperature"] for r in summary}):
        rows = _rows(summary, temperature)
        tag = f"T={temperature:g}"

        fig = go.Figure(_grouped_bars(rows, "speedup_vs_ar", [m for m in methods if m != REFERENCE], categories,
                                      ".2f", colors))
        fig.add_hline(y=1.0, line_dash="dash", annotation_text="ar", annotation_position="top left")
        fig.update_layout(barmode="group", yaxis_title="tokens/s over ar's tokens/s (same run)")
        out.append((f"Speedup over ar by category, {tag}", fig))

        fig = go.Figure(_grouped_bars(rows, "tokens_per_target_forward", methods, categories, ".2f", colors))
        fig.update_layout(barmode="group", yaxis_title="new tokens per target forward")
        out.append((f"Tokens per target forward by category, {tag}", fig))

        spec_methods = [m for m in methods if any(r["method"] == m and r["acceptance_rate"] is not None
                                                  for r in rows)]
        if spec_methods:
            fig = go.Figure(_grouped_bars(rows, "acceptance_rate", spec_methods, categories, ".2f", colors))
            fig.update_layout(barmode="group", yaxis_title="accepted / attempted draft levels", yaxis_range=[0, 1.1])
            out.append((f"Acceptance rate by category, {tag}", fig))

        overall = [next(r for r in rows if r["method"] == m and r["category"] == "all") for m in methods]

        drafting = [r for r in overall if r.get("per_position_acceptance")]
        if drafting:
            fig = go.Figure()
            for r in drafting:
                rates = r["per_position_acceptance"]
                fig.add_scatter(name=r["method"], x=list(range(1, len(rates) + 1)), y=rates, mode="lines+markers",
                                line_color=colors[r["method"]])
            fig.update_layout(xaxis_title="draft position k", xaxis_dtick=1, yaxis_range=[0, 1.05],
                              yaxis_title="share of drafts whose accepted path reached k")
            out.append((f"Per-position acceptance rate (all prompts), {tag}", fig))

        scored = [r for r in overall if r.get("mean_log_likelihood") is not None]
        if scored:
            fig = go.Figure(go.Bar(
                x=[r["method"] + ("" if r["lossless"] else " (lossy)") for r in scored],
                y=[r["mean_log_likelihood"] for r in scored],
                error_y=dict(type="data", array=[r["mean_log_likelihood_se"] or 0 for r in scored]),
                marker_color=[colors[r["method"]] for r in scored],
                text=[format(r["mean_log_likelihood"], ".3f") for r in scored], textposition="outside"))
            fig.update_layout(yaxis_title="target's mean log-likelihood per token (higher: more target-like)")
            out.append((f"Quality: the target's log-likelihood of each method's text, {tag}", fig))
        fig = go.Figure()
        for part, key, color in TIME_PARTS:
            ys = [1000 * r[key] / r["new_tokens"] if r["new_tokens"] else None for r in overall]
            fig.add_bar(name=part, x=methods, y=ys, marker_color=color)
        fig.update_layout(barmode="stack", yaxis_title="milliseconds per new token (all prompts)")
        out.append((f"Where the time goes, {tag}", fig))

        if temperature == 0:
            fig = go.Figure(_grouped_bars(rows, "differing_token_share", [m for m in methods if m != REFERENCE],
                                          categories, ".1%", colors))
            fig.update_layout(barmode="group", yaxis_title="share of tokens differing from ar (from first divergence)",
                              yaxis_tickformat=".0%")
            out.append((f"Fidelity: tokens that differ from ar's greedy output, {tag}", fig))
    for _, fig in out:
        fig.update_layout(template="plotly_white", height=420, margin=dict(t=30, b=40, l=60, r=20),
                          legend=dict(orientation="h", y=-0.15))
    return out


def _table(summary: list[dict]) -> str:
    columns = [("method", "method", "s"), ("T", "temperature", "g"), ("category", "category", "s"),
               ("prompts", "n_prompts", "d"), ("tokens/s", "tokens_per_s", ".1f"),
               ("speedup vs ar", "speedup_vs_ar", ".2f"), ("mean acceptance length", "mean_acceptance_length", ".2f"),
               ("acceptance", "acceptance_rate", ".2f"), ("draft tokens proposed", "draft_tokens_proposed", "d"),
               ("accepted", "draft_tokens_accepted", "d"), ("draft time", "draft_share", ".0%"),
               ("verify time", "verify_share", ".0%"), ("identical to ar", "identical_share", ".0%"),
               ("differing tokens", "differing_token_share", ".1%"),
               ("mean log-likelihood", "mean_log_likelihood", ".3f"), ("perplexity", "perplexity", ".2f"),
               ("log-likelihood vs ar", "log_likelihood_vs_ar", "+.3f"),
               ("judge: mean log-likelihood", "judge_mean_log_likelihood", ".3f")]
    head = "".join(f"<th>{html.escape(name)}</th>" for name, _, _ in columns)
    body = []
    for row in summary:
        cells = "".join(f"<td>{'–' if row.get(key) is None else html.escape(format(row[key], fmt))}</td>"
                        for _, key, fmt in columns)
        body.append(f"<tr class='{'all' if row['category'] == 'all' else ''}'>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def render_report(summary: list[dict], meta: dict, plotlyjs: str = "inline") -> str:
    sections = []
    for i, (title, fig) in enumerate(figures(summary)):
        include = (True if plotlyjs == "inline" else "cdn") if i == 0 else False  # one copy of plotly.js
        sections.append(f"<h2>{html.escape(title)}</h2>"
                        + fig.to_html(full_html=False, include_plotlyjs=include, config={"displaylogo": False}))
    facts = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(str(v))}</li>" for k, v in meta.items()
                    if k not in ("prompt_ids",))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>DynaSD benchmark: {html.escape(str(meta.get('pair', '')))}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; max-width: 1200px; }}
table {{ border-collapse: collapse; font-size: 0.85em; }}
td, th {{ border: 1px solid #ddd; padding: 3px 6px; text-align: right; }}
td:first-child, td:nth-child(3) {{ text-align: left; }}
tr.all {{ font-weight: bold; background: #f4f4f4; }}
</style></head><body>
<h1>DynaSD benchmark</h1>
<p><b>Measured on</b>: {html.escape(str(meta.get('device_line') or meta.get('machine', 'an unnamed machine')))}</p>
<p>Speedup is each method's tokens/s over ar's tokens/s on the same prompts in the same run; every method is
timed by the same wall-clock window around one whole generate call (prefill included) after the same warm-up.
Numbers from a shared CPU are noisy: compare ratios within one run, not across runs.</p>
<ul>{facts}</ul>
{''.join(sections)}
<h2>Summary</h2>
{_table(summary)}
</body></html>
"""


def write_report(path: str | Path, summary: list[dict], meta: dict, plotlyjs: str = "inline") -> Path:
    path = Path(path)
    path.write_text(render_report(summary, meta, plotlyjs), encoding="utf-8")
    return path
