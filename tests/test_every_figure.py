"""Every view the app draws for a step, for every method and every candidate origin.

A source whose origin one figure's table lacked used to crash the step on its first draw (a recycled node had no
tree symbol). Here every method of dynasd.options.METHODS, and Token Recycling joined to sd and to mcsd, runs a
few steps at T = 0 and at T = 1 on the tiny-random pair, and each step is drawn the way the page draws it:
ui/views.step_views (text, tree, mask, p/q, stop scores, timeline, summary, story) and the Learn tab's views
(every guided phase, the residual, the acceptance test, the cost model). What a random model happens to accept
varies, so every registered origin is also drawn on a step whose nodes and accepted tokens are relabelled as its.
"""
from __future__ import annotations

import copy
import json
from dataclasses import asdict

import pytest

import viz
from dynasd.decoders import make_decoder
from dynasd.explorer.lessons.phases import shown_at, step_phases
from dynasd.explorer.measure.speed import run_speed
from dynasd.options import METHODS, DecoderOptions
from dynasd.origins import BY_NAME, ORIGINS
from dynasd.sampling import SamplingConfig
from dynasd.trace import NODE_ORIGINS, PROPOSED_ORIGINS, TOKEN_ORIGINS, RunTrace
from ui.views import step_views
from viz.cost import cost_figure, cost_markdown
from viz.guided import guided_figure
from viz.residual import acceptance_figure, residual_explanation, residual_figure
from viz.style import FIGURE_CONFIG, ORIGIN_NAMES, ORIGIN_STRONG, ORIGIN_TINTS, THIS_STEP
from viz.tree import NODE_ORIGIN_NAMES, NODE_SYMBOLS

# Repeats itself, so that prompt lookup finds a match on the first step.
PROMPT = "the cat sat on the mat and the cat sat on the"
STEPS = 3
TEMPERATURES = (0.0, 1.0)
# method -> options beyond the defaults: every method, and recycling joined to the draft's tree
CASES = {**{method: {} for method in METHODS},
         "pld": {"lookup": 4},
         "sd+recycle": {"method": "sd", "recycle": (2, 1)},
         "mcsd+recycle": {"method": "mcsd", "k_config": (2, 2), "recycle": (2, 1), "lookup": 3}}


def run_of(pair, case: str, temperature: float) -> RunTrace:
    options = {"method": case, **CASES[case]}
    sampling = SamplingConfig(temperature=temperature)
    decoder = make_decoder(pair, DecoderOptions(**{**asdict(sampling), **options}))
    decoder.start(pair.encode_prompt(PROMPT), 8, PROMPT)
    while not decoder.done and len(decoder.run.steps) < STEPS:
        decoder.step()
    return decoder.run


@pytest.fixture(scope="module")
def runs(tiny_pair) -> dict[tuple[str, float], RunTrace]:
    return {(case, t): run_of(tiny_pair, case, t) for case in CASES for t in TEMPERATURES}


def draw_every_view(run: RunTrace, index: int) -> list:
    """What the page draws for step `index`: the step's views, then the Learn tab's; returns every figure."""
    spans, figures, summary, story = step_views(run, index)
    viz.text_color_map(spans)
    assert figures["tree"] is not None and summary and story
    step = run.steps[index]
    greedy = float(run.config.get("temperature", 0.0)) == 0.0
    root = viz.root_token(run, index)
    drawn = [figure for figure in figures.values() if figure is not None]
    drawn += [guided_figure(shown_at(step, phase), phase, root, lossy=not run.lossless) for phase in step_phases(step)]
    drawn += [residual_figure(step, greedy), acceptance_figure(step, greedy)]
    residual_explanation(step, greedy)
    speed = run_speed(run, None)
    drawn.append(cost_figure(speed))
    cost_markdown(speed)
    return drawn


def test_every_figure_offers_no_upload_and_no_logo_link(runs):
    """Gradio hands a figure's JSON `config` to Plotly: every figure carries the one toolbar (viz.style.Figure)."""
    for figure in draw_every_view(runs[("mcsd", 1.0)], 0):
        config = json.loads(figure.to_json())["config"]
        assert config == FIGURE_CONFIG and not any(config.values()), type(figure)


def test_every_step_of_every_method_draws_every_view(runs):
    for (case, temperature), run in runs.items():
        assert run.steps, f"{case} at T = {temperature} made no step"
        for index in range(len(run.steps)):
            try:
                draw_every_view(run, index)
            except Exception as exc:
                raise AssertionError(f"{case} at T = {temperature}, step {index}: {exc!r}") from exc


def test_the_runs_propose_from_every_source(runs):
    proposed = {node.origin for run in runs.values() for step in run.steps for node in step.nodes}
    assert proposed == set(NODE_ORIGINS)


@pytest.mark.parametrize("origin", [origin.name for origin in ORIGINS])
def test_a_step_from_any_registered_origin_draws_every_view(runs, origin):
    """mcsd's step with the longest accepted path, relabelled: every node from `origin`, every accepted node
    committed as its token; the text, the timeline and the stories then meet the origin whatever the model
    accepted."""
    run = copy.deepcopy(runs[("mcsd", 0.0)])
    index = max(range(len(run.steps)), key=lambda i: len(run.steps[i].accepted_path))
    step = run.steps[index]
    assert step.accepted_path, "no mcsd step accepted a node"
    for node in step.nodes:
        node.origin = origin
    step.committed_origins[:len(step.accepted_path)] = [origin] * len(step.accepted_path)
    draw_every_view(run, index)
    assert ORIGIN_NAMES[origin] in {label.removesuffix(THIS_STEP) for _, label in viz.text_spans(run, index)}
    if BY_NAME[origin].tested:  # the story counts the source's accepted tokens as accepted candidates
        accepted = len(step.accepted_path)
        assert f"{accepted} {BY_NAME[origin].kind} token" in viz.step_story(run, index)


def test_every_origin_has_an_entry_in_every_table_a_view_reads():
    assert set(NODE_SYMBOLS) == set(NODE_ORIGIN_NAMES) == set(NODE_ORIGINS)
    assert set(ORIGIN_NAMES) == set(ORIGIN_TINTS) == set(ORIGIN_STRONG) == set(TOKEN_ORIGINS)
    assert set(PROPOSED_ORIGINS) < set(NODE_ORIGINS)
    assert len({origin.symbol for origin in ORIGINS}) == len(ORIGINS), "two sources would share a shape"
