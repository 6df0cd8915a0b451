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
from dynasd.explorer.sessions.calls import in_process
from dynasd.explorer.sessions.classroom import (
    CODE_ALPHABET,
    MAX_LEARNERS,
    MAX_NAME_CHARS,
    MAX_TOKEN_CHARS,
    NO_REJECTION,
    Ask,
    ClassRegistry,
    Classroom,
    Phase,
    check_code,
    first_tests,
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
        self.controller = Controller(self.session, in_process(pairs))
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
    return pickle.dumps([klass.rounds, klass.learners, klass.names, klass.ended, klass.at, klass.ask, klass.node])


def test_a_round_asks_about_the_lecturers_newest_step_and_the_reveal_scores_every_learner(pairs):
    lecture = Lecture(pairs)
    klass = lecture.klass
    assert klass.phase is Phase.WAITING
    ana, ben, chi = (klass.join(name) for name in ("Ana", "Ben", "Chi"))
    first = lecture.step()
    assert klass.phase is Phase.ASKING and first.index == 0 and first.number == 1
    right = first.question.answer
    assert right == len(lecture.session.run.steps[0].committed)
    wrong = next(v for _, v in first.question.choices if v != right)
    klass.answer(ana, 1, right)
    klass.answer(ben, 1, wrong)
    view = klass.view(ana)
    assert view.mine == right and view.asked == 0, "nothing is scored before the reveal"
    lecture.reveal()
    assert klass.phase is Phase.REVEALED
    assert (klass.view(ana).right, klass.view(ana).asked) == (1, 1)
    assert (klass.view(ben).right, klass.view(chi).right, klass.view(chi).asked) == (0, 0, 1)
    second = lecture.step()
    assert second.number == 2 and second.index == 1 and klass.phase is Phase.ASKING
    klass.answer(chi, 2, second.question.answer)
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
    controller = Controller(session, in_process(pairs))
    controller.step(SETTINGS, "hello there")
    controller.step(SETTINGS, "hello there")
    klass = ClassRegistry().start(session.id, session.run)
    assert not klass.follow(session.run) and klass.phase is Phase.WAITING
    controller.step(SETTINGS, "hello there")
    assert klass.follow(session.run) and klass.current.index == 2


def test_bad_input_is_one_clear_message_and_changes_nothing(pairs):
    lecture = Lecture(pairs)
    klass = lecture.klass
    ana = klass.join("Ana")
    with pytest.raises(UserError, match="no question yet"):
        klass.answer(ana, 1, 1)
    with pytest.raises(UserError, match="no question yet"):
        klass.open_second_vote()
    current = lecture.step()
    with pytest.raises(UserError, match="follows the first answers"):
        klass.open_second_vote()
    klass.answer(ana, 1, current.question.answer)
    stranger = "x" * 22
    cases = [
        (lambda: klass.answer(ana, 1, current.question.answer), "answered step 0 already"),
        (lambda: klass.answer(ana, 1, 2), "that answer stands"),
        (lambda: klass.answer(stranger, 1, 1), "join the class first"),
        (lambda: klass.answer("", 1, 1), "join the class first"),
        (lambda: klass.answer("not a token!", 1, 1), "rejoin token is damaged"),
        (lambda: klass.answer("x" * (MAX_TOKEN_CHARS + 1), 1, 1), "rejoin token is damaged"),
        (lambda: klass.answer(12345, 1, 1), "rejoin token is damaged"),
        (lambda: klass.join(""), "type your name first"),
        (lambda: klass.join("   "), "type your name first"),
        (lambda: klass.join("x" * (MAX_NAME_CHARS + 1)), f"at most {MAX_NAME_CHARS} characters"),
        (lambda: klass.join("bell\x07"), "letters, digits"),
        (lambda: klass.join(None), "type your name first"),
        (lambda: klass.join(" ANA "), "already goes by 'Ana': pick another name"),
        (lambda: klass.join("ana", stranger), "already goes by 'Ana'"),
    ]
    ben = klass.join("Ben")
    before = snapshot(klass)
    cases += [(lambda: klass.answer(ben, 1, 99), "pick one of the answers"),
              (lambda: klass.answer(ben, 1, "three"), "pick one of the answers"),
              (lambda: klass.answer(ben, 7, current.question.answer), "closed at its reveal")]
    for act, said in cases:
        with pytest.raises(UserError, match=said):
            act()
        assert snapshot(klass) == before, said
    klass.open_second_vote()
    with pytest.raises(UserError, match="open already"):
        klass.open_second_vote()
    lecture.reveal()
    before = snapshot(klass)
    with pytest.raises(UserError, match="answers for step 0 closed at its reveal"):
        klass.answer(ben, 1, current.question.answer)
    with pytest.raises(UserError, match="revealed already"):
        klass.reveal()
    with pytest.raises(UserError, match="a second vote comes before the reveal"):
        klass.open_second_vote()
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
    tokens = [third.join(f"learner {i}") for i in range(MAX_LEARNERS)]
    with pytest.raises(UserError, match="full"):
        third.join("one too many")
    assert third.join("", tokens[3]) == tokens[3]  # a rejoin is no newcomer
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


def test_a_learner_is_their_token_and_no_one_answers_as_a_classmate(pairs):
    lecture = Lecture(pairs)
    klass = lecture.klass
    token = klass.join("Ana Lima")
    current = lecture.step()
    klass.answer(token, 1, current.question.answer)
    assert klass.join("whatever is typed", token) == token and len(klass.learners) == 1, "a reload rejoins"
    assert klass.view(token).mine == current.question.answer, "a second tab of the browser is the same learner"
    assert klass.view(token).name == "Ana Lima", "shown as first typed"
    with pytest.raises(UserError, match="already goes by 'Ana Lima'"):
        klass.join("  ana   LIMA ")  # a classmate typing the name gets no token of it
    assert all(token not in repr(value) for value in (klass.rounds, klass.learners, klass.results())), \
        "the class keeps a digest of the token, never the secret itself"


def test_the_view_key_changes_with_what_a_learner_sees_and_only_then(pairs):
    lecture = Lecture(pairs)
    klass = lecture.klass
    ana, ben = klass.join("Ana"), klass.join("Ben")
    waiting = klass.view(ana).key
    current = lecture.step()
    asking = klass.view(ana).key
    klass.answer(ben, 1, current.question.answer)
    assert klass.view(ana).key == asking, "another learner's answer changes nothing on this page"
    klass.answer(ana, 1, current.question.answer)
    answered = klass.view(ana).key
    klass.set_question(Ask.COMMIT)
    klass.open_second_vote()
    second = klass.view(ana).key
    lecture.reveal()
    keys = [waiting, asking, answered, second, klass.view(ana).key]
    assert len(set(keys)) == 5


def test_the_lecturer_chooses_the_question_until_the_first_answer(pairs):
    lecture = Lecture(pairs)
    klass = lecture.klass
    ana = klass.join("Ana")
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
    klass.answer(ana, 1, 1)
    assert "keeps its question" in klass.set_question(Ask.COMMIT)
    assert klass.current.question.ask is Ask.NODE
    lecture.reveal()
    assert lecture.step().question.ask is Ask.COMMIT, "the next step asks the new question"


def test_every_question_is_answerable_from_its_choices_on_every_step(pairs):
    session = Session("x")
    controller = Controller(session, in_process(pairs))
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
    ana = klass.join("Ana")
    current = lecture.step()
    copy = Classroom.from_state(klass.state())
    assert copy.code == klass.code and copy.token == klass.token and copy.current.index == current.index
    copy.answer(ana, 1, current.question.answer)
    assert not klass.current.answers, "the copy is its own"
    lecture.controller.step(SETTINGS, "hello there")
    session = pickle.loads(pickle.dumps(lecture.session.run))  # the lecturer's run as another process sees it
    assert copy.follow(session) and copy.current.index == 1, "an equal copy of the run goes on, not restarts"
    assert copy.score(copy.learner(ana)) == (1, 1)
    with pytest.raises(UserError, match="already goes by"):
        copy.join("ANA")  # the names travel with the class
    registry = ClassRegistry()
    assert registry.adopt(copy) is registry.find(copy.code)


def test_a_second_vote_scores_the_second_answer_and_counts_who_moved(pairs):
    lecture = Lecture(pairs)
    klass = lecture.klass
    ana, ben, chi, dee = (klass.join(name) for name in ("Ana", "Ben", "Chi", "Dee"))
    current = lecture.step()
    right = current.question.answer
    wrong = next(v for _, v in current.question.choices if v != right)
    klass.answer(ana, 1, wrong)
    klass.answer(ben, 1, right)
    klass.answer(chi, 1, wrong)
    assert klass.open_second_vote().vote == 2
    view = klass.view(ana)
    assert view.mine is None and view.first == wrong, "the second vote starts open; the first answer is shown"
    klass.answer(ana, 1, right)   # convinced by a neighbour
    klass.answer(ben, 1, wrong)   # talked out of it
    klass.answer(dee, 1, right)   # missed the first vote
    with pytest.raises(UserError, match="in the second vote already"):
        klass.answer(ana, 1, wrong)
    assert current.tally(1) == {wrong: 2, right: 1} and current.tally(2) == {right: 2, wrong: 1}
    lecture.reveal()
    assert [klass.view(t).right for t in (ana, ben, chi, dee)] == [1, 0, 0, 1], "scored on the last answer given"
    (row,) = klass.summary()
    assert (row.answered, row.right, row.first_right, row.second_answered) == (4, 2, 1, 3)
    assert (row.moved_to_right, row.moved_from_right) == (2, 1), "Dee had no first answer: a move to the right"


def test_the_results_hold_every_vote_and_score_and_leave_names_out_when_asked(pairs):
    lecture = Lecture(pairs)
    klass = lecture.klass
    ana, ben = klass.join("Ana"), klass.join("Ben")
    current = lecture.step()
    right = current.question.answer
    klass.answer(ana, 1, right)
    klass.open_second_vote()
    klass.answer(ana, 1, right)
    klass.answer(ben, 1, right)
    unrevealed = klass.results()
    assert {r["right_answer"] for r in unrevealed if r["kind"] == "answer"} == {""}, "not before the reveal"
    lecture.reveal()
    rows = klass.results()
    answers = [r for r in rows if r["kind"] == "answer"]
    label = current.question.label(right)
    assert [(r["learner"], r["first_vote"], r["second_vote"], r["right"]) for r in answers] == \
        [("Ana", label, label, "yes"), ("Ben", "", label, "yes")]
    assert {r["right_answer"] for r in answers} == {label} and answers[0]["question"] == current.question.text
    assert [(r["learner"], r["score"], r["revealed_rounds"]) for r in rows if r["kind"] == "score"] == \
        [("Ana", 1, 1), ("Ben", 1, 1)]
    anonymous = klass.results(names=False)
    assert {r["learner"] for r in anonymous} == {"learner 1", "learner 2"}
    assert "Ana" not in repr(anonymous) and "Ben" not in repr(anonymous)


def test_the_rejected_first_question_lists_only_the_candidates_tested_while_every_test_passes(pairs):
    """The short list is known before the tests, and the right answer is always on it (every method, T = 0 and
    T > 0): the walk goes down from the first candidate that passes, and tries every target-rooted chain."""
    session = Session("x")
    controller = Controller(session, in_process(pairs))
    checked = 0
    for method in ("sd", "mcsd", "ti-mcsd", "pld", "dynamic"):
        for temperature in (0.0, 1.0):
            settings = replace(SETTINGS, method=method, temperature=temperature, max_new_tokens=32)
            session.reset()
            controller.step(settings, "count: one two three")
            while not session.done and len(session.run.steps) < 8:
                controller.step(settings, "count: one two three")
            for index, step in enumerate(session.run.steps):
                question = question_for(session.run, index, Ask.FIRST_REJECTED)
                if question.ask is not Ask.FIRST_REJECTED:  # a step with no candidates asks how many it commits
                    continue
                listed = [v for _, v in question.choices]
                assert listed == first_tests(step) + [NO_REJECTION], (method, index)
                assert question.answer in listed, (method, temperature, index)
                checked += question.answer != NO_REJECTION
    assert checked >= 10, "enough rejections to check against"
