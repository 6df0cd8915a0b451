"""The benchmark harness: it runs every method end to end, writes well-formed outputs, and its fidelity fields
tell an exact method from one that changes a token."""
import importlib.util
import json
from pathlib import Path

import pytest

from dynasd.bench import command, measure, summary
from dynasd.bench import specs as bench_specs
from dynasd.cli import build_parser, main
from dynasd.options import DecoderOptions, options_from_args
from dynasd.prompts import select_prompts

PROMPTS = [
    {"question_id": 7, "category": "writing", "turns": ["Write a short poem about the sea.", "Now shorter."]},
    {"question_id": 3, "category": "writing", "turns": ["Tell me a story."]},
    {"question_id": 5, "category": "qa", "turns": ["What is the capital of France?"]},
]
METHODS = ("ar,sd,mcsd,ti-mcsd,hf-assisted,mcsd:k=2,2,1:stop=confidence:th=0.3,pld:ngram=1,sd:lookup=4,"
           "hf-assisted:lookup=4,sd:kernels=plain,mcsd:draft=features")
LABELS = ["ar", "sd", "mcsd", "ti-mcsd", "hf-assisted", "mcsd:k=2,2,1:stop=confidence:th=0.3", "pld:ngram=1",
          "sd:lookup=4", "hf-assisted:lookup=4", "sd:kernels=plain", "mcsd:draft=features"]
SUMMARY_KEYS = {"method", "temperature", "category", "n_prompts", "tokens_per_s", "speedup_vs_ar",
                "tokens_per_target_forward", "acceptance_rate", "acceptance_denominator", "identical_to_ar",
                "differing_token_share", "draft_seconds", "verify_seconds", "other_seconds"}


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "questions.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PROMPTS) + "\n")
    return path


@pytest.fixture(scope="module")
def bench_run(prompts_file, tmp_path_factory):
    """One CLI run on tiny-random: two prompts (one per category), every method, T = 0 and 0.7."""
    out = tmp_path_factory.mktemp("bench")
    import io
    from contextlib import redirect_stdout

    stdout = io.StringIO()
    with redirect_stdout(stdout):
        code = main(["bench", "--pair", "tiny-random", "--prompts", str(prompts_file), "--limit", "1",
                     "--methods", METHODS, "--temperatures", "0,0.7", "--max-new-tokens", "16",
                     "--warmup-tokens", "2", "--out", str(out), "--no-progress"])
    assert code == 0
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    return {"out": out, "runs": runs, "summary": json.loads((out / "summary.json").read_text()),
            "meta": json.loads((out / "meta.json").read_text()), "stdout": stdout.getvalue()}


def test_every_prompt_method_and_temperature_has_one_run_record(bench_run):
    keys = sorted((r["prompt_id"], r["method"], r["temperature"]) for r in bench_run["runs"])
    assert keys == sorted((p, m, t) for p in (3, 5) for m in LABELS for t in (0.0, 0.7))
    for run in bench_run["runs"]:
        assert 0 < run["new_tokens"] <= 16 and run["new_tokens"] == len(run["token_ids"])
        assert run["seconds"] > 0 and run["target_forward_seconds"] > 0
        if run["base_method"] != "hf-assisted":  # the clock sees every forward, on the lean path too: steps + prefill
            assert run["target_forward_calls"] - run["target_forwards"] in (0, 1), run["method"]
        if run["base_method"] in ("sd", "mcsd") and "lookup" not in run["options"]:
            assert run["draft_forward_calls"] >= run["target_forwards"] and run["draft_forward_seconds"] > 0


def test_summary_has_one_well_formed_row_per_method_temperature_and_category(bench_run):
    summary = bench_run["summary"]
    keys = [(r["method"], r["temperature"], r["category"]) for r in summary]
    assert sorted(keys) == sorted((m, t, c) for m in LABELS for t in (0.0, 0.7) for c in ("writing", "qa", "all"))
    for row in summary:
        assert SUMMARY_KEYS <= set(row)
        assert row["n_prompts"] == (2 if row["category"] == "all" else 1)
        assert row["tokens_per_s"] > 0 and row["speedup_vs_ar"] > 0
        assert row["tokens_per_target_forward"] >= 1.0
        if row["method"] == "ar":
            assert row["speedup_vs_ar"] == 1.0 and row["tokens_per_target_forward"] == 1.0
            assert row["acceptance_rate"] is None and row["draft_seconds"] == 0.0
        elif row["method"] == "hf-assisted:lookup=4":
            # transformers' prompt lookup runs no draft model: nothing to time or count on the draft side
            assert row["acceptance_rate"] is None and row["draft_seconds"] == 0.0
        else:
            assert 0.0 <= row["acceptance_rate"] <= 1.0, row["method"]
            # pld proposes from the context alone: its draft model is never run
            assert (row["draft_seconds"] == 0.0) == row["method"].startswith("pld"), row["method"]


