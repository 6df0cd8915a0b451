"""Many browser sessions at once: each sees exactly what it would see alone, the registry stays bounded, and
memory stays flat while sessions come and go."""
import gc
import threading

import pytest

from dynasd.explorer.engine import build_decoder
from dynasd.explorer.inputs import Settings, UserError
from dynasd.explorer.pairs import PairCache
from dynasd.explorer.sessions.memory import process_rss_mb
from dynasd.explorer.sessions.registry import SessionRegistry
from dynasd.explorer.sessions.session import Mode
from viz.text import shown_piece

OUT = dict(text=0, status=7, scrubber=9)

# One configuration per client: different prompts, methods and shapes, so cache mixing would show in the text.
CLIENTS = [
    ("the first prompt", dict(method="mcsd", k_config="4,2,2,1")),
    ("a second one", dict(method="sd", gamma=3)),
    ("third: counting 1, 2, 3", dict(method="ar")),
    ("Fourth Prompt?", dict(method="ti-mcsd", width=1, depth=3)),
    ("fifth", dict(method="mcsd", k_config="2,2,2", dynamic_depth=True, stop="confidence", threshold=0.5)),
    ("sixth and last but two", dict(method="sd", gamma=5)),
    ("seventh (same as first)", dict(method="mcsd", k_config="4,2,2,1")),
    ("eighth, with a tree", dict(method="mcsd", k_config="3,1,2")),
    ("ninth", dict(method="ti-mcsd", width=3, depth=2)),  # lossy, but deterministic all the same
    ("tenth", dict(method="mcsd", k_config="1,1,1,1,1", stop="cumulative", threshold=0.3)),
]
MAX_NEW = 32


def alone(tiny_pair, prompt: str, options: dict) -> tuple[str, int]:
    """Text (as the text panel shows its pieces) and step count of this configuration run by itself, in-process,
    no server."""
    settings = Settings(pair="tiny-random", max_new_tokens=MAX_NEW, **options).normalised()
    decoder = build_decoder(tiny_pair, settings)
    run = decoder.generate(tiny_pair.encode_prompt(prompt), MAX_NEW)
    return "".join(shown_piece(t) for t in tiny_pair.token_strings(run.new_token_ids)), len(run.steps)


def spans_text(outputs) -> str:
    value = outputs[OUT["text"]]
    if isinstance(value, dict) and value.get("__type__") == "update":
        value = value.get("value")
    return "".join(span["token"] for span in value or [])


@pytest.fixture(scope="module")
def server(explorer_inprocess):
    return explorer_inprocess


def drive(url, index, prompt, options, start, results):
    """Step a few times (by client index), then Run to the end: every client interleaves with the others."""
    from gradio_client import Client

    try:
        client = Client(url, verbose=False)
        kwargs = dict(prompt=prompt, pair="tiny-random", max_new_tokens=MAX_NEW, **options)
        start.wait()
        for _ in range(index % 4):
            out = client.predict(**kwargs, api_name="/step")
            assert out[OUT["status"]].startswith("✓"), out[OUT["status"]]
        out = client.predict(**kwargs, api_name="/run")
        assert "Done" in out[OUT["status"]], out[OUT["status"]]
        results[index] = (spans_text(out), out[OUT["scrubber"]]["maximum"] + 1)
    except BaseException as exc:  # reported by the main thread
        results[index] = exc


def test_ten_sessions_stepping_and_running_together_each_get_their_solo_output(server, tiny_pair):
    expected = [alone(tiny_pair, prompt, options) for prompt, options in CLIENTS]
    results: dict = {}
    start = threading.Barrier(len(CLIENTS))
    threads = [threading.Thread(target=drive, args=(server.url, i, p, o, start, results))
               for i, (p, o) in enumerate(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    for i, (prompt, _) in enumerate(CLIENTS):
        assert not isinstance(results.get(i), BaseException), f"{prompt}: {results.get(i)!r}"
        assert results[i] == expected[i], prompt


def test_one_prompt_in_eight_sessions_at_once_gives_eight_identical_texts(server, tiny_pair):
    options = dict(method="mcsd", k_config="4,2,2,1")
    expected = alone(tiny_pair, "same for all", options)
    results: dict = {}
    start = threading.Barrier(8)
    threads = [threading.Thread(target=drive, args=(server.url, i, "same for all", options, start, results))
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert [results[i] for i in range(8)] == [expected] * 8


def test_greedy_lossless_methods_match_the_targets_own_greedy_text(tiny_pair):
    """The solo references above are the target's greedy text for every lossless configuration."""
    import torch

    for prompt, options in CLIENTS:
        settings = Settings(pair="tiny-random", max_new_tokens=MAX_NEW, **options).normalised()
        decoder = build_decoder(tiny_pair, settings)
        if not decoder.lossless:
            continue
        ids = tiny_pair.encode_prompt(prompt)
        reference = tiny_pair.target.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                              dtype=torch.long), max_new_tokens=MAX_NEW, do_sample=False,
                                              eos_token_id=2, pad_token_id=2)[0, len(ids):].tolist()
        assert decoder.generate(ids, MAX_NEW).new_token_ids == reference, prompt


# -- the registry ------------------------------------------------------------------------------------------------------

def test_the_registry_never_holds_more_than_its_cap_under_concurrent_arrivals():
    registry = SessionRegistry(max_sessions=16, ttl_s=3600)
    sizes, errors = [], []

    def arrive():
        try:
            for _ in range(50):
                registry.get(None)
                sizes.append(len(registry))
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=arrive) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and max(sizes) <= 16 and len(registry) == 16


