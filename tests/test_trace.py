"""Traces: every field the UI draws, JSON round trip, and refusal of malformed or hostile files."""
import json

import pytest

from dynasd.decoders import make_decoder
from dynasd.options import DecoderOptions, options_of_run
from dynasd.trace import MAX_TRACE_BYTES, TraceError, load_run, run_to_dict, save_run
from dynasd.tree import TreeShape, ancestor_mask


@pytest.fixture(scope="module")
def sampled_run(tiny_pair):
    return make_decoder(tiny_pair, SAMPLED).generate(tiny_pair.encode_prompt("trace me"), 30, prompt_text="trace me")


SAMPLED = DecoderOptions(method="mcsd", k_config=(3, 2, 1), stop="confidence", threshold=0.5, temperature=0.8,
                         top_p=0.9, seed=3)


def test_step_traces_are_consistent(sampled_run):
    run = sampled_run
    shape = TreeShape(SAMPLED.branching())
    big = ancestor_mask(shape.parents)
    assert sum(len(s.committed) for s in run.steps) == len(run.new_token_ids)
    for step in run.steps:
        n = len(step.nodes)
        assert n == shape.level_starts[step.live_depth]
        assert step.verify_mask == ["".join("1" if v else "0" for v in row) for row in big[:n, :n].tolist()]
        assert step.position_ids[step.root_rows:] == [step.context_len + node.level - 1 for node in step.nodes]
        accepted = [i for i, node in enumerate(step.nodes) if node.status == "accepted"]
        assert accepted == step.accepted_path
        for i in step.accepted_path:
            assert step.nodes[i].u is not None and step.nodes[i].u * step.nodes[i].q_test <= step.nodes[i].p_test
        rejected = [node for node in step.nodes if node.status == "rejected"]
        assert all(node.u * node.q_test > node.p_test for node in rejected)
        final_sampled = step.committed_origins[-1] in ("bonus", "correction")
        assert final_sampled or len(step.committed) < len(step.accepted_path) + 1
        assert step.target_forwards == 1 and step.draft_forwards == step.live_depth


def test_json_round_trip(tmp_path, sampled_run):
    path = tmp_path / "run.json"
    save_run(sampled_run, path)
    loaded = load_run(path)
    assert loaded == sampled_run
    assert run_to_dict(loaded) == json.loads(path.read_text())


def test_a_saved_run_records_the_options_that_made_it(tmp_path, sampled_run):
    path = tmp_path / "run.json"
    save_run(sampled_run, path)
    loaded = load_run(path)
    assert options_of_run(loaded.method, loaded.config) == SAMPLED
    assert set(loaded.config) == {"options", "turn"}, "one record, under the options' own names"


def test_a_trace_saved_before_options_were_recorded_gives_equivalent_options(tiny_pair, sampled_run):
    # the config a decoder wrote before the options record, in its own vocabulary (SAMPLED's values)
    old = {"temperature": 0.8, "top_k": 0, "top_p": 0.9, "seed": 3, "branching": [3, 2, 1], "target_roots": False,
           "without_replacement": True, "dynamic_depth": True, "stop": "confidence", "threshold": 0.5, "lookup": 0,
           "lookup_min_ngram": 2, "feature_draft": False, "turn": 1}
    restored = options_of_run(sampled_run.method, old)
    assert (restored.method, restored.k_config, restored.stop, restored.seed) == ("mcsd", (3, 2, 1), "confidence", 3)
    prompt = tiny_pair.encode_prompt("trace me")
    assert make_decoder(tiny_pair, restored).generate(prompt, 30).new_token_ids == sampled_run.new_token_ids


def corrupt(run_dict: dict, edit) -> dict:
    obj = json.loads(json.dumps(run_dict))
    edit(obj)
    return obj


BAD_EDITS = {
    "wrong format tag": lambda o: o.update(format="pickle"),
    "unknown top field": lambda o: o.update(evil=1),
    "steps not a list": lambda o: o.update(steps="x"),
    "bad mask row": lambda o: o["steps"][0]["verify_mask"].__setitem__(0, "2" * len(o["steps"][0]["nodes"])),
    "parent after child": lambda o: o["steps"][0]["nodes"][0].update(parent=5),
    "unknown status": lambda o: o["steps"][0]["nodes"][0].update(status="maybe"),
    "missing field": lambda o: o["steps"][0].pop("committed"),
    "string token id": lambda o: o["steps"][0]["committed"].__setitem__(0, "7"),
    "path out of range": lambda o: o["steps"][0]["accepted_path"].append(10_000),
}


@pytest.mark.parametrize("name", BAD_EDITS)
def test_malformed_traces_are_refused(tmp_path, sampled_run, name):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(corrupt(run_to_dict(sampled_run), BAD_EDITS[name])))
    with pytest.raises(TraceError):
        load_run(path)


def test_non_json_and_oversized_files_are_refused(tmp_path):
    pickled = tmp_path / "p.json"
    pickled.write_bytes(b"\x80\x04\x95\x00\x00cos\nsystem\n")
    with pytest.raises(TraceError):
        load_run(pickled)
    big = tmp_path / "big.json"
    big.write_text(" " * 2048)
    with pytest.raises(TraceError):
        load_run(big, max_bytes=1024)
    assert MAX_TRACE_BYTES >= 1024 * 1024


def test_greedy_p_values_are_the_target_softmax_however_many_rows_at_a_time(tiny_pair, monkeypatch):
    """At T = 0 a step's p values come from the verify's logits turned into probabilities a few rows at a time
    (a whole tree's at once held ~9 MB more at a generate's peak): any chunk size gives the whole softmax's values,
    the node whose parent is a chunk's first or last row included."""
    from dynasd.decoders import speculative

    def p_values(rows_at_a_time: int) -> list[float]:
        monkeypatch.setattr(speculative, "SOFTMAX_ROWS", rows_at_a_time)
        options = DecoderOptions(method="mcsd", k_config=(4, 2, 2, 1))
        run = make_decoder(tiny_pair, options).generate(tiny_pair.encode_prompt("trace me"), 12)
        return [node.p for step in run.steps for node in step.nodes]

    whole = p_values(10 ** 6)
    assert len(whole) > 45 and all(0.0 <= p <= 1.0 for p in whole)
    assert p_values(1) == whole and p_values(8) == whole


@pytest.mark.parametrize("method, temperature", [("mcsd", 0.0), ("mcsd", 0.8), ("ar", 0.0), ("ar", 0.8)])
def test_a_steps_seconds_leave_out_what_only_the_views_need(tiny_pair, monkeypatch, method, temperature):
    """A step's draft, verify and accept seconds are the method's time (what Compare pairs against ar's): the p
    values at T = 0 and the token strings recorded for the views come after its clock stops. Here each softmax and
    each token-string lookup takes 20 ms."""
    import time

    import torch

    def slow(function):
        def wrapped(*args, **kwargs):
            time.sleep(0.02)
            return function(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(type(tiny_pair), "token_strings", slow(type(tiny_pair).token_strings))
    if temperature == 0.0:  # sampling needs its softmax for the draws; at T = 0 only the views read one
        monkeypatch.setattr(torch, "softmax", slow(torch.softmax))
    shape = dict(k_config=(2, 1)) if method == "mcsd" else {}
    options = DecoderOptions(method=method, temperature=temperature, seed=3, **shape)
    run = make_decoder(tiny_pair, options).generate(tiny_pair.encode_prompt("trace me"), 6)
    assert run.steps and all(step.seconds < 0.015 for step in run.steps), [step.seconds for step in run.steps]
