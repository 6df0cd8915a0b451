"""A checkpoint quiz built from the run on show: about eight multiple-choice questions whose answers come from the
trace (how many target forwards, which token ar would have written, which test failed and where u fell), each
with the view of the page that answers it.

Why: answering a question about the very run on the screen makes the learner look for it in the figures, which
teaches more than watching them. The quiz is a pure function of the trace, so it needs no state (checking builds
it again), works on replayed and example traces, and is the same for everyone who looks at the same run.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...trace import RunTrace, StepTrace
from ...trace_semantics import GREEDY, run_rule
from ..inputs import UserError

QUESTIONS = 8  # at most; a run without trees (ar) or without sampled tests gets fewer


@dataclass(frozen=True)
class Question:
    text: str
    choices: list[str]
    answer: str
    view: str           # where on the page the answer can be read
    why: str            # the answer's reason, from the trace's numbers


@dataclass(frozen=True)
class Marked:
    question: Question
    given: str | None
    correct: bool


OFFSETS = ((-1, 1, 2), (1, 2, 3), (-2, -1, 1), (-3, -2, -1))  # where the answer sits among the choices varies


def _number_choices(answer: int) -> list[str]:
    """The answer and three near misses, in increasing order: a number question is multiple choice too. Which
    near misses depends on the answer, so the right one is not always in the same place."""
    offsets = OFFSETS[answer % len(OFFSETS)]
    picks = [answer + d for d in offsets if answer + d >= 0]
    picks += [n for n in range(answer + 1, answer + 8) if n not in picks][:3 - len(picks)]
    return [str(n) for n in sorted(picks + [answer])]


def _show(token: str) -> str:
    return "'" + repr(token)[1:-1] + "'"


def _middle_step(run: RunTrace, wanted) -> StepTrace | None:
    """The step nearest the middle of the run for which `wanted(step)` holds (so the question is not about the
    first step, which learners look at anyway)."""
    middle = len(run.steps) // 2
    candidates = sorted(run.steps, key=lambda s: (abs(s.index - middle), s.index))
    return next((s for s in candidates if wanted(s)), None)


def build_quiz(run: RunTrace | None) -> list[Question]:
    """Up to QUESTIONS questions about the run on show, each answered by a view of the page it names."""
    if run is None or not run.steps:
        raise UserError("nothing to quiz on yet: press Step or Run (or replay an example) first")
    questions = (_count_questions(run) + _tree_questions(run) + _greedy_questions(run) + _test_questions(run))
    rejected = sum(n.status == "rejected" for s in run.steps for n in s.nodes)
    if len(questions) < QUESTIONS and any(s.nodes for s in run.steps):
        questions.append(Question("How many candidates were rejected in the whole run?", _number_choices(rejected),
                                  str(rejected), "Decisions (step by step) or the tree of each step",
                                  f"{rejected} nodes were tested and refused over {len(run.steps)} steps"))
    return questions[:QUESTIONS]


def _count_questions(run: RunTrace) -> list[Question]:
    """The run's forwards, its tokens and its best step."""
    summary = run.summary()
    best = max(run.steps, key=lambda s: (len(s.committed), -s.index))
    steps_shown = [str(s.index) for s in sorted(run.steps, key=lambda s: (-len(s.committed), s.index))[:4]]
    return [
        Question("How many target forwards did this run take (prefill not counted)?",
                 _number_choices(run.target_forwards), str(run.target_forwards), "Summary tab",
                 f"one per step: {len(run.steps)} steps, {run.target_forwards} target forwards"),
        Question("How many tokens did this run generate?", _number_choices(summary["new_tokens"]),
                 str(summary["new_tokens"]), "Summary tab (and the generated text)",
                 f"{summary['new_tokens']} tokens in {len(run.steps)} steps: "
                 f"{summary['tokens_per_target_forward']:.2f} per target forward"),
        Question("Which step committed the most tokens (the earliest, if several)?",
                 sorted(set(steps_shown + [str(best.index)]), key=int), str(best.index),
                 "Summary tab: the run timeline", f"step {best.index} committed {len(best.committed)} tokens"),
    ]


def _tree_questions(run: RunTrace) -> list[Question]:
    """A middle step's verify rows and how it ended."""
    tree_step = _middle_step(run, lambda s: len(s.nodes) > 0)
    if tree_step is None:
        return []
    s = tree_step.index
    rows = len(tree_step.nodes) + tree_step.root_rows
    ended = tree_step.committed_origins[-1]
    return [
        Question(f"How many rows did step {s}'s one target forward score?", _number_choices(rows), str(rows),
                 "Verify mask",
                 f"{len(tree_step.nodes)} candidates + {tree_step.root_rows} committed row(s) fed with them; each "
                 "row gives the target's next-token distribution after it, so a chain of K candidates gets K + 1 "
                 "logits (the last one is the bonus)"),
        Question(f"How did step {s} end?", ["with a bonus token", "with a correction token", "with neither"],
                 {"bonus": "with a bonus token", "correction": "with a correction token"}.get(ended, "with neither"),
                 "Candidate tree and the story under the text",
                 f"its last committed token came from the target as a {ended}" if ended in ("bonus", "correction")
                 else "ti-mcsd commits its longest chain and nothing more"),
    ]


