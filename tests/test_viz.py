"""Figure builders draw exactly what the trace says: nodes, colours, mask cells, slices and text."""
import copy
import json
from dataclasses import asdict

import pytest

import viz
from dynasd.decoders import make_decoder
from dynasd.options import DecoderOptions
from dynasd.sampling import SamplingConfig
from dynasd.trace import run_from_dict, run_to_dict
from dynasd.trace_semantics import drawn_status
from viz.decisions import no_scores_reason
from viz.mask import ACCEPTED_ROW, ATTENDS, BLOCKED, UNUSED, mask_view
from viz.style import ORIGIN_NAMES, STATUS_COLORS, STATUS_NAMES, THIS_STEP
from viz.text import shown_piece
from viz.tree import ROOT, tidy_layout, tree_graph

PROMPT = "hello there"


def run_of(pair, method, steps=None, max_new_tokens=32, sampling=SamplingConfig(), **options):
    decoder = make_decoder(pair, DecoderOptions(method=method, **asdict(sampling), **options))
    decoder.start(pair.encode_prompt(PROMPT), max_new_tokens, PROMPT)
    while not decoder.done and (steps is None or len(decoder.run.steps) < steps):
        decoder.step()
    return decoder.run


@pytest.fixture(scope="module")
def runs(tiny_pair):
    return {
        "mcsd": run_of(tiny_pair, "mcsd", k_config=(4, 2, 2, 1)),
        "sampled": run_of(tiny_pair, "mcsd", k_config=(3, 2, 2), sampling=SamplingConfig(temperature=1.0)),
        "dynamic": run_of(tiny_pair, "mcsd", k_config=(4, 2, 2, 1), stop="confidence", threshold=0.3),
        "ti": run_of(tiny_pair, "ti-mcsd", width=3, depth=3),
        "ar": run_of(tiny_pair, "ar", max_new_tokens=6),
        "big": run_of(tiny_pair, "mcsd", steps=2, k_config=(4, 4, 4, 2)),
    }


def all_steps(runs):
    return [(name, step) for name, run in runs.items() for step in run.steps]


def node_traces(fig):
    """Scatter traces that hold tree nodes (they carry node indices in customdata)."""
    return [t for t in fig.data if t.customdata is not None]


# -- tree ----------------------------------------------------------------------------------------------------------

def test_tree_draws_every_node_once_in_its_status_colour(runs):
    for name, step in all_steps(runs):
        fig = viz.tree_figure(step)
        drawn = [i for t in node_traces(fig) for i in t.customdata]
        assert sorted(drawn) == list(range(len(step.nodes))), (name, step.index)
        for t in node_traces(fig):
            statuses = {drawn_status(step, i) for i in t.customdata}
            assert len(statuses) == 1, "one trace per status, so the legend is truthful"
            status = statuses.pop()
            assert t.name == STATUS_NAMES[status]
            assert t.marker.color == STATUS_COLORS[status]


def test_the_runs_cover_the_interesting_statuses(runs):
    """Guards against the tests above passing on trees where nothing happens."""
    seen = {n.status for _, step in all_steps(runs) for n in step.nodes}
    assert {"accepted", "rejected", "not_reached", "unchosen"} <= seen
    finals = {step.committed_origins[-1] for _, step in all_steps(runs) if step.committed_origins}
    assert {"bonus", "correction", "target"} <= finals


def test_bonus_or_correction_hangs_off_the_final_parent_on_the_emphasised_path(runs):
    checked = 0
    for name, step in all_steps(runs):
        if step.final_parent is None or step.committed_origins[-1] not in ("bonus", "correction", "target"):
            continue
        fig = viz.tree_figure(step)
        pos = tidy_layout(tree_graph(step))
        origin = step.committed_origins[-1]
        star = next(t for t in fig.data if t.name == STATUS_NAMES[origin])
        assert (star.x[0], star.y[0]) == pos["final"]
        parent_level = 0 if step.final_parent == ROOT else step.nodes[step.final_parent].level
        assert star.x[0] == parent_level + 1
        path = next(t for t in fig.data if t.name == "committed path")
        segments = {(path.x[k], path.y[k], path.x[k + 1], path.y[k + 1]) for k in range(0, len(path.x), 3)}
        assert (*pos[step.final_parent], *pos["final"]) in segments
        # every accepted edge is emphasised, and nothing else is
        chain = [ROOT] + step.accepted_path + ["final"]
        expected = {(*pos[a], *pos[b]) for a, b in zip(chain, chain[1:])}
        assert segments == expected, (name, step.index)
        checked += 1
    assert checked >= 5


