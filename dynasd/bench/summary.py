"""Fidelity and the summary: pure functions of the run records, and the printed tables."""
from __future__ import annotations

from .specs import REFERENCE

ACCEPTANCE_DENOMINATOR = "draft levels attempted (one per draft level of a step's live tree; target roots excluded)"
FIDELITY_AT_SAMPLING = "T>0: outputs are random samples, so token identity with ar is not a fidelity measure"

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


def _aggregate(method: str, temperature: float, category: str, runs: list[dict]) -> dict:
    tokens = sum(r["new_tokens"] for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    forwards = [r["target_forwards"] for r in runs]
    attempted = [r["attempted_draft_levels"] for r in runs]
    accepted = [r["accepted_draft_levels"] for r in runs]
    draft_s = sum(r["draft_forward_seconds"] for r in runs)
    target_s = sum(r["target_forward_seconds"] for r in runs)
    compared = sum(r["compared_tokens"] for r in runs)
    identical = [r["identical_to_ar"] for r in runs]
    fidelity_known = temperature == 0 and all(v is not None for v in identical)
    return {
        "method": method,
        "base_method": runs[0]["base_method"],
        "temperature": temperature,
        "category": category,
        "n_prompts": len(runs),
        "new_tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": _ratio(tokens, seconds),
        "speedup_vs_ar": None,  # filled in by summarize
        "target_forwards": None if None in forwards else sum(forwards),
        "tokens_per_target_forward": None if None in forwards else _ratio(tokens, sum(forwards)),
        "accepted_draft_levels": None if None in accepted else sum(accepted),
        "attempted_draft_levels": None if None in attempted else sum(attempted),
        "acceptance_rate": None if None in attempted else _ratio(sum(accepted), sum(attempted)),
        "acceptance_denominator": ACCEPTANCE_DENOMINATOR,
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
            rows += block
    return rows


# ---------------------------------------------------------------------------------------------------------------
# the printed table

def _fmt(value, spec: str, none: str = "–") -> str:
    return none if value is None else format(value, spec)


def markdown_tables(summary: list[dict]) -> str:
    lines = ["| method | T | prompts | tokens/s | speedup vs ar | tokens / target fwd | acceptance | "
             "time: draft / verify / other | identical to ar | differing tokens |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in (r for r in summary if r["category"] == "all"):
        other = None if row["draft_share"] is None else 1 - row["draft_share"] - row["verify_share"]
        split = (f"{_fmt(row['draft_share'], '.0%')} / {_fmt(row['verify_share'], '.0%')} / {_fmt(other, '.0%')}")
        identical = (f"{row['identical_share']:.0%}" if row["identical_share"] is not None else "n/a (T>0)")
        lines.append(f"| {row['method']}{'' if row['lossless'] else ' (lossy)'} | {row['temperature']:g} | "
                     f"{row['n_prompts']} | {_fmt(row['tokens_per_s'], '.1f')} | "
                     f"{_fmt(row['speedup_vs_ar'], '.2f')}x | {_fmt(row['tokens_per_target_forward'], '.2f')} | "
                     f"{_fmt(row['acceptance_rate'], '.2f')} | {split} | {identical} | "
                     f"{_fmt(row['differing_token_share'], '.1%', 'n/a')} |")
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