def _greedy_questions(run: RunTrace) -> list[Question]:
    """At temperature 0, a lossless method's first token of a step is ar's: which was it?"""
    s = _middle_step(run, lambda s: bool(s.committed))
    if not (run.lossless and run_rule(run) is GREEDY and s is not None):
        return []
    # the step's level-1 candidates, then tokens written nearby, as the wrong choices
    nearby = [n.token for n in s.nodes if n.level == 1] + s.committed_tokens[1:] + [
        t for other in run.steps[max(0, s.index - 2):s.index] for t in other.committed_tokens]
    wrong = [t for t in dict.fromkeys(_show(t) for t in nearby) if t != _show(s.committed_tokens[0])]
    return [Question(f"Which token would ar (the target alone) have written first at step {s.index}?",
                     sorted([_show(s.committed_tokens[0])] + wrong[:3]), _show(s.committed_tokens[0]),
                     "Generated text (and the tree's green path)",
                     "at temperature 0 a lossless method writes exactly the target's own greedy text, "
                     f"so ar writes step {s.index}'s first committed token")]


def _test_questions(run: RunTrace) -> list[Question]:
    """The first failed test of a middle step, and u against the threshold of one of its tests."""
    tested = _middle_step(run, lambda s: any(s.nodes[i].status == "rejected" for i in s.tested))
    if tested is None:
        return []
    node = next(i for i in tested.tested if tested.nodes[i].status == "rejected")
    questions = [Question(f"Which node's test failed first at step {tested.index}?",
                          sorted({f"node {i}" for i in range(min(4, len(tested.nodes)))} | {f"node {node}"},
                                 key=lambda c: int(c.split()[1])),
                          f"node {node}", "Learn → Guided step (its Test phases) or Decisions",
                          f"the walk tested {', '.join(map(str, tested.tested))} in that order; node {node} "
                          f"(`{_show(tested.nodes[node].token)}`) was the first rejected")]
    # u against the threshold, asked of a node that passed when there is one (a rejected one gives its answer
    # away after the question above)
    asked = next((i for i in tested.tested if tested.nodes[i].status != "rejected"), node)
    n = tested.nodes[asked]
    if run_rule(run) is GREEDY:
        questions.append(_why_rejected(run, tested, node))
    elif n.u is not None and n.q_test:
        ratio = min(1.0, (n.p_test or 0.0) / n.q_test)
        below = n.status != "rejected"
        questions.append(Question(f"At step {tested.index}, when node {asked} (`{_show(n.token)}`) was tested, "
                                  "was u above or below min(1, p′/q′)?", ["above (or equal)", "below"],
                                  "below" if below else "above (or equal)", "Learn → Acceptance test",
                                  f"u = {n.u:.3f} {'<' if below else '≥'} min(1, p′/q′) = {ratio:.3f}: a "
                                  "candidate passes only when u is below it"))
    return questions


WHY_REJECTED = ("it was not the target's most likely token there", "p < q, so it passed only with probability p/q",
                "u fell at or above min(1, p/q)", "its parent had been rejected")


def _why_rejected(run: RunTrace, fallback: StepTrace, fallback_node: int) -> Question:
    """At temperature 0, why a rejected candidate failed, asked of one whose p ≥ q where there is one: the p/q rule
    would have kept it, the greedy rule (trace_semantics.GREEDY) does not."""
    step = _middle_step(run, lambda s: any(_pq_rejected(s, i) for i in s.tested)) or fallback
    node = next((i for i in step.tested if _pq_rejected(step, i)), fallback_node)
    n = step.nodes[node]
    took = _taken_instead(step, node)
    return Question(f"At step {step.index}, node {node} (`{_show(n.token)}`, p = {n.p:.3f}, q = {_q(n.q)}) was "
                    "rejected. Why?", sorted(WHY_REJECTED), WHY_REJECTED[0], "Decisions (its bar's hover) or the tree",
                    f"{GREEDY.when.lower()} a candidate is accepted only when {GREEDY.test}, whatever its p and q"
                    + (f"; the target's was `{_show(took)}`" if took is not None else ""))


def _pq_rejected(step: StepTrace, i: int) -> bool:
    node = step.nodes[i]
    return node.status == "rejected" and node.q is not None and node.p >= node.q


def _q(q: float | None) -> str:
    return "–" if q is None else f"{q:.3f}"


def _taken_instead(step: StepTrace, i: int) -> str | None:
    """The token the target took at a rejected node's place at temperature 0: an accepted sibling's, or the
    correction committed after the node's parent (its top token there)."""
    parent = step.nodes[i].parent
    kept = next((n.token for n in step.nodes if n.parent == parent and n.status in ("accepted", "unchosen")), None)
    if kept is None and step.final_parent == parent and step.committed_origins[-1:] == ["correction"]:
        return step.committed_tokens[-1]
    return kept


def mark(questions: list[Question], answers: list[str | None]) -> list[Marked]:
    """Each question with the learner's answer (None: not answered) and whether it is right."""
    answers = list(answers) + [None] * (len(questions) - len(answers))
    return [Marked(q, a, a == q.answer) for q, a in zip(questions, answers)]


def marked_markdown(marked: list[Marked]) -> str:
    right = sum(m.correct for m in marked)
    lines = [f"**Score: {right} of {len(marked)}.**"]
    for i, m in enumerate(marked, start=1):
        given = "not answered" if m.given is None else f"you said {m.given}"
        sign = "✓" if m.correct else "✗"
        lines.append(f"{i}. {sign} {m.question.text} **{m.question.answer}** ({given}): {m.question.why}. "
                     f"*Where to see it: {m.question.view}.*")
    return "\n".join(lines)
