"""`python -m dynasd train-draft`: distil a small draft from the target.

Three stages, each resumable from the files it leaves in `--out` (plus two optional data stages: `label`, reference
answers read by the target, and `onpolicy`, answers the draft writes itself; see onpolicy.py):
1. generate: the target answers prompts greedily, in batches: TriviaQA questions and PIQA goals read by path, or
   (`--prompt-source self`, self_instruct.py) user instructions the target writes itself. With greedy decoding the
   next token of the target's own answer *is* the target's argmax, so the text alone is the training signal:
   cross-entropy on it trains exactly the quantity sd accepts at T = 0 (top-1 agreement).
   A held-out share of the prompts is kept apart; its labels are recomputed with a teacher-forced target forward in
   the dtype the engine runs (fp32), so the agreement we report is against the engine's target.
2. train: the draft is K of the target's own layers (chosen by untrained agreement, e.g. [0, 1, 29]: keeping the
   last layer, which feeds the head, starts far better than the first K) with the target's final norm; the
   embedding and head stay the target's, frozen and shared, so only K layers (+ norm) are stored. The softmax runs
   over the tokens that occur in the training text (the 49152-wide head is ~8x a layer; the rest of the vocabulary
   never appears as a label), while agreement is always measured over the full vocabulary.
3. export: config.json + fp16 model.safetensors without embeddings, loaded by `models.load_distilled_draft`.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

DEFAULT_PROMPTS = Path(__file__).resolve().parents[3] / "shared" / "train_prompts"
DEFAULT_INIT_CANDIDATES = ("0,1,29", "0,28,29", "0,15,29", "0,1,2", "0,29", "0,1,28,29")


# ---------------------------------------------------------------------------------------------------------------
# prompts and generated data

def read_train_prompts(paths: list[str | Path]) -> list[str]:
    """Prompt texts from JSON files (a list of objects with 'question' or 'goal'), or folders of them."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files += sorted(path.glob("*.json"))
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"no prompts at '{path}'")
    texts = []
    for file in files:
        for obj in json.loads(file.read_text(encoding="utf-8")):
            text = obj.get("question") or obj.get("goal") if isinstance(obj, dict) else obj
            if isinstance(text, str) and text.strip():
                texts.append(text.strip())
    if not texts:
        raise ValueError(f"no prompts found in {', '.join(map(str, paths))}")
    return texts


@dataclass
class Sequence:
    """A prompt (chat-templated) followed by an answer; labels start at `answer_start`. For the target's own greedy
    answers the label is the next token; for other answers (teacher-forced) `labels` holds the target's argmax at
    each answer position."""

    ids: list[int]
    answer_start: int
    labels: list[int] | None = None
    # optional soft targets: the target's top-k tokens and their log-probabilities at each answer position
    topk_ids: list[list[int]] | None = None
    topk_logp: list[list[float]] | None = None


def save_sequences(path: Path, seqs: list[Sequence]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    def record(s: Sequence) -> dict:
        obj = {"ids": s.ids, "answer_start": s.answer_start, "labels": s.labels}
        if s.topk_ids is not None:
            obj.update(topk_ids=s.topk_ids, topk_logp=s.topk_logp)
        return obj

    tmp.write_text("\n".join(json.dumps(record(s)) for s in seqs) + "\n")
    tmp.replace(path)


def load_sequences(paths) -> list[Sequence]:
    seqs = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            if line.strip():
                obj = json.loads(line)
                seqs.append(Sequence(obj["ids"], obj["answer_start"], obj.get("labels"), obj.get("topk_ids"),
                                     obj.get("topk_logp")))
    return seqs


class InverseCdfSampling:
    """A logits processor that turns greedy decoding into sampling at `temperature`: it draws each row's token by
    inverting the cumulative distribution of softmax(logits / T) with one uniform number and leaves only that
    token finite. Why: torch.multinomial (and any per-token noise) over a 49k-token vocabulary costs ~60 ms per batch
    of 32 on this CPU, more than the draft's forward; a cumsum and a binary search cost a few."""

    def __init__(self, temperature: float) -> None:
        self.temperature = temperature

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        cdf = (scores.float() / self.temperature).softmax(-1).cumsum(-1)
        # the smallest index whose cumulative probability exceeds u: never a zero-probability token
        u = torch.rand(cdf.shape[0], 1) * cdf[:, -1:]
        chosen = torch.searchsorted(cdf, u, right=True).clamp_(max=cdf.shape[-1] - 1)
        return torch.full_like(scores, float("-inf")).scatter_(-1, chosen, 0.0)


@torch.inference_mode()
def generate_answers(model, prompts: list[list[int]], pad_id: int, eos_ids: set[int], max_new_tokens: int,
                     topk: int = 0, temperature: float = 0.0) -> list[Sequence]:
    """Greedy answers (or sampled at `temperature` > 0) for one batch of prompts (left-padded), cut after the first
    end-of-sequence token. With `topk`, also the model's top-k tokens and log-probabilities at every answer position
    (soft targets, free: generation computes these logits anyway)."""
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.tensor(p)
        mask[row, width - len(p):] = 1
    from transformers import LogitsProcessorList  # here: `python -m dynasd --help` stays fast

    sampling = LogitsProcessorList([InverseCdfSampling(temperature)] if temperature > 0 else [])
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                         logits_processor=sampling, pad_token_id=pad_id, eos_token_id=sorted(eos_ids),
                         return_dict_in_generate=True, output_logits=bool(topk))
    top_ids = top_logp = None
    if topk:  # [batch, steps, k]
        top = [step.float().log_softmax(-1).topk(topk, dim=-1) for step in out.logits]
        top_logp = torch.stack([t.values for t in top], dim=1)
        top_ids = torch.stack([t.indices for t in top], dim=1)
    seqs = []
    for row, p in enumerate(prompts):
        answer = out.sequences[row, width:].tolist()
        for i, tok in enumerate(answer):
            if tok in eos_ids:
                answer = answer[:i + 1]
                break
        seq = Sequence(list(p) + answer, len(p))
        if topk:
            seq.topk_ids = top_ids[row, :len(answer)].tolist()
            seq.topk_logp = [[round(v, 3) for v in r] for r in top_logp[row, :len(answer)].tolist()]
        seqs.append(seq)
    return seqs


