"""The quality score: the target's teacher-forced log-likelihood of an output given its prompt. It must line up
token for token with what the target computed while decoding, rank the target's own greedy choice above any
other token, be the same for every lossless method at T = 0, and a judge model must score the same way."""
import json
import math

import pytest
import torch

from dynasd.bench.quality import Judge, load_judge, perplexity, sequence_log_likelihood
from dynasd.cli import main
from dynasd.decoders import make_decoder
from dynasd.options import DecoderOptions

PROMPT = "Write a short poem about the sea."


@pytest.fixture(scope="module")
def greedy(tiny_pair):
    ids = tiny_pair.encode_prompt(PROMPT)
    run = make_decoder(tiny_pair, DecoderOptions(method="ar")).generate(ids, 24)
    return ids, run


def test_the_score_of_ar_text_is_the_sum_of_the_probabilities_ar_decoded_with(tiny_pair, greedy):
    """At T = 0 each ar step records the target's plain probability of the token it chose: the teacher-forced
    score must be their log-sum (an off-by-one in the alignment would break it)."""
    ids, run = greedy
    decoded = sum(math.log(s.final_p) for s in run.steps)
    assert sequence_log_likelihood(tiny_pair.target, ids, run.new_token_ids) == pytest.approx(decoded, abs=1e-3)


def test_greedy_text_scores_highest_among_perturbed_texts(tiny_pair, greedy):
    """Replace the token at position i by each of the target's next five choices there: every perturbed text
    (cut after i) scores lower than the greedy text cut at the same place."""
    ids, run = greedy
    answer = run.new_token_ids
    with torch.inference_mode():
        logits = tiny_pair.target(input_ids=torch.tensor([ids + answer])).logits[0]
    for i in (0, 5, 11, len(answer) - 1):
        best = sequence_log_likelihood(tiny_pair.target, ids, answer[:i + 1])
        ranked = torch.argsort(logits[len(ids) + i - 1], descending=True).tolist()
        others = [t for t in ranked[:6] if t != answer[i]][:5]
        for other in others:
            assert sequence_log_likelihood(tiny_pair.target, ids, answer[:i] + [other]) < best, (i, other)


def test_every_lossless_method_gets_ar_score_at_temperature_zero(tmp_path):
    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "writing", "turns": [PROMPT, "Shorter."]}) + "\n")
    out = tmp_path / "out"
    assert main(["bench", "--pair", "tiny-random", "--prompts", str(prompts), "--turns", "2", "--methods",
                 "ar,sd,mcsd,pld,recycle,ti-mcsd:w=1,ti-mcsd:w=4", "--max-new-tokens", "16", "--warmup-tokens", "2",
                 "--out", str(out), "--no-progress", "--no-report"]) == 0
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    for turn in (1, 2):
        ar = next(r for r in runs if r["method"] == "ar" and r["turn"] == turn)
        assert ar["perplexity"] == pytest.approx(math.exp(-ar["mean_log_likelihood"]))
        for run in runs:
            if run["turn"] == turn and run["lossless"]:
                assert run["mean_log_likelihood"] == pytest.approx(ar["mean_log_likelihood"], abs=1e-6), run["method"]
    rows = {r["method"]: r for r in json.loads((out / "summary.json").read_text()) if r["category"] == "all"}
    assert rows["sd"]["log_likelihood_vs_ar"] == pytest.approx(0.0, abs=1e-6)
    # the lossy fork commits tokens the target ranks lower: its greedy text scores below ar's
    assert rows["ti-mcsd:w=4"]["lossless"] is False
    if not rows["ti-mcsd:w=4"]["identical_to_ar"]:
        assert rows["ti-mcsd:w=4"]["log_likelihood_vs_ar"] < 0


def test_a_judge_scores_the_same_texts_through_its_own_tokenizer(tmp_path, greedy, tiny_pair):
    """The tiny target saved to a folder and loaded as a judge: re-tokenising the text gives its ids back, so the
    judge's score is the target's own."""
    from dynasd.loading.models import load_pair

    plain = load_pair("tiny-random", fast_kernels=False)
    plain.target.save_pretrained(tmp_path / "judge")
    plain.tokenizer.save_pretrained(tmp_path / "judge")
    judge = load_judge(str(tmp_path / "judge"), tiny_pair.device)
    ids, run = greedy
    own = Judge("target", tiny_pair.target).log_likelihood(ids, run.new_token_ids)
    assert judge.log_likelihood(ids, run.new_token_ids, tiny_pair) == pytest.approx(own, abs=1e-3)
    assert perplexity(own, len(run.new_token_ids)) > 1.0 and perplexity(None, 3) is None


def test_a_missing_judge_is_one_clear_line(tmp_path, capsys):
    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["Hi"]}) + "\n")
    code = main(["bench", "--pair", "tiny-random", "--prompts", str(prompts), "--judge", str(tmp_path / "none"),
                 "--out", str(tmp_path / "out"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: no model at local path") and "\n" not in err
