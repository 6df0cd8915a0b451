"""A class follows one run (dynasd/explorer/sessions/classroom.py), without Gradio: the lecturer's session steps the
model, the class follows its run round by round; learners join by name, answer once before the reveal and are
scored; the summary counts every answer; bad input is one UserError that changes nothing; bounds hold; the class
is data that pickles and goes on in a copy."""
import pickle
from dataclasses import replace

import pytest

from dynasd.explorer.inputs import Settings, UserError
from dynasd.explorer.lessons import predict
from dynasd.explorer.pairs import PairCache
from dynasd.explorer.sessions.calls import InProcess
from dynasd.explorer.sessions.classroom import (
    CODE_ALPHABET,
    MAX_LEARNERS,
    MAX_NAME_CHARS,
    NO_REJECTION,
    Ask,
    ClassRegistry,
    Classroom,
    Phase,
    check_code,
    question_for,
)
from dynasd.explorer.sessions.controller import Controller
from dynasd.explorer.sessions.session import Session

SETTINGS = Settings(pair="tiny-random", method="mcsd", k_config="2,2,1", max_new_tokens=24).normalised()


@pytest.fixture(scope="module")
def pairs(tiny_pair):
    return PairCache(loader=lambda *_, **__: tiny_pair)


class Lecture:
    """A lecturer's session and a class that follows it."""

    def __init__(self, pairs, registry=None):
        self.session = Session("lecturer")
        self.controller = Controller(self.session, InProcess(pairs))
        self.registry = registry or ClassRegistry()
        self.klass = self.registry.start(self.session.id, self.session.run)

    def step(self, settings=SETTINGS, prompt="hello there"):
        self.controller.step(settings, prompt)
        self.klass.follow(self.session.run)
        return self.klass.current

    def reveal(self):
        self.controller.reveal(self.klass.current.index)
        self.klass.follow(self.session.run)
        return self.klass.current


def snapshot(klass: Classroom) -> bytes:
    return pickle.dumps([klass.rounds, klass.learners, klass.ended, klass.at, klass.ask, klass.node])


def test_a_round_asks_about_the_lecturers_newest_step_and_the_reveal_scores_every_learner(pairs):
    lecture = Lecture(pairs)
    klass = lecture.klass
    assert klass.phase is Phase.WAITING
    for name in ("Ana", "Ben", "Chi"):
        klass.join(name)
    first = lecture.step()
    assert klass.phase is Phase.ASKING and first.index == 0 and first.number == 1
    right = first.question.answer
    assert right == len(lecture.session.run.steps[0].committed)
    wrong = next(v for _, v in first.question.choices if v != right)
    klass.answer("Ana", 1, right)
    klass.answer("Ben", 1, wrong)
    view = klass.view("ana")
    assert view.mine == right and view.asked == 0, "nothing is scored before the reveal"
    lecture.reveal()
    assert klass.phase is Phase.REVEALED
    assert (klass.view("Ana").right, klass.view("Ana").asked) == (1, 1)
    assert (klass.view("Ben").right, klass.view("Chi").right, klass.view("Chi").asked) == (0, 0, 1)
    second = lecture.step()
    assert second.number == 2 and second.index == 1 and klass.phase is Phase.ASKING
    klass.answer("Chi", 2, second.question.answer)
    summary = klass.end()
    assert klass.phase is Phase.ENDED
    assert [(s.answered, s.right) for s in summary] == [(2, 1), (1, 1)]
    assert summary[0].common_wrong == first.question.label(wrong) and summary[0].common_wrong_count == 1
    assert summary[1].common_wrong is None and summary[1].share_right == 1.0
    assert klass.rounds[1].moved_on, "the class's end revealed the round still open"


def test_the_class_follows_the_lecturers_page_and_a_step_past_an_open_round_reveals_it(pairs):
    lecture = Lecture(pairs)
    klass = lecture.klass
    lecture.step()
    assert not klass.follow(lecture.session.run), "following the same step again changes nothing"
    lecture.controller.step(SETTINGS, "hello there")  # the page's Step while the class still answers step 0
    lecture.controller.step(SETTINGS, "hello there")
    assert klass.follow(lecture.session.run)
    assert [(r.index, r.revealed, r.moved_on) for r in klass.rounds] == [(0, True, True), (2, False, False)]
    lecture.controller.reveal(2)  # lecture mode's V on the page: the class reveals with it
    assert klass.follow(lecture.session.run) and klass.phase is Phase.REVEALED
    lecture.step(prompt="a new prompt")  # a new run: its first step is new to the class
    assert klass.current.index == 0 and klass.current.number == 3