def generate_stage(args, log) -> None:
    from tqdm import tqdm

    from ..models import load_pair

    data_dir = Path(args.out) / "data"
    # Inference only, so the fast kernels are welcome (the same answers to float rounding; on an AMD EPYC, where MKL
    # is slow, batches of 32 ran at ~200 instead of ~170 answer tokens/s, session 13).
    pair = load_pair(args.pair, device="cpu", dtype=args.gen_dtype)
    model, pad = pair.target, pair.pad_id
    # Each job is (shard name, prompt count, a function making its encoded prompts), so that self-instructed
    # prompts are only sampled for shards that still have to be written.
    if args.prompt_source == "self":
        jobs = self_instruct_jobs(args, pair, model)
    else:
        texts = read_train_prompts(args.prompts)
        random.Random(args.seed).shuffle(texts)
        # --gen-skip leaves out training prompts an earlier run already answered (same seed, same order)
        first = args.heldout + args.gen_skip
        chunks = [("heldout", texts[:args.heldout])]
        train_texts = texts[first:first + args.gen_prompts]
        chunks += [(f"{args.shard_prefix}-{i // args.shard_prompts:04d}", train_texts[i:i + args.shard_prompts])
                   for i in range(0, len(train_texts), args.shard_prompts)]
        jobs = [(name, len(chunk), lambda chunk=chunk: [pair.encode_prompt(t) for t in chunk])
                for name, chunk in chunks]
    start, run_tokens = time.time(), 0
    bar = tqdm(total=sum(count for _, count, _ in jobs), desc="generate", unit="prompt")
    for name, count, make_prompts in jobs:
        path = data_dir / f"{name}.jsonl"
        if path.is_file():  # resumable: finished shards are kept
            bar.update(count)
            continue
        if args.gen_minutes and time.time() - start > 60 * args.gen_minutes:
            break
        # Similar lengths in one batch waste less padding.
        encoded = sorted(make_prompts(), key=len)
        seqs = []
        for i in range(0, len(encoded), args.gen_batch):
            answers = generate_answers(model, encoded[i:i + args.gen_batch], pad, set(pair.eos_token_ids),
                                       args.gen_max_new_tokens, args.gen_topk)
            seqs += answers
            run_tokens += sum(len(s.ids) - s.answer_start for s in answers)
            bar.update(len(encoded[i:i + args.gen_batch]))
            bar.set_postfix(answer_tokens=run_tokens, tok_per_s=round(run_tokens / (time.time() - start)))
        save_sequences(path, seqs)
        answer_tokens = sum(len(s.ids) - s.answer_start for s in seqs)
        log({"stage": "generate", "shard": name, "prompts": len(seqs), "answer_tokens": answer_tokens,
             "elapsed_s": round(time.time() - start, 1)})
    bar.close()


