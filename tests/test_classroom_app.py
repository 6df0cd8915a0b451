"""A class on the page (ui/classroom.py), without a browser: the learner's route and the lecturer's endpoints exist;
a learner's view of a step before its reveal tells nothing of the verdicts; each learner event sends only what it
sets; a reload rejoins by name; the lecturer's link and QR code; a learner cannot act for the lecturer. Over HTTP the
class is the soak's (scripts/soak.py class_phase, tests/test_soak.py) and the classroom script's
(tests/test_scripts.py)."""
import dataclasses
import html
import json

import gradio as gr
import pytest

from dynasd.explorer.inputs import Settings
from dynasd.explorer.pairs import PairCache
from dynasd.explorer.sessions.calls import in_process
from dynasd.explorer.sessions.classroom import Ask, ClassRegistry, Phase
from dynasd.explorer.sessions.controller import Controller
from dynasd.explorer.sessions.session import Session

SETTINGS = Settings(pair="tiny-random", method="mcsd", k_config="2,2,1", max_new_tokens=24).normalised()


@pytest.fixture
def classroom(tiny_pair, monkeypatch):
    """A class on a lecturer's session, served from ui/state's registry (replaced for the test)."""
    from ui import state

    registry = ClassRegistry()
    monkeypatch.setattr(state, "CLASSES", registry)
    session = Session("lecturer")
    controller = Controller(session, in_process(PairCache(loader=lambda *_, **__: tiny_pair)))
    klass = registry.start(session.id, None)
    return session, controller, klass


def join(code, name, token=""):
    """A learner's Join on the page: their rejoin token, as the page keeps it."""
    from ui.classroom import JoinViews, on_join

    fields = [field.name for field in dataclasses.fields(JoinViews)]
    return dict(zip(fields, on_join(code, name, token)))["token"]


def step(session, controller, klass):
    controller.step(SETTINGS, "hello there")
    klass.follow(session.run)


def test_the_app_serves_the_learners_page_as_a_route_with_the_class_endpoints():
    from ui.layout import build_app

    demo = build_app("tiny-random")
    assert ("class", "Class", False) in demo.pages, "a route of its own, not in the navbar"
    api = {fn.api_name for fn in demo.fns.values() if fn.api_name}
    assert {"class_start", "class_step", "class_reveal", "class_question", "class_end", "class_answers",
            "class_join", "class_poll", "class_show", "class_answer"} <= api
    learner = {fn.api_name: fn for fn in demo.fns.values() if fn.page == "class"}
    assert learner and all(not fn.queue for fn in learner.values()), "no learner event waits in the model's queue"
    assert all(fn.page == "" for fn in demo.fns.values() if fn.api_name and fn.api_name.startswith("class_")
               and fn.api_name not in learner), "the lecturer's events live on the lecturer's page"


def test_before_the_reveal_a_learners_view_tells_no_verdict(classroom):
    from ui.classroom import on_poll, on_show

    session, controller, klass = classroom
    ana = join(klass.code, "Ana")
    step(session, controller, klass)
    assert klass.phase is Phase.ASKING
    status, question, outcome, text, story, tree, mask, pq, asked, *_ = on_show(klass.code, ana)
    assert pq is None and outcome == "" and asked == 1
    statuses = {str(point) for trace in json.loads(tree)["data"] for point in [trace.get("name")]}
    assert not any("accepted" in s or "rejected" in s for s in statuses), statuses
    assert "Step 0" in question and "How many tokens" in question
    *_, choice, answer_btn = on_show(klass.code, ana)
    assert [value for _, value in choice.choices] == [v for _, v in klass.current.question.choices]
    key = on_poll(klass.code, ana)
    assert isinstance(key, str) and on_poll(klass.code, ana) == key, "one plain value, the same until a change"
    controller.reveal(0)
    klass.follow(session.run)
    status, question, outcome, text, story, tree, mask, pq, asked, *_ = on_show(klass.code, ana)
    assert pq is not None and "You did not answer step 0" in outcome and "score" in status
    assert on_poll(klass.code, ana) != key