def test_steps_shown_before_the_class_started_are_not_asked(pairs):
    session = Session("lecturer")
    controller = Controller(session, InProcess(pairs))
    controller.step(SETTINGS, "hello there")
    controller.step(SETTINGS, "hello there")
    klass = ClassRegistry().start(session.id, session.run)
    assert not klass.follow(session.run) and klass.phase is Phase.WAITING
    controller.step(SETTINGS, "hello there")
    assert klass.follow(session.run) and klass.current.index == 2


def test_bad_input_is_one_clear_message_and_changes_nothing(pairs):
    lecture = Lecture(pairs)
    klass = lecture.klass
    klass.join("Ana")
    with pytest.raises(UserError, match="no question yet"):
        klass.answer("Ana", 1, 1)
    current = lecture.step()
    klass.answer("Ana", 1, current.question.answer)
    before = snapshot(klass)
    cases = [
        (lambda: klass.answer("Ana", 1, current.question.answer), "answered step 0 already"),
        (lambda: klass.answer("ANA ", 1, 2), "your first answer stands"),
        (lambda: klass.answer("Zed", 1, 1), "join the class first"),
        (lambda: klass.join(""), "type your name first"),
        (lambda: klass.join("   "), "type your name first"),
        (lambda: klass.join("x" * (MAX_NAME_CHARS + 1)), f"at most {MAX_NAME_CHARS} characters"),
        (lambda: klass.join("bell\x07"), "letters, digits"),
        (lambda: klass.join(None), "type your name first"),
    ]
    klass.join("Ben")
    before = snapshot(klass)
    cases += [(lambda: klass.answer("Ben", 1, 99), "pick one of the answers"),
              (lambda: klass.answer("Ben", 1, "three"), "pick one of the answers"),
              (lambda: klass.answer("Ben", 7, current.question.answer), "closed at its reveal")]
    for act, said in cases:
        with pytest.raises(UserError, match=said):
            act()
        assert snapshot(klass) == before, said
    lecture.reveal()
    before = snapshot(klass)
    with pytest.raises(UserError, match="answers for step 0 closed at its reveal"):
        klass.answer("Ben", 1, current.question.answer)
    with pytest.raises(UserError, match="revealed already"):
        klass.reveal()
    assert snapshot(klass) == before


def test_only_the_lecturers_token_acts_on_a_class_and_a_wrong_code_is_refused(pairs):
    registry = ClassRegistry()
    klass = registry.start("lecturer", None)
    assert registry.lecturing(klass.code.lower(), klass.token) is klass
    assert registry.find(f" {klass.code[:2]}-{klass.code[2:]} ") is klass, "spaces, dashes and case are ignored"
    for token in ("", None, klass.token[:-1], klass.code):
        with pytest.raises(UserError, match="only the class's lecturer"):
            registry.lecturing(klass.code, token)
    for code in ("", "O0O0O", "x" * 40, None, 12345):
        with pytest.raises(UserError, match="class code"):
            registry.find(code)
    unknown = next(c * 5 for c in CODE_ALPHABET if c * 5 != klass.code)
    with pytest.raises(UserError, match=f"no class has the code {unknown}"):
        registry.find(unknown)
    assert check_code("ab-cd e") == "ABCDE"


def test_classes_expire_and_are_bounded_per_server_and_learners_per_class():
    now = [0.0]
    registry = ClassRegistry(max_classes=2, ttl_s=60, clock=lambda: now[0])
    first, second = registry.start("a", None), registry.start("b", None)
    with pytest.raises(UserError, match="runs 2 classes already"):
        registry.start("c", None)
    first.end()
    third = registry.start("c", None)  # the ended class made room
    with pytest.raises(UserError, match="no class has the code"):
        registry.find(first.code)
    now[0] = 30.0
    registry.find(third.code)  # a learner's visit keeps a class alive
    now[0] = 61.0
    assert registry.find(third.code) is third
    with pytest.raises(UserError, match="expires"):
        registry.find(second.code)
    for i in range(MAX_LEARNERS):
        third.join(f"learner {i}")
    with pytest.raises(UserError, match="full"):
        third.join("one too many")
    third.join("LEARNER 3")  # a rejoin is no newcomer
    assert len(third.learners) == MAX_LEARNERS


