#!/usr/bin/env python3
"""tools/ref_dpace.py - an independent float64 reference of the drafter's loss head (docs/spec.md 2.4) for the
decayed cross-entropy and D-PACE, in pure Python (no torch, no numpy: it runs here and in CI images alike).

Writes tests/golden/dpace/case.json: a tiny case (final-normed hidden states h [R, H], the frozen lm_head W [V, H],
teacher hidden rows for the KL term, the rows that carry loss with their labels) and, per objective, the per-row
cross-entropy, KL, D-PACE confidences / smoothed confidences / prefix products / weights, the loss and its gradient
dh [R, H]. tests/train/dpace.cpp checks model/draft_loss.h against it on the CPU (fp32 and fp64).

D-PACE (arXiv 2605.18810, Eq. 7-9), written here as the trainers write it (vllm-project/speculators
src/speculators/losses/utils.py dpace_loss_decay, commit c05b95b): over a block's B slots with mask m,
    q = exp(-ce)  (detached),  s = (1 - alpha) q + alpha where m else 1,  P = cumprod(s),
    w = m * reverse_cumsum(P * m),
and loss = sum w (ce + kl_weight kl) / N with N = the number of supervised slots (sum of m) of the global batch;
the weights are constants for the gradient (Eq. 9). The decayed cross-entropy: w = m exp(-(i-1)/gamma),
N = sum of w. The gradient is checked here against central finite differences with the weights held fixed.

Usage: python3 tools/ref_dpace.py [--out tests/golden/dpace/case.json] [--check]
  --check: recompute and compare with the committed file instead of writing it: every number within 1e-12
  (relative; a libm may round exp / log differently in the last bit), exit 1 on a difference (ctest ref_dpace).
"""
import argparse
import json
import math
import os
import random
import sys

# ---- the case -----------------------------------------------------------------------------------------------------
H, V, B, N = 8, 13, 4, 4  # hidden, vocab, block size, blocks (the last one a padding block)
GAMMA = 4.0  # spec 2.4's gamma for B = 8 and below (model/draft_batch.h default_gamma)
KL_WEIGHT = 0.15
ALPHAS = [0.5, 0.3]  # the default, and another to show alpha's effect


def make_case(seed=2605):
    rnd = random.Random(seed)
    # dyadic values with few bits: exact in fp32 and bf16, so the fp32 logits are exact sums of exact products
    h = [[rnd.randint(-24, 24) / 16.0 for _ in range(H)] for _ in range(N * B)]
    W = [[rnd.randint(-16, 16) / 32.0 for _ in range(H)] for _ in range(V)]
    # the mask m[j][i]: slot 0 never; block 1 has an unsupervised slot (2) inside it; block 2 ends at the sequence
    # end after slot 1; block 3 is padding (no rows at all)
    m = [[0, 1, 1, 1], [0, 1, 0, 1], [0, 1, 0, 0], [0, 0, 0, 0]]
    rows = [j * B + i for j in range(N) for i in range(B) if m[j][i]]
    labels = [rnd.randrange(V) for _ in rows]
    teacher = [[rnd.randint(-24, 24) / 16.0 for _ in range(H)] for _ in rows]
    # a few labels are the row's argmax, so that some confidences are high (the weights then move)
    for k in (0, 3):
        z = logits(h[rows[k]], W)
        labels[k] = max(range(V), key=lambda v: z[v])
    return h, W, m, rows, labels, teacher


# ---- float64 maths ------------------------------------------------------------------------------------------------
def logits(x, W):
    return [math.fsum(x[k] * W[v][k] for k in range(len(x))) for v in range(len(W))]


def log_softmax(z):
    mx = max(z)
    lse = mx + math.log(math.fsum(math.exp(t - mx) for t in z))
    return [t - lse for t in z]


def row_terms(x, W, label, t):
    """ce, kl and their gradients with respect to the logits for one row."""
    lq = log_softmax(logits(x, W))
    q = [math.exp(v) for v in lq]
    ce = -lq[label]
    dce = [q[v] - (1.0 if v == label else 0.0) for v in range(len(q))]
    if t is None:
        return ce, 0.0, dce, [0.0] * len(q)
    lp = log_softmax(logits(t, W))
    p = [math.exp(v) for v in lp]
    kl = math.fsum(p[v] * (lp[v] - lq[v]) for v in range(len(q)))
    dkl = [q[v] - p[v] for v in range(len(q))]
    return ce, kl, dce, dkl


def dpace_block_weights(ce_block, m_block, alpha):
    """D-PACE over one block, in the trainers' array form (speculators dpace_loss_decay)."""
    q = [math.exp(-c) for c in ce_block]
    smooth = [((1 - alpha) * q[i] + alpha) if m_block[i] else 1.0 for i in range(len(q))]
    prefix, acc = [], 1.0
    for s in smooth:  # cumprod
        acc *= s
        prefix.append(acc)
    pm = [prefix[i] * m_block[i] for i in range(len(q))]
    suffix = [math.fsum(pm[i:]) for i in range(len(q))]  # flip, cumsum, flip
    w = [suffix[i] * m_block[i] for i in range(len(q))]
    return q, smooth, prefix, w