def test_the_figures_of_a_round_are_drawn_once_for_the_whole_class(classroom, monkeypatch):
    import viz
    from ui import classroom as ui_classroom

    session, controller, klass = classroom
    tokens = [join(klass.code, name) for name in ("Ana", "Ben", "Chi")]
    step(session, controller, klass)
    drawn = []
    real = viz.tree_figure
    monkeypatch.setattr(viz, "tree_figure", lambda *a, **k: drawn.append(1) or real(*a, **k))
    controller.reveal(0)
    klass.follow(session.run)
    for token in (*tokens, tokens[0]):
        ui_classroom.on_show(klass.code, token)
    assert len(drawn) == 1


def test_an_answer_is_counted_once_and_bad_input_is_said_in_one_line(classroom):
    from ui.classroom import on_answer, on_poll

    session, controller, klass = classroom
    ana = join(klass.code, "Ana")
    step(session, controller, klass)
    right = klass.current.question.answer
    status, key = on_answer(klass.code, ana, 1, right)
    assert status.startswith("✓") and "your answer to step 0 is in" in status and key == on_poll(klass.code, ana)
    for args, said in [((ana, 1, right), "that answer stands"), (("Zed" * 8, 1, right), "join the class first"),
                       (("", 1, right), "join the class first"), (("<Ana>", 1, right), "token is damaged"),
                       ((ana, 9, right), "closed at its reveal")]:
        status, key = on_answer(klass.code, *args)
        assert status.startswith("⚠") and said in status and "\n" not in status, status
    assert len(klass.current.answers) == 1
    status, key = on_answer("NPE99", ana, 1, right)
    assert status.startswith("⚠") and "no class has the code NPE99" in status
    assert on_poll("NPE99", ana).startswith("⚠"), "a page whose class is gone shows why, once"


def test_a_reload_or_another_tab_is_the_learner_the_browsers_token_names(classroom):
    from types import SimpleNamespace

    from ui.classroom import JoinViews, on_answer, on_join, on_learner_open

    session, controller, klass = classroom
    token = join(klass.code, "Ana Lima")
    step(session, controller, klass)
    on_answer(klass.code, token, 1, 2)
    request = SimpleNamespace(query_params={"code": klass.code.lower()})
    fields = ["code", "name", *(field.name for field in dataclasses.fields(JoinViews))]
    opened = dict(zip(fields, on_learner_open([klass.code, "Ana Lima", token], request)))
    assert opened["name"] == "Ana Lima" and opened["latest"].endswith(".2") and opened["token"] == token
    assert "your answer to step 0 is in" in opened["status"] and "another tab" in opened["you"]
    code, name, *rest = on_learner_open(["OTHER", "Ana Lima", token], request)
    assert code == klass.code.lower() and name == gr.skip(), "another class's name is not typed in for this one"
    assert all(v == gr.skip() for v in rest), "nor joined with its token"
    status = dict(zip(fields[2:], on_join(klass.code, "ana lima")))
    assert "already goes by 'Ana Lima'" in status["status"] and status["token"] == gr.skip(), \
        "a classmate typing the name is refused"
    assert len(klass.learners) == 1


def test_only_the_lecturer_steps_reveals_asks_and_ends(classroom):
    from ui.classroom import on_class_end, on_class_reveal, on_class_step

    session, controller, klass = classroom
    before = (klass.version, len(klass.rounds), klass.ended)
    for outputs in (on_class_step(session.id, klass.code, "", "hi", **SETTINGS.controls()),
                    on_class_reveal(session.id, klass.code, "guess"), on_class_end(session.id, klass.code, None)):
        said = [o for o in outputs if isinstance(o, str) and "only the class's lecturer" in o]
        assert said and said[0].startswith("⚠"), outputs
    assert (klass.version, len(klass.rounds), klass.ended) == before


