"""`train-feature-draft --stage train`: a feature draft (dynasd/loading/feature_model.py) learns from the target's
states.

A draft of the target's `--layers` (default its last layer; embedding and output layer shared, frozen) plus the
input mixer learns, at every answer position i, from (token i, target state i-1): cross-entropy to the target's
argmax, to its top-k distribution, and a regression of its own final state onto the target's state i. The
regression is what lets the decoder feed the draft's state to a node's children (the target has not read them yet).
Input states get small uniform noise, as the draft's own states will be a little off. The softmax runs over a
reduced vocabulary (`--head-tokens`, e.g. the token draft's), which the engine's head keeps too. Held-out agreement
is measured with the target's states (depth 1) and with the draft's own previous state (depth 2, what every deeper
tree level sees).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from ..loading.feature_model import add_feature_input, draft_inputs
from ..loading.models import load_pair
from .batches import make_batches, vocabulary_rows
from .export import keep_if_best, trainable_state
from .feature_data import SELECT_PREFIX, FeatureSequence, batch_of, load_features
from .layer_draft import draft_from_export, draft_from_target, parse_layers
from .train_loop import TrainClock, batch_for_step, optimise, save_checkpoint


def build_feature_draft(target, layers: list[int], init_from: str | None = None, state_scale: float = 1.0):
    """The target's `layers` + final norm + the input mixer ([I | state_scale I] at first); embedding and output
    layer shared and frozen.

    With `init_from` (an exported token draft, `train-draft --export`), its layers and weights instead, and a mixer
    that starts by ignoring the states: the draft starts exactly as good as the token draft."""
    if init_from is None:
        return add_feature_input(draft_from_target(target, layers), state_scale=state_scale)
    return add_feature_input(draft_from_export(target, init_from), state_scale=0.0)


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
    """The training softmax's tokens (`--vocab-max` of them, end-of-sequence included): `--head-tokens` (a
    head_tokens.json) as it is; else the most frequent labels, and with `--vocab-fill` (a head_tokens.json made
    from more text) the `--vocab-top` most frequent labels, filled up with that file's tokens in id order.

    Why the fill: a byte-pair vocabulary numbers its tokens in merge order, roughly most frequent first, so the
    lowest ids of a head learnt on 1.8M tokens cover far more of the benchmark's answers than the rarer labels of a
    few hundred thousand (8,192 tokens: 0.91 of Spec-Bench's labels against 0.87)."""
    if args.head_tokens:
        return sorted(json.loads(Path(args.head_tokens).read_text())["token_ids"])
    counts = torch.bincount(torch.cat([s.labels for s in train]), minlength=vocab_size)
    order = [t for t in counts.argsort(descending=True).tolist() if counts[t] > 0 and t not in eos]
    if args.vocab_fill:
        fill = sorted(json.loads(Path(args.vocab_fill).read_text())["token_ids"])
        order = list(dict.fromkeys(order[:args.vocab_top] + [t for t in fill if t not in eos]))
    return sorted(set(order[:max(0, args.vocab_max - len(eos))]) | eos)


def load_warm_start(draft, path: Path) -> None:
    """Load an exported draft folder (model.safetensors, e.g. the shipped assets/draft-smollm2-features) or a
    checkpoint.pt into `draft`; both must hold the same tensors (the shared embedding and head in neither)."""
    state = load_file(str(path / "model.safetensors")) if path.is_dir() else \
        torch.load(path, weights_only=False)["draft"]
    result = draft.load_state_dict(state, strict=False)
    differ = result.unexpected_keys + [k for k in result.missing_keys if k in trainable_state(draft)]
    if differ:
        raise ValueError(f"{path} is not a draft of this shape ({', '.join(differ[:3])} differ): start it with "
                         "the same --layers")


def train_stage(args, log) -> dict:
    out = Path(args.out)
    if args.lr is None:
        args.lr = 3e-5 if args.init_from else 1e-3
    feature_files = sorted((out / "features").glob("*.pt"))
    held = [p for p in feature_files if p.stem.startswith("heldout")]
    selection = {p.stem[len(SELECT_PREFIX):]: load_features([p]) for p in feature_files
                 if p.stem.startswith(SELECT_PREFIX)}
    train_files = [p for p in feature_files if p not in held and not p.stem.startswith(SELECT_PREFIX)]
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
        # starting at zero, learns. Keep --lr small: the target's states are ~15x longer than token
        # embeddings (norm ~46 vs ~3.2 for SmolLM2), so at lr 1e-3 the state term outgrew the embedding within
        # 100 steps and held-out agreement fell from 0.53 to 0.32-0.37; 3e-5 keeps it growing gently.
        width = draft.config.hidden_size
        draft.model.feature_fc.weight.register_hook(
            lambda grad: torch.cat([torch.zeros_like(grad[:, :width]), grad[:, width:]], dim=1))

    if args.warm_start:  # a trained draft's weights on new text: a new schedule and optimiser, not a resume
        load_warm_start(draft, Path(args.warm_start))
    vocab_list = read_vocab(args, train, set(pair.eos_token_ids), pair.vocab_size)
    vocab = torch.tensor(vocab_list)
    label_map = vocabulary_rows(vocab, pair.vocab_size)
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
    clock = TrainClock(seconds_before)

    def evaluate(step: int) -> None:
        nonlocal best
        draft.eval()
        depth1, depth2 = agreement(draft, heldout, head, vocab, pad)
        by_category = {name: agreement(draft, seqs, head, vocab, pad) for name, seqs in selection.items()}
        draft.train()
        metrics = {"step": step, "agreement_depth1": depth1, "agreement_depth2": depth2,
                   "train_tokens_seen": step * args.batch_tokens, "train_seconds": round(clock.total(), 1)}
        score = (depth1 + depth2) / 2
        if selection:  # the benchmark's answers decide: a draft is chosen on the text it will verify
            sizes = {name: sum(len(s.labels) for s in seqs) for name, seqs in selection.items()}
            select1, select2 = (sum(sizes[n] * by_category[n][d] for n in sizes) / sum(sizes.values())
                                for d in (0, 1))
            metrics |= {"select_depth1": select1, "select_depth2": select2,
                        "select_by_category": {n: [round(a, 4) for a in by_category[n]] for n in sizes}}
            score = (select1 + select2) / 2
        # Depth 1 is what every tree's first level meets, depth 2 what the deeper levels meet; both count.
        best = keep_if_best(draft, out / "best", score, best, metrics, vocab_list)
        save_checkpoint(ckpt_path, draft, opt, step=step, best=best, train_seconds=clock.total())
        log({**{k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()},
             "heldout_agreement_depth1": round(depth1, 4), "heldout_agreement_depth2": round(depth2, 4),
             "best": round(best, 4), "elapsed_s": round(clock.elapsed(), 1)})

    def loss_at(step: int) -> tuple[torch.Tensor, int]:
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
        return loss, len(labels)

    step = optimise(args, draft, opt, params, step, clock, loss_at, evaluate, log, desc="train-feature-draft")
    return {"layers": layers, "step": step, "best_agreement": best}
