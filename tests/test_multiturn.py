"""Conversations: a decoder goes on from its caches (Decoder.continue_with) and produces what a fresh decoder makes
of the whole conversation, reading only the new tokens; the bench decodes and times every turn."""
import json

import pytest

from dynasd.bench import measure
from dynasd.cli import main
from dynasd.decoders import RequestError, make_decoder
from dynasd.options import DecoderOptions
from dynasd.prompts import follow_up_ids, select_prompts

FIRST, SECOND = "Write a short poem about the sea.", "Now make it shorter."
LOSSLESS = [("ar", {}), ("sd", {}), ("mcsd", {}), ("ti-mcsd", {"width": 1}), ("pld", {}), ("recycle", {}),
            ("sd", {"lookup": 4, "recycle": (2, 1)}), ("mcsd", {"draft_kind": "features"}),
            ("ti-mcsd", {"width": 1, "draft_kind": "features"})]


def conversation(pair, answer_ids):
    messages = [{"role": "user", "content": FIRST}, {"role": "assistant", "content": "..."},
                {"role": "user", "content": SECOND}]
    return follow_up_ids(pair.tokenizer, messages, answer_ids, pair.eos_token_ids)


@pytest.mark.parametrize("method, extra", LOSSLESS, ids=[f"{m}{e or ''}" for m, e in LOSSLESS])
def test_the_second_turn_equals_a_fresh_decoder_on_the_whole_conversation(tiny_pair, method, extra):
    """Greedy, for every lossless method; budgets of 5, 13 and 30 tokens make the first turn's last step commit
    past the budget (the caches then hold tokens that are no longer committed, and must forget them)."""
    options = DecoderOptions(method=method, **extra)
    prompt = tiny_pair.encode_prompt(FIRST)
    for budget in (5, 13, 30):
        decoder = make_decoder(tiny_pair, options)
        first = decoder.generate(prompt, budget)
        follow_up = conversation(tiny_pair, first.new_token_ids)
        whole = first.prompt_ids + first.new_token_ids + follow_up
        second = decoder.generate_turn(follow_up, 20, prompt_text=SECOND)
        fresh = make_decoder(tiny_pair, options).generate(whole, 20)
        assert second.prompt_ids == whole and second.config["turn"] == 2
        assert second.new_token_ids == fresh.new_token_ids, (method, extra, budget)


@pytest.mark.parametrize("method", ["ar", "sd", "mcsd", "ti-mcsd", "pld", "recycle"])
def test_going_on_forwards_only_the_new_tokens_through_the_target(tiny_pair, method):
    """The continuation reads the answer's last token and the follow-up at most (one fewer when that token was
    cached), never the first turn again: counted as positions through the target's embedding."""
    decoder = make_decoder(tiny_pair, DecoderOptions(method=method))
    first = decoder.generate(tiny_pair.encode_prompt(FIRST), 12)
    follow_up = conversation(tiny_pair, first.new_token_ids)
    clock = measure.ForwardClock(tiny_pair)
    try:
        decoder.continue_with(follow_up, 8)
        read = clock.positions["target"]
    finally:
        clock.close()
    assert len(follow_up) - 1 <= read <= len(follow_up) < len(first.prompt_ids)


def test_going_on_is_refused_before_the_run_ends_or_with_an_empty_message(tiny_pair):
    decoder = make_decoder(tiny_pair, DecoderOptions(method="sd"))
    decoder.start(tiny_pair.encode_prompt(FIRST), 8)
    decoder.step()
    with pytest.raises(RequestError, match="not finished"):
        decoder.continue_with([10, 11], 8)
    while not decoder.done:
        decoder.step()
    with pytest.raises(RequestError, match="follow-up message is empty"):
        decoder.continue_with([], 8)
    with pytest.raises(RequestError, match="conversation so far"):
        decoder.continue_with([10] * tiny_pair.context_limit, 8)


def test_the_follow_up_is_what_the_chat_template_puts_after_the_answer(tiny_pair):
    """prompt + answer + follow-up tokens read back as the template's own rendering of the whole conversation."""
    answer = tiny_pair.tokenizer("the sea is blue", add_special_tokens=False)["input_ids"]
    messages = [{"role": "user", "content": FIRST}, {"role": "assistant", "content": "the sea is blue"},
                {"role": "user", "content": SECOND}]
    ids = tiny_pair.encode_prompt(FIRST) + answer + follow_up_ids(tiny_pair.tokenizer, messages, answer,
                                                                  tiny_pair.eos_token_ids)
    expected = tiny_pair.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tiny_pair.tokenizer.decode(ids) == expected
    # without the chat template, the next message follows on a new line
    plain = follow_up_ids(tiny_pair.tokenizer, messages, answer, tiny_pair.eos_token_ids, chat=False)
    assert tiny_pair.tokenizer.decode(plain) == "\n" + SECOND + "\n"


