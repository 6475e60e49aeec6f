"""`python -m experiments.data_curve`: private / plain test SER against n, from the data_curve grid.

    python -m experiments.experiment --grid=experiments/grids/data_curve.py   # the runs
    python -m experiments.data_curve                                          # the curve

Pairs each private (epsilon 8) row of results/data_curve with the plain row of the same corpus
and n (SNIPS at 100%: results/snips's rows of the same recipe) and writes
results/data_curve/curve.csv, curve.md and curve.png (the ratio against n, log x). Where a
corpus has two or more pairs with a ratio above 1, the excess ratio - 1 is fitted as a power of n
and the n at which it reaches the target (1.2x) is given, marked as an extrapolation when it
lies outside the measured range.

The ratio's interval counts each SER's errors as Poisson (var log ratio = 1/E_private +
1/E_plain): it is the test set's sampling error only, not the run-to-run spread of training.
"""
from __future__ import annotations

import csv
import json
import math
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "results", "data_curve")
TARGET = 1.2  # the user's question: how many utterances until private is within 1.2x of plain
# SNIPS at 100%: results/snips's rows of snips_clc's recipe (backward LSTM fixed); the train
# fraction rows run the same commands but for --config.train_fraction
SNIPS_FULL = {"private": ("clc_dpsgd_eps8_both_directions",
                          "clc_dpsgd_eps8_both_directions_run2"),
              "sgd": ("clc_sgd_both_directions",)}


def errors(test: dict) -> tuple:
    """(errors, denominator) of a SER: intent errors plus slot deletions, insertions and
    substitutions, over utterances plus reference slots."""
    e = (test["intent_errors"] + test["slot_deletions"] + test["slot_insertions"]
         + test["slot_substitutions"])
    return e, test["utterances"] + test["reference_slots"]


def ser_ratio(private_ser: float, plain_ser: float) -> float:
    """Private / plain SER. Plain training with no test error gives inf when the private run
    errs, and 1.0 when it does not either: two runs without an error on the same test set are
    as good as each other, and the user's question (is private within 1.2x?) is answered yes."""
    if plain_ser > 0:
        return private_ser / plain_ser
    return 1.0 if private_ser == 0 else math.inf


def ratio_interval(private_errors: float, plain_errors: float, ratio: float) -> tuple:
    """The ratio's 95% interval from Poisson error counts (log scale); (nan, nan) if either
    count is 0."""
    if private_errors <= 0 or plain_errors <= 0:
        return math.nan, math.nan
    half = 1.96 * math.sqrt(1 / private_errors + 1 / plain_errors)
    return ratio * math.exp(-half), ratio * math.exp(half)


def crossing(ns: list, ratios: list, target: float = TARGET) -> dict | None:
    """A power law ratio - 1 = A n^b fitted (least squares in log-log) to the points whose
    ratio exceeds 1, and the n where it reaches `target`: {"n": ..., "b": ..., "extrapolated":
    bool}; None with fewer than two such points or a ratio that does not fall (b >= 0)."""
    points = [(math.log(n), math.log(r - 1)) for n, r in zip(ns, ratios)
              if r > 1 and math.isfinite(r)]
    if len({x for x, _ in points}) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    b = (sum((x - mx) * (y - my) for x, y in points)
         / sum((x - mx) ** 2 for x, _ in points))
    if b >= 0:
        return None
    a = my - b * mx
    n = math.exp((math.log(target - 1) - a) / b)
    measured = [math.exp(x) for x, _ in points]
    return {"n": n, "b": b, "extrapolated": not min(measured) <= n <= max(measured)}


