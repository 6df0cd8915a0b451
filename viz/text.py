"""The generated text as (token, label) spans for gr.HighlightedText: every token labelled by where it came
from, the tokens of the step on show labelled a second time so they stand out; each label's colour and its second
cue (chip_cue), so that no two kinds differ by colour alone."""
from __future__ import annotations

from dataclasses import dataclass

from dynasd.origins import BY_NAME, DRAFT, TARGET_ROOT
from dynasd.trace import PROPOSED_ORIGINS, RunTrace
from dynasd.trace_semantics import off_target_commit

from .style import ORIGIN_NAMES, ORIGIN_STRONG, ORIGIN_TINTS, STATUS_GLYPHS, THIS_STEP, fmt, visible_piece


def shown_piece(token: str) -> str:
    """A token as the text panel prints it: whitespace visible as in the tree (␣, ↵, ⇥), and a newline still
    breaking the line, so the text keeps its shape."""
    return visible_piece(token).replace("↵", "↵\n") or "∅"


def text_spans(run: RunTrace, current: int | None = None, visible: bool = True) -> list[tuple[str, str]]:
    """Spans of the text as it stood after step `current` (default: the latest step), one per token. With
    `visible` (the app's view) spaces show as ␣ like in the tree, so word pieces never pass for words;
    without it, joining the span texts gives the committed tokens exactly as the tokenizer prints them."""
    if current is None:
        current = len(run.steps) - 1
    spans: list[tuple[str, str]] = []
    for step in run.steps[: current + 1]:
        suffix = THIS_STEP if step.index == current else ""
        for token, origin in zip(step.committed_tokens, step.committed_origins):
            spans.append((shown_piece(token) if visible else token, ORIGIN_NAMES[origin] + suffix))
    return spans


def text_color_map(spans: list[tuple[str, str]] | None = None) -> dict[str, str]:
    """Label -> colour for every label text_spans can produce, or only for those used in `spans` (the
    HighlightedText legend lists every colour-map entry, so passing the spans keeps the legend to the point)."""
    colors = {ORIGIN_NAMES[o]: ORIGIN_TINTS[o] for o in ORIGIN_NAMES}
    colors.update({ORIGIN_NAMES[o] + THIS_STEP: ORIGIN_STRONG[o] for o in ORIGIN_NAMES})
    if spans is not None:
        used = {label for _, label in spans}
        colors = {label: color for label, color in colors.items() if label in used}
    return colors


@dataclass(frozen=True)
class ChipCue:
    """What tells a text chip's kind besides its colour, which greyscale and colour-vision deficiencies take away:
    its underline's style (None: none), a glyph after it (the tree's, for the target's own tokens) and, for the
    tokens of the step on show, a bold, boxed chip. The page draws it on the chip and on its legend entry
    (ui/page_scripts.py)."""

    underline: str | None
    glyph: str
    this_step: bool


# A candidate origin's tokens by their underline (one CSS style each); the target's own by their tree glyph.
CHIP_UNDERLINES: dict[str, str | None] = {"draft": "solid", "lookup": "dotted", "recycled": "dashed",
                                          "target_root": "double", "correction": None, "bonus": None,
                                          "target": None}
CHIP_GLYPHS: dict[str, str] = {"correction": STATUS_GLYPHS["correction"], "bonus": STATUS_GLYPHS["bonus"]}


def chip_cue(label: str) -> ChipCue:
    """The second cue of a text_spans label (ar's target tokens, the only kind in an ar run, have none)."""
    this_step = label.endswith(THIS_STEP)
    origin = next(o for o, name in ORIGIN_NAMES.items() if name == label.removesuffix(THIS_STEP))
    return ChipCue(CHIP_UNDERLINES[origin], CHIP_GLYPHS.get(origin, ""), this_step)


LOSSY_NOTE = "**LOSSY method** (ti-mcsd, width > 1): the text may differ from the target's own. "


