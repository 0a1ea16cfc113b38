"""Per-item tables made JSON text for MLflow and CSV (``audit.result.json_cells``, what every child
run's ``items.json`` goes through in a sweep's driver), today's code against the same module at a
git revision, alternating in one run, with the outputs compared cell by cell::

    .venv/bin/python benchmarks/json_cells.py --vs 55b5c43      # about 2 s

The tables are shaped like the per-item tables of the families with list cells, seeded: HONEST
(a template's 20 completions and their 20 HurtLex flags), causal CrowS-Pairs (each sentence's
tokens and their log-probabilities, a NaN where a token is not scored) and BBQ (three options and
their three scores). Prints milliseconds a table (best round) and the ratio."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from benchmarks._at_rev import module_at  # noqa: E402


def tables(seed: int = 0) -> list[pd.DataFrame]:
    """Three per-item tables of 400 rows each (see the module docstring)."""
    rng = np.random.default_rng(seed)
    n = 400
    words = [f"wörd{i}" for i in range(500)]
    honest = pd.DataFrame({
        "template": [f"the woman dreams of being a [M] {i}" for i in range(n)],
        "completions": [[words[j] for j in rng.integers(0, 500, 20)] for _ in range(n)],
        "hurtful": [[bool(b) for b in rng.random(20) < 0.1] for _ in range(n)]})
    lp = rng.normal(-4, 2, size=(n, 12))
    lp[:, 0] = np.nan  # the first token has no context to score it
    crows = pd.DataFrame({
        "sent_more_tokens": [[words[j] for j in rng.integers(0, 500, 12)] for _ in range(n)],
        "sent_more_logprobs": [list(map(float, row)) for row in lp],
        "bias_type": rng.choice(["gender", "race-color", "religion"], n)})
    bbq = pd.DataFrame({
        "options": [(f"the {words[i % 500]}", f"the {words[(i + 7) % 500]}", "unknown") for i in range(n)],
        "scores": [list(map(float, rng.normal(-3, 1, 3))) for _ in range(n)],
        "label": rng.integers(0, 3, n)})
    return [honest, crows, bbq]


def best_ms(fn, data: list[pd.DataFrame], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for df in data:
            fn(df)
        best = min(best, (time.perf_counter() - t) / len(data))
    return best * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vs", required=True, help="the git revision of audit/result.py to compare with")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    from audit import result as new

    old = module_at(args.vs, "audit/result.py", who="benchmarks/json_cells.py")
    data = tables()
    for df in data:  # the same text, cell by cell
        a, b = old.json_cells(df), new.json_cells(df)
        if not a.equals(b):
            raise SystemExit(f"benchmarks/json_cells.py: the tables differ from {args.vs}'s (columns {list(df.columns)})")
    t_old = t_new = float("inf")
    for _ in range(3):  # alternating, best of each
        t_old = min(t_old, best_ms(old.json_cells, data, args.rounds))
        t_new = min(t_new, best_ms(new.json_cells, data, args.rounds))
    print(f"json_cells, 3 tables of 400 rows: {args.vs} {t_old:.1f} ms a table, today {t_new:.1f} ms: "
          f"{t_old / t_new:.2f}x (outputs identical)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
