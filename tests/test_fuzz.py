"""Property tests (hypothesis, derandomized): trees and masks against an oracle, the acceptance walks'
invariants, trace round trips and hostile trace data, and random decoder configurations on tiny-random."""
import json
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynasd.decoders import make_decoder
from dynasd.explorer.inputs import UserError
from dynasd.explorer.sessions.session import load_trace
from dynasd.options import DecoderOptions
from dynasd.sampling import Draws, greedy_walk, mcss_walk
from dynasd.trace import (
    LevelScores,
    NodeTrace,
    RunTrace,
    StepTrace,
    TraceError,
    check_trace,
    run_from_dict,
    run_to_dict,
)
from dynasd.tree import ROOT, TreeShape, ancestor_mask, parse_branching, path_to

FUZZ = settings(derandomize=True, deadline=None, max_examples=60,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SLOW_FUZZ = settings(FUZZ, max_examples=40)

branchings = st.lists(st.integers(1, 4), min_size=1, max_size=5).filter(
    lambda b: TreeShape(tuple(b)).num_nodes <= 200).map(tuple)


# -- trees ----------------------------------------------------------------------------------------------------------

def ancestors_oracle(parents, i):
    seen = {i}
    while parents[i] != ROOT:
        i = parents[i]
        seen.add(i)
    return seen


@FUZZ
@given(branchings)
def test_tree_topology_is_level_major_and_parent_major(branching):
    shape = TreeShape(branching)
    assert shape.num_nodes == sum(math.prod(branching[:l + 1]) for l in range(len(branching)))
    for i, parent in enumerate(shape.parents):
        assert parent < i
        assert shape.levels[i] == (1 if parent == ROOT else shape.levels[parent] + 1)
        assert i in shape.children[parent]
        assert i in shape.nodes_at(shape.levels[i])
    for node, kids in shape.children.items():
        level = 0 if node == ROOT else shape.levels[node]
        assert len(kids) == (branching[level] if level < len(branching) else 0)
        assert kids == list(range(kids[0], kids[0] + len(kids))) if kids else True
    assert shape.level_starts[-1] == shape.num_nodes


@FUZZ
@given(branchings)
def test_ancestor_mask_and_its_slices_match_the_oracle(branching):
    shape = TreeShape(branching)
    mask = ancestor_mask(shape.parents)
    for i in range(shape.num_nodes):
        assert set(torch.nonzero(mask[i]).flatten().tolist()) == ancestors_oracle(shape.parents, i)
        assert int(mask[i].sum()) == shape.levels[i] == len(path_to(i, shape.parents))
    for depth in range(1, shape.depth + 1):
        live = shape.level_starts[depth]
        assert torch.equal(mask[:live, :live], ancestor_mask(TreeShape(branching[:depth]).parents))


@FUZZ
@given(st.text(max_size=30))
def test_parse_branching_returns_positive_levels_or_a_value_error(text):
    try:
        values = parse_branching(text)
    except ValueError:
        return
    assert values and all(isinstance(v, int) and v >= 1 for v in values)
    assert len(values) == text.count(",") + 1


@FUZZ
@given(branchings)
def test_parse_branching_round_trips(branching):
    assert parse_branching(", ".join(map(str, branching))) == branching


# -- acceptance walks -------------------------------------------------------------------------------------------------

VOCAB = 6
small_branchings = st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple)
distributions = st.lists(st.floats(0.0, 1.0), min_size=VOCAB, max_size=VOCAB).filter(lambda w: sum(w) > 1e-3)


def normalised(weights) -> torch.Tensor:
    t = torch.tensor(weights, dtype=torch.float32)
    return t / t.sum()


@st.composite
def walk_cases(draw):
    shape = TreeShape(draw(small_branchings))
    contexts = [ROOT] + list(range(shape.num_nodes))
    tokens = [0] * shape.num_nodes
    for context in contexts:  # siblings are distinct tokens, in draw order (as drawing without replacement gives)
        kids = shape.children[context]
        order = draw(st.permutations(range(VOCAB)))
        for kid, token in zip(kids, order):
            tokens[kid] = token
    p = {c: normalised(draw(distributions)) for c in contexts}
    q = {c: normalised(draw(distributions)) for c in contexts}
    return shape, tokens, p, q


