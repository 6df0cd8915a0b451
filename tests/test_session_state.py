"""A session's state is data: one app process steps a session, another goes on with it from its state alone.

Why: on ZeroGPU, and behind one URL served by several replicas, the process that serves a session's next event
need not be the one that served the last. The first process here runs the Play handlers in this test's process;
the second is a fresh interpreter that adopts the session from Session.state() bytes and steps it with its own
models. Both must go on exactly as one process would have.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO

TINY = dict(pair="tiny-random", method="mcsd", max_new_tokens=40, temperature=0.8, seed=5)
OUT_STATUS = 7

SECOND_PROCESS = """
import json, sys
from pathlib import Path
from dynasd.explorer.pairs import PairCache
from dynasd.explorer.sessions.session import Session
from ui import play, state
state.PAIRS = PairCache(device="cpu")
session = state.SESSIONS.adopt(Session.from_state(Path(sys.argv[1]).read_bytes()))
settings = json.loads(sys.argv[2])
said = [play.on_step(session.id, "go on", **settings)[7].split(" took")[0] for _ in range(3)]
steps = [[step.committed, [node.status for node in step.nodes]] for step in session.run.steps]
print(json.dumps({"said": said, "steps": steps, "text": session.run.text}))
"""


@pytest.mark.slow(seconds=8)
def test_a_second_process_goes_on_with_a_session_from_its_state(tmp_path):
    from dynasd.explorer.pairs import PairCache
    from dynasd.explorer.sessions.session import Session
    from ui import play, state

    state.PAIRS = PairCache(device="cpu")
    session = state.SESSIONS.get(None)
    for index in range(2):
        assert play.on_step(session.id, "go on", **TINY)[OUT_STATUS].startswith(f"✓ Step {index}")
    saved = tmp_path / "session.state"
    saved.write_bytes(session.state())
    assert len(saved.read_bytes()) < 64_000, "a session's state is small enough to travel with every call"
    copy = Session.from_state(saved.read_bytes())
    assert (copy.id, copy.run, copy.snapshot, copy.settings) == (session.id, session.run, session.snapshot,
                                                                 session.settings), "the state round-trips"

    second = subprocess.run([sys.executable, "-c", SECOND_PROCESS, str(saved), json.dumps(TINY)], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    there = json.loads(second.stdout.strip().splitlines()[-1])

    here = [play.on_step(session.id, "go on", **TINY)[OUT_STATUS].split(" took")[0] for _ in range(3)]
    assert there["said"] == here == ["✓ Step 2", "✓ Step 3", "✓ Step 4"]
    assert there["steps"] == [[step.committed, [node.status for node in step.nodes]] for step in session.run.steps]
    assert there["text"] == session.run.text
