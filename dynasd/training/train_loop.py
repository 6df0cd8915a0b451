"""The optimisation loop both draft trainers share: seeded batch order, warmup + cosine learning rate, a loss
window for the log, time budgets across resumed runs, and the evaluations that keep checkpoints.

Why a module of its own: the token draft (`train-draft`) and the feature draft (`train-feature-draft`) differ only
in what a step's loss is and what an evaluation measures; the loop around them, and so how a resumed run continues
the same sequence of batches and learning rates, is written once.
"""
from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from .export import trainable_state


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


class TrainClock:
    """Training time across resumed runs: the seconds a checkpoint recorded (`before`) plus this run's."""

    def __init__(self, before: float = 0.0) -> None:
        self.before, self.start = before, time.time()

    def elapsed(self) -> float:
        """Seconds of this run."""
        return time.time() - self.start

    def total(self) -> float:
        """Seconds of training in all runs (what `--minutes` and the learning-rate schedule count)."""
        return self.before + time.time() - self.start


def save_checkpoint(path: Path, draft, opt: torch.optim.Optimizer, **fields) -> None:
    """Everything `--resume` needs: the draft's trained tensors, the optimiser and the caller's `fields` (step,
    best score, training seconds, ...)."""
    torch.save({"draft": trainable_state(draft), "optimizer": opt.state_dict(), **fields}, path)


def optimise(args, draft, opt: torch.optim.Optimizer, params: list[torch.Tensor], step: int, clock: TrainClock,
             loss_at: Callable[[int], tuple[torch.Tensor, int]], evaluate: Callable[[int], None], log,
             desc: str) -> int:
    """Optimise from `step` to `--steps` (or until `--minutes` of training), returns the step reached.

    `loss_at(step)` gives the step's loss and the number of label tokens it averages; `evaluate(step)` measures and
    saves (it runs first when starting at step 0, every `--eval-every` steps and at the end). Each parameter group's
    learning rate is the schedule's times its "scale" (1 when it has none); gradients are clipped to norm 1."""
    if step == 0:
        evaluate(0)
    draft.train()
    bar = tqdm(total=args.steps, initial=step, desc=desc, unit="step")
    window = LossWindow()
    while step < args.steps:
        if args.minutes and clock.total() > 60 * args.minutes:
            log({"stage": "train", "stopped": "time budget", "step": step})
            break
        loss, tokens = loss_at(step)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args, clock.total()) * group.get("scale", 1.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        bar.update(1)
        window.add(float(loss.detach()), tokens)
        if step % args.log_every == 0 or step == args.steps:
            bar.set_postfix(loss=f"{window.mean:.3f}")
            log(window.record(step, opt.param_groups[0]["lr"], clock.start))
        if step % args.eval_every == 0 or step == args.steps:
            evaluate(step)
    bar.close()
    if step % args.eval_every and step != args.steps:
        evaluate(step)
    return step
