"""The GPU check's measurements in one process, on models built in code with SmolLM2's real shapes.

    python scripts/gpu_check.py RESULTS_DIR [--quick] [--emulate]

Why models built in code: the GPU machine is offline and what travels there is small (the embedded GGUF alone is
98 MB), while the cost of a step and of a verify row depends on the shapes, not on the weights. So the target and
the draft are SmolLM2-1.7B's and SmolLM2-135M's configurations (written below) with seeded random weights; their
final norms are scaled up so that the next-token distributions are peaked rather than flat (greedy choices are then
clear-cut, as with trained weights; the cost is the same). With random weights the draft almost never agrees with
the target: each step commits about one token, so the tokens/s measure what a step costs, not a speed-up.

It needs only torch and transformers (no gradio, no gguf, no pytest) and writes RESULTS_DIR/results.jsonl (one
record per measurement) and RESULTS_DIR/results.md (the tables). Parts: the device and versions; greedy identity of
every lossless method against ar on CUDA (float32); snapshot -> pickle -> resume -> step against an uninterrupted
decoder; tokens/s per method (bfloat16); the verify forward's cost against its rows. Each part stops at its share of
the time limit. --quick: small shapes and few tokens; --emulate: on a CPU-only machine, under the `spaces`
package's CUDA emulation (tests/spaces_emulation.py), with the packages the GPU machine lacks made unimportable, so
that the CPU test suite runs this script as the GPU machine will (tests/test_gpu_check.py).
"""
from __future__ import annotations

import argparse
import json
import pickle
import platform
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# SmolLM2's configurations (HuggingFaceTB/SmolLM2-135M and -1.7B, config.json): the shapes that set the costs
SHAPES = {
    "smollm2-1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                         num_key_value_heads=32, rope_theta=130000.0),
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, rope_theta=100000.0),
    # --quick: the same kind of model, small enough for a CPU under the emulation
    "quick-target": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, rope_theta=10000.0),
    "quick-draft": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                        num_key_value_heads=2, rope_theta=10000.0),
}
SMOLLM2_VOCAB, QUICK_VOCAB = 49152, 512
LOSSLESS = ["ar", "sd:gamma=6", "mcsd:k=4,2,2,1", "recipe=narrow-cpu", "pld", "recycle", "dynamic"]
SPEED = LOSSLESS + ["ti-mcsd"]
VERIFY_ROWS = (1, 2, 4, 8, 16, 32, 64, 128)
MISSING_ON_THE_GPU_MACHINE = ("gradio", "gradio_client", "gguf", "pytest", "plotly", "pandas", "scipy")


def block_imports(names: tuple[str, ...]) -> None:
    """Make `names` unimportable, as they are on the GPU machine (a None in sys.modules: `import` raises
    ImportError and importlib.util.find_spec answers None, as for a package that is not installed)."""
    for name in names:
        sys.modules[name] = None


def build_model(shape: str, vocab: int, seed: int, device, dtype):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True,
                         bos_token_id=1, eos_token_id=2, pad_token_id=2, **SHAPES[shape])
    config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]), torch.device(device):  # built where it runs: 1.7B on a CPU takes long
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.norm.weight.mul_(20.0)  # peaked next-token distributions (the module docstring says why)
    return model.to(dtype)


def build_pair(quick: bool, device, dtype):
    from dynasd.loading.models import ModelPair, tiny_tokenizer

    target, draft, vocab = ("quick-target", "quick-draft", QUICK_VOCAB) if quick else (
        "smollm2-1.7b", "smollm2-135m", SMOLLM2_VOCAB)
    return ModelPair(name=f"{target} + {draft} (random weights)", target=build_model(target, vocab, 1, device, dtype),
                     draft=build_model(draft, vocab, 2, device, dtype), tokenizer=tiny_tokenizer(),
                     draft_label=draft, device=device, dtype=dtype, eos_token_ids=frozenset())


def decoder_for(pair, spec_text: str, temperature: float = 0.0, seed: int = 0):
    from dynasd.bench.specs import decoder_options, parse_method
    from dynasd.decoders import make_decoder
    from dynasd.options import DecoderOptions

    options = decoder_options(DecoderOptions(temperature=temperature, seed=seed), parse_method(spec_text))
    return make_decoder(pair, options)


def prompt_ids(vocab: int, length: int, seed: int) -> list[int]:
    import torch

    generator = torch.Generator().manual_seed(seed)
    return [int(t) for t in torch.randint(3, vocab, (length,), generator=generator)]


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


