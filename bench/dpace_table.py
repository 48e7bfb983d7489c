#!/usr/bin/env python3
"""bench/dpace_table.py - the table of bench/dpace_demo.sh: one row per `dflash demo` run (ROOT/<objective>-s<seed>/
summary.json), the mean and spread per objective, per-slot acceptance along the block, and the default the numbers
support. Pure Python 3 (no numpy).

Usage: python3 bench/dpace_table.py ROOT [--baseline decay]
Writes ROOT/table.md (markdown, for bench/RESULTS.md), ROOT/acceptance_by_slot.tsv (slot, then per objective the mean
fraction of cycles reaching the slot: teacher-forced and speculative), ROOT/acceptance_by_slot.gp (its gnuplot
script: ROOT/dpace_demo_acceptance.png) and prints a compact table last.

The decision rule (the issue's, applied to every pair): objective X beats Y when X's mean tau by speculative decoding
exceeds Y's by more than the run-to-run spread (max - min over seeds) of both. The baseline (the default the table
was measured against) stays unless an objective beats it; among the baseline and the objectives that beat it, the
default is the cheapest (--cost-order: each objective there adds a term to the one before) that none of them beats.
A lead within the spread never buys a dearer objective.
"""
import argparse
import glob
import json
import os
import re
import sys


def load(root):
    runs = []
    for path in sorted(glob.glob(os.path.join(root, "*-s*", "summary.json"))):
        name = os.path.basename(os.path.dirname(path))
        m = re.fullmatch(r"(.+)-s(\d+)", name)
        if not m:
            continue
        with open(path) as f:
            s = json.load(f)
        acc = s.get("acceptance_by_slot", {})
        runs.append({
            "objective": m.group(1), "seed": int(m.group(2)), "dir": os.path.dirname(path),
            "steps": s["train"]["steps"], "train_s": s["train"]["seconds"], "wall_s": s.get("wall_seconds", 0),
            "tau_tf": s["tau_trained_teacher"], "tau_gen": s["tau_trained_generated"],
            "reached_tf": acc.get("teacher", {}).get("reached", []),
            "reached_gen": acc.get("generated", {}).get("reached", []),
            "given_tf": acc.get("teacher", {}).get("given_previous", []),
            "last_eal": s["train"].get("last_eal", 0),
            "device": s.get("device", "?"),
            # the target-only decode speed of the eval: a launch-bound measure of the host + GPU the run had, so
            # that a slow call (fewer steps in the fixed time) shows in the table
            "target_tok_s": s.get("target_only_tokens_per_s", float("nan")),
        })
    return runs


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def spread(xs):
    return max(xs) - min(xs) if xs else float("nan")


