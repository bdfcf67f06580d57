#!/usr/bin/env python3
"""Condenses the per-seed CSVs written by reproduce.sh (b{0,1}-{declared,progress,none}.csv)
into results/summary.md: per workload and information mode, one row per arrival rate with
avg JCT (mean over seeds, lowest-highest seed) and Kudos' ratios (ratio of the means,
lowest-highest per-seed ratio). The same figures as kudos-sim --summary, fewer columns."""
import csv
import os
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = [("declared", "declared work (kudos.dev/work)"),
         ("progress", "measured progress only (steps done, reported at 1 h, 2 h, 4 h, ... and at the end)"),
         ("none", "nothing (start and end times only)")]


def load(path):
    d = defaultdict(dict)  # (rate, policy) -> seed -> row
    with open(path) as f:
        for r in csv.DictReader(f):
            d[(float(r["rate_per_hour"]), r["policy"])][int(r["seed"])] = r
    return d


def jct(d, rate, pol):
    v = [float(r["avg_jct_h"]) for r in d[(rate, pol)].values()]
    return sum(v) / len(v), min(v), max(v)


def ratio(d, rate, a, b):
    A, B = d[(rate, a)], d[(rate, b)]
    per = [float(A[s]["avg_jct_h"]) / float(B[s]["avg_jct_h"]) for s in A]
    return jct(d, rate, a)[0] / jct(d, rate, b)[0], min(per), max(per), sum(p > 1 for p in per), len(per)


def fmt(t, d=1):
    return f"{t[0]:.{d}f} ({t[1]:.{d}f}–{t[2]:.{d}f})"


