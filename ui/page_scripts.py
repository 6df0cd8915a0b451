"""What runs in the page: the CSS, the scripts bound to events (the paced Run's, the Learn tab's keys and links),
and the persistent Plotly divs the step's figures are drawn into (figure_view)."""
from __future__ import annotations

import json
from pathlib import Path

import gradio as gr
import plotly

from viz.text import chip_cue, text_color_map

from .status import RUNNING, STOPPING, status_line

CSS = """
#dynasd-text { font-family: ui-monospace, monospace; }
/* every token is its own span: a hairline between pieces shows where the tokenizer cut ("Ray" + "leigh") */
#dynasd-text .textfield .token { margin: 1px 1px; box-shadow: inset -1px 0 0 rgba(0, 0, 0, 0.35); }
.explain { font-size: 0.92em; }
/* every text at least 4.5:1 against its background (WCAG 2.2 AA): the theme's subdued grey (#BBBBC2: the help
   under every control, the sliders' ends, the footer) read 1.9:1 on white, white on its orange and red buttons
   2.8-3.8:1 */
.gradio-container, .gradio-container ~ * {
  --body-text-color-subdued: #5c5c66; --block-info-text-color: #5c5c66;
  --button-primary-background-fill: #c2410c; --button-primary-background-fill-hover: #9a3412;
  --button-primary-text-color: #ffffff; --button-primary-text-color-hover: #ffffff;
  --button-cancel-background-fill: #b91c1c; --button-cancel-background-fill-hover: #991b1b;
  --button-cancel-text-color: #ffffff; --button-cancel-text-color-hover: #ffffff;
}
.dark .gradio-container, .dark .gradio-container ~ * {
  --body-text-color-subdued: #b4b4be; --block-info-text-color: #b4b4be;
}
/* table headers break between words only ("ste ps" read as two words); a wide table scrolls sideways */
#summary table { display: block; overflow-x: auto; width: 0; min-width: 100%; }
#summary th, #summary td { word-break: keep-all; overflow-wrap: normal; hyphens: none; }
/* a phone: the one-row table keeps each cell on one line and scrolls, rather than a header three lines high */
@media (max-width: 640px) { #summary th, #summary td { white-space: nowrap; } }
.clamp-note { color: #b35900; font-size: 0.85em; margin-top: 2px; }
#run-buttons { flex-wrap: nowrap; gap: 6px; }
/* a slider's help at the control's width: beside the slider's number box it was a column of 170-210 px */
.gradio-container .head:has(.info-text) { flex-wrap: wrap; }
.gradio-container .head:has(.info-text) > label { flex: 1 1 100%; }
#run-buttons button { min-width: 0; padding-left: 4px; padding-right: 4px; }
/* a one-step run's slider spans 0 to 1 (Gradio's shortest): its end, a step that does not exist, is not shown */
#scrubber:has(input[type=range]:disabled) .max_value { visibility: hidden; }
/* every control shows where the keyboard is: Gradio's theme leaves a focused slider without any ring */
.gradio-container :is(button, input, select, textarea, [role=tab], [tabindex]):focus-visible,
.gradio-container input[type=range]:focus {
  outline: 3px solid #1f5fb0 !important; outline-offset: 2px !important;
}
/* a phone: prompt, buttons and status on top, then the results, then the settings */
@media (max-width: 640px) {
  .gradio-container { padding: 4px !important; }
  #intro { font-size: 0.85em; }
  #intro h1 { font-size: 1.3em; margin: 0; }
  /* the concept paragraph collapsed to three lines; a tap opens it (INTRO_JS) */
  #intro p:first-of-type { display: -webkit-box; -webkit-line-clamp: 3; -webkit-box-orient: vertical;
                           overflow: hidden; cursor: pointer; }
  #intro p:first-of-type.open { display: block; }
  #main-row { flex-direction: column; }
  #controls-column { display: contents; }
  #top-controls { order: 0; }
  #results-column { order: 1; }
  #settings-column { order: 2; }
  #example-prompts, #top-controls .gallery { display: none; }
  #step-keys { display: none; }  /* keys need a keyboard; the results come first */
  .js-plotly-plot .modebar { display: none !important; }
  /* the help beside a figure goes under it, full width: beside it, it was a 12 px column of single letters */
  .figure-with-help { flex-direction: column !important; flex-wrap: nowrap !important; }
  .figure-with-help > * { width: 100% !important; max-width: 100% !important; min-width: 0 !important;
                          flex: 0 0 auto !important; }
  /* the tree keeps room for its labels between levels: it scrolls sideways instead of cutting them, and says so
     above it (its deepest levels start off the screen); !important: Gradio's block sets overflow: visible inline */
  /* (width 0, min-width 100%: the scrolling box adds nothing to its column's width, then fills it) */
  #tree-plot { overflow-x: auto !important; width: 0 !important; min-width: 100% !important; }
  #tree-plot::before { content: "Scroll sideways for every level of the tree →"; display: block; position: sticky;
                       left: 0; font-size: 0.85em; color: #5c5c66; padding: 2px 0 4px; }
  /* the results never wider than the screen: Compare's table had made them 2,100 px wide */
  #results-column { max-width: 100% !important; min-width: 0 !important; }
  #tree-plot .dynasd-figure { min-width: 560px; }
}
"""