def assert_chain(path, shape, start=ROOT):
    for parent, node in zip([start] + path, path):
        assert shape.parents[node] == parent


@FUZZ
@given(walk_cases())
def test_greedy_walk_accepts_exactly_the_targets_argmax_chain(case):
    shape, tokens, p, _ = case
    argmax = {c: int(p[c].argmax()) for c in p}
    walk = greedy_walk(ROOT, lambda c: shape.children[c], tokens, lambda c: argmax[c])
    assert_chain(walk.path, shape)
    for node in walk.path:
        assert tokens[node] == argmax[shape.parents[node]]
    final = walk.path[-1] if walk.path else ROOT
    assert walk.final_context == final
    kids = shape.children[final]
    assert walk.final_had_children == bool(kids)
    assert all(tokens[k] != argmax[final] for k in kids), "the walk stopped although a child matched"
    # every test is recorded in order: rejections, then the accepted child, level by level
    assert [t.node for t in walk.tests if t.accepted] == walk.path


@FUZZ
@given(walk_cases(), st.booleans(), st.integers(0, 2**31))
def test_mcss_walk_keeps_its_invariants(case, without_replacement, seed):
    shape, tokens, p, q = case
    generator = torch.Generator().manual_seed(seed)
    def draws(c):
        return [Draws(shape.children[c], q[c], without_replacement)] if shape.children[c] else []

    walk = mcss_walk(ROOT, draws, tokens, lambda c: p[c], generator)
    assert_chain(walk.path, shape)
    assert [t.node for t in walk.tests if t.accepted] == walk.path
    for test in walk.tests:
        assert test.q > 0.0, "a candidate the draft could not have drawn is never tested"
        assert 0.0 <= test.u < 1.0
        assert test.accepted == (test.u * test.q <= test.p)
    final = walk.path[-1] if walk.path else ROOT
    assert walk.final_context == final and walk.final_had_children == bool(shape.children[final])
    probs = walk.final_probs
    assert probs is not None and probs.shape == (VOCAB,)
    assert bool(torch.isfinite(probs).all()) and float(probs.min()) >= 0.0
    assert abs(float(probs.sum()) - 1.0) < 1e-5
    if not walk.final_had_children:
        assert torch.equal(probs, p[final]), "at a leaf the bonus token comes from the target itself"
    else:
        rejected = {tokens[t.node] for t in walk.tests if shape.parents[t.node] == final}
        assert all(float(probs[x]) < 1e-6 for x in rejected), "a rejected token cannot be the correction"


# -- traces ---------------------------------------------------------------------------------------------------------

finite = st.floats(0.0, 1.0, allow_nan=False)
words = st.text(max_size=5)