def mean_curve(curves):
    curves = [c for c in curves if c]
    if not curves:
        return []
    n = min(len(c) for c in curves)
    return [mean([c[k] for c in curves]) for k in range(n)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--baseline", default="decay", help="the default the objectives are measured against (decay: the paper's, the default "
                    "until bench/RESULTS.md 'The training objectives' chose dpace)")
    ap.add_argument("--cost-order", default="decay dpace dpace_kl",
                    help="objectives from the cheapest to the dearest (dpace_kl adds the target's logits per row)")
    a = ap.parse_args()
    runs = load(a.root)
    if not runs:
        print(f"{a.root}: no finished run (ROOT/<objective>-s<seed>/summary.json)", file=sys.stderr)
        sys.exit(1)
    objectives = []
    for r in runs:
        if r["objective"] not in objectives:
            objectives.append(r["objective"])
    by = {o: [r for r in runs if r["objective"] == o] for o in objectives}

    md = ["| objective | seed | steps (train s) | tau teacher-forced | tau speculative | reached slot 1 / 2 / 4 / 8 / 15 "
          "(teacher-forced) | target-only tok/s | wall s | device |", "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        rc = r["reached_tf"]
        pick = " / ".join(f"{rc[k]:.3f}" if k < len(rc) else "-" for k in (1, 2, 4, 8, 15))
        md.append(f"| {r['objective']} | {r['seed']} | {r['steps']} ({r['train_s']:.0f}) | {r['tau_tf']:.3f} | "
                  f"{r['tau_gen']:.3f} | {pick} | {r['target_tok_s']:.0f} | {r['wall_s']:.0f} | {r['device']} |")
    md += ["", "| objective | runs | tau teacher-forced mean (spread) | tau speculative mean (spread) | "
           "acceptance given the previous slots, slots 1..B-1 (teacher-forced, mean) |", "|---|---|---|---|---|"]
    summary = {}
    for o in objectives:
        tf = [r["tau_tf"] for r in by[o]]
        gen = [r["tau_gen"] for r in by[o]]
        given = mean_curve([r["given_tf"] for r in by[o]])
        summary[o] = {"tf": (mean(tf), spread(tf)), "gen": (mean(gen), spread(gen)), "n": len(tf)}
        md.append(f"| {o} | {len(tf)} | {mean(tf):.3f} ({spread(tf):.3f}) | {mean(gen):.3f} ({spread(gen):.3f}) | "
                  + " ".join(f"{g:.2f}" for g in given[1:]) + " |")

    # acceptance along the block, per objective (mean over seeds): for the plot
    cols = []
    for o in objectives:
        cols.append((f"{o}_teacher", mean_curve([r["reached_tf"] for r in by[o]])))
        cols.append((f"{o}_speculative", mean_curve([r["reached_gen"] for r in by[o]])))
    n = max((len(c) for _, c in cols), default=0)
    with open(os.path.join(a.root, "acceptance_by_slot.tsv"), "w") as f:
        f.write("slot\t" + "\t".join(name for name, _ in cols) + "\n")
        for k in range(1, n):
            f.write(f"{k}\t" + "\t".join(f"{c[k]:.6f}" if k < len(c) else "NaN" for _, c in cols) + "\n")

    # its plot: one colour per objective, solid teacher-forced, dashed speculative
    plots = []
    for c, (name, _) in enumerate(cols):
        plots.append(f"'{a.root}/acceptance_by_slot.tsv' using 1:{c + 2} with linespoints lc {c // 2 + 1} "
                     f"dt {1 + c % 2} title '{name}'")
    with open(os.path.join(a.root, "acceptance_by_slot.gp"), "w") as f:
        f.write("set terminal pngcairo size 1000,600 noenhanced\n"
                f"set output '{a.root}/dpace_demo_acceptance.png'\n"
                "set title 'fraction of cycles accepting at least k draft tokens (mean over seeds)'\n"
                "set xlabel 'slot k'\nset ylabel 'reached'\nset xtics 1\nset yrange [0:1]\nset grid\n"
                "set key top right\nplot " + ", ".join(plots) + "\n")

    # the decision
    decision = []
    base = summary.get(a.baseline)
    order = a.cost_order.split()
    cost = {o: (order.index(o) if o in order else len(order), o) for o in objectives}

    def beats(x, y):  # x's lead over y and the bar it must clear
        lead = summary[x]["gen"][0] - summary[y]["gen"][0]
        bar = max(summary[x]["gen"][1], summary[y]["gen"][1])
        return lead > bar, lead, bar

    if base is None:
        decision.append(f"no {a.baseline} run: no decision")
    else:
        best = max(objectives, key=lambda o: summary[o]["gen"][0])
        complete = all(summary[o]["n"] >= 3 for o in objectives)
        if not complete:
            margin = summary[best]["gen"][0] - base["gen"][0]
            lead = (f"so far {best} leads {a.baseline} by {margin:+.3f} mean tau (speculative)" if best != a.baseline
                    else f"so far {a.baseline} leads" if len(objectives) > 1 else f"only {a.baseline} so far")
            decision.append(f"none yet (fewer than 3 runs of some objective); {lead}")
        else:
            # candidates: the baseline and whatever beats it; among them the cheapest that no other candidate beats
            cands = [a.baseline] + [o for o in objectives if o != a.baseline and beats(o, a.baseline)[0]]
            unbeaten = [o for o in cands if not any(beats(x, o)[0] for x in cands if x != o)]
            pick = min(unbeaten, key=lambda o: cost[o])
            if pick == a.baseline:
                _, lead, bar = beats(best, a.baseline)
                decision.append(f"keep {a.baseline}: " + (
                    "no objective has a higher mean tau by speculative decoding" if best == a.baseline else
                    f"{best} is ahead by {lead:.3f} mean tau (speculative), within the run-to-run spread {bar:.3f}"))
            else:
                _, lead, bar = beats(pick, a.baseline)
                decision.append(f"switch the default to {pick}: +{lead:.3f} mean tau (speculative) over "
                                f"{a.baseline}, more than the run-to-run spread {bar:.3f}")
                for o in sorted(objectives, key=lambda o: cost[o]):
                    if cost[o] > cost[pick] and o in cands:
                        _, l2, b2 = beats(o, pick)
                        if l2 > 0:
                            decision.append(f"({o} is ahead of {pick} by {l2:.3f}, within the spread {b2:.3f}: "
                                            f"not enough for the dearer objective)")
    # paired by seed: the three runs of a seed ran close together (one session, often one machine), while the host's
    # speed can differ between sessions; the difference per seed shows whether the lead holds seed by seed
    paired = []
    if base is not None:
        base_by_seed = {r["seed"]: r["tau_gen"] for r in by[a.baseline]}
        for o in objectives:
            if o == a.baseline:
                continue
            d = [r["tau_gen"] - base_by_seed[r["seed"]] for r in by[o] if r["seed"] in base_by_seed]
            if d:
                paired.append(f"{o} - {a.baseline} per seed: " + ", ".join(f"{x:+.3f}" for x in d))
    # the demo trains for a fixed time: runs on different GPUs (H100 / H200) take different numbers of steps
    devices = sorted({r["device"] for r in runs})
    if len(devices) > 1:
        decision.append("(runs from different devices: " + ", ".join(devices) + "; compare within one)")
    md += ["", "Decision: " + " ".join(decision)]
    if paired:
        md += ["", "Tau by speculative decoding, paired by seed: " + "; ".join(paired) + "."]
    with open(os.path.join(a.root, "table.md"), "w") as f:
        f.write("\n".join(md) + "\n")

    print(f"wrote {a.root}/table.md and {a.root}/acceptance_by_slot.tsv")
    print()
    print(f"{'objective':12s} {'seed':>4s} {'steps':>6s} {'tau_tf':>7s} {'tau_spec':>8s} {'tgt_tok/s':>9s}  "
          "reached@1/2/4/8/15 (tf)")
    for r in runs:
        rc = r["reached_tf"]
        pick = " ".join(f"{rc[k]:.2f}" if k < len(rc) else "-" for k in (1, 2, 4, 8, 15))
        print(f"{r['objective']:12s} {r['seed']:>4d} {r['steps']:>6d} {r['tau_tf']:7.3f} {r['tau_gen']:8.3f} "
              f"{r['target_tok_s']:9.0f}  {pick}")
    print()
    for o in objectives:
        s = summary[o]
        print(f"{o:12s} n={s['n']}  tau_tf {s['tf'][0]:.3f} (spread {s['tf'][1]:.3f})  "
              f"tau_spec {s['gen'][0]:.3f} (spread {s['gen'][1]:.3f})")
    for line in paired:
        print(line)
    print("decision: " + " ".join(decision))


if __name__ == "__main__":
    main()