# -- the parts ----------------------------------------------------------------------------------------------------

def part_env(device, emulated: bool) -> list[dict]:
    import torch
    import transformers

    record = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
              "transformers": transformers.__version__, "device": str(device), "emulated": emulated}
    if device.type == "cuda":
        record["gpu"] = torch.cuda.get_device_name(0)
        record["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        record["memory_gb"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        if not emulated:
            try:
                import subprocess
                record["driver"] = subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                    text=True, timeout=30).stdout.strip()
            except (OSError, subprocess.SubprocessError) as exc:
                record["driver"] = f"unknown ({exc})"
    return [record]


def part_identity(pair, tokens: int, deadline: float) -> list[dict]:
    """Every lossless method at T = 0 against ar: the same tokens (float32)."""
    ids = prompt_ids(pair.vocab_size, 48, seed=7)
    reference = _run(decoder_for(pair, "ar"), ids, tokens)
    def identity(spec: str) -> dict:
        tokens_of = _run(decoder_for(pair, spec), ids, tokens)
        first_difference = next((i for i, (a, b) in enumerate(zip(tokens_of, reference)) if a != b), None)
        return {"tokens": len(tokens_of), "identical_to_ar": tokens_of == reference,
                "first_difference": first_difference}
    return _each(LOSSLESS[1:], deadline, identity)