def chip_css() -> str:
    """The text chips' second cue (viz/text.py chip_cue) on every chip and its legend entry. gr.HighlightedText
    marks a chip by its colour alone, an inline background of rgba(r, g, b, alpha), so each rule finds its chips
    by that colour (every label has its own: tests/test_colour_vision.py)."""
    rules = []
    for label, colour in text_color_map().items():
        red, green, blue = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
        chip = f'#dynasd-text :is(.token, .legend-item)[style*="rgba({red}, {green}, {blue},"]'
        cue = chip_cue(label)
        if cue.underline:
            rules.append(f"{chip} {{ text-decoration: underline {cue.underline} 2px; text-underline-offset: 3px; }}")
        if cue.glyph:
            rules.append(f'{chip}::after {{ content: "{cue.glyph}"; margin-left: 2px; font-weight: 700; }}')
        if cue.this_step:
            rules.append(f"{chip} {{ font-weight: 700; outline: 2px solid #222; outline-offset: -2px; }}")
    return "\n".join(rules) + "\n"


CSS += chip_css()


# Sliders clamp a typed value to their range without a word (Gradio's own behaviour): this note says what
# was typed and what it became, next to the slider, so a run at 2.0 after typing 5 is no surprise.
CLAMP_NOTE_JS = """
<script>
document.addEventListener("change", (event) => {
  const box = event.target;
  if (!(box instanceof HTMLInputElement) || box.type !== "number") return;
  const block = box.closest(".block");
  const range = block && block.querySelector("input[type=range]");
  if (!range) return;
  const typed = parseFloat(box.value), low = parseFloat(range.min), high = parseFloat(range.max);
  let note = block.querySelector(".clamp-note");
  if (Number.isNaN(typed) || (typed >= low && typed <= high)) { if (note) note.remove(); return; }
  if (!note) { note = document.createElement("div"); note.className = "clamp-note"; block.appendChild(note); }
  const used = Math.min(Math.max(typed, low), high);
  note.textContent = `${typed} is outside ${low} to ${high}: set to ${used}.`;
}, true);
</script>
"""


# On a phone the intro's concept paragraph shows three lines (CSS above); a tap opens or closes the rest.
INTRO_JS = """
<script>
document.addEventListener("click", (event) => {
  const paragraph = event.target instanceof Element && event.target.closest("#intro p:first-of-type");
  if (paragraph) paragraph.classList.toggle("open");
});
</script>
"""


# The paced Run's page side. Stop sets a flag in the page at once (its request to the server may arrive after
# the page's next request for a step); the page asks for the next step a frame and a task after it applied the
# last one, when its figures are drawn and a click made meanwhile has been handled, and sends the flag with it.
RUN_PRESSED_JS = "() => { window.dynasdStopPressed = false; }"
WORKING = status_line("Working on the next step…")
WORKING_JS = f"() => {json.dumps(WORKING)}"
# At Step or Run: a prompt the page has not sent before and longer than LONG_PROMPT_CHARS is read first (its
# prefill: ~20 s for 20,000 characters on a 2-core CPU), and the status line says so instead of a bare "Working".
LONG_PROMPT_CHARS = 2000
READING_PROMPT_JS = f"""
(prompt) => {{
  const fresh = typeof prompt === "string" && prompt !== window.dynasdPromptRead;
  window.dynasdPromptRead = prompt;
  if (fresh && prompt.length > {LONG_PROMPT_CHARS}) {{
    return {json.dumps(status_line("Reading the prompt (CHARS characters) before the first step: a long prompt "
                                   "takes seconds on a CPU…"))}.replace("CHARS", prompt.length.toLocaleString("en"));
  }}
  return {json.dumps(WORKING)};
}}
"""


def saying(text: str) -> str:
    """A page script that writes `text` into the status line it outputs to, at the click (the handler's own
    result replaces it): the page says that work began without Gradio's progress overlay."""
    return f"() => {json.dumps(status_line(text))}"

# On ZeroGPU a model call first waits for a GPU (seconds, or longer when the Space is busy): the page says so at
# the click, and a step computed already (a Step's chunk, a recorded Run) replaces it at once.
WAITING_FOR_GPU_JS = ("() => " + json.dumps(status_line("Waiting for a GPU… (a shared ZeroGPU Space: a call can wait "
                                                        "in a queue; steps computed already show at once)")))
STOP_PRESSED_JS = f"""
(status) => {{
  window.dynasdStopPressed = true;
  return (typeof status === "string" && status.startsWith({json.dumps(status_line(RUNNING))}))
    ? {json.dumps(status_line(STOPPING))} : status;
}}
"""
NEXT_STEP_JS = """
async (session, tick, stopPressed) => {
  await new Promise((drawn) => requestAnimationFrame(() => setTimeout(drawn, 0)));
  return [session, tick, window.dynasdStopPressed === true];
}
"""


