"""Where a candidate came from, declared once per source: the name a trace records, and how every view shows it.

A candidate's origin is written into the trace (NodeTrace.origin, StepTrace.committed_origins) and read back by
the trace's checks, the figures, the text panel, the bench and the app's help. Tables of origins kept view by view
drift apart, and a source one of them lacks crashes the view that reads it on the source's first step. So a source
declares its origin here, once: dynasd/trace.py takes its origin tuples from ORIGINS, viz/ its symbols, colours
and labels, ui/ its help. Colours are plain CSS strings: the engine names them, viz/ draws with them.

The target's own tokens (bonus, correction, the target's token in ar) are not candidates: they are the target's
picks after the walk, kept in dynasd/trace.py and drawn by viz/style.py.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Origin:
    """One candidate origin and everything a view says about it."""

    name: str         # the value in a trace; never changes, or saved traces stop loading
    source: str       # what proposed it, in the tree's hover
    label: str        # its committed tokens in the text panel and the timeline's bars
    kind: str         # adjective for its tokens in a step's story ("2 looked-up tokens were accepted")
    proposed_by: str  # where a step's candidates of this origin came from, in the story and the guided step
    symbol: str       # the tree's marker (a Plotly symbol name)
    glyph: str        # the same shape as a character, for the help text
    tint: str         # text-panel background of its committed tokens
    strong: str       # the same hue, darker: tokens of the step on show and the timeline's bars
    help: str         # one line on what it is and how it is tested, for the tree's help
    tested: bool = True  # False: the target's own picks, never tested against a q (not counted as accepted)


DRAFT = Origin(
    name="draft", source="draft model", label="accepted draft", kind="draft", proposed_by="the draft",
    symbol="circle", glyph="●", tint="#7fd18d", strong="#1f8a33",
    help="**draft model** (sd, mcsd; ti-mcsd below its roots): the draft's pick; at temperature 0 accepted when "
         "it is the target's top token, at temperature > 0 drawn from the draft's q and accepted when "
         "u < min(1, p′/q′).")
LOOKUP = Origin(
    name="lookup", source="prompt lookup (q = 1)", label="accepted lookup", kind="looked-up",
    proposed_by="prompt lookup (the tokens that followed the last few tokens where they occurred earlier in the "
                "text)",
    symbol="square", glyph="■", tint="#e3d36b", strong="#9a8a12",
    help="**prompt lookup** (pld, or sd/mcsd with lookup on): copied from an earlier place in the text, so their q "
         "is 1; at temperature 0 a node is accepted when it is the target's top token, at temperature > 0 with "
         "probability p.")
RECYCLED = Origin(
    name="recycled", source="token recycling (q = 1)", label="accepted recycled", kind="recycled",
    proposed_by="token recycling (the target's own top predictions after these tokens, the last time it read "
                "them)",
    symbol="triangle-up", glyph="▲", tint="#8fd6bf", strong="#1b8a6b",
    help="**token recycling** (recycle, or sd/mcsd with recycle on): the target's own top-k after the same token, "
         "the last time it read it, so their q is 1; at temperature 0 a node is accepted when it is the target's "
         "top token, at temperature > 0 with probability p.")
TARGET_ROOT = Origin(
    name="target_root", source="target root", label="target root", kind="target root",
    proposed_by="the target's own top tokens (from the previous verify)",
    symbol="diamond", glyph="◆", tint="#b99be6", strong="#6a3fb5",
    help="**target roots** (ti-mcsd): the target's own top tokens from the previous step; never tested, the chain "
         "with the most accepted draft tokens wins.", tested=False)

# Every candidate origin, in the order legends and the timeline list them.
ORIGINS: tuple[Origin, ...] = (DRAFT, LOOKUP, RECYCLED, TARGET_ROOT)
BY_NAME: dict[str, Origin] = {origin.name: origin for origin in ORIGINS}