def test_the_link_is_an_address_learners_reach_or_says_why_not_and_a_strange_address_is_not_used(monkeypatch):
    from ui import class_address
    from ui.classroom import class_link, qr_svg

    monkeypatch.delenv("SPACE_HOST", raising=False)
    monkeypatch.setattr(class_address, "LISTEN", {"host": "127.0.0.1", "port": 7860})
    assert class_link("https://teach.example.org/app/", "K7QX2") == \
        ("https://teach.example.org/app/class?code=K7QX2", ""), "an address the lecturer reached from outside"
    link, warning = class_link("http://127.0.0.1:7860/", "K7QX2")
    assert link == "http://127.0.0.1:7860/class?code=K7QX2" and "Phones cannot open this link" in warning
    assert "--host 0.0.0.0" in warning
    for strange in ("javascript:alert(1)", "https://x\"><script>", "https://" + "a" * 400, None, 12):
        assert class_link(strange, "K7QX2") == ("/class?code=K7QX2", "")
    monkeypatch.setattr(class_address, "LISTEN", {"host": "0.0.0.0", "port": 7861})
    monkeypatch.setattr(class_address, "lan_address", lambda: "192.168.1.23")
    assert class_link("http://localhost:7861/", "K7QX2") == ("http://192.168.1.23:7861/class?code=K7QX2", "")
    monkeypatch.setattr(class_address, "lan_address", lambda: None)
    assert "no local network address" in class_link("http://localhost:7861/", "K7QX2")[1]
    monkeypatch.setattr(class_address, "LISTEN", {"host": "10.0.0.5", "port": 7862})
    assert class_link("http://127.0.0.1:7862/", "K7QX2") == ("http://10.0.0.5:7862/class?code=K7QX2", "")
    monkeypatch.setenv("SPACE_HOST", "someone-dynasd.hf.space")
    assert class_link("http://127.0.0.1:7862/", "K7QX2") == ("https://someone-dynasd.hf.space/class?code=K7QX2", "")
    svg = qr_svg("http://127.0.0.1:7860/class?code=K7QX2")
    assert svg.startswith("<svg") and "QR code: http://127.0.0.1:7860/class?code=K7QX2" in svg


def test_the_lecturers_question_choice_reaches_the_round_on_show(classroom):
    from ui.classroom import ASKS, on_class_ask, on_show

    session, controller, klass = classroom
    ana = klass.join("Ana")
    step(session, controller, klass)
    status, *_ = on_class_ask(session.id, klass.code, klass.token, Ask.FIRST_REJECTED.value, None)
    assert "now asks" in status and klass.current.question.ask is Ask.FIRST_REJECTED
    _, question, *_, choice, _ = on_show(klass.code, ana)
    assert "reject first" in question, "the learner's page shows the new question"
    assert choice.choices == [(html.unescape(label), value) for label, value in klass.current.question.choices], \
        "and its answers to choose from, as plain text"
    status, *_ = on_class_ask(session.id, klass.code, klass.token, "why?", None)
    assert status.startswith("⚠") and all(name in status for name in ASKS)
    status, *_ = on_class_ask(session.id, klass.code, klass.token, Ask.NODE.value, "x")
    assert status.startswith("⚠") and "node number" in status


def test_the_answers_bars_name_no_one_and_hide_the_right_answer_until_the_reveal():
    from collections import Counter

    from dynasd.explorer.sessions.classroom import Question
    from viz.classroom import answers_figure

    question = Question(Ask.COMMIT, "Step 3: how many?", (("1 token", 1), ("2 tokens", 2), ("3 tokens", 3)), 2,
                        "step 3 committed 2 tokens", "why")
    tally = Counter({1: 3, 3: 1})
    before = answers_figure(question, tally, False, 5)
    assert list(before.data[0].y) == ["1 token", "3 tokens"] and list(before.data[0].x) == [3, 1]
    assert "4 of 5 answered" in before.layout.title.text and "2 tokens" not in before.layout.title.text
    assert len(set(before.data[0].marker.color)) == 1, "before the reveal no bar stands out"
    after = answers_figure(question, tally, True, 5)
    assert list(after.data[0].y) == ["1 token", "✓ 2 tokens", "3 tokens"] and list(after.data[0].x) == [3, 0, 1]
    assert after.data[0].marker.color[1] != after.data[0].marker.color[0], "the right bar differs in colour and ✓"