@st.composite
def run_traces(draw):
    steps = []
    for index in range(draw(st.integers(0, 3))):
        n = draw(st.integers(0, 6))
        parents = [draw(st.integers(-1, i - 1)) for i in range(n)]
        levels = []
        for parent in parents:
            levels.append(1 if parent == -1 else levels[parent] + 1)
        nodes = [NodeTrace(token_id=draw(st.integers(0, 99)), token=draw(words), parent=parents[i], level=levels[i],
                           origin=draw(st.sampled_from(["draft", "target_root"])), p=draw(finite),
                           q=draw(st.none() | finite), status=draw(st.sampled_from(["accepted", "rejected"])),
                           p_test=draw(st.none() | finite), q_test=draw(st.none() | finite),
                           u=draw(st.none() | finite)) for i in range(n)]
        mask = ancestor_mask(parents).int().tolist() if n else []
        path, node = [], ROOT
        while [c for c in range(n) if parents[c] == node]:
            node = [c for c in range(n) if parents[c] == node][0]
            path.append(node)
        k = draw(st.integers(1, 3))
        steps.append(StepTrace(
            index=index, context_len=draw(st.integers(1, 50)), nodes=nodes, max_nodes=n,
            max_depth=max(levels, default=0),
            live_depth=max(levels, default=0), root_rows=draw(st.integers(0, 1)),
            verify_mask=["".join(map(str, row)) for row in mask], position_ids=list(range(n)), accepted_path=path,
            committed=draw(st.lists(st.integers(0, 99), min_size=k, max_size=k)),
            committed_tokens=draw(st.lists(words, min_size=k, max_size=k)),
            committed_origins=draw(st.lists(st.sampled_from(["draft", "bonus", "correction"]), min_size=k,
                                            max_size=k)),
            final_parent=draw(st.none() | st.integers(-1, n - 1)), final_p=draw(st.none() | finite),
            root_token=draw(words), stop_policy="confidence", threshold=draw(st.none() | finite),
            stop_scores=[LevelScores(1, draw(st.lists(finite, max_size=3)), draw(st.booleans()))],
            draft_seconds=draw(finite), target_forwards=1))
    return RunTrace(method=draw(st.sampled_from(["ar", "sd", "mcsd", "ti-mcsd"])),
                    config={"branching": [2, 2], "seed": draw(st.integers(0, 9))}, pair="tiny-random",
                    draft_label=draw(words), lossless=draw(st.booleans()), prompt=draw(st.text(max_size=20)),
                    prompt_ids=draw(st.lists(st.integers(0, 99), max_size=5)), steps=steps,
                    new_token_ids=[t for s in steps for t in s.committed], text=draw(st.text(max_size=20)),
                    seconds=draw(finite), finished=draw(st.sampled_from(["", "eos", "length"])))


@FUZZ
@given(run_traces())
def test_traces_round_trip_through_json(run):
    again = run_from_dict(json.loads(json.dumps(run_to_dict(run))))
    assert again == run
    check_trace(again)


