"""A privacy report a reviewer can read: one self-contained page from a run's ledger.

Why a page and not privacy.json alone: a privacy review reads the guarantee in words, how epsilon
grew over the epochs, the mechanism's parameters, what the number assumes and what it does not
cover, file by file, and how to check the mechanism empirically. The page is written from the
ledger alone (epsilon recomputed from its records, never copied), as HTML with an inline SVG
plot or as Markdown with the same plot as a data URI; nothing is fetched to show it.
"""
from __future__ import annotations

import base64
import datetime
import html
import math
from typing import Optional, Sequence

from edp_tf import accounting
from edp_tf.ledger import charged, headline
from edp_tf.version import VERSION

FORMATS = ("html", "md")
# the audit that measures a lower bound on this kind of mechanism (tools/audit.py of a checkout;
# results/audit holds the measured rows)
_AUDITS = {"dpsgd": "per-example DP-SGD", "default": "eDP-SGD micro-batches",
           "paper": "the paper's Algorithm 1", "user": "user-level DP-FedSGD",
           "adafest": "sparse embedding noise (DP-AdaFEST)"}
_MAX_POINTS = 60  # epochs on the plot at most (each point is one accountant call)


def audit_mechanism(ledger: dict) -> str:
    """The audit's name for the mechanism of this ledger."""
    if ledger.get("privacy_unit") == "user":
        return "user"
    if ledger.get("noise_mode") == "paper":
        return "paper"
    if ledger.get("selection_noise_multiplier") is not None:
        return "adafest"
    return "dpsgd" if ledger.get("microbatch_size") == 1 else "default"


def sampling_sentence(ledger: dict) -> str:
    """How the run sampled and what the accountant charged for it, in words a reviewer can
    re-derive epsilon from (edp-privacy and the report both print it).

    Why BandMF needs its own words: its charge is not "steps at q" but ceil(steps / b) steps
    per epoch at the group rate b q; printing q and the steps would lead a reviewer to another
    epsilon."""
    records = charged(ledger)[0]
    unit = ledger.get("privacy_unit", "example")
    q, steps = ledger["sampling_rate"], sum(r.steps for r in records)
    base = (f"{ledger['sampling']} sampling, q = {q:.6g} of n = {ledger['dataset_size']} "
            f"{unit}s (expected batch {ledger['batch_size']:g}), {steps} steps over "
            f"{len(records)} epochs")
    bands = int(ledger.get("bands", 1) or 1)
    if bands <= 1:
        return base
    participations = sum(r.participations for r in records)
    return (base + f"; BandMF with b = {bands} bands (amplified banded matrix factorization, "
            f"Choquette-Choo et al. 2023): the {unit}s are split once into {bands} groups and "
            f"step t Poisson-samples group t mod {bands} at b q = "
            f"{accounting.group_sampling_rate(q, bands):.6g}, so each {unit} takes part at "
            f"most once every {bands} steps ({participations} participations at most: "
            "ceil(steps / b) per epoch). The noise is correlated through a b-banded "
            "lower-triangular strategy with columns of norm at most 1, and separated "
            "participations touch disjoint rows of it: the run is charged as DP-SGD with "
            "those participations at rate b q, each a Gaussian of the epoch's z (their "
            "amplification theorem for b-min-separated participation, the event of "
            "jax-privacy's amplified BandMF accounting)")


def epsilon_curve(ledger: dict) -> list:
    """[(epochs done, epsilon after them)], recomputed from the records (PLD)."""
    records, extras = charged(ledger)
    if not records:
        return [(0, accounting.compute_epsilon((), ledger["sampling_rate"], ledger["delta"],
                                               extras))] if extras else []
    stride = max(1, math.ceil(len(records) / _MAX_POINTS))
    ends = sorted(set(range(stride, len(records) + 1, stride)) | {len(records)})
    return [(k, accounting.compute_epsilon(records[:k], ledger["sampling_rate"],
                                           ledger["delta"], extras)) for k in ends]