def test_tidy_layout_gives_distinct_places_and_centres_parents(runs):
    step = runs["big"].steps[0]
    graph = tree_graph(step)
    pos = tidy_layout(graph)
    assert len(set(pos.values())) == len(pos)
    for node in graph.nodes:
        kids = list(graph.successors(node))
        if kids:
            ys = [pos[k][1] for k in kids]
            assert pos[node][1] == (min(ys) + max(ys)) / 2
            assert all(pos[k][0] == pos[node][0] + 1 for k in kids)


def test_target_roots_are_diamonds_and_unchosen_roots_are_marked(runs):
    step = next(s for s in runs["ti"].steps if s.nodes)
    fig = viz.tree_figure(step, lossy=True)
    assert "LOSSY" in fig.layout.title.text
    for t in node_traces(fig):
        for i, symbol in zip(t.customdata, t.marker.symbol):
            assert symbol == ("diamond" if step.nodes[i].origin == "target_root" else "circle")


# -- mask ----------------------------------------------------------------------------------------------------------

def test_mask_cells_equal_the_trace_mask(runs):
    for name, step in all_steps(runs):
        view = mask_view(step)
        n, r = len(step.nodes), step.root_rows
        assert len(view.z) == r + n and all(len(row) == 1 + r + n for row in view.z)
        for i in range(n):
            row = view.z[r + i]
            assert row[0] in (ATTENDS, ACCEPTED_ROW), "every node sees the whole context"
            cells = "".join("1" if v in (ATTENDS, ACCEPTED_ROW) else "0" for v in row[view.tree_offset:])
            assert cells == step.verify_mask[i], (name, step.index, i)
            assert (ACCEPTED_ROW in row) == (i in step.accepted_path)
        fig = viz.mask_figure(step)
        assert fig.data[0].type == "heatmap" and [list(z) for z in fig.data[0].z] == view.z


def test_duplicate_tokens_keep_distinct_rows(runs):
    step = copy.deepcopy(runs["mcsd"].steps[1])
    for node in step.nodes:
        node.token = "the"  # every node the same string
    fig = viz.mask_figure(step)
    heat = fig.data[0]
    rows = step.root_rows + len(step.nodes)
    assert len(heat.z) == rows and len(set(heat.y)) == rows, "one category per position: the id keeps them apart"
    labels = next(t for t in fig.data if t.name == "row labels")
    assert list(labels.y) == list(heat.y) and labels.texttemplate == "%{y}", "the rows are named as their labels read"
    assert len(set(labels.y)) == len(labels.y) == rows
    assert len({tuple(row) for row in heat.z}) > 1  # rows were not merged into one


def test_dynamic_depth_draws_the_live_slice_inside_the_max_mask(runs):
    run = runs["dynamic"]
    shallow = [s for s in run.steps if s.live_depth < s.max_depth and s.nodes]
    assert shallow, "the confidence policy should stop at least one step early"
    max_rows = viz.max_mask_rows(run, shallow[0].max_nodes)
    assert max_rows is not None and len(max_rows) == 44
    for step in shallow:
        fig = viz.mask_figure(step, max_rows)
        view = mask_view(step, max_rows)
        assert view.shows_max and view.size == 44 and view.live == len(step.nodes)
        live_slice = [s for s in fig.layout.shapes if s.name == "live slice"]
        assert len(live_slice) == 1
        box = live_slice[0]
        assert (box.x0, box.x1) == (view.tree_offset - 0.5, view.tree_offset + len(step.nodes) - 0.5)
        assert (box.y0, box.y1) == (step.root_rows - 0.5, step.root_rows + len(step.nodes) - 0.5)
        for i in range(44):  # outside the slice: the max mask, marked as not drafted
            for j in range(44):
                cell = view.z[step.root_rows + i][view.tree_offset + j]
                if i < view.live and j < view.live:
                    assert (cell != BLOCKED) == (step.verify_mask[i][j] == "1")
                else:
                    assert cell == (UNUSED if max_rows[i][j] == "1" else BLOCKED)
    full = next(s for s in run.steps if s.live_depth == s.max_depth)
    assert any(s.name == "live slice" for s in viz.mask_figure(full, max_rows).layout.shapes)
    static = runs["mcsd"].steps[0]
    assert not any(s.name == "live slice" for s in viz.mask_figure(static).layout.shapes)