def test_speedup_is_tokens_per_second_over_ar_in_the_same_group(bench_run):
    for row in bench_run["summary"]:
        ar = next(r for r in bench_run["summary"] if r["method"] == "ar"
                  and r["temperature"] == row["temperature"] and r["category"] == row["category"])
        assert row["speedup_vs_ar"] == pytest.approx(row["tokens_per_s"] / ar["tokens_per_s"])


def test_lossless_methods_are_identical_to_ar_at_temperature_zero(bench_run):
    for row in bench_run["summary"]:
        if row["temperature"] == 0 and row["method"] != "ti-mcsd":
            assert row["identical_to_ar"] is True, row["method"]
            assert row["identical_share"] == 1.0 and row["differing_token_share"] == 0.0
    ti = next(r for r in bench_run["summary"] if r["method"] == "ti-mcsd" and r["category"] == "all"
              and r["temperature"] == 0)
    assert ti["lossless"] is False
    assert ti["identical_to_ar"] is (ti["differing_token_share"] == 0.0)


def test_fidelity_is_null_and_explained_at_positive_temperature(bench_run):
    for row in bench_run["summary"]:
        if row["temperature"] > 0:
            assert row["identical_to_ar"] is None and row["differing_token_share"] is None
            assert "T>0" in row["fidelity_note"]


def test_printed_table_report_and_meta(bench_run):
    assert "| method | T | prompts | tokens/s | speedup vs ar |" in bench_run["stdout"]
    page = (bench_run["out"] / "report.html").read_text()
    assert page.count("Plotly.newPlot") >= 5
    assert page.count("plotly.js v") == 1  # the library is embedded once, not once per chart
    assert bench_run["meta"]["pair"] == "tiny-random"
    assert bench_run["meta"]["prompt_ids"] == [["writing", 3], ["qa", 5]]


def test_a_perturbed_method_is_detected(tiny_pair, prompts_file, tmp_path, monkeypatch):
    """Wrap sd so it changes its 4th token: fidelity must flag sd, and only sd."""
    real = measure.make_method_decoder

    def perturbed(spec, pair, options, decision_model=None):
        decoder = real(spec, pair, options, decision_model)
        if spec.method == "sd":
            generate = decoder.generate

            def wrong_generate(*a, **k):
                run = generate(*a, **k)
                if len(run.new_token_ids) > 3:  # the 2-token warm-up run stays as it is
                    run.new_token_ids[3] = 10 if run.new_token_ids[3] != 10 else 11  # ids 10, 11: letters
                return run
            decoder.generate = wrong_generate
        return decoder

    monkeypatch.setattr(measure, "make_method_decoder", perturbed)
    monkeypatch.setattr(command, "make_method_decoder", perturbed)
    args = build_parser().parse_args(["bench", "--prompts", str(prompts_file), "--max-new-tokens", "12",
                                      "--warmup-tokens", "2"])
    prompts = select_prompts(prompts_file, None, 1)
    specs = bench_specs.parse_methods("ar,sd,mcsd")
    records = command.benchmark(args, {"fast": tiny_pair}, prompts, specs, [0.0], tmp_path, progress=False)
    for record in records:
        if record["method"] == "sd":
            assert record["identical_to_ar"] is False
            compared = record["compared_tokens"]
            assert record["differing_share"] == pytest.approx((compared - 3) / compared)
        else:
            assert record["identical_to_ar"] is True and record["differing_share"] == 0.0
    overall = {r["method"]: r for r in summary.summarize(records) if r["category"] == "all"}
    assert overall["sd"]["identical_to_ar"] is False and overall["sd"]["differing_token_share"] > 0
    assert overall["ar"]["identical_to_ar"] is True and overall["mcsd"]["identical_to_ar"] is True


