"""``python -m audit.mitigation --report``: WEAT before/after each debiasing method on GloVe 6B 50d.

Options: ``--methods hd,ran`` (default: all five), ``--tests weat6,weat7,weat8,weat1``,
``--top N`` (restrict GloVe to the N most frequent words plus the test and definition words;
default: all 400000), ``--csv PATH`` (also write the long table), ``--seed`` (permutation
p-values). Prints a Markdown table of effect sizes (before -> after), the mean |s(w, A, B)|
per test, and the fit+transform time of each method.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from audit.errors import AuditError
from audit.mitigation import ALIASES
from audit.mitigation.evaluation import (
    CONTROL_TESTS,
    GENDER_TESTS,
    format_table,
    mitigation_report,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m audit.mitigation", description=__doc__.splitlines()[0])
    ap.add_argument("--report", action="store_true", help="print the before/after WEAT table")
    ap.add_argument("--methods", default="", help="comma-separated method names or aliases (default: all)")
    ap.add_argument("--tests", default=",".join(GENDER_TESTS + CONTROL_TESTS))
    ap.add_argument("--top", type=int, default=None, help="restrict GloVe to the N most frequent words")
    ap.add_argument("--definitions", default="en/gender")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--csv", default=None)
    args = ap.parse_args(argv)
    if not args.report:
        ap.print_help()
        return 0
    methods = [ALIASES.get(m.strip(), m.strip()) for m in args.methods.split(",") if m.strip()] or None
    tests = [t.strip() for t in args.tests.split(",") if t.strip()]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            df, seconds = mitigation_report(methods, tests=tests, definitions=args.definitions, top=args.top,
                                            seed=args.seed)
    except AuditError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    vocab = "all 400000 words" if args.top is None else f"top {args.top} words + test and definition words"
    print(f"WEAT effect size d (ddof=1), GloVe 6B 50d ({vocab}), definitions {args.definitions}\n")
    print(format_table(df))
    print("\nmean |s(w, A, B)| over target words (before -> after)\n")
    scale = df.assign(effect_before=df["mean_abs_s_before"], effect_after=df["mean_abs_s_after"])
    print(format_table(scale, digits=4).replace(" d (before -> after)", " mean abs s"))
    print("\nfit + transform seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()))
    if args.csv:
        df.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
