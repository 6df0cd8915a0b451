"""Fidelity and the summary: pure functions of the run records, and the printed tables."""
from __future__ import annotations

import math

from ..acceptance import add_histograms, per_position_acceptance
from .specs import REFERENCE

ACCEPTANCE_DENOMINATOR = "draft levels attempted (one per draft level of a step's live tree; target roots excluded)"
FIDELITY_AT_SAMPLING = "T>0: outputs are random samples, so token identity with ar is not a fidelity measure"
QUALITY_NOTE = ("mean log-likelihood per token of each output under the target (T = 1, teacher-forced on the "
                "output's own prompt or conversation); perplexity = exp(-mean); vs ar: the difference in nats/token")

# ---------------------------------------------------------------------------------------------------------------
# fidelity and the summary (pure functions of the run records)

def differing_share(tokens: list[int], reference: list[int]) -> float:
    """Share of token positions that differ from the reference: every position from the first divergence on
    counts as differing (a later coincidental match is not agreement), over the longer of the two outputs."""
    length = max(len(tokens), len(reference))
    if length == 0:
        return 0.0
    first = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))
    return (length - first) / length


def add_fidelity(records: list[dict]) -> None:
    """identical_to_ar / differing_share for the records of one prompt and temperature (ar among them)."""
    reference = next((r for r in records if r["method"] == REFERENCE), None)
    for record in records:
        if record["temperature"] > 0 or reference is None:
            record["identical_to_ar"] = record["differing_share"] = None
            record["compared_tokens"] = 0
            continue
        record["identical_to_ar"] = record["token_ids"] == reference["token_ids"]
        record["differing_share"] = differing_share(record["token_ids"], reference["token_ids"])
        record["compared_tokens"] = max(len(record["token_ids"]), len(reference["token_ids"]))


def _ratio(num, den):
    return num / den if den else None


def _quality(runs: list[dict], prefix: str) -> dict:
    """Ratio of sums over every scored output (long outputs weigh more), with the standard error of the outputs'
    own means (how far two methods' means must lie apart to mean something)."""
    scored = [r for r in runs if r.get(prefix + "log_likelihood") is not None and r.get(prefix + "scored_tokens")]
    tokens = sum(r[prefix + "scored_tokens"] for r in scored)
    mean = _ratio(sum(r[prefix + "log_likelihood"] for r in scored), tokens)
    per_output = [r[prefix + "log_likelihood"] / r[prefix + "scored_tokens"] for r in scored]
    se = None
    if len(per_output) > 1:
        m = sum(per_output) / len(per_output)
        se = (sum((x - m) ** 2 for x in per_output) / (len(per_output) - 1) / len(per_output)) ** 0.5
    return {prefix + "mean_log_likelihood": mean, prefix + "mean_log_likelihood_se": se,
            prefix + "perplexity": math.exp(-mean) if mean is not None else None,
            prefix + "log_likelihood_vs_ar": None}  # filled in by summarize