def step_story(run: RunTrace, index: int) -> str:
    """One paragraph that tells what happened in a step, in words a newcomer can follow; it is named by the step's
    own index (a step taken another way from a prefix keeps the index of the step it stands for)."""
    step = run.steps[index]
    lossy = "" if run.lossless else LOSSY_NOTE
    tokens = " ".join(f"`{_quote(t)}`" for t in step.committed_tokens) or "nothing"
    if not step.nodes:
        return (f"{lossy}**Step {step.index}.** No draft: the target alone ran one forward and produced {tokens}. "
                f"One token per target forward, the baseline.")
    n = len(step.committed)
    parts = [f"{lossy}**Step {step.index}.**", *_drafted(step)]
    if step.live_depth < step.max_depth and step.stop_scores:  # a shorter lookup or recycled tree is no stop
        parts.append(f"Drafting stopped early at level {step.live_depth} of {step.max_depth}: "
                     "no tip's score reached the threshold.")
    parts.append("The target scored all of them in **one** forward.")
    parts += _walked(step)
    parts.append(f"Committed: {tokens}: **{n} token{'s' if n != 1 else ''} for {step.target_forwards} target "
                 f"forward{'s' if step.target_forwards != 1 else ''}** "
                 f"(autoregressive decoding would have needed {n}).")
    return " ".join(parts)


def _drafted(step) -> list[str]:
    """Where the step's candidates came from."""
    drafted = len(step.nodes)
    sources = [BY_NAME[name] for name in dict.fromkeys(node.origin for node in step.nodes)]  # tree order, once
    roots = sum(node.origin == TARGET_ROOT.name for node in step.nodes)
    if roots:
        return [f"The target's own top {roots} next tokens started {roots} chains; the draft extended them "
                f"to {drafted} candidates in {step.draft_forwards} draft forward"
                f"{'s' if step.draft_forwards != 1 else ''}."]
    if step.draft_forwards == 0:
        proposers = " and ".join(source.proposed_by for source in sources)
        return [f"{proposers[:1].upper()}{proposers[1:]} gave the {drafted} candidate"
                f"{'s' if drafted != 1 else ''}, with no draft forward."]
    others = [source for source in sources if source is not DRAFT]  # joined to the draft's tree (sd, mcsd)
    drawn = sum(node.origin == DRAFT.name for node in step.nodes)
    # their measured time, not "cheap": on a CPU one draft forward can cost most of a target's
    said = [f"The draft proposed {drawn} candidate tokens on {step.live_depth} level"
            f"{'s' if step.live_depth != 1 else ''} ({step.draft_forwards} draft forward"
            f"{'s' if step.draft_forwards != 1 else ''}, {step.draft_seconds * 1000:.0f} ms here; the "
            f"verify took {step.verify_seconds * 1000:.0f} ms)."]
    if others:
        said.append(f"{drafted - drawn} more came from {' and '.join(s.proposed_by for s in others)}.")
    return said


def _walked(step) -> list[str]:
    """What the walk accepted, and the token the target added after it."""
    sources = [BY_NAME[name] for name in dict.fromkeys(node.origin for node in step.nodes)]
    accepted = sum(o in PROPOSED_ORIGINS for o in step.committed_origins)
    # the accepted tokens' own word when they share one ("2 recycled tokens"), else the plain "candidate"
    kinds = {BY_NAME[o].kind for o in step.committed_origins if o in PROPOSED_ORIGINS} or {sources[0].kind}
    kind = kinds.pop() if len(kinds) == 1 else "candidate"
    final = step.committed_origins[-1] if step.committed_origins else ""
    were = f"{accepted} {kind} token{'s were' if accepted != 1 else ' was'} accepted"
    if any(node.origin == TARGET_ROOT.name for node in step.nodes):
        return _chains_won(step, accepted)
    if final == "correction" and accepted == 0:
        return ["The target rejected every first-level candidate, so it supplied a correction token itself."]
    if final == "correction":
        return [f"{were}, then a candidate was rejected and the target supplied a correction token."]
    if final == "bonus":
        return [f"{were}, the whole way down, so the target added a bonus token for free."]
    return [f"{were}."]


def _chains_won(step, accepted: int) -> list[str]:
    """ti-mcsd's walk: the chain with the most accepted tokens, and where it left the target's choice."""
    said = [f"The chain with the most accepted draft tokens won: its root plus {accepted} draft "
            f"token{'s' if accepted != 1 else ''}."]
    departed = off_target_commit(step)
    if departed is not None:
        chosen, top = (step.nodes[i] for i in departed)
        said.append(f"**Off the target's choice:** it committed `{_quote(chosen.token)}` (p = {fmt(chosen.p)}) "
                    f"where the target's top token was `{_quote(top.token)}` (p = {fmt(top.p)}): this is "
                    "where the lossy method's text departs from the target's own.")
    said.append("This method adds no bonus or correction token: the winning chain, root included, is "
                "what it commits.")
    return said


def _quote(token: str) -> str:
    return token.replace("`", "'").replace("\n", "↵") or "∅"
