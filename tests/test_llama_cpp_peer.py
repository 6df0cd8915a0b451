"""llama.cpp as a bench peer: refused on a pair without a GGUF target, skipped with one line when its package is
missing, and, when llama-cpp-python is installed, run on the embedded GGUF by the bench's rules (the same token ids,
an empty cache per run, the token budget and end-of-sequence cut, one target forward per token).

Whether its T = 0 text equals our ar's is not asserted: llama.cpp computes in its own quantized arithmetic and our
target in fp32 from the dequantized weights, so identity is measured (the bench's fidelity columns), not built in."""
import io
import json
import sys
from contextlib import redirect_stdout

import pytest

from dynasd.bench import command, llama_cpp_peer
from dynasd.bench import specs as bench_specs
from dynasd.cli import build_parser, main
from dynasd.options import DecoderOptions
from dynasd.prompts import select_prompts

PROMPTS = [
    {"question_id": 1, "category": "writing", "turns": ["Write two sentences about the sea.", "Now make it shorter."]},
    {"question_id": 2, "category": "qa", "turns": ["What is the capital of France?", "And of Italy?"]},
]


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "questions.jsonl"
    path.write_text("\n".join(json.dumps(p) for p in PROMPTS) + "\n")
    return path


def bench_args(prompts_file, out, *extra):
    return ["bench", "--prompts", str(prompts_file), "--max-new-tokens", "4", "--warmup-tokens", "2",
            "--out", str(out), "--no-progress", "--no-report", "--no-quality", *extra]


# -- without llama.cpp ---------------------------------------------------------------------------------------------