def sections(ledger: dict) -> list:
    """[(title, [paragraphs or bullet lists])]: the report's content, format-free."""
    curve = epsilon_curve(ledger)
    top = headline(ledger)  # the figure every output gives
    epsilon, private = top["epsilon"], top["private"]
    unit = ledger.get("privacy_unit", "example")
    verdict = (f"The run is ({epsilon:.3g}, {ledger['delta']:.3g})-differentially private with "
               f"respect to adding or removing one training {unit}"
               + (" (all of that user's data)" if unit == "user" else "")
               + ", with every intermediate model released."
               if private else
               f"The run is NOT reported as private: the epsilon below ({epsilon:.3g} at delta "
               f"{ledger['delta']:.3g}) is what the accountant computes, but the proof does not "
               "apply as run (see what is not covered).")
    interrupted = ledger.get("in_progress")
    if interrupted:
        verdict += (f" Epoch {interrupted['epoch']} was interrupted: it is charged "
                    f"{interrupted.get('steps')} step(s) here, the most that can have run (and "
                    "in the ledger when the run resumes).")
    recorded = ledger.get("epsilon")
    if (recorded is not None and curve and not interrupted
            and not math.isclose(recorded, epsilon, rel_tol=1e-6, abs_tol=1e-9)):
        verdict += (f" WARNING: privacy.json states epsilon {recorded:.6g}, recomputed "
                    f"{epsilon:.6g}: the file was edited or written by another version.")
    others = ledger.get("epsilon_at_other_deltas") or {}
    mechanism = [
        "Sampling: " + sampling_sentence(ledger)
        + (f" (the last one interrupted or running: {top['in_progress_steps']} steps charged)"
           if top["in_progress_steps"] else ""),
        f"Clipping norm C = {ledger['l2_norm_clip']:g}, sensitivity {ledger['sensitivity']:g} C "
        f"({_clip_unit(ledger.get('microbatch_size'))}), {ledger['replicas']} replica(s), "
        f"noise mode {ledger['noise_mode']}",
        "Noise multiplier per epoch: " + ", ".join(
            f"{e['noise_multiplier']:.4g}" for e in ledger.get("epochs", [])[:12])
        + (" ..." if len(ledger.get("epochs", [])) > 12 else ""),
        f"Accountant: PLD {ledger.get('epsilon_pld', epsilon):.4g} (headline), RDP "
        f"{ledger.get('epsilon_rdp', float('nan')):.4g}; the same run at other deltas: "
        + (", ".join(f"{v['epsilon']:.4g} at delta = {label}" for label, v in others.items())
           or "not recorded"),
    ] + [f"Extra event charged: {e['name']} (Gaussian, z = {e['noise_multiplier']:g} on "
         f"sensitivity {e.get('sensitivity', 1.0):g}, "
         + ("no sampling" if e.get("sampling_rate") is None else f"q = {e['sampling_rate']:g}")
         + f", {e.get('steps', 1)} time(s)"
         + (f", spending delta {e['delta']:.3g} each" if e.get("delta") else "") + ")"
         for e in ledger.get("extra_events", [])]
    artifacts = ledger.get("artifacts") or {}
    files = ([f"covered: {a}" for a in artifacts.get("covered", [])]
             + [f"NOT covered: {a}" for a in artifacts.get("not_covered", [])])
    # every statement of what epsilon leaves out, the files' included: one list, as the ledger
    uncovered = list(ledger.get("not_covered", [])) + [
        f"the file {a}" for a in artifacts.get("not_covered", [])]
    audit = audit_mechanism(ledger)
    check = (
        f"An empirical lower bound on epsilon for {_AUDITS[audit]} at this run's epsilon and "
        f"replicas, from a checkout of edp-tf: `python -m tools.audit --mechanism={audit} "
        f"--target_epsilon={epsilon if math.isfinite(epsilon) else 8.0:.3g} "
        f"--replicas={ledger.get('replicas', 1)} --canaries=4000 --steps=2 --runs=10 "
        "--gaussian` (results/audit/table.md holds the measured rows).")
    if int(ledger.get("bands", 1) or 1) > 1:
        check = ("No audit of BandMF exists yet: tools.audit checks the Gaussian step of "
                 "DP-SGD, which each BandMF participation is (the same clipped sum and noise "
                 "std per row of the strategy), but not the correlation of the noise across "
                 "steps, on which BandMF's accounting also rests.")
    return [
        ("The guarantee", [verdict]),
        ("Epsilon over the epochs", ["__plot__"]),
        ("The mechanism", [mechanism]),
        ("What epsilon assumes", [list(ledger.get("assumes", [])) or ["(nothing recorded)"]]),
        ("What epsilon does not cover", [uncovered or ["(nothing)"]]),
        ("Each artifact", [files or ["(no artifact list recorded)"]]),
        ("Checking the mechanism", [
            check + " Recompute this report's epsilon from privacy.json with "
            "`edp-privacy --run_dir=RUN_DIR`."]),
    ]


def _clip_unit(microbatch_size) -> str:
    if microbatch_size == 1:
        return "each example clipped on its own"
    return (f"micro-batches of {microbatch_size} examples clipped" if microbatch_size
            else "one micro-batch per replica clipped")


