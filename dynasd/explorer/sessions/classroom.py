"""A class follows one run: the lecturer's session steps a model, every learner's page shows that step, and each
learner predicts it before the reveal (peer instruction: predict, vote, discuss, reveal).

A Classroom is data, like a Session (session.py): the lecturer's run on show (a RunTrace), its rounds (one step
each, with the question asked about it, every learner's answer and whether it is revealed) and the roster of
names. It pickles whole (`state()` / `from_state()`): a Space may run replicas, and ZeroGPU forks processes. No
learner runs a model: the lecturer's Step goes through the lecturer's own session and its controller, and the
class then follows that session's run (`follow`), so the page's Step, Run and lecture keys drive the class too.

The class's life, one phase at a time (`Classroom.phase`):

    WAITING  --the lecturer's run gains a step-->  ASKING (a round: the step, its verdicts hidden, a question)
    ASKING   --second vote-->  ASKING, second vote (peer instruction: learners discuss, then answer again)
    ASKING   --reveal-->  REVEALED (answers closed, every learner sees the outcome and their score)
    ASKING or REVEALED  --a newer step-->  ASKING (an open round the lecturer stepped past is revealed first)
    any      --end-->  ENDED (the summary; learners may still rejoin and read it)

Bounds: names of at most MAX_NAME_CHARS, at most MAX_LEARNERS a class and MAX_ROUNDS rounds, at most
`max_classes` classes a server (ClassRegistry), each dropped `ttl_s` after its last use. A learner is their rejoin
token, a secret the class hands out at the first join and the learner's browser keeps (a reload, a second tab or
the link again is the same learner); their name is how they are shown, and a name another token holds is refused,
so no one answers as a classmate. A learner sees no one else's answers. Only the holder of the class's lecturer
token may step, reveal, ask, open the second vote or end. Bad input is a UserError with one clear sentence, and
changes nothing.
"""
from __future__ import annotations

import collections
import hashlib
import hmac
import html
import pickle
import re
import secrets
import threading
import time
import unicodedata
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable

from ...trace import RunTrace, StepTrace
from ..inputs import UserError
from ..labels import show_token
from ..lessons.predict import _commit_reveal, _node_reveal, guessed, tested_nodes

CODE_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I/L: read off a projector, typed on a phone
CODE_LENGTH = 5
MAX_CODE_CHARS = 16        # longer input is refused before any lookup
MAX_NAME_CHARS = 24
MAX_TOKEN_CHARS = 64       # a rejoin token as the class hands it out is 22 characters
TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
MAX_LEARNERS = 50
MAX_ROUNDS = 500
NO_REJECTION = -1          # the "first rejected" answer when every test passed
FIRST, SECOND = 1, 2       # the votes of a round: every round has the first; the lecturer may open a second


class Ask(Enum):
    """The question a round asks about its step (the lecturer picks; how many tokens by default)."""

    COMMIT = "How many tokens will it commit?"
    FIRST_REJECTED = "Which candidate is rejected first?"
    NODE = "Will this candidate pass its test?"


class Phase(Enum):
    WAITING = "waiting"     # no step on show yet
    ASKING = "asking"       # a step on show, its verdicts hidden, answers open
    REVEALED = "revealed"   # the step's verdicts shown, answers closed
    ENDED = "ended"         # the class is over: the summary


@dataclass(frozen=True)
class Question:
    """What a round asks, its choices (label, value), and the right value with its words, from the step alone."""

    ask: Ask
    text: str
    choices: tuple[tuple[str, int], ...]
    answer: int
    said: str     # the right answer in words
    why: str
    node: int | None = None  # Ask.NODE: the candidate asked about

    def label(self, value: int | None) -> str:
        return next((label for label, v in self.choices if v == value), "no answer")

    @property
    def short(self) -> str:
        """The question in a few words, for the summary (the candidate asked about named)."""
        return self.text.split(": ", 1)[-1] if self.ask is Ask.NODE else self.ask.value


