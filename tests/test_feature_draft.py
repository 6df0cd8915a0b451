"""The feature draft (dynasd/loading/feature_model.py): it reads the target's states of the committed text, the
decoder stays lossless with it, and its training command learns and exports a draft the engine loads."""
import json

import pytest
import torch
from test_greedy_identity import PROMPTS, target_greedy
from test_losslessness import VOCAB, assert_matches, exact_first_two, on_context_table, sampled_first_two

from dynasd.cache import CachedModel, Runtime, stock_forward
from dynasd.decoders import make_decoder
from dynasd.kernels.lean_forward import lean_forward
from dynasd.loading.feature_model import is_feature_draft
from dynasd.loading.models import ModelPair, load_distilled_draft, tiny_feature_draft
from dynasd.options import DecoderOptions
from dynasd.sampling import SamplingConfig
from dynasd.sources import FeatureDraftTree, TargetFeatures

CONFIGS = [
    ("sd", dict(gamma=4)),
    ("mcsd", dict(k_config=(4, 2, 2, 1))),
    ("mcsd", dict(k_config=(2, 1, 1, 1), stop="confidence", threshold=0.5)),
    ("mcsd", dict(k_config=(2, 2, 1), lookup=4, lookup_ngram=1)),
    ("ti-mcsd", dict(width=1, depth=3)),
    ("ti-mcsd", dict(ti_k_config=(1, 3, 2))),
]


def test_target_features_pair_each_token_with_the_state_one_position_earlier():
    features = TargetFeatures(2, torch.float32, torch.device("cpu"))
    features.append(0, torch.tensor([[0.0, 0.5], [1.0, 1.5], [2.0, 2.5]]))
    first_two = features.inputs_for(0, 2)
    assert first_two.tolist() == [[0.0, 0.0], [0.0, 0.5]]  # position 0 has no predecessor
    assert features.inputs_for(2, 2).tolist() == [[1.0, 1.5], [2.0, 2.5]]
    with pytest.raises(ValueError):
        features.inputs_for(3, 2)  # the state of position 3 is not known yet
    with pytest.raises(ValueError):
        features.append(4, torch.zeros(1, 2))  # a gap
    features.drop_before(2)
    assert features.inputs_for(3, 1).tolist() == [[2.0, 2.5]]
    with pytest.raises(ValueError):
        features.inputs_for(2, 1)  # dropped


@pytest.mark.parametrize("method,options", CONFIGS, ids=[f"{m}-{o}" for m, o in CONFIGS])
def test_greedy_identity_with_the_feature_draft(tiny_pair, method, options):
    for prompt in PROMPTS[:4]:
        ids = tiny_pair.encode_prompt(prompt)
        run = make_decoder(tiny_pair, DecoderOptions(method=method, draft_kind="features", **options)).generate(ids, 40)
        assert run.new_token_ids == target_greedy(tiny_pair, ids, 40)[:len(run.new_token_ids)], prompt
        assert len(run.new_token_ids) == 40 or run.finished == "eos"
        assert run.config["options"]["draft_kind"] == "features"


def test_the_draft_cache_holds_the_committed_text_read_with_the_targets_states(tiny_pair):
    """After every step, the feature draft's keys/values equal those of reading the committed tokens in one go,
    each with the target's state at the position before (a full forward's states): tree nodes the draft read
    with its own states are never kept."""
    decoder = make_decoder(tiny_pair, DecoderOptions(method="mcsd", k_config=(2, 2, 1), draft_kind="features"))
    decoder.start(tiny_pair.encode_prompt("Explain trees to me"), 40)
    [draft_tree] = decoder.sources
    assert isinstance(draft_tree, FeatureDraftTree)
    accepted = 0
    while not decoder.done:
        accepted += len(decoder.step().accepted_path)
        cached = draft_tree.cache.cached_len
        ids = torch.tensor([decoder.committed[:cached]])
        with torch.inference_mode():
            states = tiny_pair.target.model(input_ids=ids).last_hidden_state[0]
        fresh = CachedModel(tiny_pair.feature_draft, need_hidden=True)
        inputs = torch.cat([torch.zeros(1, states.shape[1]), states[:-1]])
        fresh.forward(decoder.committed[:cached], [], None, [], keep_logits=1, features=inputs)
        # Where MKL is tuned (Intel), the draft's float16 panels serve 1-24 rows and its float32 weights more
        # (fast_linear.PretransposedLinear): a one-go read of over 24 tokens rounds its weights otherwise (~3e-4),
        # while a position read with the wrong state is off by whole units.
        for layer, reference in zip(draft_tree.cache.cache.layers, fresh.cache.layers):
            assert torch.allclose(layer.keys[:, :, :cached], reference.keys, atol=2e-3)
            assert torch.allclose(layer.values[:, :, :cached], reference.values, atol=2e-3)
    assert accepted > 0  # steps that accepted draft nodes were checked too


