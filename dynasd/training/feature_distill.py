"""`python -m dynasd train-feature-draft`: train a feature draft (dynasd/feature_draft.py) for the pair's target.

Three stages, each resumable from the files it leaves in `--out`:
1. features: the target reads the token sequences of a `train-draft` data folder (its own greedy answers to
   training prompts, `python -m dynasd train-draft --stage generate`) once, teacher-forced, and keeps its final
   normed hidden state at every position plus, at every answer position, its argmax and top-k log-probabilities.
   Stored per shard as `features/<shard>.pt` (fp16 states).
2. train: a draft of the target's `--layers` (default its last layer; embedding and output layer shared, frozen)
   plus the input mixer learns, at every answer position i, from (token i, target state i-1): cross-entropy to the
   target's argmax, to its top-k distribution, and a regression of its own final state onto the target's state i.
   The regression is what lets the decoder feed the draft's state to a node's children (the target has not read
   them yet). Input states get small uniform noise, as the draft's own states will be a little off. The softmax
   runs over a reduced vocabulary (`--head-tokens`, e.g. the token draft's), which the engine's head keeps too.
   Held-out agreement is measured with the target's states (depth 1) and with the draft's own previous state
   (depth 2, what every deeper tree level sees).
3. export: config.json (with `dynasd_feature_draft`) + fp16 weights without the shared embedding, loaded by
   `models.load_distilled_draft` like the token draft.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .distill import (LossWindow, batch_for_step, export_best, export_draft, load_sequences, lr_at, make_batches,
                      open_log, parse_layers, trainable_state)
from ..feature_draft import add_feature_input, draft_inputs


@dataclass
class FeatureSequence:
    """A token sequence with the target's states at every position and its labels at the answer positions
    (answer_start - 1 .. len - 2, each predicting the next token)."""

    ids: list[int]
    answer_start: int
    states: torch.Tensor          # [len, hidden] fp16
    labels: torch.Tensor          # [answers] target argmax
    topk_ids: torch.Tensor        # [answers, k]
    topk_logp: torch.Tensor       # [answers, k]


# ---------------------------------------------------------------------------------------------------------------
# 1. features

@torch.inference_mode()
def target_features(target, seqs, pad_id: int, topk: int, batch_tokens: int = 2048) -> list[FeatureSequence]:
    out: list[FeatureSequence | None] = [None] * len(seqs)
    for batch in make_batches(seqs, batch_tokens):
        width = max(len(seqs[i].ids) for i in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        for r, i in enumerate(batch):  # right padding: causal attention never reads it
            ids[r, :len(seqs[i].ids)] = torch.tensor(seqs[i].ids)
        states = target.model(input_ids=ids).last_hidden_state
        for r, i in enumerate(batch):
            s = seqs[i]
            answer = states[r, s.answer_start - 1:len(s.ids) - 1]
            logp = target.lm_head(answer).float().log_softmax(-1)
            top = logp.topk(topk, dim=-1)
            out[i] = FeatureSequence(list(s.ids), s.answer_start, states[r, :len(s.ids)].to(torch.float16).clone(),
                                     logp.argmax(-1), top.indices.to(torch.int32), top.values.to(torch.float16))
    return out


def features_stage(args, log) -> None:
    from tqdm import tqdm

    from ..models import load_pair

    data_dir, feature_dir = Path(args.data) / "data", Path(args.out) / "features"
    feature_dir.mkdir(parents=True, exist_ok=True)
    shards = sorted(data_dir.glob("*.jsonl"))
    if not shards:
        raise FileNotFoundError(f"no generated data in {data_dir} (run `train-draft --stage generate` first)")
    pair = load_pair(args.pair, device="cpu", dtype="fp32")  # inference only: the fast kernels are welcome
    start, tokens = time.time(), 0
    for shard in tqdm(shards, desc="features", unit="shard"):
        path = feature_dir / f"{shard.stem}.pt"
        if path.is_file():
            continue
        seqs = [s for s in load_sequences([shard]) if len(s.ids) > s.answer_start]
        feats = target_features(pair.target, seqs, pair.pad_id, args.topk)
        torch.save([vars(f) for f in feats], path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)
        tokens += sum(len(s.ids) for s in seqs)
        log({"stage": "features", "shard": shard.stem, "sequences": len(seqs), "tokens": tokens,
             "tokens_per_s": round(tokens / (time.time() - start), 1)})


def load_features(paths) -> list[FeatureSequence]:
    return [FeatureSequence(**record) for path in paths for record in torch.load(path, weights_only=False)]


# ---------------------------------------------------------------------------------------------------------------
# 2. train

def build_feature_draft(target, layers: list[int], init_from: str | None = None, state_scale: float = 1.0):
    """The target's `layers` + final norm + the input mixer ([I | state_scale I] at first); embedding and output
    layer shared and frozen.

    With `init_from` (an exported token draft, `train-draft --export`), its layers and weights instead, and a mixer
    that starts by ignoring the states: the draft starts exactly as good as the token draft."""
    from .distill import draft_from_target

    if init_from is None:
        return add_feature_input(draft_from_target(target, layers), state_scale=state_scale)
    from safetensors.torch import load_file

    config = json.loads((Path(init_from) / "config.json").read_text())
    draft = draft_from_target(target, list(config["dynasd_source_layers"]))
    state = load_file(str(Path(init_from) / "model.safetensors"))
    draft.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    return add_feature_input(draft, state_scale=0.0)


def batch_of(seqs: list[FeatureSequence], pad_id: int):
    """Right-padded ids, input states (the target's state one position earlier, zeros at 0), and per answer
    position (row, column) with its label, top-k and the target's own state there."""
    width = max(len(s.ids) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    states = torch.zeros(len(seqs), width, seqs[0].states.shape[1])
    rows, cols = [], []
    for r, s in enumerate(seqs):
        n = len(s.ids)
        ids[r, :n] = torch.tensor(s.ids)
        states[r, :n] = s.states.float()
        rows += [r] * (n - s.answer_start)
        cols += range(s.answer_start - 1, n - 1)
    inputs = torch.zeros_like(states)
    inputs[:, 1:] = states[:, :-1]
    rows_t, cols_t = torch.tensor(rows), torch.tensor(cols)
    labels = torch.cat([s.labels for s in seqs])
    topk_ids = torch.cat([s.topk_ids for s in seqs]).long()
    topk_logp = torch.cat([s.topk_logp for s in seqs]).float()
    return ids, inputs, rows_t, cols_t, labels, topk_ids, topk_logp, states[rows_t, cols_t]


def draft_states(draft, ids: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    return draft.model(inputs_embeds=draft_inputs(draft, ids, inputs)).last_hidden_state


@torch.no_grad()
def agreement(draft, seqs: list[FeatureSequence], head: torch.Tensor, vocab: torch.Tensor, pad_id: int,
              batch_tokens: int = 2048) -> tuple[float, float]:
    """Top-1 agreement with the target's argmax at answer positions: (depth 1: every input state the target's;
    depth 2: the input state at each position the draft's own from the position before, as deeper tree levels
    see it)."""
    hits, total = [0, 0], 0
    for batch in make_batches(seqs, batch_tokens):
        ids, inputs, rows, cols, labels, *_ = batch_of([seqs[i] for i in batch], pad_id)
        first = draft_states(draft, ids, inputs)
        own = torch.zeros_like(inputs)
        own[:, 1:] = first[:, :-1]
        for depth, states in enumerate((first, draft_states(draft, ids, own))):
            hits[depth] += int((vocab[(states[rows, cols] @ head.T).argmax(-1)] == labels).sum())
        total += len(labels)
    return hits[0] / max(total, 1), hits[1] / max(total, 1)


def initial_state_scale(args, target, train: list[FeatureSequence]) -> float:
    """--state-scale, or with 'auto' the ratio of token-embedding to state lengths: the mixer then starts with both
    inputs the same size (SmolLM2-135M's states are ~15x longer, and at scale 1 they swamp the token)."""
    if args.state_scale != "auto":
        return float(args.state_scale)
    states = torch.cat([s.states[:256].float() for s in train[:64]])
    embeddings = target.model.embed_tokens.weight.detach().float()
    return float(embeddings.norm(dim=-1).mean() / states.norm(dim=-1).mean())


def read_vocab(args, train: list[FeatureSequence], eos: set[int], vocab_size: int) -> list[int]:
    """The training softmax's tokens: `--head-tokens` (a head_tokens.json), else the most frequent labels."""
    if args.head_tokens:
        return sorted(json.loads(Path(args.head_tokens).read_text())["token_ids"])
    counts = torch.bincount(torch.cat([s.labels for s in train]), minlength=vocab_size)
    order = [t for t in counts.argsort(descending=True).tolist() if counts[t] > 0 and t not in eos]
    return sorted(set(order[:max(0, args.vocab_max - len(eos))]) | eos)


def train_stage(args, log) -> dict:
    from tqdm import tqdm

    from ..models import load_pair

    out = Path(args.out)
    if args.lr is None:
        args.lr = 3e-5 if args.init_from else 1e-3
    feature_files = sorted((out / "features").glob("*.pt"))
    held = [p for p in feature_files if p.stem.startswith("heldout")]
    train_files = [p for p in feature_files if not p.stem.startswith("heldout")]
    if not train_files or not held:
        raise FileNotFoundError(f"no training or held-out features in {out / 'features'} (run --stage features)")
    train, heldout = load_features(train_files), load_features(held)
    pair = load_pair(args.pair, device="cpu", dtype="fp32", fast_kernels=False)
    target, pad = pair.target, pair.pad_id
    for p in target.parameters():
        p.requires_grad_(False)
    layers = parse_layers(args.layers) if args.layers != "last" else [target.config.num_hidden_layers - 1]
    state_scale = initial_state_scale(args, target, train)
    draft = build_feature_draft(target, layers, args.init_from, state_scale)
    layers = list(draft.config.dynasd_source_layers)
    if args.init_from:
        # The mixer's token half stays the identity (the trained layers read embeddings); only the state half,
        # starting at zero, and the bias learn. Keep --lr small: the target's states are ~15x longer than token
        # embeddings (norm ~46 vs ~3.2 for SmolLM2), so at lr 1e-3 the state term outgrew the embedding within
        # 100 steps and held-out agreement fell from 0.53 to 0.32-0.37 (session 13); 3e-5 keeps it growing gently.
        width = draft.config.hidden_size
        draft.model.feature_fc.weight.register_hook(
            lambda grad: torch.cat([torch.zeros_like(grad[:, :width]), grad[:, width:]], dim=1))

    vocab_list = read_vocab(args, train, set(pair.eos_token_ids), pair.vocab_size)
    vocab = torch.tensor(vocab_list)
    label_map = torch.full((pair.vocab_size,), -100, dtype=torch.long)
    label_map[vocab] = torch.arange(len(vocab))
    head = draft.lm_head.weight[vocab].detach()
    (out / "head_tokens.json").write_text(json.dumps({"token_ids": vocab_list}))

    params = [p for p in draft.parameters() if p.requires_grad]
    # The mixer is new; the layers may come trained (--init-from) and then move more slowly (--layer-lr-scale).
    mixer = list(draft.model.feature_fc.parameters())
    rest = [p for p in params if all(p is not m for m in mixer)]
    opt = torch.optim.AdamW([{"params": mixer, "scale": 1.0}, {"params": rest, "scale": args.layer_lr_scale}],
                            lr=args.lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    ckpt_path = out / "checkpoint.pt"
    step, best, seconds_before = 0, -1.0, 0.0
    if args.resume and ckpt_path.is_file():
        ckpt = torch.load(ckpt_path, weights_only=False)
        draft.load_state_dict(ckpt["draft"], strict=False)
        opt.load_state_dict(ckpt["optimizer"])
        step, best, seconds_before = ckpt["step"], ckpt["best"], ckpt["train_seconds"]
    torch.manual_seed(args.seed + step)
    batches = make_batches(train, args.batch_tokens)
    log({"stage": "train", "layers": layers, "train_sequences": len(train), "batches_per_epoch": len(batches),
         "train_answer_tokens": sum(len(s.labels) for s in train), "train_vocab": len(vocab_list),
         "heldout_answer_tokens": sum(len(s.labels) for s in heldout), "resumed_at": step,
         "initial_state_scale": None if args.init_from else round(state_scale, 5)})
    start = time.time()

    def evaluate_and_save(step: int, best: float) -> float:
        draft.eval()
        depth1, depth2 = agreement(draft, heldout, head, vocab, pad)
        draft.train()
        # Depth 1 is what every tree's first level meets, depth 2 what the deeper levels meet; both count.
        if (depth1 + depth2) / 2 > best:
            best = (depth1 + depth2) / 2
            export_draft(draft, out / "best")
            (out / "best" / "head_tokens.json").write_text(json.dumps({"token_ids": vocab_list}))
            (out / "best" / "metrics.json").write_text(json.dumps(
                {"step": step, "agreement_depth1": depth1, "agreement_depth2": depth2}))
        torch.save({"draft": trainable_state(draft), "optimizer": opt.state_dict(), "step": step, "best": best,
                    "train_seconds": seconds_before + time.time() - start}, ckpt_path)
        log({"step": step, "heldout_agreement_depth1": round(depth1, 4), "heldout_agreement_depth2": round(depth2, 4),
             "best": round(best, 4), "elapsed_s": round(time.time() - start, 1)})
        return best

    if step == 0:
        best = evaluate_and_save(0, best)
    draft.train()
    bar = tqdm(total=args.steps, initial=step, desc="train-feature-draft", unit="step")
    window = LossWindow()
    while step < args.steps:
        if args.minutes and seconds_before + time.time() - start > 60 * args.minutes:
            log({"stage": "train", "stopped": "time budget", "step": step})
            break
        ids, inputs, rows, cols, labels, topk_ids, topk_logp, goal = batch_of(
            [train[i] for i in batches[batch_for_step(step, len(batches), args.seed)]], pad)
        if args.state_noise:  # the draft's own states, fed to tree nodes, are a little off the target's
            scale = inputs.pow(2).mean().sqrt()
            inputs = inputs + (torch.rand_like(inputs) * 2 - 1) * args.state_noise * scale
        states = draft_states(draft, ids, inputs)[rows, cols]
        logits = states @ head.T
        mapped = label_map[labels]
        keep = mapped >= 0
        loss = F.cross_entropy(logits[keep], mapped[keep])
        if args.soft_weight:
            soft_ids = label_map[topk_ids]
            soft_p = topk_logp.exp() * (soft_ids >= 0)
            soft_p = soft_p / soft_p.sum(-1, keepdim=True).clamp(min=1e-9)
            logq = logits.log_softmax(-1).gather(1, soft_ids.clamp(min=0))
            loss = loss + args.soft_weight * -(soft_p * logq).sum(-1).mean()
        if args.state_weight:
            loss = loss + args.state_weight * F.smooth_l1_loss(states, goal)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args, seconds_before + time.time() - start) * group["scale"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        bar.update(1)
        window.add(float(loss.detach()), len(labels))
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
    p.add_argument("--pair", default="embedded", help="model pair whose target the draft serves")
    p.add_argument("--data", default="runs/distill",
                   help="a train-draft working folder whose data/ holds generated sequences (heldout*.jsonl are "
                        "kept for measuring agreement)")
    p.add_argument("--out", default="runs/feature-draft", help="working folder: features, checkpoint, log, best")
    p.add_argument("--stage", default="all", choices=["all", "features", "train", "export"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: leave torch's default)")
    p.add_argument("--export", default=None, help="folder to write the best draft to (e.g. "
                                                  "dynasd/assets/draft-smollm2-features)")
    p.add_argument("--topk", type=int, default=8, help="features: top-k log-probabilities kept per position")
    t = p.add_argument_group("train")
    t.add_argument("--layers", default="last", help="target layers the draft starts from ('last' or e.g. 0,29)")
    t.add_argument("--state-scale", default="auto",
                   help="from scratch: the mixer's initial weight on the states ('auto': embedding length / state "
                        "length, so neither input swamps the other)")
    t.add_argument("--init-from", default=None,
                   help="an exported token draft (e.g. dynasd/assets/draft-smollm2) to start from instead of --layers")
    t.add_argument("--head-tokens", default=None,
                   help="head_tokens.json of the training softmax (default: the --vocab-max most frequent labels)")
    t.add_argument("--vocab-max", type=int, default=16384)
    t.add_argument("--soft-weight", type=float, default=0.5, help="weight of the top-k cross-entropy")
    t.add_argument("--state-weight", type=float, default=1.0, help="weight of the state regression")
    t.add_argument("--state-noise", type=float, default=0.05,
                   help="uniform noise on input states, relative to their RMS")
    t.add_argument("--steps", type=int, default=1000)
    t.add_argument("--minutes", type=float, default=0, help="stop training after this long (0: no limit)")
    t.add_argument("--batch-tokens", type=int, default=2048, help="padded tokens per batch")
    t.add_argument("--lr", type=float, default=None,
                   help="the mixer's learning rate (default 1e-3 from scratch, 3e-5 with --init-from: see train_stage)")
    t.add_argument("--layer-lr-scale", type=float, default=1.0,
                   help="the layers' learning rate relative to the mixer's (--lr)")
    t.add_argument("--warmup", type=int, default=20)
    t.add_argument("--weight-decay", type=float, default=0.0)
    t.add_argument("--log-every", type=int, default=10)
    t.add_argument("--eval-every", type=int, default=100)
    t.add_argument("--resume", action="store_true")


def run(args: argparse.Namespace) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open_log(out)
    if args.stage in ("all", "features"):
        features_stage(args, log)
    if args.stage in ("all", "train"):
        result = train_stage(args, log)
        print(json.dumps(result))
    if args.stage in ("all", "export") and args.export:
        export_best(out, args.export)
    log.close()
    return 0