def test_kernels_option_runs_a_method_on_the_plain_pair(prompts_file, tmp_path, monkeypatch):
    """`kernels=plain` measures the same method on stock transformers modules, `kernels=torch` without the compiled
    kernel, beside the fast ones, in one run."""
    from dynasd.kernels.fast_linear import kernel_pays_here
    from dynasd.loading.models import load_pair

    real, seen = measure.make_method_decoder, {}

    def recording(spec, pair, options, decision_model=None):
        down_proj = pair.target.model.layers[0].mlp.down_proj
        seen[spec.label] = (type(down_proj).__name__, pair.target.config._attn_implementation,
                            getattr(down_proj, "panels", None) is not None)
        return real(spec, pair, options, decision_model)

    monkeypatch.setattr(measure, "make_method_decoder", recording)
    monkeypatch.setattr(command, "make_method_decoder", recording)
    pairs = {"fast": load_pair("tiny-random"), "plain": load_pair("tiny-random", fast_kernels=False),
             "torch": load_pair("tiny-random", compiled_kernel=False)}
    args = build_parser().parse_args(["bench", "--prompts", str(prompts_file), "--max-new-tokens", "8",
                                      "--warmup-tokens", "2"])
    specs = bench_specs.parse_methods("ar,pld,pld:kernels=plain,ar:kernels=fast,sd:kernels=torch")
    records = command.benchmark(args, pairs, select_prompts(prompts_file, None, 1), specs, [0.0], tmp_path,
                              progress=False)
    # The compiled kernel's panels exist only where it pays (x86 with AVX-512; fast_linear.kernel_pays_here).
    fast, plain = ("PretransposedLinear", "dynasd_sdpa", kernel_pays_here()), ("Linear", "sdpa", False)
    torch_only = ("PretransposedLinear", "dynasd_sdpa", False)
    assert seen == {"ar": fast, "pld": fast, "pld:kernels=plain": plain, "ar:kernels=fast": fast,
                    "sd:kernels=torch": torch_only}
    assert all(r["identical_to_ar"] for r in records)


# -- pure parts ---------------------------------------------------------------------------------------------------

def test_method_list_syntax():
    specs = bench_specs.parse_methods("sd:gamma=3,mcsd:k=4,2,2,1:stop=confidence:th=0.3,mcsd+dyn,hf-assisted:n=5")
    assert [s.label for s in specs] == ["ar", "sd:gamma=3", "mcsd:k=4,2,2,1:stop=confidence:th=0.3", "mcsd+dyn",
                                        "hf-assisted:n=5"]  # ar is added: it is the reference
    assert dict(specs[2].options) == {"k": "4,2,2,1", "stop": "confidence", "th": "0.3"}
    assert specs[3].method == "mcsd" and dict(specs[3].options) == {"stop": "confidence"}
    base = options_from_args(build_parser().parse_args(["bench", "--prompts", "x"]))
    mcsd = bench_specs.decoder_options(base, specs[2])
    assert (mcsd.method, mcsd.k_config, mcsd.stop, mcsd.threshold) == ("mcsd", (4, 2, 2, 1), "confidence", 0.3)
    ti = bench_specs.decoder_options(base, bench_specs.parse_method("ti-mcsd:k=2,4,1"))
    assert (ti.ti_k_config, ti.k_config) == ((2, 4, 1), (4, 2, 2, 1))  # ti-mcsd's k is its own shape
    pld = bench_specs.decoder_options(base, bench_specs.parse_method("pld:lookup=6:ngram=1"))
    assert (pld.lookup, pld.lookup_ngram) == (6, 1)


def test_command_line_options_apply_to_every_method_that_reads_them():
    """--gamma is sd's, --k-config mcsd's: each method takes the flags it reads and keeps its own key=value."""
    base = options_from_args(build_parser().parse_args(["bench", "--prompts", "x", "--gamma", "6", "--k-config",
                                                        "2,2", "--lookup", "3", "--top-k", "5"]))
    sd, mcsd, ti, ar = (bench_specs.decoder_options(base, bench_specs.parse_method(text))
                        for text in ("sd:lookup=0", "mcsd", "ti-mcsd", "ar"))
    assert (sd.gamma, sd.lookup, sd.k_config, sd.top_k) == (6, 0, (4, 2, 2, 1), 5)
    assert (mcsd.k_config, mcsd.lookup, mcsd.gamma) == ((2, 2), 3, 4)
    assert (ti.lookup, ti.k_config, ti.top_k) == (0, (4, 2, 2, 1), 5)  # ti-mcsd reads no lookup and no k_config
    assert ar == DecoderOptions(method="ar", top_k=5)


