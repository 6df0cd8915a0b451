"""A run as one self-contained HTML file: every step's figures (tree, verify mask, p vs q), the text as it stood
after the step, the step's narration, and a step slider; plotly.js is inlined, so the file opens offline in any
browser from disk (lecture slides, a course page) with no server and no model.

Everything from the trace (prompt, tokens) is escaped: a trace may come from a stranger. The steps' data travel as
one JSON block that the page's script reads; its figures are drawn with Plotly.react when the slider moves.
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path

import plotly

from dynasd.trace import RunTrace

from .decisions import pq_figure
from .mask import mask_figure, max_mask_rows
from .text import step_story, text_color_map, text_spans
from .timeline import summary_markdown, timeline_figure
from .tree import root_token, tree_figure

PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
FIGURES = (("tree", "Candidate tree"), ("mask", "Verify mask"), ("pq", "p vs q per candidate"))
MAX_EXPORT_STEPS = 400  # a file stays a few tens of megabytes at most


def _inline(text: str) -> str:
    out = html.escape(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", out)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"(?<![\w*])\*([^*\n]+)\*(?![\w*])", r"<i>\1</i>", out)


def markdown_html(text: str) -> str:
    """The little markdown the narration and the summary use (**bold**, *italic*, `code`, pipe tables), as
    escaped HTML."""
    out, table = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            if not set(line) <= set("|-: "):  # a header's separator row draws nothing
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                tag = "th" if not table else "td"
                table.append("<tr>" + "".join(f"<{tag}>{_inline(c)}</{tag}>" for c in cells) + "</tr>")
            continue
        if table:
            out.append('<div class="scroll"><table class="summary">' + "".join(table) + "</table></div>")
            table = []
        out.append(_inline(line) + "<br>" if line else "")
    return "".join(out)


def text_html(run: RunTrace, index: int) -> str:
    spans = text_spans(run, index)
    colors = text_color_map(spans)
    return "".join(f'<span class="tok" style="background:{colors[label]}" title="{html.escape(label)}">'
                   f"{html.escape(token)}</span>" for token, label in spans)


def step_record(run: RunTrace, index: int) -> dict:
    step = run.steps[index]
    root = root_token(run, index)
    figures = dict(tree=tree_figure(step, root, lossy=not run.lossless),
                   mask=mask_figure(step, max_mask_rows(run, step.max_nodes), root_label=root),
                   pq=pq_figure(step))
    return {"story": markdown_html(step_story(run, index)), "text": text_html(run, index),
            "figures": {name: json.loads(figure.to_json()) for name, figure in figures.items()}}


PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>DynaSD run: TITLE</title>
<style>
body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 1400px; padding: 12px; color: #222; }
h1 { font-size: 1.3em; margin: 0 0 4px 0; } .meta { color: #555; font-size: 0.9em; }
#controls { position: sticky; top: 0; background: white; padding: 8px 0; display: flex; gap: 8px;
            align-items: center; flex-wrap: wrap; border-bottom: 1px solid #ddd; z-index: 5; }
#controls input[type=range] { flex: 1; min-width: 160px; }
button { font-size: 1em; padding: 4px 12px; }
#text { font-family: ui-monospace, monospace; line-height: 1.9; margin: 10px 0; white-space: pre-wrap; }
.tok { border-radius: 3px; padding: 1px 1px; margin: 0 1px; }
#story { margin: 8px 0 12px 0; }
table.summary { border-collapse: collapse; margin: 6px 0; }
.summary td, .summary th { border: 1px solid #ddd; padding: 3px 8px; }
code { background: #f1f1f1; padding: 0 3px; border-radius: 3px; }
.figs { display: grid; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); gap: 12px; }
.fig { border: 1px solid #e3e3e3; border-radius: 6px; min-height: 300px; }
.scroll { overflow-x: auto; } .figs > div { min-width: 0; }
@media (max-width: 640px) { .figs { grid-template-columns: 1fr; } }
</style>
<script>PLOTLY</script>
</head><body>
<h1>TITLE</h1>
<div class="meta">META</div>
<div class="meta"><b>Prompt:</b> PROMPT</div>
<div id="controls">
  <button id="prev" title="previous step (←)">←</button>
  <input id="step" type="range" min="0" max="LAST" value="0" step="1" aria-label="step">
  <button id="next" title="next step (→)">→</button>
  <span id="label"></span>
</div>
<div id="text"></div>
<div id="story"></div>
<div class="figs">FIGURE_DIVS</div>
<h2 style="font-size:1.1em">The whole run</h2>
<div>SUMMARY</div>
<div id="timeline" class="fig"></div>
<script type="application/json" id="steps">STEPS</script>
<script type="application/json" id="timeline-figure">TIMELINE</script>
<script>
const steps = JSON.parse(document.getElementById('steps').textContent);
const names = NAMES;
const slider = document.getElementById('step');
function show(i) {
  i = Math.max(0, Math.min(steps.length - 1, i));
  slider.value = i;
  document.getElementById('label').textContent = `step ${i} of ${steps.length - 1}`;
  document.getElementById('text').innerHTML = steps[i].text;
  document.getElementById('story').innerHTML = steps[i].story;
  for (const name of names) {
    const figure = steps[i].figures[name];
    figure.layout.autosize = true;
    Plotly.react(document.getElementById(name), figure.data, figure.layout, {displaylogo: false, responsive: true});
  }
}
slider.addEventListener('input', () => show(parseInt(slider.value)));
document.getElementById('prev').onclick = () => show(parseInt(slider.value) - 1);
document.getElementById('next').onclick = () => show(parseInt(slider.value) + 1);
document.addEventListener('keydown', (e) => {
  if (e.key === 'ArrowRight') show(parseInt(slider.value) + 1);
  else if (e.key === 'ArrowLeft') show(parseInt(slider.value) - 1);
});
const timeline = JSON.parse(document.getElementById('timeline-figure').textContent);
Plotly.newPlot('timeline', timeline.data, timeline.layout, {displaylogo: false, responsive: true});
show(0);
</script>
</body></html>
"""