def test_the_lean_forward_reads_features_as_transformers_forward_does(tiny_pair):
    draft = tiny_pair.feature_draft
    tokens = tiny_pair.encode_prompt("zz top")
    features = torch.randn(len(tokens), draft.config.hidden_size, generator=torch.Generator().manual_seed(0))
    results = []
    for forward in (lean_forward, stock_forward):
        model = CachedModel(draft, need_hidden=True, runtime=Runtime(forward=forward))
        results.append(model.forward(tokens, [], None, [], keep_logits=2, features=features, keep_hidden=3))
    (lean_logits, lean_hidden), (stock_logits, stock_hidden) = results
    assert lean_hidden.shape[0] == 3 and torch.equal(lean_logits, stock_logits)
    assert torch.equal(lean_hidden, stock_hidden)
    with pytest.raises(ValueError, match="feature row"):
        CachedModel(draft).forward(tokens, [], None, [], keep_logits=1)  # a feature draft without features


def test_a_step_uses_the_feature_draft_not_the_token_draft(tiny_pair):
    """The feature path is really taken: the token draft is never called, the feature draft is."""
    calls = {"token": 0, "feature": 0}
    # the token draft's own output layer (its embedding is the target's module, shared: dynasd/loading/models.py; its
    # decoder layers run through the lean forward, which calls their linear layers but not the layers themselves)
    hooks = [tiny_pair.draft.lm_head.register_forward_hook(lambda *a: calls.__setitem__(
                 "token", calls["token"] + 1)),
             tiny_pair.feature_draft.model.feature_fc.register_forward_hook(lambda *a: calls.__setitem__(
                 "feature", calls["feature"] + 1))]
    try:
        decoder = make_decoder(tiny_pair, DecoderOptions(method="sd", draft_kind="features"))
        decoder.generate(tiny_pair.encode_prompt("a"), 8)
    finally:
        for hook in hooks:
            hook.remove()
    assert calls["token"] == 0 and calls["feature"] > 0


def test_a_pair_without_a_feature_draft_is_refused_clearly(tiny_pair):
    pair = ModelPair(**{**vars(tiny_pair), "feature_draft": None})
    with pytest.raises(ValueError, match="no feature draft"):
        make_decoder(pair, DecoderOptions(method="sd", draft_kind="features"))


@pytest.fixture(scope="module")
def small_feature_pair():
    from dynasd.loading.models import tiny_llama, tiny_tokenizer

    target = tiny_llama(VOCAB, seed=44, layers=1)
    return on_context_table(ModelPair(
        name="tiny-v4-features", target=target, draft=tiny_llama(VOCAB, seed=45, layers=1),
        tokenizer=tiny_tokenizer(), draft_label="unrelated tiny draft", device=torch.device("cpu"),
        dtype=torch.float32, eos_token_ids=frozenset(), feature_draft=tiny_feature_draft(target, 46)))


@pytest.mark.slow(seconds=14)
@pytest.mark.parametrize("method,options", [("sd", dict(gamma=2)), ("mcsd", dict(k_config=(3, 2)))])
def test_sampling_with_the_feature_draft_follows_the_target_distribution(small_feature_pair, method, options):
    """The feature draft's first two committed tokens follow the target's distribution (chi-square, the same
    10,000 runs as every losslessness case, on the same ContextTable: the feature draft's contexts are those of
    its input rows, the target's states mixed in)."""
    cfg = SamplingConfig(temperature=1.0)
    counts = sampled_first_two(small_feature_pair, cfg, method, dict(options, draft_kind="features"))
    assert_matches(counts, exact_first_two(small_feature_pair, cfg))