def _read(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _corpus(result: dict) -> str:
    return "SNIPS CLC" if "snips" in result["command"] else "synthetic (default command)"


def load_cells() -> dict:
    """{(corpus, n): {"private": [results], "sgd": [results]}} from both grids."""
    groups: dict = {}
    cells_dir = os.path.join(RESULTS, "cells")
    results = [_read(os.path.join(cells_dir, f)) for f in sorted(os.listdir(cells_dir))
               if f.endswith(".json")] if os.path.isdir(cells_dir) else []
    for kind, names in SNIPS_FULL.items():
        results += [_read(os.path.join(ROOT, "results", "snips", "cells", f"{name}.json"))
                    for name in names]
    for r in results:
        kind = "sgd" if r["mechanism"] == "sgd" else "private"
        groups.setdefault((_corpus(r), r["dataset_size"]), {"private": [], "sgd": []})[
            kind].append(r)
    return groups


def curve_rows(groups: dict) -> list:
    rows = []
    for (corpus, n), runs in sorted(groups.items()):
        for private in runs["private"]:
            for plain in runs["sgd"]:
                e_priv, denominator = errors(private["test"])
                e_plain, _ = errors(plain["test"])
                ratio = ser_ratio(private["test"]["ser"], plain["test"]["ser"])
                lo, hi = ratio_interval(e_priv, e_plain, ratio)
                bio = (private.get("test_bio") or {}).get("ser"), (
                    plain.get("test_bio") or {}).get("ser")
                rows.append({
                    "corpus": corpus, "n": n, "private_ser": private["test"]["ser"],
                    "plain_ser": plain["test"]["ser"],
                    "gap": private["test"]["ser"] - plain["test"]["ser"], "ratio": ratio,
                    "ratio_ci95": f"{lo:.2f}-{hi:.2f}" if math.isfinite(lo) else "",
                    "private_errors": e_priv, "plain_errors": e_plain,
                    "scored_items": denominator,
                    "ratio_bio": bio[0] / bio[1] if bio[0] is not None and bio[1] else "",
                    "epsilon": private.get("epsilon"),
                    "noise_multiplier": private.get("noise_multiplier"),
                    # the noise's std on the mean clipped gradient, in units of C: z / (q n)
                    "noise_per_example": _noise_per_example(private, n),
                    "private_command": private["command"], "plain_command": plain["command"],
                })
    return rows


def _noise_per_example(private: dict, n: int):
    z, q = private.get("noise_multiplier"), private.get("sampling_rate")
    return z / (q * n) if z and q else ""


def first_within(ns: list, ratios: list, target: float = TARGET) -> int | None:
    """The smallest measured n from which every pair, at that n and at every larger measured n,
    is within `target`; None if the largest n is not. Measured, not fitted: it needs no model of
    the curve, where `crossing` extrapolates one."""
    worst: dict = {}
    for n, r in zip(ns, ratios):
        worst[n] = max(worst.get(n, -math.inf), r)
    found = None
    for n in sorted(worst, reverse=True):
        if worst[n] > target:
            break
        found = n
    return found


def by_corpus(rows: list) -> dict:
    """{corpus: ([n of each pair], [ratio of each pair])}, corpora in sorted order."""
    out: dict = {}
    for corpus in sorted({r["corpus"] for r in rows}):
        mine = [r for r in rows if r["corpus"] == corpus]
        out[corpus] = [r["n"] for r in mine], [r["ratio"] for r in mine]
    return out


def answers(rows: list) -> dict:
    """{corpus: crossing(...) over that corpus's pairs}."""
    return {corpus: crossing(ns, ratios) for corpus, (ns, ratios) in by_corpus(rows).items()}


def _fmt(value, digits: int = 3) -> str:
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.{digits}f}"
    return str(value)