def svg_plot(curve: Sequence[tuple], width: int = 560, height: int = 240,
             target: Optional[float] = None) -> str:
    """Epsilon against epochs as a standalone SVG (no plotting library in the privacy core),
    with the budget (`target`) as a dashed line."""
    left, bottom, pad = 56, 36, 14
    if not curve:
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="40">'
                '<text x="10" y="25">no epoch recorded</text></svg>')
    x_max = max(k for k, _ in curve)
    finite = [e for _, e in curve if math.isfinite(e)] + ([target] if target else [])
    y_max = max(finite) * 1.1 if finite and max(finite) > 0 else 1.0

    def xy(k, e):
        x = left + (width - left - pad) * (k / x_max)
        y = height - bottom - (height - bottom - pad) * (min(e, y_max) / y_max)
        return f"{x:.1f},{y:.1f}"

    points = " ".join(xy(k, e) for k, e in curve)
    budget = ""
    if target:
        y = xy(0, target).split(",")[1]
        budget = (f'<line x1="{left}" y1="{y}" x2="{width - pad}" y2="{y}" stroke="#b03a2e" '
                  f'stroke-dasharray="5,4"/><text x="{width - pad}" y="{float(y) - 4:.1f}" '
                  f'text-anchor="end" font-size="11" fill="#b03a2e">target {target:.3g}</text>')
    ticks = "".join(
        f'<text x="{left - 6}" y="{height - bottom - (height - bottom - pad) * f + 4:.1f}" '
        f'text-anchor="end" font-size="11">{y_max * f:.3g}</text>' for f in (0, 0.5, 1))
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="sans-serif">'
            f'<line x1="{left}" y1="{height - bottom}" x2="{width - pad}" y2="{height - bottom}" '
            f'stroke="black"/><line x1="{left}" y1="{pad}" x2="{left}" y2="{height - bottom}" '
            f'stroke="black"/>{ticks}'
            f'<text x="{width - pad}" y="{height - bottom + 16}" text-anchor="end" '
            f'font-size="11">{x_max} epochs</text>'
            f'<text x="{left - 6}" y="{height - 4}" text-anchor="end" font-size="11">0</text>'
            f'<text x="{left + 4}" y="{pad + 10}" font-size="11">epsilon</text>'
            f'{budget}<polyline fill="none" stroke="#1f5fa8" stroke-width="2" '
            f'points="{points}"/>'
            + "".join(f'<circle cx="{xy(k, e).split(",")[0]}" cy="{xy(k, e).split(",")[1]}" '
                      f'r="2.5" fill="#1f5fa8"/>' for k, e in curve)
            + "</svg>")


def render(ledger: dict, fmt: str = "html", title: Optional[str] = None) -> str:
    """The report as one self-contained page, `fmt` "html" or "md"."""
    if fmt not in FORMATS:
        raise ValueError(f"report format must be one of {FORMATS}, got {fmt!r}")
    title = title or "Privacy report"
    content = sections(ledger)
    plot = svg_plot(epsilon_curve(ledger), target=ledger.get("target_epsilon"))
    content.insert(0, ("About this report", [
        f"Written by edp-tf {VERSION} on {datetime.date.today().isoformat()} from the run's "
        "privacy.json; every number is recomputed from its records, and the guarantee states "
        "exactly its headline (edp_tf.ledger.headline)."]))
    if fmt == "md":
        data = base64.b64encode(plot.encode()).decode()
        out = [f"# {title}", ""]
        for heading, blocks in content:
            out += [f"## {heading}", ""]
            for block in blocks:
                if block == "__plot__":
                    out += [f"![epsilon over the epochs](data:image/svg+xml;base64,{data})", ""]
                elif isinstance(block, list):
                    out += [f"* {item}" for item in block] + [""]
                else:
                    out += [block, ""]
        return "\n".join(out)
    body = [f"<h1>{html.escape(title)}</h1>"]
    for heading, blocks in content:
        body.append(f"<h2>{html.escape(heading)}</h2>")
        for block in blocks:
            if block == "__plot__":
                body.append(plot)
            elif isinstance(block, list):
                body.append("<ul>" + "".join(f"<li>{html.escape(item)}</li>" for item in block)
                            + "</ul>")
            else:
                body.append(f"<p>{html.escape(block)}</p>")
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>body{{font-family:sans-serif;"
            "max-width:52em;margin:2em auto;line-height:1.45}}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")


def write(ledger: dict, path: str, title: Optional[str] = None) -> str:
    """Writes the report to `path` (.html, else Markdown) and returns the path."""
    fmt = "html" if str(path).lower().endswith((".html", ".htm")) else "md"
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(ledger, fmt, title))
    return str(path)
