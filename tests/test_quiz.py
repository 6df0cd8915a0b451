"""The checkpoint quiz: its answers are the trace's own numbers (checked here against the trace independently), each
question offers its answer among its choices and says where on the page to read it; marking counts right answers;
it is built and checked through the API and in a real browser on a replayed example."""
import pytest
from test_browser import WAIT_S, browser  # noqa: F401  (the browser fixture)

from dynasd.explorer.inputs import UserError
from dynasd.explorer.lessons import quiz
from dynasd.explorer.sessions.share import example_traces, load_example


def test_every_example_gets_eight_questions_whose_answers_are_among_the_choices():
    for name in example_traces():
        questions = quiz.build_quiz(load_example(name))
        assert len(questions) == quiz.QUESTIONS
        for q in questions:
            assert q.answer in q.choices and len(set(q.choices)) == len(q.choices) >= 2, q.text
            assert q.view and q.why
        assert len({q.choices.index(q.answer) for q in questions if q.choices[0].isdigit()}) > 1, \
            "the right number is not always in the same place"


def test_the_answers_are_the_runs_own_facts():
    run = load_example("mcsd-greedy")
    by_text = {q.text.split("?")[0]: q for q in quiz.build_quiz(run)}
    assert by_text["How many target forwards did this run take (prefill not counted)"].answer == str(len(run.steps))
    assert by_text["How many tokens did this run generate"].answer == str(sum(len(s.committed) for s in run.steps))
    rows = next(q for text, q in by_text.items() if text.startswith("How many rows did step"))
    step = run.steps[int(rows.text.split()[5].rstrip("'s"))]
    assert rows.answer == str(len(step.nodes) + step.root_rows)
    ar = next(q for text, q in by_text.items() if text.startswith("Which token would ar"))
    step = run.steps[int(ar.text.rstrip("?").split()[-1])]
    assert ar.answer == repr(step.committed_tokens[0]).replace('"', "'")
    sampled = {q.text.split(":")[0]: q for q in quiz.build_quiz(load_example("sd-sampled"))}
    u_question = next(q for text, q in sampled.items() if "was tested" in text)
    assert u_question.answer in ("above (or equal)", "below") and ("≥" in u_question.why) == (
        u_question.answer == "above (or equal)")


def test_marking_counts_right_answers_and_says_where_to_look():
    questions = quiz.build_quiz(load_example("sd-sampled"))
    answers = [q.answer for q in questions[:5]] + [next(c for c in q.choices if c != q.answer) for q in questions[5:7]]
    marked = quiz.mark(questions, answers)
    assert [m.correct for m in marked] == [True] * 5 + [False, False, False]
    text = quiz.marked_markdown(marked)
    assert text.startswith("**Score: 5 of 8.**") and "not answered" in text and "Where to see it" in text
    with pytest.raises(UserError, match="nothing to quiz on"):
        quiz.build_quiz(None)


@pytest.mark.browser
@pytest.mark.slow(seconds=6)
def test_the_quiz_in_the_page_on_a_replayed_example(browser, explorer_url):  # noqa: F811
    """Build the quiz on the replayed example, answer the first question right, check: 1 or more of 8."""
    from gradio_client import Client
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    client = Client(explorer_url, verbose=False)
    client.predict("mcsd-greedy", api_name="/replay_example")
    *_, said, marks = client.predict(api_name="/quiz")
    assert "8 questions" in said
    assert client.predict(*[None] * quiz.QUESTIONS, api_name="/quiz_check").startswith("**Score: 0 of 8.**")

    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.05)
    browser.get(explorer_url)
    text = lambda elem_id: browser.find_element(By.ID, elem_id).text  # noqa: E731
    tab = lambda label: next(b for b in browser.find_elements(By.CSS_SELECTOR, "button[role=tab]")  # noqa: E731
                             if b.text.strip() == label)
    wait.until(ready.element_to_be_clickable((By.ID, "step-btn")))
    tab("Learn").click()
    tab("Share and examples").click()
    browser.find_element(By.ID, "learn-example-btn").click()  # the first example: mcsd-greedy
    wait.until(lambda _: "Replaying the example" in text("status"))
    tab("Quiz").click()
    browser.find_element(By.ID, "quiz-build").click()
    wait.until(lambda _: "8 questions" in text("quiz-status"))
    run = load_example("mcsd-greedy")
    first = browser.find_element(By.CSS_SELECTOR, f"#quiz-q1 input[value='{len(run.steps)}']")
    browser.execute_script("arguments[0].click()", first)
    browser.find_element(By.ID, "quiz-check").click()
    wait.until(lambda _: "Score:" in text("quiz-marks"))
    assert text("quiz-marks").startswith("Score: 1 of 8.") and "Where to see it" in text("quiz-marks")