def test_a_reload_of_the_lecturers_page_puts_the_class_back_only_with_its_secret(classroom):
    from ui.classroom import ClassStartViews, on_lecturer_open

    session, controller, klass = classroom
    fields = [field.name for field in dataclasses.fields(ClassStartViews)]
    shown = dict(zip(fields, on_lecturer_open([klass.code, klass.token], "http://127.0.0.1:7860/")))
    assert shown["code"] == klass.code and shown["token"] == klass.token
    assert f"/class?code={klass.code}" in shown["link"] and "is on show again" in shown["class_status"]
    assert shown["session_id"] == gr.skip(), "the page keeps its own session"
    for kept in ([klass.code, "not the secret"], ["", ""], None, ["ZZZZZ", klass.token]):
        assert all(v == gr.skip() for v in on_lecturer_open(kept, "http://127.0.0.1:7860/")), kept


@pytest.mark.slow(seconds=12)
def test_a_server_open_to_the_room_links_learners_to_its_local_network_address(tmp_path):
    """`python app.py --host 0.0.0.0` and a lecturer on the machine's loopback: the class's link and QR code carry
    the machine's address on its local network, which phones can open (or, with no network, say so); the same app
    on the loopback only says phones cannot open its link (the browser test's server)."""
    from conftest import served_app
    from gradio_client import Client

    from ui.class_address import lan_address

    with served_app(["--pair", "tiny-random"], {"DYNASD_PUBLIC": "", "SPACE_HOST": ""}, tmp_path / "app.log",
                    host="0.0.0.0") as url:
        port = url.rstrip("/").rsplit(":", 1)[1]
        started = Client(url, verbose=False).predict(url, api_name="/class_start")
    code, link, qr = started[3], started[5], started[6]
    address = lan_address()
    if address is None:
        assert "no local network address" in link
    else:
        assert f"Learners open **http://{address}:{port}/class?code={code}**" in link
        assert "Phones cannot" not in link and f"http://{address}:{port}/class?code={code}" in qr


def test_the_results_download_as_csv_with_formulas_kept_as_text_and_the_legend_shows_only_this_texts_kinds(classroom):
    import csv
    import io
    from pathlib import Path

    from ui.classroom import ClassResultsViews, ShowViews, on_class_results, on_show

    session, controller, klass = classroom
    fields = [field.name for field in dataclasses.fields(ClassResultsViews)]
    said = dict(zip(fields, on_class_results(session.id, klass.code, klass.token, False)))
    assert said["class_status"].startswith("⚠") and "no results" in said["class_status"], "nothing to export yet"
    sneaky = join(klass.code, "=HYPERLINK(1)")
    step(session, controller, klass)
    klass.answer(sneaky, 1, klass.current.question.answer)
    controller.reveal(0)
    klass.follow(session.run)
    shown = dict(zip(fields, on_class_results(session.id, klass.code, klass.token, False)))
    path = Path(shown["results"].value["path"])  # the File shown, with the CSV's path
    rows = list(csv.DictReader(io.StringIO(path.read_text(encoding="utf-8"))))
    assert {row["learner"] for row in rows} == {"'=HYPERLINK(1)"}, "a spreadsheet reads it as text, not a formula"
    assert [row["kind"] for row in rows] == ["answer", "score"] and rows[0]["right"] == "yes"
    views = dict(zip([field.name for field in dataclasses.fields(ShowViews)], on_show(klass.code, sneaky)))
    text = views["text"]
    kinds = {label for _, label in klass.drawn[klass.frame()]["text"] if label}
    assert kinds and set(text.color_map) == kinds, "the legend shows the kinds of token this text has, no more"