def test_step_figures_redraw_without_measuring_many_labels(runs):
    """The page redraws these figures at every step: Plotly measures each tick label on a redraw (~0.7 ms a
    label) and automargin draws a figure twice, so the large tree's token labels are a text trace (mask rows) or
    node ids at a stride (mask columns: every other id of the 44-node tree, readable on a phone; p vs q bars), and
    margins are fixed."""
    run = runs["mcsd"]
    step = max(run.steps, key=lambda s: len(s.nodes))
    assert len(step.nodes) > 16
    for fig in (viz.mask_figure(step, viz.max_mask_rows(run, step.max_nodes)), viz.pq_figure(step)):
        axes = [fig.layout[name] for name in fig.layout if name.startswith(("xaxis", "yaxis"))]
        assert not any(axis.automargin for axis in axes)
        assert sum(len(axis.ticktext or ()) for axis in axes) <= 24
    mask = viz.mask_figure(step)
    assert len(next(t for t in mask.data if t.name == "row labels").y) == step.root_rows + len(step.nodes)


def test_strided_labels_mark_the_start_never_crowd_and_stay_few():
    from viz.labels import strided

    for count in range(0, 130):
        for most in (1, 12, 64):
            kept = strided(count, most)
            assert kept == sorted(set(kept)) and all(0 <= i < count for i in kept)
            assert (kept[0] == 0) if count else kept == []
            assert len(kept) <= most + 1
            every = max(1, -(-count // most))
            assert all(b - a >= every for a, b in zip(kept, kept[1:])), (count, most, kept)
            assert count <= every or kept[-1] == count - 1, "the end is marked"
            if count and count <= most:
                assert kept == list(range(count)), "a short axis is labelled in full"


# -- decisions, timeline, compare ------------------------------------------------------------------------------------

def test_pq_bars_follow_the_nodes(runs):
    step = runs["sampled"].steps[0]
    fig = viz.pq_figure(step)
    p_bars, q_bars = fig.data[0], fig.data[1]
    assert list(p_bars.y) == [n.p for n in step.nodes]
    assert list(q_bars.y) == [n.q for n in step.nodes]
    assert list(p_bars.marker.color) == [STATUS_COLORS[drawn_status(step, i)] for i in range(len(step.nodes))]


def test_stop_scores_are_drawn_against_the_threshold(runs):
    step = next(s for s in runs["dynamic"].steps if s.stop_scores)
    fig = viz.stop_figure(step)
    threshold = [s for s in fig.layout.shapes if s.name == "threshold"]
    assert threshold and threshold[0].y0 == step.threshold == 0.3
    best = next(t for t in fig.data if t.name and t.name.startswith("best"))
    assert list(best.y) == [max(level.scores) for level in step.stop_scores]


def test_timeline_stacks_every_committed_token(runs):
    run = runs["mcsd"]
    fig = viz.timeline_figure(run, current=1)
    bars = [t for t in fig.data if t.type == "bar" and t.xaxis in (None, "x")]  # top left; acceptance is below
    assert sum(sum(t.y) for t in bars) == len(run.new_token_ids)
    assert {t.name for t in bars} <= set(ORIGIN_NAMES.values())


def compared(runs: dict):
    """A Compare's result over finished runs, each timed as one chunk per step (dynasd/explorer/measure/compare.py)."""
    from dynasd.explorer.inputs import Settings
    from dynasd.explorer.measure.compare import Chunk, CompareState, MethodRun, compare_result

    state = CompareState(Settings(pair="tiny-random"), "hi", tuple(runs),
                         runs={m: MethodRun(m, run=run) for m, run in runs.items()},
                         chunks=[Chunk(m, i, len(s.committed), s.seconds) for m, run in runs.items()
                                 for i, s in enumerate(run.steps)], rounds=1)
    return compare_result(state)


def test_compare_rows_flag_text_that_differs_from_ar(runs, tiny_pair):
    ar = run_of(tiny_pair, "ar", max_new_tokens=32)
    result = compared({"ar": ar, "mcsd": runs["mcsd"], "ti-mcsd": runs["ti"]})
    rows = {r["method"]: r for r in viz.compare_table(result)}
    assert rows["mcsd"]["same text as ar"] == ("yes" if runs["mcsd"].text == ar.text else "NO")
    assert rows["mcsd"]["same text as ar"] == "yes", "greedy mcsd is lossless"
    assert "ti-mcsd (LOSSY)" in rows


# -- text ----------------------------------------------------------------------------------------------------------

def test_text_spans_reproduce_the_generated_text(runs, tiny_pair):
    for name, run in runs.items():
        spans = viz.text_spans(run)
        exact = viz.text_spans(run, visible=False)
        assert "".join(token for token, _ in exact) == "".join(t for s in run.steps for t in s.committed_tokens)
        # the view shows every token; the decoded text hides special ones such as <s>
        special = set(tiny_pair.tokenizer.all_special_tokens)
        assert "".join(token for token, _ in exact if token not in special) == run.text, name
        assert [token for token, _ in spans] == [shown_piece(token) for token, _ in exact]
        origins = [o for s in run.steps for o in s.committed_origins]
        assert [label.removesuffix(THIS_STEP) for _, label in spans] == [ORIGIN_NAMES[o] for o in origins]
        marked = [label for _, label in spans if label.endswith(THIS_STEP)]
        assert len(marked) == len(run.steps[-1].committed)
        assert set(label for _, label in spans) <= set(viz.text_color_map())


def test_text_spans_at_an_earlier_step_stop_there(runs):
    run = runs["mcsd"]
    spans = viz.text_spans(run, 1)
    assert len(spans) == len(run.steps[0].committed) + len(run.steps[1].committed)
    assert sum(label.endswith(THIS_STEP) for _, label in spans) == len(run.steps[1].committed)


# -- size and replay -----------------------------------------------------------------------------------------------

def test_every_update_stays_small_even_for_a_212_node_tree(runs):
    run = runs["big"]
    step = run.steps[-1]
    assert len(step.nodes) == 212
    figures = [viz.tree_figure(step), viz.mask_figure(step, viz.max_mask_rows(run, step.max_nodes)),
               viz.pq_figure(step), viz.stop_figure(step), viz.timeline_figure(run)]
    sizes = [len(f.to_json()) for f in figures]
    assert max(sizes) < 300_000, sizes


def test_a_saved_trace_replays_to_the_same_figures(runs):
    run = runs["dynamic"]
    replayed = run_from_dict(json.loads(json.dumps(run_to_dict(run))))
    for index in range(len(run.steps)):
        a, b = run.steps[index], replayed.steps[index]
        assert viz.tree_figure(a).to_json() == viz.tree_figure(b).to_json()
        assert viz.mask_figure(a).to_json() == viz.mask_figure(b).to_json()
    assert viz.text_spans(run) == viz.text_spans(replayed)


def test_the_text_panel_shows_spaces_and_piece_boundaries_like_the_tree():
    assert shown_piece(" Ray") == "␣Ray" and shown_piece("leigh") == "leigh", "a word piece has no ␣: not a word"
    assert shown_piece("\n") == "↵\n", "a newline is shown and still breaks the line"
    assert shown_piece("") == "∅"


# -- payload: what one update of the explorer sends ------------------------------------------------------------------

PAYLOAD_CAP = 60_000  # bytes of figure JSON per update; a Run redraws them every step in the browser


def update_payload(run, index) -> int:
    step = run.steps[index]
    root, max_rows = viz.root_token(run, index), viz.max_mask_rows(run, step.max_nodes)
    figures = [viz.tree_figure(step, root), viz.mask_figure(step, max_rows, root_label=root),
               viz.pq_figure(step), viz.stop_figure(step), viz.timeline_figure(run, index)]
    return sum(len(f.to_json()) for f in figures)


def test_one_update_of_the_default_tree_stays_under_the_payload_cap(runs):
    """The default mcsd 4,2,2,1 tree (44 nodes, a 45 x 46 mask) and the dynamic-depth run, whose mask draws the
    max tree: every step's five figures together fit the cap (they were ~170 kB, the mask 137 kB of it)."""
    for name in ("mcsd", "dynamic", "sampled"):
        run = runs[name]
        sizes = [update_payload(run, i) for i in range(len(run.steps))]
        assert max(sizes) <= PAYLOAD_CAP, (name, sizes)


def test_the_mask_is_sent_as_a_typed_array(runs):
    """plotly.py sends numpy cells as base64 (`bdata`), which Gradio passes through and plotly.js decodes; a
    regression to nested lists would triple the mask's size."""
    heat = json.loads(viz.mask_figure(runs["mcsd"].steps[1]).to_json())["data"][0]
    assert set(heat["z"]) >= {"dtype", "bdata"} and heat["z"]["dtype"] == "u1"


# -- titles, legends and notes say what happened -------------------------------------------------------------------

def test_the_mask_title_counts_only_the_rows_the_target_scored(runs):
    run = runs["dynamic"]
    max_rows = viz.max_mask_rows(run, run.steps[0].max_nodes)
    shallow = next(s for s in run.steps if s.nodes and len(s.nodes) < 44)
    title = viz.mask_figure(shallow, max_rows).layout.title.text
    assert f"{shallow.root_rows + len(shallow.nodes)} rows scored" in title
    assert f"{len(shallow.nodes)} of 44 nodes drafted" in title
    empty = copy.deepcopy(shallow)
    empty.nodes, empty.verify_mask, empty.accepted_path, empty.live_depth = [], [], [], 0
    title = viz.mask_figure(empty, max_rows).layout.title.text
    assert "no candidates" in title and "plain step" in title and "rows scored" not in title


def test_siblings_after_an_accepted_node_are_not_called_below_a_rejection(runs):
    found = 0
    for _, step in all_steps(runs):
        for i, node in enumerate(step.nodes):
            if node.status != "not_reached":
                continue
            siblings = [n for j, n in enumerate(step.nodes) if n.parent == node.parent and j != i]
            expected = "skipped" if any(n.status == "accepted" for n in siblings) else "not_reached"
            assert drawn_status(step, i) == expected
            found += expected == "skipped"
    assert found, "the greedy runs leave untested siblings of accepted nodes"
    assert "below" not in STATUS_NAMES["skipped"]


def test_a_node_drawn_not_tested_is_called_not_tested_in_every_hover(runs):
    """The tree's glyph, the tree's hover and the p-vs-q bar's hover name one status for a node."""
    checked = 0
    for _, step in all_steps(runs):
        skipped = [i for i in range(len(step.nodes)) if drawn_status(step, i) == "skipped"]
        if not skipped:
            continue
        tree_hovers = {int(h.split("node ")[1].split("<")[0]): h
                       for trace in node_traces(viz.tree_figure(step, "root")) for h in trace.hovertext}
        bar_hovers = viz.pq_figure(step).data[0].hovertext
        for i in skipped:
            for hover in (tree_hovers[i], bar_hovers[i]):
                assert "not tested" in hover and "not reached" not in hover
            checked += 1
    assert checked


def test_the_stop_panel_never_claims_a_draft_where_there_is_none(runs):
    ar = runs["ar"].steps[0]
    assert "nothing was drafted" in no_scores_reason(ar)
    for origin, named in (("lookup", "prompt lookup"), ("recycled", "token recycling")):
        drawless = copy.deepcopy(runs["mcsd"].steps[0])  # the same tree, proposed by a source with no draft
        drawless.draft_forwards = 0
        for node in drawless.nodes:
            node.origin = origin
        assert named in no_scores_reason(drawless) and "draft builds" not in no_scores_reason(drawless)
    assert "full tree" in no_scores_reason(runs["mcsd"].steps[0])


def test_a_lossy_commit_below_the_target_top_choice_is_called_out(runs):
    from dynasd.trace_semantics import off_target_commit

    departed = [(s, off_target_commit(s)) for s in runs["ti"].steps if off_target_commit(s)]
    kept = [s for s in runs["ti"].steps if s.nodes and not off_target_commit(s)]
    assert departed and kept, "the ti run should have both kinds of step"
    step, (chosen, top) = departed[0]
    assert step.nodes[chosen].p < step.nodes[top].p
    notes = [a.text for a in viz.tree_figure(step, lossy=True).layout.annotations]
    assert any(f"p = {step.nodes[chosen].p:.3f}" in t and f"p = {step.nodes[top].p:.3f}" in t for t in notes)
    assert "Off the target's choice" in viz.step_story(runs["ti"], step.index)
    assert not viz.tree_figure(kept[0], lossy=True).layout.annotations
    title = viz.tree_figure(step, lossy=True).layout.title.text
    assert "<br>LOSSY" in title, "the lossy warning has its own line, so a narrow panel does not cut it"


def test_the_timeline_draws_the_ar_line_once_named_for_both(runs):
    fig = viz.timeline_figure(runs["mcsd"])
    names = [t.name for t in fig.data if t.type == "scatter"]
    assert names == ["tokens committed<br>= target forwards AR would need", "target forwards used"]


def test_speed_and_acceptance_read_the_same_in_summary_and_compare(runs):
    from viz.timeline import LEVEL_RATE, TOKENS_PER_S, summary_numbers

    run = runs["mcsd"]
    row = viz.compare_table(compared({"mcsd": run}))[0]
    numbers = summary_numbers(run)
    decoding = sum(s.draft_seconds + s.verify_seconds + s.accept_seconds for s in run.steps)
    assert numbers["tokens_per_s"] == pytest.approx(len(run.new_token_ids) / decoding)
    assert numbers["prefill_seconds"] == pytest.approx(run.seconds - decoding, abs=1e-9)
    assert row[TOKENS_PER_S] == round(numbers["tokens_per_s"], 1)
    text = viz.summary_markdown(run)
    assert row[LEVEL_RATE] in text and row[LEVEL_RATE].endswith("%"), "one format: a percentage"
    assert f"{numbers['tokens_per_target_forward']:.2f}" in text and "mean acceptance length" in text
    assert row["tokens / target forward"] == round(numbers["tokens_per_target_forward"], 2)
    assert "2 methods" in viz.compare_figure(compared({"mcsd": run, "ar": runs["ar"]})).layout.title.text


def test_every_view_names_the_acceptance_test_alike_and_agrees_with_the_walk(runs):
    """p′ and q′ (what a test used), one comparison (u < min(1, p′/q′)), and the verdict the walk recorded: the
    tree's hover, the p/q bars' hover, the Acceptance test view and the guided step say the same for every test."""
    from dynasd.explorer.lessons.phases import step_phases
    from dynasd.sampling import ACCEPT_RULE, REJECT_RULE
    from viz.residual import acceptance_figure
    from viz.tree import _hover

    seen = 0
    for step in runs["sampled"].steps:
        figures = {"tree": viz.tree_figure(step), "p/q bars": viz.pq_figure(step),
                   "acceptance": acceptance_figure(step, greedy=False)}
        text = json.dumps([f.to_plotly_json() for f in figures.values()], ensure_ascii=False)
        phases = " ".join(phase.text for phase in step_phases(step))
        assert "p'" not in text + phases and "p/q)" not in text + phases  # the old names are gone
        for i, node in enumerate(step.nodes):
            if node.u is None:
                continue
            seen += 1
            rule = ACCEPT_RULE if node.status in ("accepted", "unchosen") else REJECT_RULE
            assert rule in _hover(i, step), (i, node)
            assert any(rule in h for h in figures["p/q bars"].data[0].hovertext), (i, node)
            assert any(rule in h for h in figures["acceptance"].data[0].hovertext), (i, node)
            assert ("<" if rule == ACCEPT_RULE else "≥") + " min(1, p′/q′)" in phases, (i, node)
    assert seen >= 3, "the sampled run has tests to compare"


def test_compare_puts_what_a_reader_compares_first_first(runs):
    from viz.compare import AGAINST_AR
    from viz.timeline import TOKENS_PER_S

    rows = viz.compare_table(compared({"ar": runs["ar"], "mcsd": runs["mcsd"]}))
    assert list(rows[0])[:4] == ["method", "same text as ar", AGAINST_AR, TOKENS_PER_S], \
        "what a reader compares first comes first: the text check, the speed against ar, then tokens / s"


def test_the_summary_names_the_machine_weights_and_kernels_of_the_run(runs):
    from dynasd.device_info import device_line

    run = runs["mcsd"]
    assert run.device.startswith(device_line().split(",")[0])
    assert "; target: " in run.device and (" products" in run.device or " kernels" in run.device)
    assert f"*Measured on* {run.device}" in viz.summary_markdown(run)


def test_a_device_line_is_shown_whole_and_only_an_overlong_one_is_cut_at_a_word(runs):
    """The line of a VNNI machine with a draft (~210 characters) had lost its last word to a 200-character cut."""
    from dataclasses import replace

    from dynasd.device_info import SHOWN_DEVICE_CHARS

    vnni = ("Intel(R) Xeon(R) Processor (AVX-512, AMX, AVX2, FMA), 2 of 2 threads; target: GGUF blocks, "
            "AVX-512 kernels, 8-bit activations on VNNI; draft: 8- and 4-bit blocks, AVX-512 kernels, 8-bit "
            "activations on VNNI")
    assert f"*Measured on* {vnni}\n" in viz.summary_markdown(replace(runs["mcsd"], device=vnni))
    overlong = "; ".join([vnni] * 3)
    shown = viz.summary_markdown(replace(runs["mcsd"], device=overlong)).split("*Measured on* ")[1].split("\n")[0]
    assert shown.endswith(" …") and len(shown) <= SHOWN_DEVICE_CHARS + 2 and overlong.startswith(shown[:-2])
    assert overlong[len(shown) - 2] in " ,;", "cut where a word ends"


def test_the_timeline_and_compare_report_acceptance_by_position_as_the_metrics_module_counts_it(runs):
    """The second row of the timeline and the Compare columns read dynasd/acceptance.py: vLLM's per-position
    rate, the conditional rate and the histogram of accepted lengths; ar, which drafts nothing, has neither."""
    from dynasd.acceptance import acceptance_of
    from viz.timeline import CONDITIONAL, PER_POSITION, rates_text

    run = runs["mcsd"]
    acceptance = acceptance_of(run.steps)
    bars = {trace.name: trace for trace in viz.timeline_figure(run, 0).data if trace.type == "bar"}
    assert list(bars["per-position acceptance:<br>steps that reached k"].y) == acceptance.per_position
    assert list(bars["conditional: accepted at k<br>once the walk got to k"].y) == acceptance.conditional
    assert list(bars["steps by candidates accepted"].y) == acceptance.histogram
    assert sum(acceptance.histogram) == len(run.steps)
    row = viz.compare_table(compared({"mcsd": run, "ar": runs["ar"]}))
    assert row[0][PER_POSITION] == rates_text(acceptance.per_position) in viz.summary_markdown(run)
    assert row[0][CONDITIONAL] == rates_text(acceptance.conditional)
    assert row[1][PER_POSITION] == "–" and row[1][CONDITIONAL] == "–"
    assert "steps by candidates accepted" not in {t.name for t in viz.timeline_figure(runs["ar"]).data}


def test_the_summary_names_a_draft_model_only_for_methods_that_run_one(runs, tiny_pair):
    pld = run_of(tiny_pair, "pld", max_new_tokens=8)
    assert pld.draft_label == "none (candidates copied from the prompt by lookup)"
    assert f"· draft: {pld.draft_label}" in viz.summary_markdown(pld)
    assert runs["ar"].draft_label == "none (the target alone)"
    recycled = run_of(tiny_pair, "recycle", max_new_tokens=8).draft_label
    assert recycled == "none (candidates from the target's own earlier predictions)"
    assert f"· draft: {runs['mcsd'].draft_label}" in viz.summary_markdown(runs["mcsd"])