def write(rows: list) -> None:
    os.makedirs(RESULTS, exist_ok=True)
    columns = list(rows[0]) if rows else []
    with open(os.path.join(RESULTS, "curve.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)
    lines = ["# Private (epsilon 8) / plain test SER against n", "",
             ("Generated by `python -m experiments.data_curve` from results/data_curve/cells and "
              "results/snips/cells (SNIPS at 100%). n = training utterances; SER = Viterbi "
              "decoding (as results/snips); ratio_bio = the BIO decoding's ratio; the interval "
              "is the test set's sampling error only (Poisson error counts)."), "",
             ("| corpus | n | private SER | plain SER | gap | ratio | 95% (test sampling) | "
              "errors private / plain | ratio (BIO) | epsilon | z | z / (q n) | commands |"),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['corpus']} | {r['n']:,} | {r['private_ser']:.4f} | {r['plain_ser']:.4f} | "
            f"{r['gap']:.4f} | "
            f"{_fmt(r['ratio'], 2)} | {r['ratio_ci95']} | {r['private_errors']} / "
            f"{r['plain_errors']} of {r['scored_items']} | {_fmt(r['ratio_bio'], 2)} | "
            f"{_fmt(r['epsilon'], 2)} | {_fmt(r['noise_multiplier'], 3)} | "
            f"{_fmt(r['noise_per_example'] * 1e4 if r['noise_per_example'] else '', 2)}e-4 | "
            f"`{r['private_command']}`; `{r['plain_command']}` |")
    lines += ["", f"## n at which private / plain = {TARGET}", ""]
    for corpus, (ns, ratios) in by_corpus(rows).items():
        n = first_within(ns, ratios)
        lines.append(f"* {corpus}, measured: " + (
            f"within {TARGET}x from n = {n:,} on (every pair at that n and above)"
            if n is not None else f"not within {TARGET}x at the largest n measured"))
    for corpus, fit in answers(rows).items():
        if fit is None:
            lines.append(f"* {corpus}: no fit (fewer than two pairs with a finite ratio above 1, "
                         "or a ratio that does not fall with n)")
        else:
            label = ("extrapolated beyond the measured range" if fit["extrapolated"]
                     else "within the measured range")
            n = f"{fit['n']:,.0f}" if fit["n"] < 1e7 else f"{fit['n']:.1e}"
            lines.append(f"* {corpus}: ratio - 1 ~ n^{fit['b']:.2f}; {TARGET}x at n ~ {n} "
                         f"({label})")
    with open(os.path.join(RESULTS, "curve.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def plot(rows: list) -> None:
    """Left: the ratio against n (a line through each n's mean; dotted: the power law to 1.2x
    where it extrapolates). Right: both SERs against n (a ratio with a plain SER near 0 says
    little: the synthetic corpus)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_ser) = plt.subplots(1, 2, figsize=(11, 4.2))
    for corpus, marker in (("SNIPS CLC", "o"), ("synthetic (default command)", "s")):
        mine = [r for r in rows if r["corpus"] == corpus]
        if not mine:
            continue
        color = ax_ser.plot([r["n"] for r in mine], [r["private_ser"] for r in mine], marker,
                            label=f"{corpus}, private eps 8")[0].get_color()
        ax_ser.plot([r["n"] for r in mine], [r["plain_ser"] for r in mine], marker,
                    mfc="none", color=color, label=f"{corpus}, plain")
        finite = [r for r in mine if math.isfinite(r["ratio"])]
        if not finite:
            continue
        ax.plot([r["n"] for r in finite], [r["ratio"] for r in finite], marker, color=color,
                label=corpus)
        by_n: dict = {}
        for r in finite:
            by_n.setdefault(r["n"], []).append(r["ratio"])
        ns = sorted(by_n)
        means = [sum(by_n[n]) / len(by_n[n]) for n in ns]
        ax.plot(ns, means, "-", color=color)
        fit = crossing([r["n"] for r in finite], [r["ratio"] for r in finite])
        if fit is not None and fit["extrapolated"]:
            end = min(fit["n"], 100 * ns[-1])  # beyond 100x the data the line says nothing
            grid = [ns[0] * (end / ns[0]) ** (k / 40) for k in range(41)]
            # the fit through (n*, TARGET): ratio - 1 = (TARGET - 1) (n / n*)^b
            ax.plot(grid, [1 + (TARGET - 1) * (g / fit["n"]) ** fit["b"] for g in grid], ":",
                    color=color, label=f"{corpus}: power-law fit (extrapolation)")
    ax.axhline(TARGET, color="grey", linestyle="--", linewidth=1, label=f"{TARGET}x")
    ax.axhline(1.0, color="black", linewidth=0.5)
    for a_ in (ax, ax_ser):
        a_.set_xscale("log")
        a_.set_xlabel("training utterances n (log)")
        a_.legend(fontsize=7)
    ax.set_ylabel("private (eps 8) / plain test SER")
    ax_ser.set_yscale("log")
    ax_ser.set_ylabel("test SER (log)")
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, "curve.png"), dpi=120)
    plt.close(fig)


def main() -> None:
    rows = curve_rows(load_cells())
    write(rows)
    plot(rows)
    with open(os.path.join(RESULTS, "curve.md")) as f:
        print(f.read())


if __name__ == "__main__":
    main()