def _json_block(value) -> str:
    """JSON safe inside a <script> element: no '</' can close it early."""
    return json.dumps(value, separators=(",", ":")).replace("</", "<\\/").replace("<!--", "<\\!--")


def run_html(run: RunTrace) -> str:
    """The whole page for `run` (at most MAX_EXPORT_STEPS steps: the first ones)."""
    if not run.steps:
        raise ValueError("the run has no steps")
    shown = min(len(run.steps), MAX_EXPORT_STEPS)
    last = shown - 1
    title = f"{run.method} on {run.pair}"
    summary = run.summary()
    meta = (f"{len(run.steps)} steps{f' (the first {shown} exported)' if shown < len(run.steps) else ''}, "
            f"{summary['new_tokens']} tokens, {summary['tokens_per_target_forward']:.2f} tokens per target forward; "
            f"draft: {run.draft_label}; {'lossless' if run.lossless else 'LOSSY'}. Keys: ← and → move a step.")
    divs = "".join(f'<div><b>{html.escape(label)}</b><div id="{name}" class="fig"></div></div>'
                   for name, label in FIGURES)
    replacements = {
        "PLOTLY": PLOTLY_JS.read_text(encoding="utf-8").replace("</script", "<\\/script"),
        "TITLE": html.escape(title), "META": html.escape(meta), "PROMPT": html.escape(run.prompt[:4000]),
        "LAST": str(last), "FIGURE_DIVS": divs, "NAMES": json.dumps([name for name, _ in FIGURES]),
        "SUMMARY": markdown_html(summary_markdown(run, last)),
        "STEPS": _json_block([step_record(run, i) for i in range(shown)]),
        "TIMELINE": _json_block(json.loads(timeline_figure(run, last).to_json())),
    }
    pattern = re.compile("|".join(sorted(map(re.escape, replacements), key=len, reverse=True)))
    return pattern.sub(lambda m: replacements[m.group(0)], PAGE)


def write_run_html(run: RunTrace, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(run_html(run), encoding="utf-8")
    return path