# The step's five figures are drawn by the page into one Plotly div each, kept from one update to the next
# (Plotly.react redraws it in place). gr.Plot rebuilds its Plotly component for every new figure and draws the
# figure twice, once into the component it throws away: half of a Step's drawing time in the page. The figures
# travel as Plotly JSON, drawn by the plotly.js of the installed plotly package (the version that wrote them).
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
FIGURE_HEAD = f'<script src="gradio_api/file={PLOTLY_JS.as_posix()}"></script>'
# The library is kept as window.dynasdPlotly at first use: a gr.Plot shown later (Learn, Compare) loads gradio's
# own copy as window.Plotly, and a div must stay with the library that drew it.
FIGURE_JS = """
const box = element.querySelector('.dynasd-figure');
// the tree scrolls sideways on a phone (CSS): it takes the keyboard's focus, and the arrow keys scroll it
const scroller = element.closest('#tree-plot');
if (scroller) {
  scroller.tabIndex = 0;
  scroller.setAttribute('role', 'region');
  scroller.setAttribute('aria-label', 'Candidate tree (scrolls sideways on a narrow screen)');
}
let waiting = false;  // a figure sent while its tab was hidden: drawn when the tab is shown
const draw = () => {
  const plotly = window.dynasdPlotly = window.dynasdPlotly || window.Plotly;
  if (!plotly) { setTimeout(draw, 50); return; }  // plotly.js is still loading
  if (!props.value) { waiting = false; plotly.purge(box); return; }
  waiting = box.offsetParent === null;  // hidden (another tab on show): no Step pays for drawing it
  if (waiting) return;
  const figure = JSON.parse(props.value);
  figure.layout.autosize = true;
  plotly.react(box, figure.data, figure.layout, {displaylogo: false});
};
// The tab shown (the box gets a width) draws a figure that waited; a window resized redraws to the box's width.
let width = box.clientWidth;
new ResizeObserver(() => {
  const now = box.clientWidth;
  if (now && waiting) draw();
  else if (now && now !== width && box.data && window.dynasdPlotly) window.dynasdPlotly.Plots.resize(box);
  width = now;
}).observe(box);
watch('value', draw);
draw();
"""


def figure_view(label: str, elem_id: str) -> gr.HTML:
    """One of the step's figures: its value is the figure's Plotly JSON (None: empty), drawn by FIGURE_JS."""
    return gr.HTML(None, label=label, elem_id=elem_id, html_template='<div class="dynasd-figure"></div>',
                   js_on_load=FIGURE_JS, head=FIGURE_HEAD, container=True, min_height=120)


# Keyboard shortcuts: a page-load script (Blocks.load with js only). Keys typed into a text box are left alone.
LEARN_KEYS_JS = """
() => {
  if (window.__dynasdLearnKeys) return;
  window.__dynasdLearnKeys = true;
  document.addEventListener('keydown', (event) => {
    const target = event.target;
    const tag = target && target.tagName ? target.tagName.toLowerCase() : '';
    if (tag === 'input' || tag === 'textarea' || tag === 'select' || (target && target.isContentEditable)) return;
    if (event.altKey || event.ctrlKey || event.metaKey) return;
    // the focused tree keeps the arrow keys only while it scrolls sideways (a phone); elsewhere they step Learn
    if (target && target.id === 'tree-plot' && target.scrollWidth > target.clientWidth) return;
    const click = (id) => { const b = document.getElementById(id); if (b) { b.click(); event.preventDefault(); } };
    if (event.key === 'ArrowRight' && event.shiftKey) click('step-btn');
    else if (event.key === 'ArrowRight') click('learn-next');
    else if (event.key === 'ArrowLeft') click('learn-prev');
  });
}
"""

LEARN_FOLLOWS_JS = """
() => {
  const explain = document.getElementById('learn-explain');
  const status = document.getElementById('status');
  const running = status && status.innerText.startsWith(%s);  // as STOP_PRESSED_JS tells a Run
  if (explain && explain.offsetParent !== null && !running) explain.click();
}
""" % json.dumps(status_line(RUNNING))

# The link box receives "?query" from Python; the browser knows the page's own address and completes it.
# The step's link made whole, shown, and copied where the page may write the clipboard (a secure context: https
# or this machine's own address); elsewhere the status says to copy it from the box.
COPY_LINK_JS = """
async (query, status) => {
  if (typeof query !== 'string' || !query.startsWith('?')) return [query, status];
  const link = window.location.origin + window.location.pathname + query;
  let said = '✓ Link to this step ready: copy it from the box.';
  try { await navigator.clipboard.writeText(link); said = '✓ Link to this step copied.'; } catch (error) {}
  return [link, said];
}
"""

# While an opened link replays to its step (the model may first have to load), the status says so at once.
REPLAYING_LINK_JS = """
(status) => {
  const step = new URLSearchParams(window.location.search).get('step');
  return /^[0-9]+$/.test(step || '') ? `→ Replaying to step ${step}…` : status;
}
"""

FULL_LINK_JS = """
(query) => (typeof query === 'string' && query.startsWith('?'))
  ? window.location.origin + window.location.pathname + query : query
"""
