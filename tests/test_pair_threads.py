"""One pair from several threads at once: the serving process's model thread, the soak's reference runs and a
script's own threads may all hold the same loaded pair, or build one, while another thread decodes.

What two threads share there is the pair's modules (read only while decoding: every decoder keeps its own KV
caches and random generator) and torch's one global random generator, which seeds the tiny-random pair's weights
and initialises any module being built. These tests pin both down: a build in one thread must not change the
weights another thread builds, and decoders of one pair stepping in two threads must write what they write one
after the other."""
import threading

import torch

from dynasd.explorer.engine import build_decoder
from dynasd.explorer.inputs import Settings
from dynasd.loading.models import ASSETS_DIR, tiny_random_pair
from dynasd.stopping.decision_models import DecisionModel

LOSSY_TREE = dict(method="ti-mcsd", width=3, depth=2)  # its output depends on the draft's proposals too
MAX_NEW = 16


def in_threads(work, count: int) -> list:
    """`work(i)` for i in range(count), all started together; their results in order (an exception re-raised)."""
    results: list = [None] * count
    start = threading.Barrier(count)

    def run(i):
        start.wait()
        try:
            results[i] = work(i)
        except BaseException as exc:  # re-raised by the caller's thread
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in module.state_dict().items()}


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def test_two_threads_building_the_tiny_pair_at_once_each_get_the_seeded_weights():
    alone = tiny_random_pair()
    for _ in range(3):  # the threads' draws interleave differently each time; one try can miss a race
        for pair in in_threads(lambda i: tiny_random_pair(), 2):
            assert same_weights(weights(pair.target), weights(alone.target))
            assert same_weights(weights(pair.draft), weights(alone.draft))


def test_loading_a_decision_model_draws_nothing_from_the_global_generator():
    """A decision model loaded while another thread builds a seeded pair must not take that build's draws: its
    initial weights are overwritten by the file's anyway, so loading it draws none."""
    before = torch.random.get_rng_state()
    model = DecisionModel.load(ASSETS_DIR / "decision-smollm2-hard")
    assert torch.equal(torch.random.get_rng_state(), before)
    assert all(not tensor.is_meta for tensor in model.state_dict().values())
    assert model.score(torch.full((1, 8), 1 / 8), None).shape == (1,)


def test_decoders_of_one_pair_in_two_threads_write_what_each_writes_alone(tiny_pair):
    settings = Settings(pair="tiny-random", max_new_tokens=MAX_NEW, **LOSSY_TREE).normalised()
    prompts = [f"tab {i} says" for i in range(4)]

    def write(i: int) -> list[int]:
        decoder = build_decoder(tiny_pair, settings)
        return decoder.generate(tiny_pair.encode_prompt(prompts[i]), MAX_NEW).new_token_ids

    alone = [write(i) for i in range(len(prompts))]
    assert len(set(map(tuple, alone))) > 1, "different prompts, different texts: a mix-up would show"
    for _ in range(2):
        assert in_threads(write, len(prompts)) == alone