def test_train_feature_draft_learns_and_exports_a_loadable_draft(tmp_path):
    from dynasd.cli import main
    from dynasd.loading.models import load_pair

    data = tmp_path / "gen"
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([{"question": f"what is {i} plus {i + 1}?"} for i in range(28)]))
    assert main(["train-draft", "--pair", "tiny-random", "--stage", "generate", "--prompts", str(prompts),
                 "--out", str(data), "--heldout", "4", "--gen-prompts", "24", "--gen-max-new-tokens", "24",
                 "--shard-prompts", "8", "--threads", "1"]) == 0
    out, export = tmp_path / "feature", tmp_path / "export"
    assert main(["train-feature-draft", "--pair", "tiny-random", "--data", str(data), "--out", str(out),
                 "--layers", "1", "--steps", "60", "--eval-every", "20", "--log-every", "20", "--lr", "3e-3",
                 "--export", str(export), "--threads", "1"]) == 0
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert losses[-1] < 0.8 * losses[0], losses
    scores = [r for r in records if "heldout_agreement_depth1" in r]
    assert max(r["heldout_agreement_depth1"] for r in scores) > scores[0]["heldout_agreement_depth1"]
    assert sorted(p.name for p in (out / "features").iterdir()) == ["heldout.pt", "train-0000.pt",
                                                                  "train-0001.pt", "train-0002.pt"]

    target = load_pair("tiny-random", device="cpu", fast_kernels=False).target
    draft = load_distilled_draft(target, export)
    assert is_feature_draft(draft)
    pair = ModelPair(**{**vars(load_pair("tiny-random", device="cpu")), "feature_draft": draft})
    ids = pair.encode_prompt("hello there")
    run = make_decoder(pair, DecoderOptions(method="mcsd", draft_kind="features")).generate(ids, 24)
    assert run.new_token_ids == target_greedy(pair, ids, 24)[:len(run.new_token_ids)]


def test_the_app_offers_the_feature_draft_only_for_pairs_that_have_one():
    from dynasd.loading.models import has_feature_draft
    from ui.play import on_pair_change

    assert has_feature_draft("tiny-random") and not has_feature_draft("smollm2-360m+135m")
    *_, checkbox = on_pair_change("tiny-random")
    assert checkbox.visible is True
    *_, checkbox = on_pair_change("smollm2-360m+135m")
    assert checkbox.visible is False


@pytest.mark.slow
def test_the_embedded_pair_ships_its_feature_draft_as_the_default_and_keeps_the_token_draft(embedded_pair):
    """The embedded pair's feature draft measured faster than its token draft (assets/draft-smollm2-features/
    MODEL_CARD.md): it is what draft_kind "default" runs, one layer over the target's states with its reduced head;
    the token draft stays selectable."""
    from dynasd.explorer.engine import build_decoder
    from dynasd.explorer.inputs import Settings
    from dynasd.loading.models import has_feature_draft

    assert has_feature_draft("embedded") and embedded_pair.default_draft() is embedded_pair.feature_draft
    assert embedded_pair.feature_draft.config.num_hidden_layers == 1
    for kind, model in (("default", embedded_pair.feature_draft), ("features", embedded_pair.feature_draft),
                        ("tokens", embedded_pair.draft)):
        assert build_decoder(embedded_pair, Settings(method="sd", draft_kind=kind)).draft_model is model, kind


def test_a_feature_draft_started_from_a_token_draft_predicts_exactly_as_it_does(tmp_path):
    """--init-from: the mixer's state half starts at zero, so whatever states it reads, the new draft's logits are
    the token draft's (training starts from its agreement, not below it)."""
    from dynasd.loading.models import load_pair
    from dynasd.training.distill import draft_from_target, export_draft
    from dynasd.training.feature_distill import build_feature_draft

    target = load_pair("tiny-random", device="cpu", fast_kernels=False).target
    token_draft = draft_from_target(target, [1]).eval()
    export_draft(token_draft, tmp_path, dtype=torch.float32)
    draft = build_feature_draft(target, [], init_from=str(tmp_path)).eval()
    assert is_feature_draft(draft) and draft.config.dynasd_source_layers == [1]
    ids = torch.tensor([[5, 9, 3, 7, 11]])
    states = 10 * torch.randn(1, 5, target.config.hidden_size)
    from dynasd.loading.feature_model import draft_inputs

    with torch.no_grad():
        expected = token_draft(input_ids=ids).logits
        got = draft(inputs_embeds=draft_inputs(draft, ids, states)).logits
    assert torch.allclose(got, expected, atol=1e-5)