def table(path):
    d = load(path)
    rates = sorted({k[0] for k in d})
    base = jct(d, rates[0], "kube-default")[0]
    out = ["| rate | kube-default | fastest-type | kudos | greedy oracle | kube ×2 | kudos/kube | kudos/g-oracle | kudos/fastest | MAPE@5 |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rates:
        k = jct(d, r, "kube-default")
        doubled = k[0] / base
        rk, ro, rf = ratio(d, r, "kudos", "kube-default"), ratio(d, r, "kudos", "greedy-oracle"), ratio(d, r, "kudos", "fastest-type")
        m = [float(x["mape_after5"]) for x in d[(r, "kudos")].values() if x["mape_after5"]]
        miss = lambda bad: "**" if bad else ""
        ko = doubled >= 2
        cells = [f"{r:g}", fmt(k), fmt(jct(d, r, "fastest-type")), fmt(jct(d, r, "kudos")),
                 fmt(jct(d, r, "greedy-oracle")), f"{doubled:.1f}×",
                 f"{miss(ko and rk[0] > 0.5)}{fmt(rk, 2)}{miss(ko and rk[0] > 0.5)}",
                 f"{miss(ko and ro[0] > 1.10)}{fmt(ro, 2)}{miss(ko and ro[0] > 1.10)}",
                 f"{miss(rf[0] > 1)}{fmt(rf, 2)}{miss(rf[0] > 1)}" + (f" [{rf[3]}/{rf[4]}]" if rf[3] else ""),
                 f"{100 * sum(m) / len(m):.0f}% ({100 * min(m):.0f}–{100 * max(m):.0f})"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def load_modes(wl):
    """Workload wl's CSVs of every information mode, the declared mode's, its rates and the
    kube-default JCT at the lowest rate (what "kube ×2" compares with); None if a mode is
    missing."""
    ds = {m: load(os.path.join(HERE, f"{wl}-{m}.csv")) for m, _ in MODES
          if os.path.exists(os.path.join(HERE, f"{wl}-{m}.csv"))}
    if len(ds) < len(MODES):
        return None
    d0 = ds["declared"]
    rates = sorted({k[0] for k in d0})
    return ds, d0, rates, jct(d0, rates[0], "kube-default")[0]


def side_by_side(wl):
    """One row per rate: Kudos' ratios in the three information modes side by side."""
    loaded = load_modes(wl)
    if loaded is None:
        return ""
    ds, d0, rates, base = loaded
    head = ["rate", "kube-default h", "g-oracle h", "kube ×2"]
    for what in ("kudos/kube", "kudos/g-oracle", "kudos/fastest"):
        head += [f"{what} {m[0]}" for m, _ in MODES]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rates:
        k = jct(d0, r, "kube-default")
        ko = k[0] / base >= 2
        row = [f"{r:g}", fmt(k), fmt(jct(d0, r, "greedy-oracle")), f"{k[0] / base:.1f}×"]
        for den, limit, applies in (("kube-default", 0.5, ko), ("greedy-oracle", 1.10, ko), ("fastest-type", 1.0, True)):
            for m, _ in MODES:
                x = ratio(ds[m], r, "kudos", den)
                b = "**" if applies and x[0] > limit else ""
                row.append(f"{b}{fmt(x, 2)}{b}")
        out.append("| " + " | ".join(row) + " |")
    return "\n".join(out)


def compact(wl):
    """As side_by_side, one cell per ratio: the three modes' ratios of means (d / p / n) and the
    lowest-highest per-seed ratio over all three."""
    loaded = load_modes(wl)
    if loaded is None:
        return ""
    ds, d0, rates, base = loaded
    out = ["| rate | kube-default h | kudos h (d / p / n) | g-oracle h | kube ×2 | kudos/kube | kudos/g-oracle | kudos/fastest |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rates:
        k = jct(d0, r, "kube-default")
        ko = k[0] / base >= 2
        kud = " / ".join(f"{jct(ds[m], r, 'kudos')[0]:.1f}" for m, _ in MODES)
        row = [f"{r:g}", f"{k[0]:.1f}", kud, f"{jct(d0, r, 'greedy-oracle')[0]:.1f}", f"{k[0] / base:.1f}×"]
        for den, limit, applies in (("kube-default", 0.5, ko), ("greedy-oracle", 1.10, ko), ("fastest-type", 1.0, True)):
            xs = [ratio(ds[m], r, "kudos", den) for m, _ in MODES]
            # A miss that rounds to the limit gets a third decimal.
            means = " / ".join(
                ("**%.3f**" if round(x[0], 2) <= limit else "**%.2f**") % x[0] if applies and x[0] > limit
                else "%.2f" % x[0] for x in xs)
            lo, hi = min(x[1] for x in xs), max(x[2] for x in xs)
            row.append(f"{means} ({lo:.2f}–{hi:.2f})")
        out.append("| " + " | ".join(row) + " |")
    return "\n".join(out)


def mape(d, rate):
    m = [float(x["mape_after5"]) for x in d[(rate, "kudos")].values() if x["mape_after5"]]
    return f"{100 * sum(m) / len(m):.0f}% ({100 * min(m):.0f}–{100 * max(m):.0f})"


def mape_table():
    """MAPE@5 per information mode, class = model family (the sweeps) against class = job type
    (model and batch size, --class-by-job-type), at the rates of the job-type runs."""
    out = ["| workload | Kudos told | rate | MAPE@5, class = model family | MAPE@5, class = job type "
           "| kudos/g-oracle, family | kudos/g-oracle, job type |",
           "|---|---|---|---|---|---|---|"]
    for wl in ("b1", "b0"):
        for mode, _ in MODES:
            fam, jt = (os.path.join(HERE, f"{wl}-{mode}.csv"), os.path.join(HERE, f"{wl}-jobtype-{mode}.csv"))
            if not (os.path.exists(fam) and os.path.exists(jt)):
                continue
            F, J = load(fam), load(jt)
            for r in sorted({k[0] for k in J}):
                # Same seeds, same jobs: only the class label differs; the oracle is the sweep's.
                for p in J:
                    if p[1] == "kudos":
                        F[(p[0], "kudos-jt")] = J[p]
                ro = fmt(ratio(F, r, "kudos", "greedy-oracle"), 2)
                rj = fmt(ratio(F, r, "kudos-jt", "greedy-oracle"), 2)
                out.append(f"| {wl.upper()} | {mode} | {r:g} | {mape(F, r)} | {mape(J, r)} | {ro} | {rj} |")
    return "\n".join(out)


def main():
    parts = ["<!-- generated by simulator/results/condense.py from the per-seed CSVs -->",
             "Avg JCT in hours, mean over seeds 0–9 (lowest–highest seed). Ratios: ratio of the means "
             "(lowest–highest per-seed ratio). **bold**: misses its target (kudos/kube ≤ 0.5 and "
             "kudos/g-oracle ≤ 1.10 where kube ×2 ≥ 2.0, kudos/fastest ≤ 1 everywhere); [k/10]: seeds "
             "where Kudos was slower than fastest-type. MAPE@5: Kudos' prediction error once the "
             "(model family, GPU type) pair had ≥ 5 finished runs, mean (lowest–highest seed)."]
    parts.append("### Compact: ratios of the means when Kudos is told declared work / measured progress / "
                 "nothing (lowest–highest per-seed ratio over all three modes); kudos h likewise")
    for wl in ("b1", "b0"):
        t = compact(wl)
        if t:
            parts.append(f"{wl.upper()}:\n\n{t}")
    parts.append("### Side by side: Kudos told declared work (d), measured progress (p), nothing (n)")
    for wl in ("b1", "b0"):
        t = side_by_side(wl)
        if t:
            parts.append(f"{wl.upper()}:\n\n{t}")
    for wl, title in [("b1", "B1: Philly job mix on Gavel throughputs, 27 nodes × 4 GPUs (9 per type), 108 GPUs"),
                      ("b0", "B0: Gavel's generator, single-GPU jobs, Gavel's 108 one-GPU nodes (36 per type)")]:
        for mode, told in MODES:
            p = os.path.join(HERE, f"{wl}-{mode}.csv")
            if os.path.exists(p):
                parts.append(f"### {title}; Kudos told: {told}\n\n{table(p)}")
    parts.append("### Kudos' prediction error after 5 runs (MAPE@5), by information mode and class label\n\n"
                 "Mean over seeds 0–9 (lowest–highest seed).\n\n" + mape_table())
    out = os.path.join(HERE, "summary.md")
    with open(out, "w") as f:
        f.write("\n\n".join(parts) + "\n")
    print(out, file=sys.stderr)


if __name__ == "__main__":
    main()
