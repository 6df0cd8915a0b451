"""The page's words: the introduction, each view's "What am I seeing?" help, the Learn tab's help and the example
prompts. The method and Compare help speak of the default tree, read from dynasd/options.py."""
from __future__ import annotations

from dynasd.device_info import machine_line
from dynasd.explorer.measure.compare import MIN_TIMED_S
from dynasd.options import DEFAULT_RECYCLE, OPTIONS, Shape
from dynasd.origins import LOOKUP, ORIGINS, RECYCLED
from dynasd.trace_semantics import GREEDY, SAMPLING, AcceptanceRule
from dynasd.tree import TreeShape
from viz.style import MASK_ACCEPTED, MASK_ATTENDS, MASK_UNUSED, STATUS_COLORS, STATUS_GLYPHS

EXAMPLES = [
    "Explain why the sky is blue in two sentences.",
    "Write a haiku about a cat watching rain.",
    "List three tips for learning a new language.",
    "What is the capital of France, and what is it famous for?",
]

INTRO = """
# DynaSD Explorer
**Speculative decoding in one picture.** A large *target* model writes text one token per forward pass, and each
pass is slow. A small *draft* model is fast but often wrong. So the draft **guesses several tokens ahead**, and the
target **checks all the guesses in a single forward pass**: it keeps the guesses it agrees with, and where it
disagrees it writes its own token instead. With *multiple candidates* the draft proposes a whole **tree** of
alternatives, so when one guess is wrong a sibling may be right. Lossless methods produce exactly the text the
target would have written alone, only in fewer target passes.

Press **Step** to watch one round (draft → verify → commit), **Run** to keep going, and drag the **step slider**
to look back at any earlier round.
"""

_DEFAULT_TREE = TreeShape(OPTIONS["k_config"].default)  # the mcsd and Compare help speak of the default tree


def mcsd_help(branching: tuple[int, ...]) -> str:
    """mcsd's help for the tree the controls hold (a recipe's 2,1,1,1 is not the default's 44 candidates)."""
    tree = TreeShape(tuple(branching))
    return (f"**mcsd**: the draft guesses a *tree*: k-config `{Shape.text(tree.branching)}` means "
            f"{tree.branching[0]} first guesses and then, level by level, "
            f"{', '.join(map(str, tree.branching[1:])) or 'no'} continuations of each: {tree.num_nodes} "
            f"candidates, depth {tree.depth}. More shots at being right per forward. Lossless.")


def method_help(method: str, k_config=None) -> str:
    """The method's help; mcsd's names the k-config given (text such as "2,1,1,1"), else the default's."""
    if method == "mcsd" and k_config:
        try:
            branching = Shape().coerce(k_config, OPTIONS["k_config"].title)
        except ValueError:
            branching = None
        if branching:
            return mcsd_help(branching)
    return METHOD_HELP.get(method, "")


METHOD_HELP = {
    "ar": "**ar**: the target alone, one forward per token. The baseline every other method is measured against.",
    "sd": "**sd**: the draft guesses a *chain* of γ tokens; the target verifies them in one forward and keeps the "
          "agreeing prefix plus one token of its own. Lossless.",
    "mcsd": mcsd_help(_DEFAULT_TREE.branching),
    "ti-mcsd": "**ti-mcsd**: the first token of each of *width* chains comes from the **target's** own top "
               "choices (known from the previous step), the draft extends each chain *depth* tokens. The chain "
               "with most accepted tokens wins, which can pick the target's 2nd choice: **LOSSY** when width > 1.",
    "pld": "**pld**: prompt lookup decoding, no draft model. When the last tokens occurred earlier in the text "
           f"(prompt or output), the tokens that followed them there become a chain of candidates ({LOOKUP.glyph}, "
           "q = 1); otherwise the target takes a plain step. Free guesses: good on repetitive text. Lossless. "
           "*Prompt lookup* below sets the chain length (0 = 8); sd and mcsd can use lookup too.",
    "recycle": f"**recycle**: Token Recycling, no draft model. A table keeps, per token, the **target's own** top "
               "next tokens from the last time it read that token; each step walks the table from the last token "
               f"through a tree template (`{Shape.text(DEFAULT_RECYCLE)}` by default: {DEFAULT_RECYCLE[0]} "
               f"followers of the last token and then, level by level, {', '.join(map(str, DEFAULT_RECYCLE[1:]))} of "
               f"each) and the target verifies the candidates ({RECYCLED.glyph}, q = 1) in one forward. Every row "
               "it reads, accepted or not, refreshes the table, so the guesses improve as the text goes on. "
               f"Lossless. *{OPTIONS['recycle'].label}* in the advanced settings sets the template; sd and mcsd "
               "can join recycling too.",
}