def self_instruct_jobs(args, pair, model) -> list[tuple[str, int, Callable[[], list[list[int]]]]]:
    """Jobs for `--prompt-source self`: first a held-out shard (`heldout-self`, never trained on: its prompts are
    excluded from all training shards), then training shards of instructions the target writes itself (see
    self_instruct.py). Prompts already in finished shards are excluded too, so a resumed run stays de-duplicated."""
    from .self_instruct import TASK_OPENERS, sample_instructions, shard_seed

    shards = -(-args.gen_prompts // args.shard_prompts)
    plan = [("heldout-self", args.self_heldout)] if args.self_heldout else []
    plan += [(f"{args.shard_prefix}-{i:04d}", min(args.shard_prompts, args.gen_prompts - i * args.shard_prompts))
             for i in range(shards)]
    seen: set[tuple[int, ...]] = set()
    for name, _ in plan:
        path = Path(args.out) / "data" / f"{name}.jsonl"
        if path.is_file():
            seen.update(tuple(s.ids[:s.answer_start]) for s in load_sequences([path]))

    def make(name: str, count: int) -> Callable[[], list[list[int]]]:
        openers = TASK_OPENERS if args.instruction_openers == "tasks" and name != "heldout-self" else ()
        return lambda: sample_instructions(pair, model, count, shard_seed(args.seed, name), seen, args.gen_batch,
                                           args.instruction_max_tokens, openers=openers)

    return [(name, count, make(name, count)) for name, count in plan]


def read_answer_pairs(paths: list[str | Path]) -> list[tuple[str, str]]:
    """(prompt, reference answer) pairs, e.g. PIQA goals with their correct solution."""
    files = [f for p in map(Path, paths) for f in (sorted(p.glob("*.json")) if p.is_dir() else [p])]
    pairs = []
    for file in files:
        for obj in json.loads(file.read_text(encoding="utf-8")):
            if isinstance(obj, dict) and isinstance(obj.get("correct_answer"), str):
                prompt = obj.get("question") or obj.get("goal")
                if prompt and obj["correct_answer"].strip():
                    pairs.append((prompt.strip(), obj["correct_answer"].strip()))
    return pairs


def label_stage(args, log) -> None:
    """Teacher-forced data: reference answers read by the target in one batched forward (several times cheaper
    per token than generating), labelled with the target's argmax at every answer position."""
    from tqdm import tqdm

    from ..models import load_pair

    texts = read_train_prompts(args.prompts)
    random.Random(args.seed).shuffle(texts)
    heldout = set(texts[:args.heldout])
    pairs = [p for p in read_answer_pairs(args.prompts) if p[0] not in heldout]
    random.Random(args.seed + 1).shuffle(pairs)
    pair = load_pair(args.pair, device="cpu", dtype="fp32", fast_kernels=False)
    pad = pair.pad_id
    start, done = time.time(), 0
    chunk = args.shard_prompts * 4
    for shard, i in enumerate(tqdm(range(0, min(len(pairs), args.label_prompts), chunk), desc="label")):
        path = Path(args.out) / "data" / f"train-tf-{shard:04d}.jsonl"
        if path.is_file():
            continue
        if args.label_minutes and time.time() - start > 60 * args.label_minutes:
            break
        seqs = []
        for prompt, answer in pairs[i:i + chunk]:
            ids = pair.encode_prompt(prompt)
            answer_ids = pair.tokenizer(answer, add_special_tokens=False)["input_ids"][:args.gen_max_new_tokens]
            seqs.append(Sequence(ids + answer_ids, len(ids)))
        seqs = teacher_forced(pair.target, seqs, pad)
        save_sequences(path, seqs)
        done += sum(len(s.labels) for s in seqs)
        log({"stage": "label", "shard": path.name, "answer_tokens": done, "elapsed_s": round(time.time() - start, 1)})


# ---------------------------------------------------------------------------------------------------------------
# the draft: K of the target's layers, sharing its embedding and head

def parse_layers(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def draft_from_target(target, layers: list[int]):
    """A draft made of the target's `layers` (in that order) + its final norm; embedding and head are the
    target's own tensors (shared, never trained)."""
    n = target.config.num_hidden_layers
    if not layers or any(not 0 <= i < n for i in layers):
        raise ValueError(f"draft layers must be indices in 0..{n - 1}, got {layers}")
    config = target.config.__class__.from_dict(target.config.to_dict())
    config.num_hidden_layers = len(layers)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in layers]
    config.dynasd_source_layers = list(layers)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    dtype = target.model.embed_tokens.weight.dtype
    draft = target.__class__(config).to(dtype)
    with torch.no_grad():
        for new, old in enumerate(layers):
            source = dict(target.model.layers[old].named_modules())
            for name, module in draft.model.layers[new].named_modules():
                if isinstance(module, torch.nn.Linear):
                    module.weight.copy_(plain_weight(source[name], module.in_features, dtype))
                    if module.bias is not None:
                        module.bias.copy_(source[name].bias)
                elif not list(module.children()) and hasattr(module, "weight"):  # norms
                    module.weight.copy_(source[name].weight)
        draft.model.norm.weight.copy_(target.model.norm.weight)
    draft.model.embed_tokens.weight = target.model.embed_tokens.weight
    if config.tie_word_embeddings:
        draft.lm_head.weight = draft.model.embed_tokens.weight
    else:
        draft.lm_head.weight = target.lm_head.weight
    for name, param in draft.named_parameters():
        param.requires_grad_(not (name.startswith("model.embed_tokens") or name.startswith("lm_head")))
    return draft


def plain_weight(module: torch.nn.Module, in_features: int, dtype: torch.dtype) -> torch.Tensor:
    """The (out, in) weight a linear layer applies, also when it is stored packed (a GGUF-quantized layer keeps
    uint8 blocks and may permute its input): read off by applying the layer to the identity."""
    if isinstance(module, torch.nn.Linear) and module.weight.is_floating_point():
        return module.weight.detach().to(dtype)
    eye = torch.eye(in_features, dtype=dtype)
    out = module(eye)
    if getattr(module, "bias", None) is not None:
        out = out - module.bias
    return out.T.contiguous()


def trainable_state(draft) -> dict[str, torch.Tensor]:
    """What a distilled draft stores: everything except the (shared) embedding and head."""
    return {k: v for k, v in draft.state_dict().items()
            if not (k.startswith("model.embed_tokens") or k.startswith("lm_head")) and "rotary" not in k}


def export_draft(draft, folder: str | Path, card: str | None = None, dtype=torch.float16) -> int:
    """Write config.json + model.safetensors (no embeddings, `dtype`); returns the weight file's size in bytes."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in trainable_state(draft).items()}
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    draft.config.to_json_file(str(folder / "config.json"))
    if card is not None:
        (folder / "MODEL_CARD.md").write_text(card)
    return (folder / "model.safetensors").stat().st_size


# ---------------------------------------------------------------------------------------------------------------
# batches and evaluation

def make_batches(seqs: list[Sequence], batch_tokens: int) -> list[list[int]]:
    """Indices of sequences grouped by length so that each padded batch holds at most ~batch_tokens tokens."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].ids))
    batches, current, width = [], [], 0
    for i in order:
        w = max(width, len(seqs[i].ids))
        if current and w * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current, w = [], len(seqs[i].ids)
        current.append(i)
        width = w
    if current:
        batches.append(current)
    return batches


def collate_soft(seqs: list[Sequence], label_map: torch.Tensor, k: int):
    """Soft targets in `collate`'s position order: [positions, k] training-vocabulary rows (-100: none, or outside
    the vocabulary) and the target's probabilities renormalised over the kept ones (0 where none)."""
    ids, logp = [], []
    for s in seqs:
        n = len(s.ids) - s.answer_start
        if s.topk_ids is not None:
            ids += [row[:k] + [-1] * (k - len(row[:k])) for row in s.topk_ids]
            logp += [row[:k] + [-math.inf] * (k - len(row[:k])) for row in s.topk_logp]
        else:
            ids += [[-1] * k] * n
            logp += [[-math.inf] * k] * n
    ids_t = torch.tensor(ids, dtype=torch.long).reshape(-1, k)
    mapped = torch.where(ids_t >= 0, label_map[ids_t.clamp(min=0)], torch.full_like(ids_t, -100))
    probs = torch.tensor(logp, dtype=torch.float).reshape(-1, k).exp() * (mapped >= 0)
    probs = probs / probs.sum(-1, keepdim=True).clamp(min=1e-9)
    return mapped, probs


def collate(seqs: list[Sequence], pad_id: int, label_map: torch.Tensor | None = None):
    """Right-padded ids (causal attention never looks right, so no mask is needed) and, for every answer position,
    (row, column, label): the label is the next token, mapped to its row in the training vocabulary."""
    width = max(len(s.ids) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    rows, cols, labels = [], [], []
    for r, s in enumerate(seqs):
        ids[r, :len(s.ids)] = torch.tensor(s.ids)
        for j, c in enumerate(range(s.answer_start - 1, len(s.ids) - 1)):
            rows.append(r)
            cols.append(c)
            labels.append(s.labels[j] if s.labels is not None else s.ids[c + 1])
    labels_t = torch.tensor(labels, dtype=torch.long)
    if label_map is not None:
        labels_t = label_map[labels_t]
    return ids, torch.tensor(rows), torch.tensor(cols), labels_t


@torch.inference_mode()
def teacher_forced(target, seqs: list[Sequence], pad_id: int, topk: int = 0, batch_tokens: int = 2048
                   ) -> list[Sequence]:
    """The target reads each sequence in batched forwards (no generation, several times cheaper per token) and
    gives, at every answer position, its argmax as the label and, with `topk`, its top-k tokens and
    log-probabilities (the soft targets of `collate_soft`)."""
    out = [Sequence(list(s.ids), s.answer_start, [], [] if topk else None, [] if topk else None) for s in seqs]
    for batch in make_batches(seqs, batch_tokens):
        ids, rows, cols, _ = collate([seqs[i] for i in batch], pad_id)
        # the head only where a label is needed: it is the costliest layer
        logits = target.lm_head(target.model(input_ids=ids).last_hidden_state[rows, cols]).float()
        # collate lists each row's answer positions in order, so appending rebuilds every sequence's labels
        for r, t in zip(rows.tolist(), logits.argmax(-1).tolist()):
            out[batch[r]].labels.append(t)
        if topk:
            top = logits.log_softmax(-1).topk(topk, dim=-1)
            for r, i, v in zip(rows.tolist(), top.indices.tolist(), top.values.tolist()):
                out[batch[r]].topk_ids.append(i)
                out[batch[r]].topk_logp.append([round(x, 3) for x in v])
    return out


def target_argmax_labels(target, seqs: list[Sequence], pad_id: int, batch_tokens: int = 2048) -> list[Sequence]:
    """Replace each answer token by the target's teacher-forced argmax (the exact T = 0 reference)."""
    return [Sequence(s.ids[:s.answer_start] + t.labels, s.answer_start)
            for s, t in zip(seqs, teacher_forced(target, seqs, pad_id, batch_tokens=batch_tokens))]


def cached_labels(target, seqs: list[Sequence], path: Path, pad_id: int) -> list[Sequence]:
    """`target_argmax_labels`, computed once and kept in `path` (the held-out reference of every later run)."""
    if path.is_file():
        return load_sequences([path])
    labels = target_argmax_labels(target, seqs, pad_id)
    save_sequences(path, labels)
    return labels


@torch.inference_mode()
def agreement(draft, labelled: list[Sequence], context: list[Sequence], pad_id: int, batch_tokens: int = 2048
              ) -> float:
    """Share of answer positions where the draft's full-vocabulary argmax equals the target's argmax.
    `context` holds the token ids the models read, `labelled` the target's argmax at each answer position."""
    hits = total = 0
    for batch in make_batches(context, batch_tokens):
        ids, rows, cols, _ = collate([context[i] for i in batch], pad_id)
        _, _, _, labels = collate([labelled[i] for i in batch], pad_id)
        top = draft.lm_head(draft.model(input_ids=ids).last_hidden_state[rows, cols]).argmax(-1)
        hits += int((top == labels).sum())
        total += len(labels)
    return hits / max(total, 1)


# ---------------------------------------------------------------------------------------------------------------
# training

def lr_at(step: int, args, seconds: float = 0.0) -> float:
    """Linear warmup, then cosine to 10% over `--steps` or `--minutes` of training, whichever ends first."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    if args.minutes:
        progress = max(progress, min(1.0, seconds / (60 * args.minutes)))
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def batch_for_step(step: int, batches: int, seed: int) -> int:
    """The batch a training step uses: every epoch visits each batch once, in an order seeded by (seed, epoch), so a
    resumed run continues the same sequence."""
    epoch, index = divmod(step, batches)
    order = list(range(batches))
    random.Random(seed * 1000 + epoch).shuffle(order)
    return order[index]


class LossWindow:
    """The training loss averaged over the tokens since the last log line, and the tokens/s it came at."""

    def __init__(self) -> None:
        self.loss, self.tokens, self.start = 0.0, 0, time.time()

    def add(self, loss: float, tokens: int) -> None:
        self.loss += loss * tokens
        self.tokens += tokens

    @property
    def mean(self) -> float:
        return self.loss / max(self.tokens, 1)

    def record(self, step: int, lr: float, started: float) -> dict:
        """The log record of this window; the next window starts now."""
        record = {"step": step, "loss": round(self.mean, 4), "lr": round(lr, 6),
                  "tokens_per_s": round(self.tokens / (time.time() - self.start), 1),
                  "elapsed_s": round(time.time() - started, 1)}
        self.loss, self.tokens, self.start = 0.0, 0, time.time()
        return record


def export_best(out: Path, export: str | Path) -> None:
    """Copy the best checkpoint's files (`out/best`) to `export`, e.g. an assets folder."""
    import shutil

    if not (out / "best" / "model.safetensors").is_file():
        raise FileNotFoundError(f"no trained draft in {out / 'best'} (run the train stage first)")
    Path(export).mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors", "metrics.json", "head_tokens.json"):
        if (out / "best" / name).is_file():
            shutil.copy(out / "best" / name, Path(export) / name)
    print(f"exported {out / 'best'} to {export}")


def train_stage(args, log) -> dict:
    from tqdm import tqdm

    from ..models import load_pair

    out = Path(args.out)
    data_dir = out / "data"
    train_files = sorted(data_dir.glob("train-*.jsonl"))
    if not train_files or not (data_dir / "heldout.jsonl").is_file():
        raise FileNotFoundError(f"no generated data in {data_dir} (run the generate stage first)")
    train = load_sequences(train_files)
    heldout = load_sequences([data_dir / "heldout.jsonl"])
    pair = load_pair(args.pair, device="cpu", dtype="fp32", fast_kernels=False)
    target, pad = pair.target, pair.pad_id
    for p in target.parameters():
        p.requires_grad_(False)

    heldout_labels = cached_labels(target, heldout, out / "heldout-fp32-labels.jsonl", pad)
    # A second held-out set, self-written instructions (--prompt-source self): reported, and with --select-on mean
    # averaged with the first to pick the best checkpoint.
    self_heldout = self_labels = None
    if (data_dir / "heldout-self.jsonl").is_file():
        self_heldout = load_sequences([data_dir / "heldout-self.jsonl"])
        self_labels = cached_labels(target, self_heldout, out / "heldout-self-fp32-labels.jsonl", pad)

    ckpt_path = out / "checkpoint.pt"
    ckpt = torch.load(ckpt_path, weights_only=False) if args.resume and ckpt_path.is_file() else None
    if ckpt is not None:
        layers = ckpt["layers"]
    elif args.init_from:
        layers = []  # read from the folder below
    elif args.layers == "auto":
        scores = {}
        for cand in args.init_candidates.split(";"):
            cand_layers = [i for i in parse_layers(cand) if i < target.config.num_hidden_layers]
            if cand_layers:
                scores[tuple(cand_layers)] = agreement(draft_from_target(target, cand_layers), heldout_labels,
                                                       heldout, pad)
        log({"stage": "init", "untrained_agreement": {",".join(map(str, k)): round(v, 4)
                                                      for k, v in scores.items()}})
        layers = list(max(scores, key=scores.get))
    else:
        layers = parse_layers(args.layers)
    init_state = None
    if ckpt is None and args.init_from:  # continue from an exported draft (its layers, new optimiser)
        from safetensors.torch import load_file

        config = json.loads((Path(args.init_from) / "config.json").read_text())
        layers = list(config["dynasd_source_layers"])
        init_state = load_file(str(Path(args.init_from) / "model.safetensors"))
    draft = draft_from_target(target, layers)
    if init_state is not None:
        draft.load_state_dict({k: v.float() for k, v in init_state.items()}, strict=False)

    # The training softmax runs over the tokens the target actually wrote (see the module docstring), at most
    # --vocab-max of them (the most frequent labels, always with the end-of-sequence tokens); labels outside it are
    # left out of the loss. The engine restricts the draft's head to exactly this set (head_tokens.json).
    train_labels = [t for s in train for t in (s.labels if s.labels is not None else s.ids[s.answer_start:])]
    if args.train_vocab == "data":
        counts = Counter(train_labels)
        eos = set(pair.eos_token_ids)
        keep = [t for t, _ in counts.most_common() if t not in eos][:max(0, args.vocab_max - len(eos))]
        vocab = sorted(set(keep) | eos)
    else:
        vocab = list(range(pair.vocab_size))
    label_map = torch.full((pair.vocab_size,), -100, dtype=torch.long)
    label_map[torch.tensor(vocab)] = torch.arange(len(vocab))
    head = draft.lm_head.weight[torch.tensor(vocab)].detach()
    (out / "head_tokens.json").write_text(json.dumps({"token_ids": vocab}))
    heldout_targets = [t for s in heldout_labels for t in s.ids[s.answer_start:]]
    in_vocab = set(vocab)
    coverage = {"train_label_coverage": round(sum(t in in_vocab for t in train_labels) / len(train_labels), 5),
                "heldout_label_coverage": round(sum(t in in_vocab for t in heldout_targets) / len(heldout_targets), 5)}
    soft_seqs = sum(s.topk_ids is not None for s in train)

    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    step, best, seconds_before = 0, -1.0, 0.0
    if ckpt is not None:
        draft.load_state_dict(ckpt["draft"], strict=False)
        opt.load_state_dict(ckpt["optimizer"])
        step, best, seconds_before = ckpt["step"], ckpt["best_agreement"], ckpt.get("train_seconds", 0.0)
    torch.manual_seed(args.seed + step)
    batches = make_batches(train, args.batch_tokens)
    log({"stage": "train", "layers": layers, "train_sequences": len(train), "batches_per_epoch": len(batches),
         "train_answer_tokens": sum(len(s.ids) - s.answer_start for s in train), "train_vocab": len(vocab),
         "heldout_answer_tokens": sum(len(s.ids) - s.answer_start for s in heldout), "resumed_at": step,
         "distinct_labels": len(counts) if args.train_vocab == "data" else None, **coverage,
         "soft_target_sequences": soft_seqs, "init_from": args.init_from if ckpt is None else None})

    def evaluate_and_save(step: int, best: float) -> float:
        draft.eval()
        agree = agreement(draft, heldout_labels, heldout, pad)
        metrics = {"step": step, "agreement": agree}
        score = agree
        if self_heldout is not None:
            metrics["self_instruct_agreement"] = agreement(draft, self_labels, self_heldout, pad)
            if args.select_on == "mean":
                score = (agree + metrics["self_instruct_agreement"]) / 2
                metrics["selected_on_mean"] = score
        draft.train()
        if score > best:
            best = score
            export_draft(draft, out / "best")
            (out / "best" / "metrics.json").write_text(json.dumps(metrics))
            (out / "best" / "head_tokens.json").write_text(json.dumps({"token_ids": vocab}))
        torch.save({"draft": trainable_state(draft), "optimizer": opt.state_dict(), "step": step,
                    "best_agreement": best, "layers": layers,
                    "train_seconds": seconds_before + time.time() - start}, ckpt_path)
        log({"step": step, "heldout_agreement": round(agree, 4), "best": round(best, 4),
             **({"self_instruct_agreement": round(metrics["self_instruct_agreement"], 4)} if self_heldout else {}),
             "elapsed_s": round(time.time() - start, 1)})
        return best

    start = time.time()
    if step == 0:
        best = evaluate_and_save(0, best)
    draft.train()
    bar = tqdm(total=args.steps, initial=step, desc="train-draft", unit="step")
    window = LossWindow()
    while step < args.steps:
        if args.minutes and seconds_before + time.time() - start > 60 * args.minutes:
            log({"stage": "train", "stopped": "time budget", "step": step})
            break
        batch = [train[i] for i in batches[batch_for_step(step, len(batches), args.seed)]]
        ids, rows, cols, labels = collate(batch, pad, label_map)
        keep = labels >= 0
        hidden = draft.model(input_ids=ids).last_hidden_state[rows[keep], cols[keep]]
        logits = hidden @ head.T
        loss = torch.nn.functional.cross_entropy(logits, labels[keep])
        if args.soft_weight and soft_seqs:
            # + cross-entropy to the target's top-k distribution (renormalised over the kept tokens)
            soft_ids, soft_p = collate_soft(batch, label_map, args.soft_k)
            soft_ids, soft_p = soft_ids[keep], soft_p[keep]
            has = soft_p.sum(-1) > 0
            if bool(has.any()):
                logq = logits[has].log_softmax(-1).gather(1, soft_ids[has].clamp(min=0))
                loss = loss + args.soft_weight * -(soft_p[has] * logq).sum(-1).mean()
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args, seconds_before + time.time() - start)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        bar.update(1)
        window.add(float(loss.detach()), int(keep.sum()))
        if step % args.log_every == 0 or step == args.steps:
            bar.set_postfix(loss=f"{window.mean:.3f}")
            log(window.record(step, opt.param_groups[0]["lr"], start))
        if step % args.eval_every == 0 or step == args.steps:
            best = evaluate_and_save(step, best)
    bar.close()
    if step % args.eval_every and step != args.steps:
        best = evaluate_and_save(step, best)
    return {"layers": layers, "step": step, "best_agreement": best}


# ---------------------------------------------------------------------------------------------------------------
# command

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pair", default="embedded", help="model pair whose target is distilled (embedded, tiny-random)")
    p.add_argument("--prompts", nargs="+", default=[str(DEFAULT_PROMPTS)],
                   help="JSON prompt files or folders of them (objects with 'question' or 'goal')")
    p.add_argument("--out", default="runs/distill", help="working folder: data, checkpoint, log, best export")
    p.add_argument("--stage", default="all", choices=["all", "generate", "label", "onpolicy", "train", "export"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave torch's default)")
    g = p.add_argument_group("generate")
    g.add_argument("--prompt-source", default="files", choices=["files", "self"],
                   help="files: --prompts; self: the target writes the user instructions itself (self_instruct.py)")
    g.add_argument("--heldout", type=int, default=64, help="prompts kept apart for measuring agreement")
    g.add_argument("--self-heldout", type=int, default=32,
                   help="with --prompt-source self: self-written instructions kept apart (data/heldout-self.jsonl)")
    g.add_argument("--instruction-max-tokens", type=int, default=64,
                   help="with --prompt-source self: longest instruction sampled (T = 1, top-p 0.95)")
    g.add_argument("--instruction-openers", default="none", choices=["none", "tasks"],
                   help="with --prompt-source self: 'tasks' starts each batch's user turns with a generic task word "
                        "(Write, Explain, Translate, Solve, ...; self_instruct.TASK_OPENERS) for more varied tasks; "
                        "the held-out shard is always sampled free")
    g.add_argument("--gen-prompts", type=int, default=2000, help="training prompts to answer")
    g.add_argument("--gen-minutes", type=float, default=0, help="stop generating after this long (0: no limit)")
    g.add_argument("--gen-batch", type=int, default=32)
    g.add_argument("--gen-max-new-tokens", type=int, default=128)
    g.add_argument("--gen-dtype", default="fp32",
                   help="dtype of the target while generating (bf16 is only faster on CPUs with bf16 instructions)")
    g.add_argument("--shard-prompts", type=int, default=128, help="prompts per saved shard")
    g.add_argument("--gen-skip", type=int, default=0,
                   help="skip this many training prompts (already answered by an earlier run with the same seed)")
    g.add_argument("--shard-prefix", default="train", help="file name prefix of generated shards (train-*)")
    g.add_argument("--gen-topk", type=int, default=0,
                   help="also store the target's top-k tokens and log-probabilities per answer position")
    g.add_argument("--label-prompts", type=int, default=0,
                   help="also label this many reference answers (PIQA solutions) with the target's argmax")
    g.add_argument("--label-minutes", type=float, default=0)
    o = p.add_argument_group("onpolicy (onpolicy.py: the draft writes answers to the training prompts, the target "
                             "labels them)")
    o.add_argument("--onpolicy-prompts", type=int, default=0,
                   help="training prompts the draft answers (0: none in --stage all, every prompt in --stage onpolicy)")
    o.add_argument("--onpolicy-minutes", type=float, default=0, help="stop after this long (0: no limit)")
    o.add_argument("--onpolicy-temperature", type=float, default=0.7,
                   help="the draft samples its answers at this temperature (0: greedy)")
    o.add_argument("--onpolicy-prompt-source", default="training", choices=["training", "passage-tasks"],
                   help="the training shards' prompts, or task instructions (summarise, translate, rewrite, ...) "
                        "over the target's answers in them (task_prompts.py)")
    o.add_argument("--onpolicy-draft", default=None,
                   help="exported draft folder that writes (default: the pair's draft, e.g. the shipped one)")
    t = p.add_argument_group("train")
    t.add_argument("--layers", default="auto",
                   help="target layers the draft starts from, e.g. 0,1,29; auto picks the best untrained candidate")
    t.add_argument("--init-candidates", default=";".join(DEFAULT_INIT_CANDIDATES))
    t.add_argument("--train-vocab", default="data", choices=["data", "full"])
    t.add_argument("--select-on", default="heldout", choices=["heldout", "mean"],
                   help="best checkpoint by agreement on data/heldout.jsonl, or by the mean of it and the "
                        "self-instruct held-out set (data/heldout-self.jsonl) when there is one")
    t.add_argument("--vocab-max", type=int, default=16384,
                   help="at most this many output tokens (the most frequent labels + end-of-sequence)")
    t.add_argument("--soft-weight", type=float, default=0.0,
                   help="weight of a cross-entropy to the target's stored top-k distribution (--gen-topk data)")
    t.add_argument("--soft-k", type=int, default=8)
    t.add_argument("--init-from", default=None,
                   help="start from an exported draft folder (e.g. runs/distill/best) instead of target layers")
    t.add_argument("--steps", type=int, default=1000)
    t.add_argument("--minutes", type=float, default=0, help="stop training after this long (0: no limit)")
    t.add_argument("--batch-tokens", type=int, default=2048, help="padded tokens per batch")
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup", type=int, default=20)
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--log-every", type=int, default=10)
    t.add_argument("--eval-every", type=int, default=100)
    t.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--export", default=None, help="folder to write the best draft to (e.g. dynasd/assets/draft-smollm2)")


def open_log(out: Path):
    """A JSON Lines training log in `out` (appended to, so resumed runs keep one history)."""
    out.mkdir(parents=True, exist_ok=True)
    log_file = (out / "log.jsonl").open("a")

    def log(record: dict) -> None:
        log_file.write(json.dumps({"time": round(time.time(), 1), **record}) + "\n")
        log_file.flush()

    log.close = log_file.close
    return log


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    out = Path(args.out)
    log = open_log(out)

    if args.stage in ("all", "generate"):
        generate_stage(args, log)
    if args.stage in ("all", "label") and args.label_prompts:
        label_stage(args, log)
    if args.stage == "onpolicy" or (args.stage == "all" and args.onpolicy_prompts):
        from .onpolicy import onpolicy_stage

        onpolicy_stage(args, log)
    if args.stage in ("all", "train"):
        summary = train_stage(args, log)
        print(json.dumps(summary))
    if args.export:
        export_best(out, args.export)
    log.close()
    return 0