def test_prompt_files_give_every_turn_and_json_lists_take_a_category(tmp_path):
    spec = tmp_path / "q.jsonl"
    spec.write_text(json.dumps({"question_id": 1, "category": "writing", "turns": [FIRST, SECOND]}) + "\n")
    trivia = tmp_path / "trivia.json"
    trivia.write_text(json.dumps([{"question": "Who wrote Hamlet?"}, {"question": "What is 2 + 2?"}]))
    chosen = select_prompts([spec, f"triviaqa={trivia}", trivia], None, 1)
    assert [(p["category"], p["id"], p["turns"]) for p in chosen] == [
        ("writing", 1, [FIRST, SECOND]), ("triviaqa", 1, ["Who wrote Hamlet?"]), ("trivia", 1, ["Who wrote Hamlet?"])]
    trivia.write_text(json.dumps({"question": "not a list"}))
    with pytest.raises(ValueError, match="expected a JSON list"):
        select_prompts([trivia], None, 1)


@pytest.fixture(scope="module")
def two_turn_bench(tmp_path_factory):
    folder = tmp_path_factory.mktemp("two-turns")
    prompts = folder / "q.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "writing", "turns": [FIRST, SECOND]}) + "\n"
                       + json.dumps({"question_id": 2, "category": "qa", "turns": ["Who wrote Hamlet?"]}) + "\n")
    out = folder / "out"
    code = main(["bench", "--pair", "tiny-random", "--prompts", str(prompts), "--turns", "2", "--methods",
                 "ar,sd,ti-mcsd:w=1,hf-assisted", "--max-new-tokens", "12", "--warmup-tokens", "2", "--out",
                 str(out), "--no-progress", "--no-report"])
    assert code == 0
    return [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()], \
        json.loads((out / "summary.json").read_text())


def test_a_two_turn_bench_counts_and_times_the_second_turn(two_turn_bench):
    runs, summary = two_turn_bench
    assert sorted((r["prompt_id"], r["turn"]) for r in runs if r["method"] == "ar") == [(1, 1), (1, 2), (2, 1)]
    for run in runs:
        assert run["new_tokens"] > 0 and run["seconds"] > 0 and run["target_forward_seconds"] > 0
    overall = {r["method"]: r for r in summary if r["category"] == "all"}
    for method, row in overall.items():
        mine = [r for r in runs if r["method"] == method]
        assert row["n_prompts"] == 2 and row["n_turns"] == 3
        assert row["new_tokens"] == sum(r["new_tokens"] for r in mine)
        assert row["seconds"] == pytest.approx(sum(r["seconds"] for r in mine))
    for second in (r for r in runs if r["turn"] == 2):
        first = next(r for r in runs if r["method"] == second["method"] and r["turn"] == 1
                     and r["prompt_id"] == second["prompt_id"])
        follow_up = second["prompt_tokens"] - first["prompt_tokens"] - first["new_tokens"]
        assert follow_up > 0
        if second["base_method"] == "hf-assisted":  # transformers reads the whole conversation again
            assert second["target_positions"] >= second["prompt_tokens"]
        else:  # our decoders read the follow-up and then one verify per step: no second prefill of turn 1
            steps = second["target_positions"] - follow_up
            assert second["target_forwards"] <= steps < second["prompt_tokens"]
    # every method here is lossless: each reproduces ar turn by turn at T = 0
    assert all(r["identical_to_ar"] for r in runs)


def test_the_explorer_session_answers_a_follow_up_like_a_fresh_decoder(tiny_pair):
    """The app's follow-up control: a new turn after a finished run, its text what a decoder makes of the whole
    conversation; refused before the run has finished."""
    from dynasd.explorer.inputs import Settings, UserError
    from dynasd.explorer.pairs import PairCache
    from dynasd.explorer.sessions.registry import SessionRegistry

    pairs = PairCache(device="cpu")
    session = SessionRegistry().get(None)
    session.start(pairs, Settings(pair="tiny-random", method="sd", max_new_tokens=10), FIRST)
    with pytest.raises(UserError, match="after a finished run"):
        session.follow_up(pairs, SECOND)
    while not session.done:
        session.step(pairs)
    first = session.run
    session.follow_up(pairs, SECOND)
    while not session.done:
        session.step(pairs)
    pair = pairs.get(session.settings)
    whole = first.prompt_ids + first.new_token_ids + conversation(pair, first.new_token_ids)
    fresh = make_decoder(pair, DecoderOptions(method="sd")).generate(whole, 10)
    assert session.turns == [FIRST, SECOND] and session.run.prompt_ids == whole
    assert session.run.new_token_ids == fresh.new_token_ids


def test_generate_goes_on_with_follow_up_messages(capsys):
    assert main(["generate", "--pair", "tiny-random", "--method", "sd", "--prompt", FIRST, "--follow-up", SECOND,
                 "--max-new-tokens", "8", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["turn"] for r in lines] == [1, 2] and all(r["new_tokens"] > 0 for r in lines)
    assert main(["generate", "--pair", "tiny-random", "--prompt", FIRST, "--follow-up", " "]) == 2
    assert "a follow-up message is empty" in capsys.readouterr().err