def test_a_lecturer_teaches_one_class_at_a_time():
    registry = ClassRegistry(max_classes=2)
    other = registry.start("another lecturer", None)
    first = registry.start("lecturer", None)
    again = registry.start("lecturer", None)  # Start pressed twice: the first class ends and gives up its place
    assert first.ended and not again.ended and not other.ended
    assert registry.start("lecturer", None) is not again and again.ended, "still room: the ended one made way"
    with pytest.raises(UserError, match="has ended"):
        again.reveal()


def test_a_learner_who_rejoins_by_name_finds_their_answers(pairs):
    lecture = Lecture(pairs)
    klass = lecture.klass
    key = klass.join("Ana Lima")
    current = lecture.step()
    klass.answer("Ana Lima", 1, current.question.answer)
    assert klass.join("  ana   LIMA ") == key and len(klass.learners) == 1
    assert klass.view("ANA LIMA").mine == current.question.answer
    assert klass.view("Ana Lima").name == "Ana Lima", "shown as first typed"


def test_the_view_key_changes_with_what_a_learner_sees_and_only_then(pairs):
    lecture = Lecture(pairs)
    klass = lecture.klass
    klass.join("Ana")
    klass.join("Ben")
    waiting = klass.view("Ana").key
    current = lecture.step()
    asking = klass.view("Ana").key
    klass.answer("Ben", 1, current.question.answer)
    assert klass.view("Ana").key == asking, "another learner's answer changes nothing on this page"
    klass.answer("Ana", 1, current.question.answer)
    answered = klass.view("Ana").key
    klass.set_question(Ask.COMMIT)
    lecture.reveal()
    keys = [waiting, asking, answered, klass.view("Ana").key]
    assert len(set(keys)) == 4


def test_the_lecturer_chooses_the_question_until_the_first_answer(pairs):
    lecture = Lecture(pairs)
    klass = lecture.klass
    klass.join("Ana")
    lecture.step()
    step = lecture.session.run.steps[0]
    said = klass.set_question(Ask.FIRST_REJECTED)
    assert "now asks" in said and klass.current.question.ask is Ask.FIRST_REJECTED
    first = klass.current.question.answer
    rejected = [i for i in predict.tested_nodes(step) if step.nodes[i].status == "rejected"]
    assert first == (rejected[0] if rejected else NO_REJECTION)
    tested = predict.tested_nodes(step)
    klass.set_question(Ask.NODE, tested[-1])
    assert klass.current.question.node == tested[-1]
    assert klass.current.question.answer == int(predict.passed(step, tested[-1]))
    untested = next((i for i in range(len(step.nodes)) if i not in tested), None)
    if untested is not None:
        with pytest.raises(UserError, match="not tested"):
            klass.set_question(Ask.NODE, untested)
    klass.answer("Ana", 1, 1)
    assert "keeps its question" in klass.set_question(Ask.COMMIT)
    assert klass.current.question.ask is Ask.NODE
    lecture.reveal()
    assert lecture.step().question.ask is Ask.COMMIT, "the next step asks the new question"


def test_every_question_is_answerable_from_its_choices_on_every_step(pairs):
    session = Session("x")
    controller = Controller(session, InProcess(pairs))
    for settings in (SETTINGS, replace(SETTINGS, method="ar"), replace(SETTINGS, method="sd", temperature=1.0),
                     replace(SETTINGS, method="ti-mcsd", width=2, depth=2)):
        session.reset()
        controller.step(settings, "count: one two three")
        while not session.done and len(session.run.steps) < 6:
            controller.step(settings, "count: one two three")
        for index in range(len(session.run.steps)):
            for ask in Ask:
                question = question_for(session.run, index, ask)
                assert question.answer in {v for _, v in question.choices}, (settings.method, index, ask)
                assert question.said and question.why and question.text


def test_a_class_pickles_mid_round_and_goes_on_in_the_copy(pairs):
    lecture = Lecture(pairs)
    klass = lecture.klass
    klass.join("Ana")
    current = lecture.step()
    copy = Classroom.from_state(klass.state())
    assert copy.code == klass.code and copy.token == klass.token and copy.current.index == current.index
    copy.answer("Ana", 1, current.question.answer)
    assert not klass.current.answers, "the copy is its own"
    lecture.controller.step(SETTINGS, "hello there")
    session = pickle.loads(pickle.dumps(lecture.session.run))  # the lecturer's run as another process sees it
    assert copy.follow(session) and copy.current.index == 1, "an equal copy of the run goes on, not restarts"
    assert copy.score(copy.learner("Ana")) == (1, 1)
    registry = ClassRegistry()
    assert registry.adopt(copy) is registry.find(copy.code)
