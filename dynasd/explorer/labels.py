"""A token as a learner reads it, in every view and sentence: whitespace made visible, long tokens cut, HTML
escaped. In the engine's package because the explorer's own sentences (the guided step's phases) quote tokens the
same way the figures label them."""
from __future__ import annotations

import html

MAX_LABEL_CHARS = 10


def visible_piece(token: str) -> str:
    """A token with its whitespace made visible (␣ space, ↵ newline, ⇥ tab): the one convention the tree, the
    mask and the text panel share, so a word piece such as 'leigh' never passes for a word of its own."""
    return token.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥").replace("\r", "")


def show_token(token: str, limit: int = MAX_LABEL_CHARS) -> str:
    """A token as a short visible label: whitespace made visible, long tokens cut, HTML escaped (Plotly
    renders a subset of HTML, so a token like '<s>' would otherwise vanish)."""
    visible = visible_piece(token)
    if visible == "":
        visible = "∅"
    if len(visible) > limit:
        visible = visible[: limit - 1] + "…"
    return html.escape(visible, quote=False)  # Plotly decodes &lt; &gt; &amp; but prints &quot; literally