@dataclass
class Round:
    """One step on show to the class: its question and every learner's answer (by learner key, in arrival order),
    in the first vote and, once the lecturer opened it, the second (peer instruction: after the first answers the
    learners discuss with their neighbours and answer again; the second answer is the one scored)."""

    number: int   # 1, 2, ... in the order the class saw them
    index: int    # the step of the class's run
    question: Question
    answers: dict[str, int] = field(default_factory=dict)   # the first vote
    revealed: bool = False
    moved_on: bool = False  # revealed because the lecturer stepped past it
    second: dict[str, int] | None = None                    # the second vote, once opened

    @property
    def vote(self) -> int:
        """The vote open now (or the last one, once revealed)."""
        return FIRST if self.second is None else SECOND

    def votes(self, vote: int) -> dict[str, int]:
        if vote == FIRST:
            return self.answers
        return self.second if self.second is not None else {}

    def tally(self, vote: int | None = None) -> collections.Counter:
        """How many chose each answer in `vote` (the vote open now when None)."""
        return collections.Counter(self.votes(vote or self.vote).values())

    def final(self, key: str) -> int | None:
        """A learner's scored answer: their second vote's, else their first's."""
        if self.second is not None and key in self.second:
            return self.second[key]
        return self.answers.get(key)

    def finals(self) -> dict[str, int]:
        return {key: self.final(key) for key in {**self.answers, **(self.second or {})}}


@dataclass(frozen=True)
class RoundSummary:
    number: int
    index: int
    question: str
    right_answer: str
    answered: int
    right: int                 # scored answers (the second vote's where given) that were right
    common_wrong: str | None   # the wrong answer given most often (None: no wrong answer)
    common_wrong_count: int
    first_right: int = 0       # right in the first vote
    second_answered: int | None = None   # None: no second vote
    moved_to_right: int = 0    # wrong (or no answer) in the first vote, right in the second
    moved_from_right: int = 0  # right in the first vote, wrong in the second

    @property
    def share_right(self) -> float:
        return self.right / self.answered if self.answered else 0.0


@dataclass(frozen=True)
class LearnerView:
    """What one learner's page shows now, as data (ui/classroom.py draws it). `key` changes whenever any of it does,
    so a page that holds `key` already needs nothing sent."""

    key: str
    learner: str              # the learner's key
    name: str
    phase: Phase
    round: Round | None
    mine: int | None          # this learner's answer in the round's open (or last) vote
    right: int                # this learner's score over the revealed rounds
    asked: int
    first: int | None = None  # in a second vote: this learner's answer in the first


def question_for(run: RunTrace, index: int, ask: Ask = Ask.COMMIT, node: int | None = None) -> Question:
    """The question `ask` about step `index` (a step with no candidates is asked how many tokens it commits)."""
    step = run.steps[index]
    tested = tested_nodes(step)
    if not step.nodes or not tested:
        ask = Ask.COMMIT
    if ask is Ask.COMMIT:
        answer, said, why = _commit_reveal(run, index)
        most = step.live_depth + 1 if step.nodes else 1
        text = (f"Step {index}: {len(step.nodes)} candidate(s) on {step.live_depth} level(s). How many tokens will it "
                "commit, the target's own bonus or correction token included?" if step.nodes else
                f"Step {index}: no candidates (the target alone). How many tokens will it commit?")
        choices = tuple((f"{k} token{'s' if k > 1 else ''}", k) for k in range(1, max(most, answer) + 1))
        return Question(ask, text, choices, answer, said, why)
    if ask is Ask.FIRST_REJECTED:
        first = next((i for i in tested if step.nodes[i].status == "rejected"), NO_REJECTION)
        choices = tuple((node_label(step, i), i) for i in first_tests(step))
        if first == NO_REJECTION:
            said = f"no candidate of step {index} was rejected"
            why = "Every candidate the walk tested passed, so the target added its bonus token at the end."
        else:
            said = f"the walk rejected {node_label(step, first)} first"
            order = ", ".join(str(i) for i in tested[:tested.index(first) + 1])
            why = f"The walk tested node(s) {order} in that order; node {first} was the first to fail its test."
        return Question(ask, f"Step {index}: which candidate will the walk reject first?",
                        choices + (("none: every test passes", NO_REJECTION),), first, said, why)
    node = node if node in tested else tested[0]
    answer, said, why = _node_reveal(step, node)
    return Question(ask, f"Step {index}: will {node_label(step, node)} pass its test?",
                    (("it passes", 1), ("it fails", 0)), answer, said, why, node)


def first_tests(step: StepTrace) -> list[int]:
    """The candidates the walk tests while every test passes: under each node the first candidate drafted from it
    (the walk tries a level's candidates in order and goes down from the first that passes), and under every
    target-rooted chain's root (a root is the target's own token, never tested, and the walk tries every chain) the
    same. So the first rejection, whatever the outcome, is one of them: the "rejected first" question's short list,
    known before the tests (it says nothing of their outcome)."""
    children: dict[int, list[int]] = {}
    for i, n in enumerate(step.nodes):
        if n.status != "padding":
            children.setdefault(n.parent, []).append(i)

    def down(parent: int) -> list[int]:
        kids = children.get(parent, [])
        roots = [i for i in kids if step.nodes[i].origin == "target_root"]
        if roots:
            return [i for root in roots for i in down(root)]
        return [kids[0], *down(kids[0])] if kids else []

    return down(-1)