@pytest.mark.parametrize("text, message", [("beam", "unknown method"), ("sd:k=2", "takes no option"),
                                           ("ar,ar", "listed twice"), ("mcsd:stop=later", "unknown stop policy"),
                                           ("sd:gamma", "key=value"), ("pld:gamma=2", "takes no option"),
                                           ("ti-mcsd:lookup=4", "takes no option"),
                                           ("ar:kernels=slow", "kernels must be fast, torch or plain"),
                                           ("sd:draft=big", "unknown draft kind 'big'"),
                                           ("pld:draft=features", "takes no option"),
                                           ("sd:gamma=0", r"sd:gamma=0: gamma must lie in \[1, 256\]"),
                                           ("mcsd:k=4,0", "every branching factor must be at least 1"),
                                           ("mcsd:replacement=maybe", "must be 1 or 0"),
                                           ("hf-assisted:schedule=often", "schedule must be"),
                                           ("hf-assisted:n=many", "n must be a number"),
                                           ("recipe=fastest", "unknown recipe 'fastest'.*known: narrow-cpu")])
def test_bad_method_lists_are_refused_with_a_reason(text, message):
    with pytest.raises(ValueError, match=message):
        bench_specs.parse_methods(text)


def test_bad_options_fail_before_models_load(prompts_file, capsys):
    code = main(["bench", "--pair", "tiny-random", "--prompts", str(prompts_file), "--methods", "sd:gamma=x"])
    assert code == 2 and "sd:gamma=x: gamma must be a whole number" in capsys.readouterr().err


def test_options_that_only_fit_together_fail_before_models_load(prompts_file, capsys):
    code = main(["bench", "--pair", "no-such-pair", "--prompts", str(prompts_file), "--methods", "mcsd:k=16,16"])
    assert code == 2 and "mcsd:k=16,16: the tree has 272 nodes; the limit is 256" in capsys.readouterr().err


def test_differing_share_counts_every_position_from_the_first_divergence():
    assert summary.differing_share([1, 2, 3, 4], [1, 2, 3, 4]) == 0.0
    assert summary.differing_share([1, 9, 3, 4], [1, 2, 3, 4]) == 0.75  # positions 1..3, though 3 and 4 match
    assert summary.differing_share([1, 2], [1, 2, 3, 4]) == 0.5          # a shorter output misses the rest
    assert summary.differing_share([], []) == 0.0


def test_prompt_selection_is_first_n_by_question_id_per_category(prompts_file):
    chosen = select_prompts(prompts_file, ["qa", "writing"], 1)
    assert [(p["category"], p["id"]) for p in chosen] == [("qa", 5), ("writing", 3)]
    assert chosen[1]["text"] == "Tell me a story."  # the first turn
    assert len(select_prompts(prompts_file, None, None)) == 3
    with pytest.raises(ValueError, match="no prompts in category"):
        select_prompts(prompts_file, ["math"], 1)


def test_truncation_stops_after_eos_and_at_the_budget():
    assert measure.truncate([5, 6, 2, 7], 10, {2}) == ([5, 6, 2], "eos")
    assert measure.truncate([5, 6, 7, 8], 3, {2}) == ([5, 6, 7], "length")


def test_hf_assisted_counts_match_transformers_own_rounds_and_candidates(tiny_pair, monkeypatch):
    """Rounds = target forwards, attempted = assistant forwards: checked against the candidate generator itself.
    The draft's generation config is left as it was (the heuristic schedule would otherwise carry over). The
    clock's first forwards (the Compare tab's prefill of this peer) lie inside the call's own time."""
    from transformers.generation import candidate_generator

    lengths = []
    real = candidate_generator.AssistedCandidateGenerator.get_candidates

    def counting(self, input_ids, *args, **kwargs):
        candidates, logits = real(self, input_ids, *args, **kwargs)
        lengths.append(candidates.shape[1] - input_ids.shape[1])
        return candidates, logits

    monkeypatch.setattr(candidate_generator.AssistedCandidateGenerator, "get_candidates", counting)
    before = tiny_pair.draft.generation_config.to_dict()
    clock = measure.ForwardClock(tiny_pair)
    try:
        spec = bench_specs.parse_method("hf-assisted:n=3:schedule=heuristic")
        measured = measure.run_hf_assisted(spec, tiny_pair, DecoderOptions(method="ar"),
                                           tiny_pair.encode_prompt("Tell me a story."), 24, clock)
    finally:
        clock.close()
    assert measured.target_forwards == len(lengths) and measured.attempted_draft_levels == sum(lengths)
    assert 0 <= measured.accepted_draft_levels <= measured.attempted_draft_levels
    assert tiny_pair.draft.generation_config.to_dict() == before
    for role in ("target", "draft"):
        assert 0 < clock.first_seconds[role] < clock.seconds[role]
    assert clock.first_seconds["target"] + clock.first_seconds["draft"] < measured.seconds


