"""The engine on every device: CUDA runs stock PyTorch ops (the CPU kernels are CPU-only choices, made in one place),
a decoding step reads few values back to the host, and a bench runs end to end on each device and dtype.

`device` (tests/conftest.py) is "cpu" everywhere and "cuda" where a GPU is present.
"""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from conftest import NO_CUDA

from dynasd.bench.host_syncs import count_host_reads, reads_per_step
from dynasd.kernels import KernelPlan, accelerate, plan_for
from dynasd.kernels.compile import kernel_variant
from dynasd.kernels.fast_linear import PretransposedLinear
from dynasd.loading.models import tiny_random_pair
from dynasd.options import DecoderOptions
from dynasd.sampling import Draws, mcss_walk

# -- the kernel plan per device ------------------------------------------------------------------------------------

CPU_ONLY = ("linear_layouts", "compiled_kernel", "half_panels", "gguf_blocks", "draft_blocks")


@pytest.mark.parametrize("device_type", ["cuda", "mps", "xpu"])
def test_off_the_cpu_the_plan_applies_no_cpu_kernel(device_type):
    for decides_output in (True, False):
        plan = plan_for(torch.device(device_type), decides_output=decides_output)
        assert not any(getattr(plan, name) for name in CPU_ONLY), plan
        assert plan == KernelPlan(), "every other field is a device-agnostic default"


def test_on_the_cpu_the_plan_applies_the_cpu_kernels():
    target, draft = plan_for(torch.device("cpu")), plan_for(torch.device("cpu"), decides_output=False)
    assert target.linear_layouts and target.compiled_kernel and not target.half_panels
    assert draft.half_panels, "a draft's panels are half precision"
    assert draft.draft_blocks == (kernel_variant() is not None) and not target.draft_blocks, "8-bit blocks: drafts only"


def test_accelerate_decides_from_the_pair_device_alone():
    """A pair that says it lives on CUDA (its modules stay on the CPU here) keeps every linear layer a stock
    nn.Linear; the same pair on the CPU gets the few-row layouts."""
    def swapped(model):
        return sum(isinstance(m, PretransposedLinear) for m in model.modules())

    on_cuda = accelerate(dataclasses.replace(tiny_random_pair(), device=torch.device("cuda")), compiled_kernel=False)
    for model in (on_cuda.target, on_cuda.draft, on_cuda.feature_draft):
        assert swapped(model) == 0 and model.dynasd_kernel_plan == KernelPlan()
    on_cpu = accelerate(tiny_random_pair(), compiled_kernel=False)
    assert swapped(on_cpu.target) > 0 and swapped(on_cpu.draft) > 0


# -- host reads per step -----------------------------------------------------------------------------------------------

def test_the_counter_counts_each_host_read_and_puts_torch_back():
    item, tolist = torch.Tensor.item, torch.Tensor.tolist
    t = torch.tensor([1.0, 2.0])
    with count_host_reads() as counts:
        t[0].item()
        t.tolist()
        float(t[1])
        bool(t[0] > 0)
        t + 1  # not a read
    assert counts == {"item": 1, "tolist": 1, "__float__": 1, "__bool__": 1}
    assert torch.Tensor.item is item and torch.Tensor.tolist is tolist
    with count_host_reads("cuda") as counts:
        t.tolist()
    assert not counts, "reads of CPU tensors are not synchronisations on a GPU"


def test_a_greedy_step_reads_per_draft_level_not_per_node(tiny_pair_on_device):
    """At T = 0 a chain of 4 and a 44-node tree of the same depth read the same number of values per step."""
    counts = {}
    for k in ((1, 1, 1, 1), (4, 2, 2, 1)):
        rows = reads_per_step(tiny_pair_on_device, DecoderOptions(method="mcsd", k_config=k), "hello there", 3)
        counts[k] = {row["reads"] for row in rows}
        assert all(row["nodes"] == sum(_level_sizes(k)) for row in rows)
    assert counts[(1, 1, 1, 1)] == counts[(4, 2, 2, 1)] and len(counts[(1, 1, 1, 1)]) == 1, counts


def _level_sizes(k):
    sizes, width = [], 1
    for branching in k:
        width *= branching
        sizes.append(width)
    return sizes


def test_the_sampling_walk_reads_two_values_per_test_and_one_per_rejection(device):
    """p(x) and q(x) come back in one read and u in another; a rejection without replacement adds the check of
    q's remaining mass. Nothing else in the walk waits for the device."""
    gen = torch.Generator(device=device).manual_seed(0)
    vocab, siblings = 8, 4
    p = torch.softmax(torch.randn(vocab, generator=torch.Generator().manual_seed(1)), -1).to(device)
    q = torch.softmax(torch.randn(vocab, generator=torch.Generator().manual_seed(2)), -1).to(device)
    tokens = [3, 5, 1, 6]
    for seed in range(20):
        gen.manual_seed(seed)
        with count_host_reads() as counts:
            walk = mcss_walk(-1, lambda node: [Draws(list(range(siblings)), q)] if node == -1 else [], tokens,
                             lambda node: p, gen)
        rejections = sum(not t.accepted for t in walk.tests)
        assert sum(counts.values()) == 2 * len(walk.tests) + rejections, (counts, walk.tests)


# -- one bench run per device and dtype --------------------------------------------------------------------------

# fp32 everywhere; on CUDA also the half-precision dtypes a GPU runs.
BENCH_CASES = [pytest.param("cpu", "fp32", id="cpu-fp32")] + [
    pytest.param("cuda", dtype, id=f"cuda-{dtype}", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                             reason=NO_CUDA))
    for dtype in ("fp32", "bf16", "fp16")]


@pytest.mark.parametrize("device,dtype", BENCH_CASES)
def test_a_bench_runs_on_each_device_and_dtype(device, dtype, tmp_path, capsys):
    from dynasd.cli import main

    prompts = tmp_path / "questions.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["What is a tree?"]}) + "\n")
    out = tmp_path / "bench"
    code = main(["bench", "--pair", "tiny-random", "--device", device, "--dtype", dtype, "--prompts", str(prompts),
                 "--methods", "ar,sd:gamma=3,mcsd:k=2,2,1", "--temperatures", "0", "--max-new-tokens", "12",
                 "--warmup-tokens", "2", "--out", str(out), "--no-progress", "--no-report"])
    assert code == 0, capsys.readouterr().err
    runs = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert {r["method"] for r in runs} == {"ar", "sd:gamma=3", "mcsd:k=2,2,1"}
    assert all(len(r["token_ids"]) == 12 for r in runs)
    meta = json.loads((out / "meta.json").read_text())
    assert device in json.dumps(meta)
    if dtype == "fp32":  # half precision may round the tree verify and ar's forward differently
        assert all(r["identical_to_ar"] for r in runs if r["method"] != "ar"), runs
