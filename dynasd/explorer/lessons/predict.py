"""Predict, then reveal: the learner commits a guess about a step before its verdict is shown, and the reveal
scores it with the right answer and one line of why, taken from the trace's own numbers.

Why: a visualisation teaches little unless the learner responds to it, and predicting before the answer is shown
improves recall. Two questions, both answered by the recorded step alone (so they work on replayed and example
traces with no model loaded):
- how many tokens will this step commit? (Play; `node` -1)
- will this tested node pass its test? (the guided step; `node` is the node, the guess 1 or 0)

Guesses are RunTrace.predictions: a saved trace keeps them, and loading it restores the guesses and the score.
A step once seen stays seen: a step guessed or revealed, or shown with its verdicts before 'Let me predict first'
was ticked (or during a Run), has a prediction in the trace, and no view hides it again (`seen_steps`). Until then
no view of the step tells its answer, and no view draws a later step the learner has not seen (`as_far_as_seen`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

from ...sampling import passes
from ...trace import Prediction, RunTrace, StepTrace
from ..inputs import UserError

COMMIT = -1  # the node of a "how many tokens will this step commit?" guess


@dataclass(frozen=True)
class Reveal:
    """A scored guess: whether it was right, the right answer in words, why, and the run's score after it."""

    correct: bool
    answer: str
    why: str
    right: int
    asked: int
    repeated: bool = False  # the question had been answered already: the first guess stands

    def markdown(self) -> str:
        mark = "✓ right" if self.correct else "✗ not quite"
        again = " (you had answered this already: your first guess counts)" if self.repeated else ""
        return f"**{mark}**{again}: {self.answer}. {self.why}"


REVEALED = -1  # the guess of a step revealed with no guess (a presenter, or a step already seen): not scored


def score(run: RunTrace) -> tuple[int, int]:
    """(right, asked) over every guess made on this run."""
    scored = [g for g in run.predictions if g.guess != REVEALED]
    return sum(g.guess == g.answer for g in scored), len(scored)


def reveal(run: RunTrace, index: int) -> None:
    """Show step `index`'s verdicts with no guess (a presenter's reveal); kept with the run, never scored."""
    if run is None or not 0 <= int(index) < len(run.steps):
        raise UserError("no step to reveal: press Step first")
    if guessed(run, int(index)) is None:
        answer, _, _ = _commit_reveal(run, int(index))
        run.predictions.append(Prediction(step=int(index), node=COMMIT, guess=REVEALED, answer=answer))


def keep_seen(run: RunTrace, steps: Iterable[int]) -> None:
    """Steps the learner has seen with their verdicts, kept as revealed (never scored), so that no view hides them
    again: those shown before 'Let me predict first' was ticked, and those a Run showed."""
    seen = seen_steps(run)
    for index in steps:
        if index not in seen and 0 <= index < len(run.steps):
            run.predictions.append(Prediction(step=index, node=COMMIT, guess=REVEALED,
                                              answer=len(run.steps[index].committed)))
            seen.add(index)


def seen_steps(run: RunTrace) -> set[int]:
    """The steps whose commit was guessed or revealed: their views show their verdicts."""
    return {g.step for g in run.predictions if g.node == COMMIT}


def run_upto(run: RunTrace, count: int) -> RunTrace:
    """The run as it stood after its first `count` steps (the run itself when that is all of it): its tokens, time
    and finish as they were then, so that a view drawn from it counts nothing that came later."""
    if count >= len(run.steps):
        return run
    kept, later = run.steps[:count], run.steps[count:]
    return replace(run, steps=kept, new_token_ids=[t for s in kept for t in s.committed],
                   text="".join(t for s in kept for t in s.committed_tokens), finished="",
                   seconds=max(0.0, run.seconds - sum(s.seconds for s in later)))


def score_markdown(run: RunTrace | None) -> str:
    if run is None or not score(run)[1]:
        return "Score: no guesses yet."
    right, asked = score(run)
    return f"Score on this run (saved with its trace): **{right} of {asked}** right ({100 * right / asked:.0f}%)."


def guessed(run: RunTrace, step: int, node: int = COMMIT) -> Prediction | None:
    """The guess already made on this question, if any."""
    return next((g for g in run.predictions if g.step == step and g.node == node), None)


def tested_nodes(step: StepTrace) -> list[int]:
    """The nodes whose test a learner may predict: those the walk tested, in its order."""
    return list(step.tested) or [i for i, n in enumerate(step.nodes) if n.status in ("accepted", "rejected")]


def passed(step: StepTrace, node: int) -> bool:
    """Whether a tested node passed its test (accepted, or passed on a chain that lost: `unchosen`)."""
    return step.nodes[node].status in ("accepted", "unchosen")


def commit_question(run: RunTrace, index: int) -> str:
    """The Play question about step `index`, with what the learner may see before the reveal: the tree's size."""
    step = run.steps[index]
    if not step.nodes:
        return (f"**Step {index}: predict first.** No candidates this step (the target alone). How many tokens "
                "will it commit? Type a number and press **Reveal** (in lecture mode: V).")
    return (f"**Step {index}: predict first.** {len(step.nodes)} candidate(s) on {step.live_depth} level(s) wait "
            "for the verify (the tree shows them untested). How many tokens will this step commit, counting the "
            "target's own bonus or correction token? Type a number and press **Reveal** (in lecture mode: V).")