def node_label(step: StepTrace, i: int) -> str:
    n = step.nodes[i]
    return f"node {i} · {show_token(n.token, 12)} (level {n.level})"


def check_name(name) -> str:
    """A learner's name as shown back to them: trimmed, inner whitespace collapsed; refused when empty, too long
    or holding characters that do not print."""
    if not isinstance(name, str):
        raise UserError("type your name first")
    shown = " ".join(name.split())
    if not shown:
        raise UserError("type your name first")
    if len(shown) > MAX_NAME_CHARS:
        raise UserError(f"a name has at most {MAX_NAME_CHARS} characters (this one has {len(shown)})")
    if any(unicodedata.category(c)[0] == "C" for c in shown):
        raise UserError("a name is letters, digits, spaces and punctuation")
    return shown


def name_key(name: str) -> str:
    """A name as the class compares names: two names that differ only in case or spacing are one name."""
    return check_name(name).casefold()


def check_token(token) -> str:
    """A rejoin token as the browser sent it back ("" when it holds none yet), or UserError."""
    if token is None or token == "":
        return ""
    if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS or not set(token) <= TOKEN_CHARS:
        raise UserError("this page's rejoin token is damaged: reload the page and join again")
    return token


def token_key(token: str) -> str:
    """A learner's key in the class's answers: a digest of their token (the answers and an export never hold the
    secret itself)."""
    return hashlib.sha256(token.encode()).hexdigest()[:16]


def check_code(code) -> str:
    """A class code as typed (case, spaces and dashes ignored), or UserError."""
    typed = re.sub(r"[\s-]", "", code).upper() if isinstance(code, str) else ""
    if not typed:
        raise UserError("type the class code first (the lecturer's screen shows it)")
    if len(typed) > MAX_CODE_CHARS or any(c not in CODE_ALPHABET for c in typed):
        raise UserError(f"'{str(code)[:MAX_CODE_CHARS]}' is not a class code: a code is {CODE_LENGTH} letters and "
                        "digits, as the lecturer's screen shows it")
    return typed


def same_run(a: RunTrace | None, b: RunTrace | None, index: int) -> bool:
    """Whether `b` goes on from `a` up to step `index` (the same object here, or equal copies in another process)."""
    if a is b:
        return True
    if a is None or b is None or a.prompt_ids != b.prompt_ids or a.config != b.config:
        return False
    return index < 0 or (len(a.steps) > index and len(b.steps) > index and a.steps[index] == b.steps[index])