def test_a_missing_package_skips_llama_cpp_with_one_line_and_the_other_methods_run(
        prompts_file, tmp_path, tiny_pair, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises ImportError
    monkeypatch.setattr(command, "load_pair_from", lambda args, **kw: tiny_pair)  # the embedded pair's name, fast
    with redirect_stdout(io.StringIO()):
        code = main(bench_args(prompts_file, tmp_path, "--pair", "embedded", "--methods", "ar,pld,llama.cpp"))
    assert code == 0
    mentions = [line for line in capsys.readouterr().err.splitlines() if "llama" in line]
    assert mentions == [llama_cpp_peer.SKIPPED]
    runs = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert {r["method"] for r in runs} == {"ar", "pld"} and len(runs) == 2 * len(PROMPTS)
    assert "llama_cpp" not in json.loads((tmp_path / "meta.json").read_text())


def test_a_package_that_cannot_load_is_skipped_with_its_reason(monkeypatch, capsys):
    monkeypatch.setattr(llama_cpp_peer, "llama_cpp_import_problem", lambda: "cannot load: libllama.so: no such file")
    specs = bench_specs.parse_methods("ar,llama.cpp,sd")
    assert [s.label for s in llama_cpp_peer.without_unavailable_llama_cpp(specs)] == ["ar", "sd"]
    assert capsys.readouterr().err == "llama.cpp: skipped (llama-cpp-python cannot load: libllama.so: no such file)\n"


def test_nothing_is_checked_or_printed_when_llama_cpp_is_not_asked_for(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    specs = bench_specs.parse_methods("ar,sd")
    assert llama_cpp_peer.without_unavailable_llama_cpp(specs) == specs and capsys.readouterr().err == ""


@pytest.mark.parametrize("pair_args, named", [
    (["--pair", "tiny-random"], "pair 'tiny-random' has none"),
    (["--pair", "smollm2-360m+135m"], "pair 'smollm2-360m+135m' has none"),
    (["--target", "models/target", "--draft", "models/draft"], "--target models/target is not one"),
])
def test_a_pair_without_a_gguf_target_is_refused_in_one_line_before_models_load(
        prompts_file, tmp_path, pair_args, named, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # refused, not skipped: the request itself is wrong
    monkeypatch.setattr(command, "load_pair_from", lambda *a, **k: pytest.fail("a model was loaded"))
    code = main(bench_args(prompts_file, tmp_path, *pair_args, "--methods", "ar,llama.cpp"))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: llama.cpp runs the target's GGUF file, and {named} (use --pair embedded")


@pytest.mark.parametrize("pair_args, on_gguf", [([], True), (["--pair", "embedded"], True),
                                                (["--target", "x.gguf", "--draft", "d"], True),
                                                (["--pair", "tiny-random"], False),
                                                (["--pair", "embedded", "--target", "m", "--draft", "d"], False)])
def test_the_gguf_target_is_read_from_the_arguments_as_load_pair_reads_them(pair_args, on_gguf):
    """--target wins over --pair, as in models.load_pair."""
    args = build_parser().parse_args(["bench", "--prompts", "x", *pair_args])
    assert llama_cpp_peer.runs_on_gguf(args) is on_gguf


@pytest.mark.parametrize("text, message", [("llama.cpp:kernels=plain", "llama.cpp takes no option 'kernels'"),
                                           ("llama.cpp:n=4", "llama.cpp takes no option 'n'"),
                                           ("llama.cpp,llama.cpp", "listed twice")])
def test_llama_cpp_takes_no_options(text, message):
    with pytest.raises(ValueError, match=message):
        bench_specs.parse_methods(text)


# -- with llama.cpp (slow: the embedded GGUF) ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def peer(request):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the peers extra)")
    import torch

    from dynasd.loading.models import embedded_gguf_path

    pair = request.getfixturevalue("embedded_pair")  # loaded only when llama.cpp can run
    loaded = llama_cpp_peer.LlamaCppPeer(embedded_gguf_path(), pair, torch.get_num_threads())
    yield loaded
    loaded.close()


GREEDY = DecoderOptions(method="ar")


@pytest.mark.slow
def test_outputs_are_token_ids_of_the_pair_within_the_budget(peer, embedded_pair):
    ids = embedded_pair.encode_prompt("Name three colours.")
    for budget in (1, 5, 24):
        measured = peer.run(GREEDY, ids, budget)
        assert 1 <= len(measured.token_ids) <= budget
        assert all(0 <= t < embedded_pair.vocab_size for t in measured.token_ids)
        assert measured.text == embedded_pair.decode(measured.token_ids)
        assert measured.target_forwards == len(measured.token_ids)  # one decode per token: 1.0 per forward, as ar
        assert measured.finished == ("eos" if measured.token_ids[-1] in embedded_pair.eos_token_ids else "length")
        assert measured.context_ids == ids and measured.seconds > 0


@pytest.mark.slow
def test_generation_stops_at_the_first_end_of_sequence_token(peer, embedded_pair, monkeypatch):
    """Declare the second token of a greedy answer an end-of-sequence id: the run ends there, cut after it."""
    ids = embedded_pair.encode_prompt("Name three colours.")
    free = peer.run(GREEDY, ids, 8).token_ids
    monkeypatch.setattr(peer, "eos_ids", frozenset({free[1]}))
    stopped = peer.run(GREEDY, ids, 8)
    assert stopped.token_ids == free[: free.index(free[1]) + 1] and stopped.finished == "eos"


@pytest.mark.slow
def test_every_run_prefills_its_whole_prompt_from_an_empty_cache(peer, embedded_pair, monkeypatch):
    """Two prompts share the chat template's header: llama.cpp must not reuse it (nor the first run's tokens), so
    each run's first evaluation is its whole prompt, and a prompt decoded again gives the same greedy text."""
    evaluated = []
    real_eval = peer.llm.eval
    monkeypatch.setattr(peer.llm, "eval", lambda tokens: (evaluated.append(list(tokens)), real_eval(tokens))[1])
    first, second = (embedded_pair.encode_prompt(text) for text in ("Name three colours.", "Name three fruits."))
    before = peer.run(GREEDY, first, 6)
    prefills = [len(evaluated)]
    peer.run(GREEDY, second, 6)
    prefills.append(len(evaluated))
    again = peer.run(GREEDY, first, 6)
    assert [evaluated[0], evaluated[prefills[0]], evaluated[prefills[1]]] == [first, second, first]
    assert all(len(call) == 1 for i, call in enumerate(evaluated) if i not in (0, *prefills))
    assert again.token_ids == before.token_ids


@pytest.mark.slow
def test_sampling_applies_temperature_then_top_k_with_the_runs_seed(peer, embedded_pair):
    """Top-k 1 after any temperature leaves the argmax alone: the greedy text. The same seed draws the same text."""
    ids = embedded_pair.encode_prompt("Write a line about rain.")
    greedy = peer.run(GREEDY, ids, 12).token_ids
    assert peer.run(DecoderOptions(method="ar", temperature=1.5, top_k=1, seed=3), ids, 12).token_ids == greedy
    sampled = DecoderOptions(method="ar", temperature=1.0, top_p=0.9, seed=7)
    assert peer.run(sampled, ids, 12).token_ids == peer.run(sampled, ids, 12).token_ids


@pytest.mark.slow
def test_the_bench_runs_llama_cpp_beside_ar_over_two_turns(peer, embedded_pair, prompts_file, tmp_path):
    """Through command.benchmark: one record per prompt, turn and method, each turn's conversation re-read whole,
    fidelity against ar filled in. The share of outputs identical to ar is measured and printed, not asserted."""
    args = build_parser().parse_args(bench_args(prompts_file, tmp_path, "--max-new-tokens", "16", "--turns", "2"))
    records = command.benchmark(args, {"fast": embedded_pair}, select_prompts(prompts_file, None, None),
                                bench_specs.parse_methods("ar,llama.cpp"), [0.0], tmp_path, progress=False)
    llama = [r for r in records if r["method"] == "llama.cpp"]
    assert sorted((r["prompt_id"], r["turn"]) for r in llama) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    for record in llama:
        assert 0 < record["new_tokens"] <= 16 and record["tokens_per_target_forward"] == 1.0
        assert isinstance(record["identical_to_ar"], bool) and record["attempted_draft_levels"] is None
    for first, second in zip(llama[::2], llama[1::2]):  # the second turn re-reads the first and its own answer
        assert second["prompt_tokens"] > first["prompt_tokens"] + first["new_tokens"]
    identical = sum(r["identical_to_ar"] for r in llama)
    print(f"llama.cpp identical to ar at T=0: {identical} of {len(llama)} outputs")