def _stated(rule: AcceptanceRule) -> str:
    """An acceptance rule as a list item, its condition first in bold: the words are the rule's own
    (dynasd/trace_semantics.py), which tests/test_stated_rules.py checks against the decoder."""
    return f"- **{rule.when}** {rule.says}"


def _dot(status: str, shape: str = "●") -> str:
    return f'<span style="color:{STATUS_COLORS[status]}">{shape}</span> {STATUS_GLYPHS[status]}'


TREE_HELP = f"""
**What am I seeing?** Every token the draft proposed this step, as a tree growing left to right from the *root*
(the last token already written). Each column is one draft level; siblings are alternative guesses for the same
position. After the target's single check (each status has its glyph on the node, not only its colour):
- {_dot("accepted")} **accepted**: the target agreed; the thick dark line is the path kept.
- {_dot("rejected")} **rejected**: tested and refused; its hover names what the target took there.
  {_dot("unchosen")} **passed, other chain won**: e.g. ti-mcsd's target roots (◆) not chosen.
- {_dot("not_reached")} **not reached**: below a node that was not accepted, never tested.
  {_dot("skipped")} **not tested**: a sibling was accepted first, so the walk went on from it.
- A node's shape says which source proposed it:
""" + "".join(f"  - {origin.glyph} {origin.help}\n" for origin in ORIGINS) + f"""\
- {_dot("bonus", "★")} **bonus** or {_dot("correction", "★")} **correction**: the
  target's own token after the last accepted node: {GREEDY.bonus} at temperature 0; at temperature > 0 a bonus
  is {SAMPLING.bonus}, a correction {SAMPLING.correction}. The lossless methods add one every step, so a step
  never commits fewer than one token. ti-mcsd adds none: it commits the winning chain, root included.

Hover a node for p (target probability), q (draft probability), p/q and, when sampling, the random draw u. The
rule depends on the temperature:
{_stated(GREEDY)}
{_stated(SAMPLING)}

A correction's hover gives the probability it was committed with: **{GREEDY.correction_p}** at temperature 0 (it is
the target's top token), **{SAMPLING.correction_p}** at temperature > 0 (the residual's, not the target's p).
"""

MASK_HELP = f"""
**What am I seeing?** The attention mask of the target's single verification pass. Each **row** is a position the
target scores, labelled *id·token* (✓ = accepted); each **column** a position it may look at
(<span style="color:{MASK_ATTENDS}">■</span> = allowed), in the same order, marked by node id. The whole committed
text is one column on the left (ctx): everyone sees it. Inside the tree block, a candidate sees only **itself and
its ancestors**, never its siblings or cousins: that is what lets all branches of the tree be checked at once
without mixing them up. The accepted path's cells are dark (<span style="color:{MASK_ACCEPTED}">■</span>) and carry
a ✓. Hover a cell: its row and column, named as on the axes, and whether it may attend. With dynamic depth, the
light dotted area (<span style="color:{MASK_UNUSED}">■</span> ·) is the mask of the largest tree and the red box is
the *slice* used this step: the tree stopped growing early and the same mask is simply cut.
"""

DECISIONS_HELP = f"""
**What am I seeing?** *Top*: for every candidate, the target's probability **p** (filled bar, coloured by what
happened) and the draft's probability **q** (outline), in the tree's order (a large tree's bars carry node ids, as
in the mask's rows; hover a bar for its token and its test). Whether p and q decide depends on the temperature:
{_stated(GREEDY)}
{_stated(SAMPLING)}

*Bottom*: with a stop policy,
after each draft level every tip gets a score (e.g. the draft's confidence); drafting goes one level deeper only
while the best score reaches the threshold (dashed line). Low confidence means the next guess is likely wrong, so
stopping early saves draft work.
"""

SUMMARY_HELP = """
**What am I seeing?** *Left*: the tokens each step committed, by origin. *Right*: tokens written (green) against
target forwards spent (grey); ar spends one forward a token (dashed red), so the gap is the target work saved.
**Tokens per target forward** is the speed-up free of the hardware. **Speed-up over ar** is what Compare measured on
this machine for this method, these settings and this prompt: the method and ar timed side by side, round by round,
with its range (a dash until a Compare ran them). **Tokens / s, as it happened** is this run's own rate over its
steps (draft + verify + accept; the prefill, paid once whatever the method, is reported apart), taken while the page
drew each step and moving with whatever else the machine does: no comparison.

*Below*, the acceptance by draft position, as vLLM names it. **Per-position acceptance** (teal): the share of
drafting steps that accepted a candidate at position k; it only falls with k, and when every step drafts, 1 + its
sum is the tokens per target forward (vLLM's **mean acceptance length**). **Conditional acceptance** (blue): of the
steps whose walk reached position k with a candidate there, the share that accepted one; a draft good early and
weak late shows here first, and it says how deep a tree is worth growing. *Right*: how many candidates each step
accepted.
"""