def test_eviction_takes_the_oldest_idle_session_and_never_a_busy_one():
    now = [0.0]
    registry = SessionRegistry(max_sessions=3, ttl_s=100, clock=lambda: now[0])
    running, idle_old, idle_new = (registry.get(None) for _ in range(3))
    running.mode = Mode.RUNNING  # a Run streamed to an API client
    running.last_used = -50  # the oldest of all, but busy
    idle_old.last_used, idle_new.last_used = 1, 2
    now[0] = 3
    registry.get(None)
    assert running.id in registry and idle_old.id not in registry and idle_new.id in registry
    holder = registry.get(idle_new.id)
    with holder.lock:  # a session whose lock is held (a step in progress) is busy too
        done = threading.Event()
        threading.Thread(target=lambda: (registry.get(None), done.set())).start()
        assert done.wait(5)
    assert holder.id in registry and running.id in registry
    now[0] = 500  # past the time-to-live: expired, but never while running
    registry.get(None)
    assert running.id in registry and holder.id not in registry
    running.mode = Mode.STEPPING
    for _ in range(3):
        registry.get(None)
    assert running.id not in registry
    busy = SessionRegistry(max_sessions=1)
    busy.get(None).mode = Mode.RUNNING
    with pytest.raises(UserError, match="busy"):
        busy.get(None)


def test_memory_stays_flat_over_many_abandoned_sessions(tiny_pair):
    pairs = PairCache(loader=lambda *a, **k: tiny_pair)
    registry = SessionRegistry(max_sessions=8, ttl_s=3600)

    def abandon(n):
        for i in range(n):
            session = registry.get(None)
            session.start(pairs, Settings(pair="tiny-random", max_new_tokens=48, method="mcsd"),
                          f"session {i}: a prompt that takes a little room in the cache")
            for _ in range(3):
                session.step(pairs)

    abandon(20)  # warm up allocator pools and caches first
    gc.collect()
    start = process_rss_mb()
    abandon(100)
    gc.collect()
    end = process_rss_mb()
    assert len(registry) == 8
    print(f"RSS over 100 abandoned sessions: {start:.0f} MB -> {end:.0f} MB")
    assert end - start < 60, f"memory grew from {start:.0f} MB to {end:.0f} MB"


def test_the_app_registry_stays_bounded_as_clients_come_and_go(server):
    from gradio_client import Client

    registry = server.state.SESSIONS
    saved = registry.max_sessions
    registry.max_sessions = 6
    try:
        client = Client(server.url, verbose=False)
        for i in range(15):
            client.reset_session()  # a new browser tab, the old one abandoned
            status = client.predict(prompt=f"tab {i}", pair="tiny-random", max_new_tokens=8, api_name="/step")
            assert status[OUT["status"]].startswith("✓")
            assert len(registry) <= 6
    finally:
        registry.max_sessions = saved


def test_loading_tiny_random_while_other_sessions_build_decision_models_gives_the_seeded_pair():
    """tiny-random is built by reseeding torch's process-wide RNG, and a decision model's construction draws from
    it: the session layer keeps the two from interleaving, so the pair is the same as on every other machine."""
    import torch

    from dynasd.loading.models import load_pair, tiny_random_pair

    reference = tiny_random_pair()
    stop = threading.Event()
    cumulative = Settings(pair="tiny-random", stop="cumulative").normalised()

    def build_stop_policies():
        while not stop.is_set():
            assert build_decoder(reference, cumulative).stop.decision_model is not None  # a module was built

    builders = [threading.Thread(target=build_stop_policies) for _ in range(2)]
    for t in builders:
        t.start()
    try:
        loaded = [PairCache(loader=load_pair, device="cpu").get(Settings(pair="tiny-random")) for _ in range(3)]
    finally:
        stop.set()
        for t in builders:
            t.join()
    for pair in loaded:  # by name: the loaded pair's linear layers also hold a transposed copy (fast_linear.py)
        state = pair.target.state_dict()
        assert all(torch.equal(state[name], value) for name, value in reference.target.state_dict().items())