def node_question(step: StepTrace, node: int) -> str:
    """The guided step's question about one test, asked before its answer shows: a sampled test's p′ and q′ (u
    decides, hidden until the guess); at temperature 0 no p at all, since the target's p is the answer."""
    n = step.nodes[node]
    if n.u is not None and n.q_test:
        ratio = min(1.0, (n.p_test or 0.0) / n.q_test)
        return (f"**Predict:** will node {node} (`{n.token}`, level {n.level}) pass? p′ = {n.p_test:.3f}, "
                f"q′ = {n.q_test:.3f}, so it passes when u < min(1, p′/q′) = {ratio:.3f}; u is drawn once you "
                "answer.")
    return (f"**Predict:** will node {node} (`{n.token}`, level {n.level}) pass? At temperature 0 it passes iff it "
            "is the target's most likely token there; the target's p for it is shown once you answer.")


def _commit_reveal(run: RunTrace, index: int) -> tuple[int, str, str]:
    step = run.steps[index]
    answer = len(step.committed)
    drafted = sum(o not in ("bonus", "correction", "target") for o in step.committed_origins)
    final = step.committed_origins[-1] if step.committed_origins else ""
    if not step.nodes:
        why = "With no candidates the target's one forward gives exactly one token."
    elif final in ("bonus", "correction"):
        ending = ("every level on the path passed, so the target added a bonus token" if final == "bonus" else
                  "the walk stopped at a rejection, and the target's correction token took its place")
        why = (f"The walk accepted {drafted} candidate(s) of {len(step.nodes)} on {step.live_depth} level(s); "
               f"{ending}: {drafted} + 1 = {answer}.")
    else:
        why = f"The longest accepted chain had {answer} token(s) (ti-mcsd commits its path with no extra token)."
    return answer, f"step {index} committed {answer} token(s)", why


def _node_reveal(step: StepTrace, node: int) -> tuple[int, str, str]:
    n = step.nodes[node]
    answer = int(passed(step, node))
    verdict = "passed" if answer else "failed"
    if n.u is not None and n.q_test:
        below = passes(n.u, n.p_test or 0.0, n.q_test)
        ratio = min(1.0, (n.p_test or 0.0) / n.q_test)
        why = (f"u = {n.u:.3f} was {'below' if below else 'at or above'} min(1, p′/q′) = {ratio:.3f}"
               + (" (p′ ≥ q′: a token the target likes at least as much as the draft always passes)"
                  if ratio >= 1.0 else ""))
    else:
        why = (f"The target gives it p = {n.p:.3f}, and it "
               f"{'is' if answer else 'is not'} the target's most likely token there")
    return answer, f"node {node} (`{n.token}`) {verdict} its test", why + "."


def predict(run: RunTrace, index: int, node: int, guess: int) -> Reveal:
    """Score a guess about step `index` (node COMMIT: the tokens it commits; else: whether `node` passes) and
    keep it with the run. A question answered already is revealed again, scored by its first guess."""
    if run is None or not run.steps:
        raise UserError("nothing to predict yet: press Step or Run (or replay an example) first")
    if not 0 <= int(index) < len(run.steps):
        raise UserError(f"there is no step {index} in the run on show (0 to {len(run.steps) - 1})")
    index, node, guess = int(index), int(node), int(guess)
    step = run.steps[index]
    if node == COMMIT:
        if not 0 <= guess <= 1 + len(step.nodes) + 64:
            raise UserError(f"a step commits between 1 and {step.live_depth + 1} tokens; {guess} cannot be right")
        answer, said, why = _commit_reveal(run, index)
    else:
        if node not in tested_nodes(step):
            raise UserError(f"node {node} of step {index} was not tested: nothing to predict there")
        if guess not in (0, 1):
            raise UserError("the guess about a test is 1 (passes) or 0 (fails)")
        answer, said, why = _node_reveal(step, node)
    earlier = guessed(run, index, node)
    if earlier is None:
        run.predictions.append(Prediction(step=index, node=node, guess=guess, answer=answer))
    first = earlier.guess if earlier is not None else guess
    right, asked = score(run)
    return Reveal(first == answer, said, why, right, asked, repeated=earlier is not None)


def asks_first(session, index: int) -> str:
    """The question Play asks before showing step `index` of the session's run ('' when it shows the step):
    with 'Let me predict first' on, until that step's commit has been guessed; never during a Run."""
    run = session.run
    if not session.predict_first or session.run_in_progress or run is None or not 0 <= index < len(run.steps):
        return ""
    return "" if guessed(run, index) is not None else commit_question(run, index)


def as_far_as_seen(session, index: int) -> RunTrace:
    """The session's run as the views of step `index` may draw it (a run timeline draws every step it holds): the
    whole run, unless predictions are on; then only the steps before `index` while it waits for its guess, else
    up to it and on through the later steps already seen (a replayed trace holds steps the learner has not seen)."""
    run = session.run
    if asks_first(session, index):
        return run_upto(run, index)
    if not session.predict_first or session.run_in_progress:
        return run
    seen, count = seen_steps(run), index + 1
    while count < len(run.steps) and count in seen:
        count += 1
    return run_upto(run, count)


def pending_test(run: RunTrace, index: int, tests_done: int) -> int | None:
    """The node of the guided step's test phase number `tests_done` (1-based) while it has no guess, else None:
    its u and verdict wait until the learner has answered."""
    tested = tested_nodes(run.steps[index])
    if not 1 <= tests_done <= len(tested):
        return None
    node = tested[tests_done - 1]
    return node if guessed(run, index, node) is None else None