json_values = st.recursive(st.none() | st.booleans() | st.integers(-5, 300) | st.floats(allow_nan=True) |
                           st.text(max_size=4), lambda inner: st.lists(inner, max_size=3) |
                           st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
TRACE_KEYS = ["steps", "new_token_ids", "prompt", "text", "config", "prompt_ids", "nodes", "verify_mask",
              "accepted_path", "committed", "committed_origins", "stop_scores", "level", "parent", "p", "status"]


@st.composite
def mutated_traces(draw, good):
    """A valid trace with one value somewhere replaced by arbitrary JSON."""
    obj = json.loads(json.dumps(good))
    targets = [obj] + obj["steps"] + [n for s in obj["steps"] for n in s["nodes"]]
    target = draw(st.sampled_from(targets))
    key = draw(st.sampled_from(sorted(target)) | st.sampled_from(TRACE_KEYS))
    target[key] = draw(json_values)
    return obj


@pytest.fixture(scope="module")
def good_trace(tiny_pair):
    run = make_decoder(tiny_pair, DecoderOptions(k_config=(2, 2))).generate(tiny_pair.encode_prompt("hi"), 6, "hi")
    return run_to_dict(run)


@FUZZ
@given(data=st.data())
def test_the_app_loader_only_ever_says_no_with_a_reason(good_trace, tmp_path_factory, data):
    """Whatever a trace file holds, the app's loader returns a drawable run or raises UserError, nothing else."""
    obj = data.draw(mutated_traces(good_trace))
    path = tmp_path_factory.mktemp("fuzz") / "trace.json"
    path.write_text(json.dumps(obj))
    try:
        run = load_trace(path)
    except UserError as exc:
        assert str(exc).startswith("cannot load that trace")
        return
    check_trace(run)


@pytest.mark.parametrize("field,value", [("new_token_ids", 5), ("new_token_ids", {}), ("prompt_ids", "abc"),
                                         ("config", [])])
def test_mistyped_top_level_fields_are_trace_errors(good_trace, field, value):
    with pytest.raises(TraceError):
        run_from_dict({**good_trace, field: value})


def test_a_string_verify_mask_is_a_trace_error(good_trace):
    bad = json.loads(json.dumps(good_trace))
    step = next(s for s in bad["steps"] if len(s["nodes"]) >= 1)
    step["verify_mask"] = "1" * len(step["nodes"])
    with pytest.raises(TraceError):
        run_from_dict(bad)


# -- random decoder configurations on tiny-random --------------------------------------------------------------------

PROMPTS = ["hello", "What is speculative decoding?", "a", "1, 2, 3,", "Zz"]
MAX_NEW = 20


@pytest.fixture(scope="module")
def greedy_reference(tiny_pair):
    cache = {}

    def reference(prompt):
        if prompt not in cache:
            ids = tiny_pair.encode_prompt(prompt)
            out = tiny_pair.target.generate(torch.tensor([ids]),
                                            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                            max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=2, pad_token_id=2)
            cache[prompt] = out[0, len(ids):].tolist()
        return cache[prompt]

    return reference


@st.composite
def decoder_configs(draw):
    method = draw(st.sampled_from(["ar", "sd", "mcsd", "ti-mcsd", "pld"]))
    stop = draw(st.sampled_from(["none", "confidence", "cumulative"]))
    lookup = 0 if method == "ti-mcsd" else draw(st.sampled_from([0, 0, 1, 3, 8]))
    greedy = draw(st.booleans())
    sampling = {} if greedy else dict(temperature=draw(st.floats(0.05, 2.0)), top_p=draw(st.floats(0.05, 1.0)),
                                      top_k=draw(st.integers(0, 8)))
    options = DecoderOptions(
        method=method, gamma=draw(st.integers(1, 6)), k_config=tuple(draw(st.lists(st.integers(1, 3), min_size=1,
                                                                                      max_size=4))),
        width=draw(st.integers(1, 3)), depth=draw(st.integers(1, 4)), dynamic_depth=draw(st.booleans()),
        with_replacement=draw(st.booleans()), stop=stop, threshold=draw(st.floats(0.0, 1.0)),
        seed=draw(st.integers(0, 10_000)), lookup=lookup, lookup_ngram=draw(st.integers(1, 3)), **sampling)
    # a method's own options only (the others would be refused: validate() names options a method does not read)
    return dict(options=options.for_method(), prompt=draw(st.sampled_from(PROMPTS)),
                max_new_tokens=draw(st.integers(1, MAX_NEW)))


@SLOW_FUZZ
@given(decoder_configs())
def test_random_decoder_configurations_give_valid_traces_and_greedy_identity(tiny_pair, greedy_reference, config):
    options, prompt, max_new = config["options"], config["prompt"], config["max_new_tokens"]
    run = make_decoder(tiny_pair, options).generate(tiny_pair.encode_prompt(prompt), max_new, prompt)

    check_trace(run)
    assert run_from_dict(json.loads(json.dumps(run_to_dict(run)))) == run
    assert run.finished in ("eos", "length") and 1 <= len(run.new_token_ids) <= max_new
    assert (run.finished == "length") == (len(run.new_token_ids) == max_new and 2 not in run.new_token_ids)
    assert 2 not in run.new_token_ids[:-1], "nothing after the end of sequence"
    assert [t for s in run.steps for t in s.committed] == run.new_token_ids
    for step in run.steps:
        assert step.committed, "every step commits at least one token"
        parents = [n.parent for n in step.nodes]
        mask = ancestor_mask(parents).int().tolist() if parents else []
        assert step.verify_mask == ["".join(map(str, row)) for row in mask]
        assert {i for i, n in enumerate(step.nodes) if n.status == "accepted"} == set(step.accepted_path)
        assert len(step.nodes) <= step.max_nodes and step.live_depth <= step.max_depth
    if options.sampling.greedy and run.lossless:
        assert run.new_token_ids == greedy_reference(prompt)[:max_new]