def _each(specs: list[str], deadline: float, measure) -> list[dict]:
    """One record per method: its measurement, or the exception it raised (the others are still measured), or
    "out of time" once the part's deadline has passed."""
    records = []
    for spec in specs:
        if time.monotonic() > deadline:
            records.append({"method": spec, "skipped": "out of time"})
            continue
        try:
            records.append({"method": spec, **measure(spec)})
        except Exception as exc:
            records.append({"method": spec, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    return records


def _run(decoder, ids: list[int], tokens: int) -> list[int]:
    decoder.start(list(ids), tokens)
    while not decoder.done:
        decoder.step()
    return list(decoder.run.new_token_ids)


def part_snapshot(pair, tokens: int, deadline: float) -> list[dict]:
    """A decoder snapshotted after each step, pickled, resumed in a fresh decoder and stepped: the same tokens as
    one decoder stepped throughout (at T = 0.7, so the random stream is part of the state)."""
    from dynasd.decoders import resume

    ids = prompt_ids(pair.vocab_size, 32, seed=11)
    def resumed(spec: str) -> dict:
        whole = _run(decoder_for(pair, spec, temperature=0.7, seed=5), ids, tokens)
        decoder = decoder_for(pair, spec, temperature=0.7, seed=5)
        decoder.start(list(ids), tokens)
        resumes = 0
        while not decoder.done:
            snapshot = pickle.loads(pickle.dumps(decoder.snapshot()))
            decoder = resume(pair, snapshot)
            decoder.step()
            resumes += 1
        return {"resumes": resumes, "identical_to_uninterrupted": list(decoder.run.new_token_ids) == whole}
    return _each(["sd:gamma=6", "mcsd:k=4,2,2,1", "recipe=narrow-cpu", "ti-mcsd", "dynamic"], deadline, resumed)


def part_speed(pair, tokens: int, prompts: int, deadline: float) -> list[dict]:
    """Tokens/s of each method after a warm-up, decoding only (the prefill apart); the phases' mean times per step
    (each read after a synchronize)."""
    def speed(spec: str) -> dict:
        _run(decoder_for(pair, spec), prompt_ids(pair.vocab_size, 64, seed=99), min(8, tokens))  # warm-up
        new_tokens, seconds, steps, phases = 0, 0.0, 0, [0.0, 0.0, 0.0]
        for p in range(prompts):
            decoder = decoder_for(pair, spec)
            decoder.start(prompt_ids(pair.vocab_size, 128, seed=p), tokens)
            synchronize(pair.device)
            started = time.perf_counter()
            while not decoder.done:
                step = decoder.step()
                steps += 1
                phases = [a + b for a, b in zip(phases, (step.draft_seconds, step.verify_seconds,
                                                          step.accept_seconds))]
            synchronize(pair.device)
            seconds += time.perf_counter() - started
            new_tokens += len(decoder.run.new_token_ids)
        return {"dtype": str(pair.dtype).replace("torch.", ""), "new_tokens": new_tokens,
                "seconds": round(seconds, 4), "tokens_per_s": round(new_tokens / seconds, 1),
                "tokens_per_step": round(new_tokens / steps, 2), "ms_per_step": round(1000 * seconds / steps, 2),
                "draft_ms": round(1000 * phases[0] / steps, 2), "verify_ms": round(1000 * phases[1] / steps, 2),
                "accept_ms": round(1000 * phases[2] / steps, 2)}
    return _each(SPEED, deadline, speed)


def part_verify_cost(pair, context: int, repeats: int) -> list[dict]:
    """The target's forward over n new rows behind a cached context (the verify's cost against its rows)."""
    from dynasd.explorer.costs.cost import calibrate

    timings = calibrate(pair.target, prompt_ids(pair.vocab_size, context, seed=3), VERIFY_ROWS, repeats=repeats)
    one = timings[1]
    return [{"rows": rows, "context": context, "ms": round(1000 * s, 3), "vs_one_row": round(s / one, 2)}
            for rows, s in timings.items()]


# -- the run ------------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="folder for results.jsonl and results.md")
    parser.add_argument("--quick", action="store_true", help="small shapes and few tokens")
    parser.add_argument("--emulate", action="store_true",
                        help="on a CPU-only machine: under the spaces package's CUDA emulation, as the GPU machine")
    parser.add_argument("--time-limit", type=float, default=420.0, help="seconds for all the parts (default 420)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    if args.emulate:
        block_imports(MISSING_ON_THE_GPU_MACHINE)
        sys.path.insert(0, str(REPO / "tests"))
        import spaces_emulation

        spaces_emulation.start()
    import torch

    if not torch.cuda.is_available():
        print("gpu_check.py: no CUDA device visible to torch (--emulate runs it on a CPU)", file=sys.stderr)
        return 1
    device = torch.device("cuda")
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    quick = args.quick
    tokens, speed_tokens, prompts = (4, 3, 1) if quick else (48, 128, 2)
    budget = args.time_limit

    failed = False
    tables: list[str] = []
    with open(results / "results.jsonl", "w") as out:
        def part(name: str, share: float, body) -> None:
            nonlocal failed
            part_started = time.monotonic()
            deadline = started + budget * share
            try:
                records = body(deadline)
                error = ""
            except Exception as exc:  # the other parts still run
                records, error, failed = [], f"{type(exc).__name__}: {exc}", True
                traceback.print_exc()
            took = time.monotonic() - part_started
            for record in records:
                out.write(json.dumps({"part": name, **record}) + "\n")
            out.write(json.dumps({"part": name, "seconds": round(took, 1), "error": error}) + "\n")
            out.flush()
            bad = [r for r in records if r.get("identical_to_ar") is False
                   or r.get("identical_to_uninterrupted") is False or r.get("error")]
            failed = failed or bool(bad)
            tables.append(_table(name, records, error, took))
            print(f"{name}: {'FAILED ' + error if error else 'done'} ({took:.1f} s)", flush=True)

        part("env", 0.02, lambda deadline: part_env(device, args.emulate))
        fp32 = {}
        part("greedy identity, float32", 0.30, lambda deadline: part_identity(
            fp32.setdefault("pair", build_pair(quick, device, torch.float32)), tokens, deadline))
        part("snapshot and resume, float32", 0.45, lambda deadline: part_snapshot(
            fp32.setdefault("pair", build_pair(quick, device, torch.float32)), tokens, deadline))
        fp32.clear()
        bf16 = {}
        part("tokens/s, bfloat16", 0.85, lambda deadline: part_speed(
            bf16.setdefault("pair", build_pair(quick, device, torch.bfloat16)), speed_tokens, prompts, deadline))
        part("verify cost against rows, bfloat16", 1.0, lambda deadline: part_verify_cost(
            bf16.setdefault("pair", build_pair(quick, device, torch.bfloat16)), 64 if quick else 512,
            2 if quick else 5))
    total = time.monotonic() - started
    shapes = "quick shapes" if quick else "SmolLM2-1.7B target, SmolLM2-135M draft, random weights"
    (results / "results.md").write_text(f"# GPU check ({shapes}{', emulated CUDA' if args.emulate else ''})\n\n"
                                        + "\n".join(tables) + f"\ntotal: {total:.0f} s\n")
    print((results / "results.md").read_text())
    return 1 if failed else 0


def _table(name: str, records: list[dict], error: str, took: float) -> str:
    lines = [f"## {name} ({took:.1f} s){' FAILED: ' + error if error else ''}", ""]
    if records:
        keys = list(dict.fromkeys(k for r in records for k in r))
        lines += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in records]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