def test_acceptance_denominator_counts_draft_levels_only(bench_run):
    """Without early stopping every step attempts all its draft levels: 4 for sd (gamma 4), mcsd (4,2,2,1) and
    ti-mcsd (4 chains of 4 draft tokens; the target-initialized roots are not draft levels)."""
    for run in bench_run["runs"]:
        if run["method"] in ("sd", "mcsd", "ti-mcsd"):
            assert run["attempted_draft_levels"] == 4 * run["target_forwards"], run["method"]
            # each step commits its accepted levels + 1 token; the last step may lose up to 4 to the budget
            assert run["accepted_draft_levels"] <= run["new_tokens"] - run["target_forwards"] + 4


def test_weights_read_count_each_forward_of_each_model_at_its_weight_bytes(bench_run):
    """The bandwidth columns: a run's weight bytes are its target forwards times the target's weights plus its draft
    forwards times the draft's (dynasd.kernels.weight_bytes_per_forward: every linear layer once, the tied output
    layer included, the embedding's lookups not); the summary divides them by tokens and by seconds."""
    from dynasd.kernels import weight_bytes_per_forward
    from dynasd.loading.models import load_pair

    pair = load_pair("tiny-random")
    target, draft = weight_bytes_per_forward(pair.target), weight_bytes_per_forward(pair.draft)
    linears = sum(m.in_features * m.out_features * 4 for m in pair.target.modules() if hasattr(m, "in_features"))
    assert target == linears  # float32 weights, no bias, the output layer counted once
    for run in bench_run["runs"]:
        if run["method"] in ("ar", "sd", "mcsd"):
            assert run["weight_bytes_read"] == (target * run["target_forward_calls"]
                                                + draft * run["draft_forward_calls"]), run["method"]
    ar = [r for r in bench_run["runs"] if r["method"] == "ar" and r["temperature"] == 0]
    row = next(r for r in bench_run["summary"] if r["method"] == "ar" and r["temperature"] == 0
               and r["category"] == "all")
    read = sum(r["weight_bytes_read"] for r in ar)
    assert row["weight_mb_per_token"] == pytest.approx(read / 1e6 / sum(r["new_tokens"] for r in ar))
    assert row["weight_gb_per_s"] == pytest.approx(read / 1e9 / sum(r["seconds"] for r in ar))
    assert "weights read: MB/token, GB/s" in bench_run["stdout"]


def speedup_bounds(summary):
    """scripts/speedup_bounds.py's function, loaded by path (scripts/ is not a package; no sys.path edit)."""
    path = Path(__file__).resolve().parent.parent / "scripts" / "speedup_bounds.py"
    spec = importlib.util.spec_from_file_location("speedup_bounds", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.speedup_bounds(summary)


def test_speedup_bounds_script_starts_from_the_bench_speedup_and_bounds_it_from_above(bench_run):
    """scripts/speedup_bounds.py: its measured ratio is the summary's speedup_vs_ar; taking the draft's time out,
    then everything but the target's forwards, can only raise it."""
    bounds = speedup_bounds(bench_run["summary"])
    overall = {(r["method"], r["temperature"]): r["speedup_vs_ar"] for r in bench_run["summary"]
               if r["category"] == "all"}
    assert set(bounds) == set(overall)
    for key, b in bounds.items():
        assert b["measured"] == overall[key], key
        assert b["measured"] <= b["free_draft"] < b["target_only"], key
        if key[0] in ("sd", "mcsd"):  # these call the draft: taking its time out must show
            assert b["free_draft"] > b["measured"], key


def test_speedup_bounds_arithmetic_on_hand_written_rows():
    def row(method, category, speedup, seconds, draft, target):
        return {"method": method, "temperature": 0.0, "category": category, "speedup_vs_ar": speedup,
                "seconds": seconds, "draft_seconds": draft, "verify_seconds": target}

    bounds = speedup_bounds([row("ar", "all", 1.0, 8.0, 0.0, 7.0), row("sd", "all", 1.6, 5.0, 1.5, 2.5),
                             row("sd", "qa", 1.5, 2.0, 0.5, 1.0),  # one category: not an overall row
                             row("mcsd", "all", None, 5.0, 1.0, 4.0)])  # no ar to compare with
    assert set(bounds) == {("ar", 0.0), ("sd", 0.0)}
    assert bounds[("sd", 0.0)] == pytest.approx({"measured": 1.6, "free_draft": 1.6 * 5 / 3.5,
                                                 "target_only": 1.6 * 5 / 2.5})