COMPARE_HELP = f"""
**What am I seeing?** The same prompt and settings through every method, run in interleaved rounds: each round gives
every method a short chunk of steps, and ar runs in every round (a method that finishes early runs again from the
prompt while others run, until {MIN_TIMED_S:g} s of its steps are timed), so each method's **× ar** is its tokens /
s against ar's in the same rounds, with the range of that ratio over the rounds (over a few rounds or runs,
Student's t range): a second Compare of the prompt minutes later mostly lands within that range, not on the same
number, while absolute tokens / s move by 15% or more. Over longer times a shared machine's own speed drifts and
every ratio with it, so a kept result names the time it was measured. Tokens / s come
second, beside **ar in the same rounds**: a method's tokens / s over that is its × ar (ar's own row counts every
round, so it can read otherwise); **× ar by CPU time** is the same ratio from this process's CPU time, a cross-check
against other work on the same cores. While it measures, the page shows only its progress: drawing the table at
every round would slow the methods measured meanwhile. The result is kept: Summary, the Cost model, Rows and
batches, Where would it pay? and the Recipe menu quote it for runs of these settings on this prompt. **same text as
ar** says whether a method wrote exactly what the target alone writes. At temperature 0 every lossless method must
say *yes*; a *NO* from ti-mcsd is its lossiness showing. At temperature > 0 texts differ even for lossless methods
because the random draws differ (they agree in distribution, not token by token).

**hf-assisted (transformers)** is the peer: transformers' own assisted generation, `generate(assistant_model=...)`,
with the same pair, prompt, sampling settings, seed and token budget, and its own defaults otherwise: a chain of
up to 20 draft tokens a round, cut where the draft's confidence falls under 0.4; no tree. Its numbers are read
like ours: tokens / s counts decoding only (its prefill, done inside `generate`, is its first forward of each
model, the ones over the prompt, timed by hooks and taken out), and each target forward is one verification round.
**tokens / target forward** is what vLLM calls the mean acceptance length; by draft position k the
**per-position** and **conditional** acceptance columns use its names too (the Summary tab's chart explains both).

**Why can a speculative method be slower than ar here?** On a CPU a forward's cost grows with the rows it scores:
the CPU is busy computing, not waiting for memory, so verifying the {_DEFAULT_TREE.num_nodes + 1} rows of the default \
{Shape.text(_DEFAULT_TREE.branching)} tree costs several single-token forwards, and each of the tree's \
{_DEFAULT_TREE.depth} draft forwards is not free either. A wide tree then saves target forwards (tokens / target \
forward > 1) yet loses time (tokens / s below ar). Whether it would pay with a bigger target or on a GPU depends \
on what a draft forward costs against a target forward: Learn → *Where would it pay?* carries a run's acceptance \
there from measured costs. Which method wins depends on the CPU, its weights and arithmetic: what this Compare \
measures here is the answer for this machine, and the Recipe menu shows it beside each recipe it ran.
"""

TRACE_HELP = """
**Trace files.** Save the current run (every step, every candidate, p, q, masks) as JSON; load one to replay it
here with no model loaded. Use the step slider to walk through a loaded run. Loading also sets the prompt and the
controls to the ones the run was made with, so **Step** or **Run** makes it again (with a model).
"""

LEARN_HELP = """
**Learn one step at a time.** Each view below explains the step on show (the step slider on the left) and follows
it while this tab is open (a Run is followed once it ends). **Guided step** replays it phase by phase: **→** /
**←** (or the buttons) go to the next / previous phase, **Shift + →** presses **Step**. **Residual** shows why
sampling stays exact when a candidate is rejected, **Acceptance test** the draw behind every decision. **Cost
model** explains the speed-up on this device; **Side by side** runs two methods from the same prefix;
**Losslessness** samples the next token hundreds of times and compares it with the target.
"""


def device_note(zero_gpu: bool = False) -> str:
    """The machine the page's speeds are measured on, under the intro (a run's own, with its weights and kernels,
    is in its Summary)."""
    where = ("a shared ZeroGPU GPU, named in each run's Summary" if zero_gpu else machine_line())
    return (f"<small>Speed-ups on this page are measured by Compare, or expected from costs measured, on "
            f"**{where}**.</small>")