class Classroom:
    """One class: the lecturer's run, its rounds and its learners. Methods take `self.lock` themselves."""

    def __init__(self, code: str, lecturer_session: str, run: RunTrace | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.id = secrets.token_hex(8)            # a new class under an old code is another class
        self.code = code
        self.token = secrets.token_urlsafe(18)    # the lecturer's secret: step, reveal, ask, end
        self.lecturer_session = lecturer_session
        self.clock = clock
        self.created = self.last_used = clock()
        self.run = run
        self.at = len(run.steps) - 1 if run is not None else -1  # the run's last step the class has seen
        self.rounds: list[Round] = []
        self.learners: dict[str, str] = {}       # learner key (token_key) -> the name as first typed
        self.names: dict[str, str] = {}          # name_key -> the learner key that holds the name
        self.ask, self.node = Ask.COMMIT, None     # what the next round asks
        self.ended = False
        self.version = 0                          # bumped at every change a page may show
        self.lock = threading.RLock()
        self.drawn: dict = {}                     # views drawn per round and phase by ui/ (not state: redrawn)

    # -- the class as data ------------------------------------------------------------------------------------
    STATE = ("id", "code", "token", "lecturer_session", "created", "last_used", "run", "at", "rounds", "learners",
             "names", "ask", "node", "ended", "version")

    def state(self) -> bytes:
        with self.lock:
            return pickle.dumps({name: getattr(self, name) for name in self.STATE})

    @classmethod
    def from_state(cls, state: bytes) -> "Classroom":
        fields = pickle.loads(state)
        klass = cls(fields["code"], fields["lecturer_session"])
        for name in cls.STATE:
            setattr(klass, name, fields[name])
        return klass

    # -- where the class stands -------------------------------------------------------------------------------
    @property
    def current(self) -> Round | None:
        return self.rounds[-1] if self.rounds else None

    @property
    def phase(self) -> Phase:
        if self.ended:
            return Phase.ENDED
        if self.current is None:
            return Phase.WAITING
        return Phase.REVEALED if self.current.revealed else Phase.ASKING

    def frame(self) -> tuple[int, str]:
        """What every learner's figures show: the round on show and the phase (ui/ draws each frame once)."""
        return (self.current.number if self.current else 0), self.phase.value

    # -- the lecturer ------------------------------------------------------------------------------------------
    def follow(self, run: RunTrace | None) -> bool:
        """Follow the lecturer's run: a step newer than the class has seen opens a round about it (an open round the
        lecturer stepped past is revealed first); a round whose step the lecturer revealed on their page (a
        presenter's reveal or a guess, kept in the run) is revealed. Returns whether anything changed."""
        with self.lock:
            if self.ended or run is None or not run.steps:
                return False
            changed = False
            if not same_run(self.run, run, self.at):  # a new run on the lecturer's page: its steps are all new
                self.at = -1
            self.run = run
            latest = len(run.steps) - 1
            if latest > self.at:
                if len(self.rounds) >= MAX_ROUNDS:
                    raise UserError(f"this class has shown {MAX_ROUNDS} steps, its limit: end it and start another")
                self._close(moved_on=True)
                self.rounds.append(Round(len(self.rounds) + 1, latest, question_for(run, latest, self.ask, self.node)))
                self.at, changed = latest, True
            current = self.current
            if current is not None and not current.revealed and current.index < len(run.steps) \
                    and guessed(run, current.index) is not None:
                current.revealed = changed = True
            if changed:
                self._changed()
            return changed

    def reveal(self) -> Round:
        """The lecturer's reveal of the round on show: answers close, everyone sees the outcome."""
        with self.lock:
            current = self._unrevealed_round("nothing to reveal", "step on for the next question")
            current.revealed = True
            self._changed()
            return current

    def open_second_vote(self) -> Round:
        """Peer instruction's second vote on the round on show: after the first answers the learners discuss, then
        answer again (each learner's second answer is scored; the first is kept for the histogram and summary)."""
        with self.lock:
            current = self._unrevealed_round("there is no question yet: step first",
                                             "a second vote comes before the reveal")
            if current.second is not None:
                raise UserError(f"the second vote on step {current.index} is open already")
            if not current.answers:
                raise UserError("a second vote follows the first answers: none are in yet")
            current.second = {}
            self._changed()
            return current

    def set_question(self, ask: Ask, node: int | None = None) -> str:
        """What the next rounds ask; the round on show is asked again while no one has answered it."""
        with self.lock:
            if self.ended:
                raise UserError("the class has ended: start a new one")
            if ask is Ask.NODE and node is not None and (not isinstance(node, int) or node < 0):
                raise UserError("a candidate is a node number, 0 or more")
            self.ask, self.node = ask, node if ask is Ask.NODE else None
            current = self.current
            if current is None or current.revealed:
                return f"The next step asks: {ask.value}"
            if current.answers:
                return (f"The next step asks: {ask.value} (step {current.index} keeps its question: "
                        f"{len(current.answers)} answer(s) are in)")
            if node is not None and node not in tested_nodes(self.run.steps[current.index]):
                tested = ", ".join(map(str, tested_nodes(self.run.steps[current.index]))) or "none"
                raise UserError(f"node {node} is not tested in step {current.index}: ask about one of {tested}")
            current.question = question_for(self.run, current.index, ask, node)
            self._changed()
            return f"Step {current.index} now asks: {current.question.ask.value}"

    def end(self) -> list[RoundSummary]:
        with self.lock:
            if not self.ended:
                self._close(moved_on=True)
                self.ended = True
                self._changed()
            return self.summary()

    # -- the learners ------------------------------------------------------------------------------------------
    def join(self, name, token=None) -> str:
        """A learner joins under `name` and gets their rejoin token (the browser keeps it), or comes back with it (a
        reload, another tab): then their answers are theirs again and the name they first chose stays. A name
        another learner holds is refused. Returns the token."""
        token = check_token(token)
        with self.lock:
            key = token_key(token) if token else ""
            if key in self.learners:
                self._touch()
                return token
            shown, wanted = check_name(name), name_key(name)
            if wanted in self.names:
                raise UserError(f"someone in this class already goes by '{self.learners[self.names[wanted]]}': "
                                "pick another name")
            if len(self.learners) >= MAX_LEARNERS:
                raise UserError(f"this class is full ({MAX_LEARNERS} learners)")
            token = token or secrets.token_urlsafe(16)
            key = token_key(token)
            self.learners[key], self.names[wanted] = shown, key
            self._touch()
            return token

    def learner(self, token) -> str:
        """The key of the learner holding `token`, or UserError."""
        token = check_token(token)
        key = token_key(token) if token else ""
        if key not in self.learners:
            raise UserError("join the class first: type your name and press Join")
        return key

    def answer(self, token, number, value) -> LearnerView:
        """A learner's answer to round `number` (the round their page shows) in the vote open now: one per vote,
        before the reveal. Returns the learner's view with it."""
        key = self.learner(token)
        with self.lock:
            if self.ended:
                raise UserError("the class has ended: your answers are counted in the summary")
            current = self._open_round("there is no question yet: wait for the lecturer's step")
            try:
                number = int(number)
            except (TypeError, ValueError):
                raise UserError("that answer names no step") from None
            if number != current.number or current.revealed:
                shown = next((r for r in self.rounds if r.number == number), None)
                step = f"step {shown.index}" if shown else "that step"
                raise UserError(f"the answers for {step} closed at its reveal: this one was not counted")
            votes = current.votes(current.vote)
            if key in votes:
                which = "in the second vote " if current.vote == SECOND else ""
                raise UserError(f"you answered step {current.index} {which}already "
                                f"({current.question.label(votes[key])}): that answer stands")
            try:
                value = int(value)
            except (TypeError, ValueError):
                value = None
            if value not in {v for _, v in current.question.choices}:
                raise UserError("pick one of the answers first")
            votes[key] = value
            self._changed()
            return self.view(token)

    def view(self, token) -> LearnerView:
        key = self.learner(token)
        with self.lock:
            current = self.current
            mine = current.votes(current.vote).get(key) if current else None
            first = current.answers.get(key) if current and current.vote == SECOND else None
            right, asked = self.score(key)
            number, phase = self.frame()
            asked_about = f"{current.question.ask.name}{current.question.node}.{current.vote}" if current else ""
            return LearnerView(f"{self.id}.{number}.{phase}.{asked_about}.{mine}", key, self.learners[key],
                               self.phase, current, mine, right, asked, first)

    def score(self, key: str) -> tuple[int, int]:
        """(right, asked) over the revealed rounds: a round not answered counts as asked."""
        revealed = [r for r in self.rounds if r.revealed]
        return sum(r.final(key) == r.question.answer for r in revealed), len(revealed)

    # -- the class as a whole ----------------------------------------------------------------------------------
    def summary(self) -> list[RoundSummary]:
        """Per revealed round: how many answered, how many were right (scored on the second vote where a learner
        gave one), the most common wrong answer, and with a second vote how many moved to the right answer."""
        rows = []
        with self.lock:
            for r in self.rounds:
                if not r.revealed:
                    continue
                finals, right = r.finals(), r.question.answer
                tally = collections.Counter(finals.values())
                wrong = [(count, -value) for value, count in tally.items() if value != right]
                common = -max(wrong)[1] if wrong else None
                moved = collections.Counter((r.answers.get(key) == right, value == right)
                                            for key, value in (r.second or {}).items())
                rows.append(RoundSummary(r.number, r.index, r.question.short, r.question.label(right),
                                         len(finals), tally[right],
                                         None if common is None else r.question.label(common),
                                         tally[common] if common is not None else 0,
                                         first_right=r.tally(FIRST)[right],
                                         second_answered=None if r.second is None else len(r.second),
                                         moved_to_right=moved[(False, True)], moved_from_right=moved[(True, False)]))
        return rows

    def results(self, names: bool = True) -> list[dict]:
        """The class's results as rows (ui/ writes them as CSV): one per round and learner (the question, the right
        answer, the answer in each vote), then one per learner (their score). Without names, a learner is
        "learner N" in the order they joined. Text is plain (the labels' Markdown escapes undone)."""
        label = lambda question, value: html.unescape(question.label(value))  # noqa: E731
        with self.lock:
            shown = {key: name if names else f"learner {i}" for i, (key, name) in enumerate(self.learners.items(), 1)}
            rows = []
            for r in self.rounds:
                for key, who in shown.items():
                    first, second = r.answers.get(key), (r.second or {}).get(key)
                    if first is None and second is None:
                        continue
                    final = r.final(key)
                    rows.append(dict(kind="answer", round=r.number, step=r.index,
                                     question=html.unescape(r.question.text),
                                     right_answer=label(r.question, r.question.answer) if r.revealed else "",
                                     learner=who, first_vote=label(r.question, first) if first is not None else "",
                                     second_vote=label(r.question, second) if second is not None else "",
                                     right=("yes" if final == r.question.answer else "no") if r.revealed else ""))
            for key, who in shown.items():
                right, asked = self.score(key)
                rows.append(dict(kind="score", learner=who, score=right, revealed_rounds=asked))
            return rows

    def _open_round(self, nothing: str) -> Round:
        if self.current is None:
            raise UserError(nothing)
        return self.current

    def _unrevealed_round(self, nothing: str, once_revealed: str) -> Round:
        """The round on show for a lecturer's action before its reveal, else UserError (`nothing`: no round yet;
        `once_revealed`: what to do instead once it is revealed)."""
        if self.ended:
            raise UserError("the class has ended: start a new one")
        current = self._open_round(nothing)
        if current.revealed:
            raise UserError(f"step {current.index} is revealed already: {once_revealed}")
        return current

    def _close(self, moved_on: bool) -> None:
        current = self.current
        if current is not None and not current.revealed:
            current.revealed, current.moved_on = True, moved_on

    def _changed(self) -> None:
        self.version += 1
        self._touch()

    def _touch(self) -> None:
        self.last_used = self.clock()


class ClassRegistry:
    """Classes by code, at most `max_classes`, each dropped `ttl_s` seconds after its last use (an ended class is
    the first to go when a new one needs its room)."""

    def __init__(self, max_classes: int = 8, ttl_s: float = 3 * 3600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_classes, self.ttl_s, self.clock = max_classes, ttl_s, clock
        self._classes: dict[str, Classroom] = {}
        self._guard = threading.Lock()

    def __len__(self) -> int:
        with self._guard:
            return len(self._classes)

    def start(self, lecturer_session: str, run: RunTrace | None) -> Classroom:
        """A new class for the lecturer of `lecturer_session`; the steps `run` has already are not asked. A lecturer
        teaches one class at a time: their earlier class ends (so a Start pressed twice holds no second place)."""
        with self._guard:
            now = self.clock()
            self._expire(now)
            for klass in self._classes.values():
                if klass.lecturer_session == lecturer_session:
                    klass.end()
            if len(self._classes) >= self.max_classes:
                ended = [k for k in self._classes.values() if k.ended]
                if not ended:
                    raise UserError(f"this server runs {self.max_classes} classes already: end one, or try again "
                                    "once one has expired")
                del self._classes[min(ended, key=lambda k: k.last_used).code]
            code = self._new_code()
            klass = Classroom(code, lecturer_session, run, clock=self.clock)
            self._classes[code] = klass
            return klass

    def find(self, code) -> Classroom:
        """The class with this code, or UserError (a wrong, ended long ago or expired code)."""
        typed = check_code(code)
        with self._guard:
            now = self.clock()
            self._expire(now)
            klass = self._classes.get(typed)
            if klass is None:
                raise UserError(f"no class has the code {typed}: check it on the lecturer's screen (a class "
                                f"expires {self.ttl_s / 3600:.0f} h after its last use)")
            klass.last_used = now
            return klass

    def lecturing(self, code, token) -> Classroom:
        """The class with this code when `token` is its lecturer's, else UserError: only the lecturer acts on it."""
        if not code and not token:
            raise UserError("start a class first")
        klass = self.find(code)
        if not isinstance(token, str) or not hmac.compare_digest(token.encode(), klass.token.encode()):
            raise UserError("only the class's lecturer can do that (the lecturer's page holds the class's secret)")
        return klass

    def adopt(self, klass: Classroom) -> Classroom:
        """Serve a class made whole from another process's Classroom.state() under its code from now on."""
        with self._guard:
            self._expire(self.clock())
            if klass.code not in self._classes and len(self._classes) >= self.max_classes:
                raise UserError(f"this server runs {self.max_classes} classes already")
            klass.last_used = self.clock()
            self._classes[klass.code] = klass
            return klass

    def _expire(self, now: float) -> None:
        for code in [c for c, k in self._classes.items() if now - k.last_used > self.ttl_s]:
            del self._classes[code]

    def _new_code(self) -> str:
        while True:
            code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
            if code not in self._classes:
                return code