def test_auto_state_scale_starts_the_mixer_with_inputs_of_equal_length():
    """From scratch, 'auto' weighs the states by embedding length / state length, so that neither input swamps the
    other at the start (the target's states can be many times longer than its token embeddings)."""
    from argparse import Namespace

    from dynasd.loading.models import load_pair
    from dynasd.training.feature_distill import FeatureSequence, build_feature_draft, initial_state_scale

    target = load_pair("tiny-random", device="cpu", fast_kernels=False).target
    width = target.config.hidden_size
    states = 50 * torch.randn(6, width)
    seq = FeatureSequence([1, 2, 3, 4, 5, 6], 3, states.half(), torch.zeros(3, dtype=torch.long),
                          torch.zeros(3, 1, dtype=torch.int32), torch.zeros(3, 1))
    scale = initial_state_scale(Namespace(state_scale="auto"), target, [seq])
    embedding_length = target.model.embed_tokens.weight.detach().norm(dim=-1).mean()
    assert scale == pytest.approx(float(embedding_length / states.half().float().norm(dim=-1).mean()), rel=1e-4)
    assert initial_state_scale(Namespace(state_scale="0.5"), target, [seq]) == 0.5
    mixer = build_feature_draft(target, [1], state_scale=scale).model.feature_fc.weight
    assert torch.allclose(mixer[:, width:], scale * torch.eye(width))
    assert torch.equal(mixer[:, :width], torch.eye(width))


def test_the_default_draft_is_the_pairs_own_and_the_trace_records_the_options_as_given(tiny_pair):
    from dataclasses import replace

    from dynasd.options import options_of_run

    ids = tiny_pair.encode_prompt("hello there")
    for kind in ("tokens", "features"):
        pair = replace(tiny_pair, default_draft_kind=kind)
        decoder = make_decoder(pair, DecoderOptions(method="sd", gamma=2))
        run = decoder.generate(ids, 6)
        assert (decoder.draft_model is pair.feature_draft) == (kind == "features")
        assert run.draft_label == (pair.feature_draft_label if kind == "features" else pair.draft_label)
        assert options_of_run(run.method, run.config).draft_kind == "default", "the settings it was made with"


def test_a_trace_recorded_when_the_token_draft_was_the_default_still_loads():
    from dynasd.options import DecoderOptions as Options

    record = {**Options(method="pld").to_record(), "draft_kind": "tokens"}
    assert Options.from_record(record).draft_kind == "default"
    assert Options.from_record({**Options(method="sd").to_record(), "draft_kind": "tokens"}).draft_kind == "tokens"


def test_a_warm_start_loads_an_exported_draft_or_a_checkpoint_and_refuses_other_layers(tmp_path):
    """`--warm-start` continues from a trained draft on new text: every tensor of the export (fp16) or checkpoint
    lands in the new draft; a draft of other layers is refused, not half loaded."""
    from dynasd.loading.models import load_pair
    from dynasd.training.distill import export_draft
    from dynasd.training.export import trainable_state
    from dynasd.training.feature_distill import build_feature_draft
    from dynasd.training.feature_training import load_warm_start

    target = load_pair("tiny-random", device="cpu", fast_kernels=False).target
    trained = build_feature_draft(target, [1])
    with torch.no_grad():
        for tensor in trained.parameters():
            tensor.add_(0.25)
    export_draft(trained, tmp_path / "export")
    torch.save({"draft": trainable_state(trained)}, tmp_path / "checkpoint.pt")
    for source, dtype in ((tmp_path / "export", torch.float16), (tmp_path / "checkpoint.pt", torch.float32)):
        fresh = build_feature_draft(target, [1])
        load_warm_start(fresh, source)
        got, want = trainable_state(fresh), trainable_state(trained)
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k].to(dtype).float()) for k in want)
    with pytest.raises(ValueError, match="same --layers"):
        load_warm_start(build_feature_draft(target, [0, 1]), tmp_path / "export")