def loss_head(h, W, m, rows, labels, teacher, weights, norm, kl_weight):
    """loss = sum_r w_r (ce_r + kl_weight kl_r) / norm and dh (rows not selected: 0), weights held fixed."""
    dh = [[0.0] * H for _ in range(N * B)]
    terms, ces, kls = [], [], []
    for k, r in enumerate(rows):
        t = teacher[k] if kl_weight > 0 else None
        ce, kl, dce, dkl = row_terms(h[r], W, labels[k], t)
        ces.append(ce)
        kls.append(kl)
        terms.append(weights[k] * (ce + kl_weight * kl))
        dz = [(dce[v] + kl_weight * dkl[v]) * weights[k] / norm for v in range(V)]
        dh[r] = [math.fsum(dz[v] * W[v][c] for v in range(V)) for c in range(H)]
    return math.fsum(terms) / norm, ces, kls, dh


def objective(case, kind, alpha=None, kl_weight=0.0):
    h, W, m, rows, labels, teacher = case
    # the cross-entropies first (the forward): D-PACE's weights depend on them
    ce = {}
    for k, r in enumerate(rows):
        ce[r] = row_terms(h[r], W, labels[k], None)[0]
    out = {"kind": kind, "kl_weight": kl_weight}
    if kind == "decay":
        weights = [math.exp(-((r % B) - 1) / GAMMA) for r in rows]
        norm = math.fsum(weights)
        out["gamma"] = GAMMA
    else:
        q, smooth, prefix, weights = [], [], [], []
        for j in range(N):
            blk_rows = [j * B + i for i in range(B)]
            ce_block = [ce.get(r, 0.0) for r in blk_rows]  # unselected slots: any value (masked)
            bq, bs, bp, bw = dpace_block_weights(ce_block, m[j], alpha)
            for i in range(B):
                if m[j][i]:
                    q.append(bq[i])
                    smooth.append(bs[i])
                    prefix.append(bp[i])
                    weights.append(bw[i])
        norm = float(len(rows))  # the number of supervised slots: independent of the weights
        out.update({"alpha": alpha, "q": q, "smooth": smooth, "prefix": prefix})
    loss, ces, kls, dh = loss_head(h, W, m, rows, labels, teacher, weights, norm, kl_weight)
    out.update({"w": weights, "normaliser": norm, "ce": ces, "kl": kls, "loss": loss, "dh": dh})
    out["fd_max_rel_err"] = fd_check(case, weights, norm, kl_weight, dh)
    return out


def fd_check(case, weights, norm, kl_weight, dh):
    """max |dh - central difference| / max |dh| with the weights held fixed (they are detached: Eq. 9)."""
    h, W, m, rows, labels, teacher = case
    eps, worst, scale = 1e-6, 0.0, max(abs(v) for row in dh for v in row)
    for r in rows[:3] + rows[-2:]:
        for c in range(H):
            hp = [row[:] for row in h]
            hm = [row[:] for row in h]
            hp[r][c] += eps
            hm[r][c] -= eps
            lp = loss_head(hp, W, m, rows, labels, teacher, weights, norm, kl_weight)[0]
            lm = loss_head(hm, W, m, rows, labels, teacher, weights, norm, kl_weight)[0]
            worst = max(worst, abs((lp - lm) / (2 * eps) - dh[r][c]) / scale)
    return worst


def build():
    case = make_case()
    h, W, m, rows, labels, teacher = case
    objectives = {"decay": objective(case, "decay"), "decay_kl": objective(case, "decay", kl_weight=KL_WEIGHT)}
    for a in ALPHAS:
        objectives[f"dpace_a{a}"] = objective(case, "dpace", alpha=a)
        objectives[f"dpace_a{a}_kl"] = objective(case, "dpace", alpha=a, kl_weight=KL_WEIGHT)
    for name, o in objectives.items():
        assert o["fd_max_rel_err"] < 1e-7, (name, o["fd_max_rel_err"])
    return {
        "about": "tools/ref_dpace.py: float64 reference of the loss head (docs/spec.md 2.4), decay and D-PACE",
        "H": H, "V": V, "block_size": B, "blocks": N,
        "h": h, "lm_head": W, "mask": m, "rows": rows, "labels": labels, "teacher_h": teacher,
        "objectives": objectives,
    }


def differences(a, b, where="", tol=1e-12):
    """The places where two JSON trees differ (numbers: relative difference above tol)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where}: keys {sorted(a)} vs {sorted(b)}"]
        # fd_max_rel_err is finite-difference noise (a diagnostic, asserted < 1e-7 when built), not a golden value
        return [d for k in a if k != "fd_max_rel_err" for d in differences(a[k], b[k], f"{where}.{k}", tol)]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: length {len(a)} vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]", tol)]
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return [] if abs(a - b) <= tol * max(abs(a), abs(b), 1e-300) else [f"{where}: {a!r} vs {b!r}"]
    return [] if a == b else [f"{where}: {a!r} vs {b!r}"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "golden", "dpace", "case.json"))
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    g = build()
    text = json.dumps(g, indent=1) + "\n"
    if a.check:
        with open(a.out) as f:
            bad = differences(json.load(f), g)
        for b in bad[:10]:
            print(b)
        print(f"{a.out}: {'agrees with the reference' if not bad else f'{len(bad)} DIFFERENCES'}")
        sys.exit(0 if not bad else 1)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(text)
    for name, o in g["objectives"].items():
        print(f"{name:16s} loss {o['loss']:.12f}  normaliser {o['normaliser']:.6f}  "
              f"w {[round(x, 4) for x in o['w']]}  fd {o['fd_max_rel_err']:.1e}")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
