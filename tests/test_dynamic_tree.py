"""The dynamic draft tree (dynasd/sources/dynamic_tree.py): grown by cumulative draft probability within a node
budget, exact under MCSS, and recorded so a figure can show how it grew. Greedy identity is in
test_greedy_identity.py and the resumed run in test_snapshot.py, with every other method."""
import math

import pytest
from test_losslessness import assert_matches, exact_first_two, sampled_first_two, small_pair  # noqa: F401

from dynasd.decoders import make_decoder
from dynasd.options import DecoderOptions, OptionsError
from dynasd.sampling import SamplingConfig
from dynasd.trace import TraceError, run_from_dict, run_to_dict

PROMPT = "Tell me a story about a cat."


@pytest.mark.slow(seconds=16)
def test_sampling_with_a_dynamic_tree_follows_the_target_distribution(small_pair):  # noqa: F811
    """10,000 runs of the first two tokens (chi-square, as every method's): a tree whose siblings stop after a
    number of draws decided by the values of other nodes stays exact. Two waves of three in a 4-token vocabulary
    with top-k 3: a root with three children or two, second children drawn in the wave after the first, rows that
    run out of tokens (top-k) leave draws unmade rather than padded."""
    cfg = SamplingConfig(temperature=0.9, top_k=3, top_p=0.95)
    options = dict(nodes=6, depth=2, expand=3)
    assert_matches(sampled_first_two(small_pair, cfg, "dynamic", options), exact_first_two(small_pair, cfg))


def grown_steps(pair, temperature: float = 0.0, **options):
    decoder = make_decoder(pair, DecoderOptions(method="dynamic", temperature=temperature, **options))
    return decoder.generate(pair.encode_prompt(PROMPT), 24).steps


def test_each_wave_takes_the_most_probable_next_draws_within_the_budget(tiny_pair):
    """At T = 0: every context's children are its most probable tokens in rank order; a node's value is the product
    of the draft's probabilities along its path; a wave draws at most ⌈nodes / depth⌉ nodes, each wave one level
    deeper at most; no draw left out is worth more than the last wave's least valuable one (best first); only
    nodes the draft read have children."""
    budget, depth, expand = 10, 4, 3
    for step in grown_steps(tiny_pair, nodes=budget, depth=depth, expand=expand):
        growth, nodes = step.growth, step.nodes
        assert growth.budget == budget and growth.per_wave == math.ceil(budget / depth)
        assert len(nodes) <= budget and growth.nodes == list(range(len(nodes)))
        assert max(n.level for n in nodes) <= depth
        for wave in set(growth.waves):
            assert growth.waves.count(wave) <= growth.per_wave
        for i, node in enumerate(nodes):
            parent_value = 1.0 if node.parent == -1 else growth.values[node.parent]
            assert growth.values[i] == pytest.approx(parent_value * node.q, rel=1e-5)
            assert node.level <= growth.waves[i]
            if node.parent != -1:
                assert node.parent in growth.expanded and growth.waves[node.parent] < growth.waves[i]
        for parent in {-1, *growth.expanded}:
            qs = [n.q for n in nodes if n.parent == parent]
            assert qs == sorted(qs, reverse=True) and len(qs) <= expand
        last = max(growth.waves)
        if growth.left_out:
            assert max(d.value for d in growth.left_out) <= min(
                v for v, w in zip(growth.values, growth.waves) if w == last) + 1e-9
            assert all(d.token_id >= 0 and d.token for d in growth.left_out)


def test_a_confident_draft_grows_deep_and_a_hesitant_one_wide(tiny_pair):
    """The point of the method: the same budget spent differently. A step whose root row is flat gets more
    level-1 siblings than one whose root row has a clear favourite (measured over one run's steps)."""
    steps = grown_steps(tiny_pair, nodes=12, depth=4, expand=4)
    shapes = {(sum(n.level == 1 for n in s.nodes), max(n.level for n in s.nodes)) for s in steps}
    assert len(shapes) > 1, "every step grew the same tree: the growth does not follow the draft"


def test_sampled_growth_leaves_its_draws_unmade_and_records_them_without_tokens(tiny_pair):
    steps = grown_steps(tiny_pair, temperature=0.8, nodes=8, depth=3, expand=3)
    assert any(s.growth.left_out for s in steps)
    assert all(d.token_id == -1 and d.token == "" for s in steps for d in s.growth.left_out)


def test_a_dynamic_run_saves_and_loads_with_its_growth_and_a_bad_growth_is_refused(tiny_pair):
    decoder = make_decoder(tiny_pair, DecoderOptions(method="dynamic", nodes=6, depth=3))
    run = decoder.generate(tiny_pair.encode_prompt(PROMPT), 8)
    assert run_from_dict(run_to_dict(run)) == run
    broken = run_to_dict(run)
    broken["steps"][0]["growth"]["expanded"].append(99)
    with pytest.raises(TraceError, match="growth"):
        run_from_dict(broken)


def test_dynamic_options_are_its_own():
    """Budget, depth and expansion belong to `dynamic`; another method refuses them, and the shared depth option
    still means ti-mcsd's chain length there."""
    DecoderOptions(method="dynamic", nodes=20, depth=5, expand=2).validate()
    with pytest.raises(OptionsError, match="mcsd takes no node budget"):
        DecoderOptions(method="mcsd", nodes=20).validate()
    with pytest.raises(OptionsError, match="node budget must lie"):
        DecoderOptions.parse({"method": "dynamic", "nodes": "0"})


def test_the_tree_figure_shows_what_was_read_kept_and_left_out(tiny_pair):
    """Every grown node is drawn (kept), the nodes the draft read carry a ring, the draws left out hang hollow under
    their parents with their token at T = 0, and a node's hover gives its cumulative q and wave."""
    import viz

    step = grown_steps(tiny_pair, nodes=10, depth=3, expand=3)[0]
    figure = viz.tree_figure(step, "t")
    by_name = {trace.name: trace for trace in figure.data}
    assert len(by_name["read by the draft (expanded)"].x) == len(step.growth.expanded) > 0
    left_out = by_name["left out: the budget did not reach it"]
    assert list(left_out.text) == [viz.tree.show_token(d.token, 8) for d in step.growth.left_out]
    hovers = " ".join(h for trace in figure.data if trace.customdata is not None for h in trace.hovertext)
    assert hovers.count("cumulative q") == len(step.nodes) and "drawn in wave 1" in hovers
    assert f"grown: {len(step.nodes)}/10 nodes" in figure.layout.title.text


def test_the_guided_step_replays_a_dynamic_tree_wave_by_wave(tiny_pair):
    """Learn → guided step: one draft phase per wave (a later wave may add a sibling at level 1), each showing the
    nodes drawn so far with the ones the draft had read by then ringed."""
    import viz
    from dynasd.explorer.lessons.phases import step_at_phase, step_phases

    step = next(s for s in grown_steps(tiny_pair, nodes=12, depth=4, expand=4) if max(s.growth.waves) > 1)
    drafts = [p for p in step_phases(step) if p.kind == "draft"]
    assert [p.title for p in drafts] == [f"Draft wave {w}" for w in sorted(set(step.growth.waves))]
    first = step_at_phase(step, drafts[0])
    assert len(first.nodes) == step.growth.waves.count(1) and not first.growth.expanded
    second = step_at_phase(step, drafts[1])
    assert second.growth.expanded == first.growth.nodes and not second.growth.left_out
    viz.guided.guided_figure(second, drafts[1], "t")
