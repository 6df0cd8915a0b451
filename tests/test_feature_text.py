"""The feature draft's training text: written once, kept as compact token ids, labelled again through the engine's
kernels, and a selection set of benchmark answers by category that is never trained on."""
import json

import numpy as np
import pytest
import torch

from dynasd.cache import CachedModel
from dynasd.cli import main
from dynasd.loading.models import load_pair
from dynasd.training.feature_data import load_features, target_features
from dynasd.training.sequences import Sequence
from dynasd.training.token_store import load_token_shards, save_token_shard, token_shards


def test_token_shards_keep_ids_and_answer_starts_exactly(tmp_path):
    seqs = [Sequence([1, 2, 3, 65535], 2), Sequence([7], 0), Sequence(list(range(300)), 120)]
    save_token_shard(tmp_path / "train-0000.npz", seqs)
    back = load_token_shards(token_shards(tmp_path))
    assert [(s.ids, s.answer_start) for s in back] == [(s.ids, s.answer_start) for s in seqs]
    with np.load(tmp_path / "train-0000.npz") as shard:
        assert shard["ids"].dtype == np.uint16
    with pytest.raises(ValueError, match="16 bits"):
        save_token_shard(tmp_path / "big.npz", [Sequence([70000], 0)])
    assert not (tmp_path / "big.npz").exists()


def test_features_are_the_states_and_choices_a_verify_gives():
    """One teacher-forced forward per sequence: its states are what the target's runtime returns at each position,
    and its labels the argmax of the logits at the positions before each answer token."""
    pair = load_pair("tiny-random", device="cpu")
    ids = pair.encode_prompt("hello there") + [5, 9, 11, 3]
    seq = Sequence(ids, len(ids) - 4)
    (feature,) = target_features(pair.target, [seq], topk=3)
    model = CachedModel(pair.target, need_hidden=True)
    logits, states = model.forward(ids, [], None, [], keep_logits=len(ids), keep_hidden=len(ids))
    assert torch.equal(feature.states, states.to(torch.float16))
    assert feature.labels.tolist() == logits[seq.answer_start - 1:-1].argmax(-1).tolist()
    assert feature.topk_ids[:, 0].tolist() == feature.labels.tolist()


def test_text_then_features_then_training_selects_on_the_benchmark_answers(tmp_path):
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([{"question": f"what is {i} plus {i + 1}?"} for i in range(40)]))
    bench = tmp_path / "bench.jsonl"
    bench.write_text("\n".join(json.dumps({"question_id": i, "category": c, "turns": [f"{c} task {i}"]})
                               for i, c in enumerate(["writing", "coding", "writing"])))
    text, out = tmp_path / "text", tmp_path / "work"
    common = ["train-feature-draft", "--pair", "tiny-random", "--text", str(text), "--out", str(out),
              "--threads", "1"]
    args = ["--stage", "text", "--prompts", str(prompts), "--heldout", "4", "--text-shards", "6",
            "--shard-prompts", "6", "--text-max-new-tokens", "32", "--text-batch", "4"]
    assert main(common + args) == 0
    names = [p.name for p in token_shards(text)]
    assert names == ["heldout.npz"] + [f"train-000{i}.npz" for i in range(6)]
    kinds = [r["kind"] for r in map(json.loads, (out / "log.jsonl").read_text().splitlines())]
    assert kinds == ["heldout", "prompt files", "self-instruct"] + ["prompt files"] * 3 + ["passage tasks"]
    before = {p.name: p.read_bytes() for p in token_shards(text)}
    assert main(common + args) == 0  # a second run finds every shard written and writes none again
    assert {p.name: p.read_bytes() for p in token_shards(text)} == before

    assert main(common + ["--stage", "features", "--select-prompts", str(bench), "--select-limit", "2"]) == 0
    features = sorted(p.name for p in (out / "features").iterdir())
    assert features == ["heldout.pt", "select-coding.pt", "select-writing.pt"] + [f"train-000{i}.pt" for i in range(6)]
    assert len(load_features([out / "features" / "select-writing.pt"])) == 2
    assert main(common + ["--stage", "train", "--layers", "1", "--steps", "4", "--eval-every", "2",
                          "--log-every", "2"]) == 0
    scores = [r for r in map(json.loads, (out / "log.jsonl").read_text().splitlines()) if "select_depth1" in r]
    assert [r["step"] for r in scores] == [0, 2, 4]
    assert set(scores[-1]["select_by_category"]) == {"writing", "coding"}
    best = json.loads((out / "best" / "metrics.json").read_text())
    assert (best["select_depth1"] + best["select_depth2"]) / 2 == pytest.approx(max(
        (r["select_depth1"] + r["select_depth2"]) / 2 for r in scores), abs=1e-4)


def test_the_head_takes_the_most_frequent_labels_then_a_larger_heads_tokens_in_id_order(tmp_path):
    from argparse import Namespace

    from dynasd.training.feature_data import FeatureSequence
    from dynasd.training.feature_training import read_vocab

    labels = torch.tensor([7, 7, 7, 30, 30, 5])
    seq = FeatureSequence([1] * 7, 1, torch.zeros(7, 2), labels, labels[:, None], torch.zeros(6, 1))
    fill = tmp_path / "head_tokens.json"
    fill.write_text(json.dumps({"token_ids": [40, 3, 30, 9, 2]}))
    args = Namespace(head_tokens=None, vocab_fill=str(fill), vocab_top=2, vocab_max=5)
    # 7 and 30 (the two most frequent), then 2 and 3 from the file in id order; 0 is end-of-sequence
    assert read_vocab(args, [seq], {0}, 64) == [0, 2, 3, 7, 30]
    assert read_vocab(Namespace(**{**vars(args), "vocab_fill": None, "vocab_max": 3}), [seq], {0}, 64) == [0, 7, 30]
