"""The two sides of speculation on a CPU, as two shipped examples with the cost model's one-line reason each.

The numbers come from the bench run recorded in docs/benchmarks.md ("Where speculation pays on a CPU, and where it
loses"); the examples themselves (assets/examples, written by scripts/example_traces.py) replay with no model.
"""
from __future__ import annotations

NOTES = {
    "pld-copying-pays": (
        "Speculation pays here: the answer copies the prompt, so prompt lookup's chains are mostly accepted (3.5 "
        "tokens per target forward) for about 5 verify rows and no draft model; on a CPU each verify row costs "
        "about a tenth of a forward (1 row 4.7 ms, 8 rows 12.5 ms on the Xeon measured), so a forward that "
        "commits 3.5 tokens costs far less than 3.5 ar steps (2.03x ar on this prompt, 1.59x on the copying "
        "prompts; docs/benchmarks.md)."),
    "mcsd-wide-tree-loses": (
        "Speculation loses here: free writing gives the draft little to guess right (1.8 tokens per target "
        "forward), while the default 44-node tree makes every verify 45 rows, several times the cost of one row "
        "on a CPU, plus four draft forwards a step (0.27x ar on the free-writing prompts; docs/benchmarks.md). "
        "Trees this wide pay where rows are nearly free: a GPU."),
}


def example_note(name: str) -> str:
    """The one-line reason of a shipped example ('' for one without a note)."""
    return NOTES.get(name, "")
