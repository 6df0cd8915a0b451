"""The two shipped examples of both sides on a CPU: each replays with no model and says its one-line reason, and
its recorded steps show what that reason says (many tokens per forward for few rows, or few for many)."""
from dynasd.explorer.costs.both_sides import NOTES, example_note
from dynasd.explorer.costs.cost import run_shape
from dynasd.explorer.sessions.share import example_traces, load_example


def test_each_side_has_a_shipped_example_whose_steps_show_its_reason():
    assert set(NOTES) <= set(example_traces())
    pays, loses = load_example("pld-copying-pays"), load_example("mcsd-wide-tree-loses")
    assert pays.method == "pld" and loses.method == "mcsd"
    pays_shape, loses_shape = run_shape(pays), run_shape(loses)
    assert pays.summary()["tokens_per_target_forward"] >= 3 and pays_shape.rows <= 10
    assert loses.summary()["tokens_per_target_forward"] < 2.5 and loses_shape.rows >= 40
    assert loses_shape.draft_forwards >= 3 and pays_shape.draft_forwards == 0
    assert example_note("pld-copying-pays").startswith("Speculation pays here")
    assert example_note("mcsd-wide-tree-loses").startswith("Speculation loses here")
    assert example_note("sd-sampled") == ""


def test_replaying_an_example_says_its_reason(explorer_url):
    from gradio_client import Client

    client = Client(explorer_url, verbose=False)
    views = client.predict("pld-copying-pays", api_name="/replay_example")
    assert "Speculation pays here" in views[7]  # the status line
