"""Power and false-positive rate of the release-over-release comparison (audit.compare).

Run from the repository root::

    .venv/bin/python benchmarks/regression_power.py            # 14 min here under load (load average 11)
    .venv/bin/python benchmarks/regression_power.py --quick    # a smaller grid, ~15 s

Simulation (static vectors, :func:`simulate_pair`): a "base" model has, in ``dim``
dimensions, target words ``X = N(0, I) + beta g`` and ``Y = N(0, I) - beta g`` and attribute
words ``A = N(0, I) + alpha g``, ``B = N(0, I) - alpha g`` along a bias direction ``g``
(``beta = 1.2``, ``alpha = 2``: WEAT effect size d of about 1.2, the range of GloVe's WEAT 1-10). Two
"revisions" are the base plus independent retraining noise ``noise * N(0, I)`` on every
word (``noise`` 0.25: a word's vectors in the two revisions have cosine ~0.97; 0.5: ~0.89).
Revision B gets a *planted change*: its X words move by ``+delta g`` and its Y words by
``-delta g`` (more bias); ``delta = 0`` are the pairs with no change, whose two revisions
are exchangeable. Each pair is compared with :func:`audit.compare.compare_weat`: the
revisions share one vector space, so its default swaps every word (targets and attributes)
between them; two-sided test of the change in d with ``--permutations`` random swaps (1,999
by default, p-value resolution 5e-4), at level ``--alpha``. ``--swap targets`` measures the
swap of target scores only, which ignores the noise of the attribute words.

Output: for each noise level and target-set size, the false-positive rate at ``delta = 0``
with its Monte-Carlo standard error ``sqrt(r (1 - r) / n_seeds)`` and whether it stays at or
below alpha within 2 standard errors; the power and the mean change in d (``Δd``, the
planted change's size on the effect-size scale) for each ``delta``; and the smallest
``Δd`` detected with 80% power (linear interpolation of power against mean ``Δd``; ``>``
the largest simulated change when not reached). The set sizes default to those of the
shipped tests (5, 6, 8, 10, 18, 25, 32 target words per set).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

from audit.compare import compare_weat

SIZES = (5, 6, 8, 10, 18, 25, 32)
DELTAS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5)
NOISES = (0.25, 0.5)


def simulate_pair(seed: int, n_targets: int, *, n_attributes: int = 8, dim: int = 50, beta: float = 1.2,
                  alpha: float = 2.0, delta: float = 0.0, noise: float = 0.5) -> tuple[list, list]:
    """Two revisions ``(X, Y, A, B)`` of one simulated model (module docstring)."""
    rng = np.random.default_rng(seed)
    g = np.zeros(dim)
    g[0] = 1.0
    base = [
        rng.normal(size=(n_targets, dim)) + beta * g,
        rng.normal(size=(n_targets, dim)) - beta * g,
        rng.normal(size=(n_attributes, dim)) + alpha * g,
        rng.normal(size=(n_attributes, dim)) - alpha * g,
    ]
    rev_a = [v + noise * rng.normal(size=v.shape) for v in base]
    rev_b = [v + noise * rng.normal(size=v.shape) for v in base]
    rev_b[0] = rev_b[0] + delta * g
    rev_b[1] = rev_b[1] - delta * g
    return rev_a, rev_b


def run_cell(n_targets: int, delta: float, noise: float, seeds: range, *, alpha: float = 0.05,
             permutations: str | int = "auto", n_attributes: int = 8, swap: str = "auto") -> dict:
    """Rejection rate and mean Δd over ``seeds`` for one (size, delta, noise)."""
    rejected, dds, d_a = 0, [], []
    for s in seeds:
        a, b = simulate_pair(s, n_targets, n_attributes=n_attributes, delta=delta, noise=noise)
        c = compare_weat(a, b, n_bootstrap=0, permutations=permutations, seed=s, swap=swap)
        rejected += c.p_value <= alpha
        dds.append(c.delta)
        d_a.append(c.value_a)
    n = len(seeds)
    rate = rejected / n
    return {"n_targets": n_targets, "delta": delta, "noise": noise, "n_seeds": n, "rate": rate,
            "mc_se": math.sqrt(rate * (1 - rate) / n), "mean_dd": float(np.mean(dds)),
            "mean_d_a": float(np.mean(d_a))}


def detectable_change(cells: list[dict], power: float = 0.8) -> float | None:
    """Smallest mean Δd with rejection rate >= ``power`` (linear interpolation between the
    simulated changes); None when no simulated change reaches it."""
    pts = sorted((c["mean_dd"], c["rate"]) for c in cells if c["delta"] > 0)
    prev = (0.0, min((c["rate"] for c in cells if c["delta"] == 0), default=0.0))
    for x, y in pts:
        if y >= power:
            x0, y0 = prev
            return x if y == y0 else x0 + (power - y0) * (x - x0) / (y - y0)
        prev = (x, y)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    ap.add_argument("--deltas", type=float, nargs="+", default=list(DELTAS))
    ap.add_argument("--noise", type=float, nargs="+", default=list(NOISES))
    ap.add_argument("--seeds-null", type=int, default=1000, help="pairs without change per cell")
    ap.add_argument("--seeds", type=int, default=200, help="pairs per planted change")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--permutations", type=int, default=1999, help="random swap patterns per comparison")
    ap.add_argument("--swap", choices=["auto", "words", "targets"], default="auto",
                    help="compare_weat's swap (auto: all words, the revisions share a space)")
    ap.add_argument("--quick", action="store_true", help="sizes 8 25, noise 0.5, 400/100 seeds")
    a = ap.parse_args(argv)
    if a.quick:
        a.sizes, a.noise, a.seeds_null, a.seeds = [8, 25], [0.5], 400, 100
    deltas = [0.0] + [d for d in a.deltas if d > 0]
    t0 = time.perf_counter()
    print(f"# Release-over-release WEAT comparison: false positives and power (alpha = {a.alpha})\n")
    print(f"two-sided label-swap test of the change in d (swap={a.swap}, {a.permutations} random swaps); "
          f"null pairs: "
          f"{a.seeds_null} seeds per cell, planted changes: {a.seeds} seeds per cell\n")
    summary = []
    for noise in a.noise:
        print(f"## revision noise {noise}\n")
        head = " | ".join(f"δ={d:g}: Δd, power" for d in deltas[1:])
        print(f"| words per set | d (rev. A) | false-positive rate ± MC s.e. | ≤ α? | {head} | Δd at 80% power |")
        print("| ---: | ---: | --- | --- | " + " | ".join("---" for _ in deltas[1:]) + " | ---: |")
        for n in a.sizes:
            perms = a.permutations
            cells = [run_cell(n, 0.0, noise, range(a.seeds_null), alpha=a.alpha, permutations=perms, swap=a.swap)]
            for d in deltas[1:]:
                cells.append(run_cell(n, d, noise, range(10_000, 10_000 + a.seeds), alpha=a.alpha,
                                      permutations=perms, swap=a.swap))
            null = cells[0]
            ok = null["rate"] <= a.alpha + 2 * math.sqrt(a.alpha * (1 - a.alpha) / null["n_seeds"])
            dc = detectable_change(cells)
            dc_s = f"{dc:.2f}" if dc is not None else f"> {max(c['mean_dd'] for c in cells):.2f}"
            body = " | ".join(f"{c['mean_dd']:.2f}, {c['rate']:.2f}" for c in cells[1:])
            print(f"| {n} | {null['mean_d_a']:.2f} | {null['rate']:.3f} ± {null['mc_se']:.3f} | "
                  f"{'yes' if ok else 'NO'} | {body} | {dc_s} |", flush=True)
            summary.append((noise, n, dc, null["rate"], ok))
        print()
    print(f"{time.perf_counter() - t0:.0f} s; load average {os.getloadavg()[0]:.1f}")
    return 0 if all(s[4] for s in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