def _aggregate(method: str, temperature: float, category: str, runs: list[dict]) -> dict:
    tokens = sum(r["new_tokens"] for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    forwards = [r["target_forwards"] for r in runs]
    attempted = [r["attempted_draft_levels"] for r in runs]
    accepted = [r["accepted_draft_levels"] for r in runs]
    weight_bytes = sum(r.get("weight_bytes_read", 0) for r in runs)
    draft_s = sum(r["draft_forward_seconds"] for r in runs)
    target_s = sum(r["target_forward_seconds"] for r in runs)
    compared = sum(r["compared_tokens"] for r in runs)
    identical = [r["identical_to_ar"] for r in runs]
    fidelity_known = temperature == 0 and all(v is not None for v in identical)
    histograms = [r.get("acceptance_histogram") for r in runs]
    histogram = None if None in histograms else add_histograms(histograms)
    proposed = [r.get("draft_tokens_proposed") for r in runs]
    accepted_tokens = [r.get("draft_tokens_accepted") for r in runs]
    mean_acceptance_length = None if None in forwards else _ratio(tokens, sum(forwards))
    return {
        "method": method,
        "base_method": runs[0]["base_method"],
        "temperature": temperature,
        "category": category,
        "n_prompts": len({r["prompt_id"] for r in runs}),
        "n_turns": len(runs),
        "new_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": _ratio(tokens, seconds),
        # the weights read per token (dynasd.kernels.weight_bytes_per_forward) and the bandwidth that draws:
        # how far a method is from the machine's memory limit
        "weight_mb_per_token": _ratio(weight_bytes / 1e6, tokens) if weight_bytes else None,
        "weight_gb_per_s": _ratio(weight_bytes / 1e9, seconds) if weight_bytes else None,
        "speedup_vs_ar": None,  # filled in by summarize
        "target_forwards": None if None in forwards else sum(forwards),
        "tokens_per_target_forward": None if None in forwards else _ratio(tokens, sum(forwards)),
        "accepted_draft_levels": None if None in accepted else sum(accepted),
        "attempted_draft_levels": None if None in attempted else sum(attempted),
        "acceptance_rate": None if None in attempted else _ratio(sum(accepted), sum(attempted)),
        "acceptance_denominator": ACCEPTANCE_DENOMINATOR,
        "mean_acceptance_length": mean_acceptance_length,
        "acceptance_histogram": histogram,
        "per_position_acceptance": per_position_acceptance(histogram) if histogram is not None else None,
        "draft_tokens_proposed": None if None in proposed else sum(proposed),
        "draft_tokens_accepted": None if None in accepted_tokens else sum(accepted_tokens),
        "draft_token_acceptance": None if None in proposed else _ratio(sum(accepted_tokens), sum(proposed)),
        **_quality(runs, ""),
        **_quality(runs, "judge_"),
        "draft_seconds": draft_s,
        "verify_seconds": target_s,
        "other_seconds": seconds - draft_s - target_s,
        "draft_share": _ratio(draft_s, seconds),
        "verify_share": _ratio(target_s, seconds),
        "lossless": all(r["lossless"] for r in runs),
        "identical_to_ar": all(identical) if fidelity_known else None,
        "identical_share": sum(identical) / len(runs) if fidelity_known else None,
        "differing_token_share": (sum(r["differing_share"] * r["compared_tokens"] for r in runs) / compared
                                  if fidelity_known and compared else (0.0 if fidelity_known else None)),
        "fidelity_note": None if temperature == 0 else FIDELITY_AT_SAMPLING,
    }


def summarize(records: list[dict]) -> list[dict]:
    """One row per (method, temperature, category), then per (method, temperature) over all categories.

    Rates are ratios of sums (total tokens / total seconds), so long outputs weigh more, as in Spec-Bench.
    """
    methods = list(dict.fromkeys(r["method"] for r in records))
    temperatures = sorted({r["temperature"] for r in records})
    categories = list(dict.fromkeys(r["category"] for r in records))
    rows = []
    for temperature in temperatures:
        for category in categories + ["all"]:
            group = [r for r in records if r["temperature"] == temperature
                     and (category == "all" or r["category"] == category)]
            block = [_aggregate(m, temperature, category, [r for r in group if r["method"] == m])
                     for m in methods if any(r["method"] == m for r in group)]
            reference = next((row for row in block if row["method"] == REFERENCE), None)
            for row in block:
                if reference and reference["tokens_per_s"] and row["tokens_per_s"] is not None:
                    row["speedup_vs_ar"] = row["tokens_per_s"] / reference["tokens_per_s"]
                for prefix in ("", "judge_"):
                    mine = row[prefix + "mean_log_likelihood"]
                    ar = reference[prefix + "mean_log_likelihood"] if reference else None
                    if mine is not None and ar is not None:
                        row[prefix + "log_likelihood_vs_ar"] = mine - ar
            rows += block
    return rows


# ---------------------------------------------------------------------------------------------------------------
# the printed table

def _fmt(value, spec: str, none: str = "–") -> str:
    return none if value is None else format(value, spec)


def _prompts(row: dict) -> str:
    turns = row.get("n_turns", row["n_prompts"])
    return f"{row['n_prompts']}" if turns == row["n_prompts"] else f"{row['n_prompts']} ({turns} turns)"


def quality_verdicts(summary: list[dict]) -> list[str]:
    """One line per lossy method and temperature: where its quality lies against ar and the lossless methods."""
    lines = []
    overall = [r for r in summary if r["category"] == "all" and r["mean_log_likelihood"] is not None]
    for row in overall:
        if row["lossless"]:
            continue
        same = [r for r in overall if r["temperature"] == row["temperature"]]
        lossless = [r["log_likelihood_vs_ar"] for r in same if r["lossless"] and r["method"] != REFERENCE
                    and r["log_likelihood_vs_ar"] is not None]
        span = (f"; the lossless methods lie at {min(lossless):+.3f} to {max(lossless):+.3f}" if lossless else "")
        ar = next((r for r in same if r["method"] == REFERENCE), None)
        if ar is None or row["log_likelihood_vs_ar"] is None:
            continue
        lines.append(f"- {row['method']} (lossy), T={row['temperature']:g}: {row['log_likelihood_vs_ar']:+.3f} "
                     f"nats/token against ar (perplexity {row['perplexity']:.2f} against {ar['perplexity']:.2f})"
                     f"{span}.")
    return lines


def markdown_tables(summary: list[dict]) -> str:
    overall = [r for r in summary if r["category"] == "all"]
    lines = ["| method | T | prompts | tokens/s | speedup vs ar | weights read: MB/token, GB/s | "
             "mean acceptance length | acceptance | time: draft / verify / other | identical to ar | "
             "differing tokens |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in overall:
        other = None if row["draft_share"] is None else 1 - row["draft_share"] - row["verify_share"]
        split = (f"{_fmt(row['draft_share'], '.0%')} / {_fmt(row['verify_share'], '.0%')} / {_fmt(other, '.0%')}")
        identical = (f"{row['identical_share']:.0%}" if row["identical_share"] is not None else "n/a (T>0)")
        lines.append(f"| {row['method']}{'' if row['lossless'] else ' (lossy)'} | {row['temperature']:g} | "
                     f"{_prompts(row)} | {_fmt(row['tokens_per_s'], '.1f')} | "
                     f"{_fmt(row['speedup_vs_ar'], '.2f')}x | {_fmt(row['weight_mb_per_token'], '.1f')}, "
                     f"{_fmt(row['weight_gb_per_s'], '.2f')} | {_fmt(row['mean_acceptance_length'], '.2f')} | "
                     f"{_fmt(row['acceptance_rate'], '.2f')} | {split} | {identical} | "
                     f"{_fmt(row['differing_token_share'], '.1%', 'n/a')} |")
    lines += ["", "Draft tokens and per-position acceptance (share of drafts whose accepted path reached position k):",
              "", "| method | T | draft tokens proposed | accepted | accepted / proposed | per position 1, 2, 3, ... |",
              "|---|---|---|---|---|---|"]
    for row in overall:
        if row["draft_tokens_proposed"] is None:
            continue
        positions = ", ".join(f"{v:.2f}" for v in row["per_position_acceptance"] or []) or "–"
        lines.append(f"| {row['method']} | {row['temperature']:g} | {row['draft_tokens_proposed']} | "
                     f"{row['draft_tokens_accepted']} | {_fmt(row['draft_token_acceptance'], '.2f')} | {positions} |")
    if any(row["mean_log_likelihood"] is not None for row in overall):
        judged = any(row["judge_mean_log_likelihood"] is not None for row in overall)
        lines += ["", "Quality: the target's mean log-likelihood per token of each method's outputs (± standard "
                  "error over outputs), its perplexity, and the difference from ar's:", "",
                  "| method | T | mean log-likelihood | perplexity | vs ar (nats/token) |"
                  + (" judge: mean log-likelihood | judge: vs ar |" if judged else ""),
                  "|---|---|---|---|---|" + ("---|---|" if judged else "")]
        for row in overall:
            se = row["mean_log_likelihood_se"]
            line = (f"| {row['method']}{'' if row['lossless'] else ' (lossy)'} | {row['temperature']:g} | "
                    f"{_fmt(row['mean_log_likelihood'], '.3f')}{f' ± {se:.3f}' if se is not None else ''} | "
                    f"{_fmt(row['perplexity'], '.2f')} | {_fmt(row['log_likelihood_vs_ar'], '+.3f')} |")
            if judged:
                line += (f" {_fmt(row['judge_mean_log_likelihood'], '.3f')} | "
                         f"{_fmt(row['judge_log_likelihood_vs_ar'], '+.3f')} |")
            lines.append(line)
        lines += [""] + quality_verdicts(summary)
    categories = list(dict.fromkeys(r["category"] for r in summary if r["category"] != "all"))
    methods = list(dict.fromkeys(r["method"] for r in summary))
    for temperature in sorted({r["temperature"] for r in summary}):
        lines += ["", f"Speedup vs ar by category, T={temperature:g}:", "",
                  "| category | " + " | ".join(methods) + " |", "|---" * (len(methods) + 1) + "|"]
        for category in categories:
            cells = []
            for method in methods:
                row = next((r for r in summary if r["method"] == method and r["category"] == category
                            and r["temperature"] == temperature), None)
                cells.append(_fmt(row and row["speedup_vs_ar"], ".2f"))
            lines.append(f"| {category} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


