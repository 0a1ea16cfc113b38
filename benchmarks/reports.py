"""Report writing: the dot-and-interval plots placed by measured text sizes
(``jobs.report._forest_layout``) against matplotlib's constrained layout, the engine they used
before, on the same results in the same run.

    .venv/bin/audit run jobs/specs/default.yaml        # writes out/default/reports/results.parquet
    .venv/bin/python benchmarks/reports.py             # about 1.5 minutes
    .venv/bin/python benchmarks/reports.py --results other/reports/results.parquet --repeats 3
    .venv/bin/python benchmarks/reports.py --vs dcf16ef                # this tree's reports against a revision's
    .venv/bin/python benchmarks/reports.py --vs dcf16ef --synthetic 192  # on the tests' 192-model sweep

Each variant runs ``jobs.report.write_reports`` (tables, every plot, breakdowns) into a temporary
folder, alternating, ``--repeats`` times; the table gives this process's CPU seconds (best and
median) and the ratio baseline / ours. The baseline places the same figures with
``fig.set_layout_engine("constrained")`` and leaves the rest of the code as it is; with ``--vs
REV`` it is ``jobs/report.py`` as it was at git revision ``REV`` (loaded beside this tree's, the
rest of the code shared). ``--synthetic N``: instead of a sweep's results, the synthetic sweep of
``tests/test_reports_scale.py`` with ``N`` models (WEAT 1-10 and CrowS-Pairs per bias type).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from benchmarks._at_rev import module_at  # noqa: E402
from jobs import report  # noqa: E402


def _constrained(fig, **_):
    """The baseline: matplotlib's constrained layout places the figure (as before the change)."""
    fig.set_layout_engine("constrained")


def _time_module(df: pd.DataFrame, mod) -> float:
    """CPU seconds of ``mod.write_reports`` (a ``jobs.report`` module) on ``df``, into a temporary folder."""
    with tempfile.TemporaryDirectory() as d:
        t = time.process_time()
        mod.write_reports(df, d, mitigations={})
        return time.process_time() - t


def _time(df: pd.DataFrame, layout) -> float:
    ours = report._forest_layout
    report._forest_layout = layout or ours
    try:
        return _time_module(df, report)
    finally:
        report._forest_layout = ours


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", default="out/default/reports/results.parquet",
                   help="a sweep's results.parquet (default: the default audit's)")
    p.add_argument("--synthetic", type=int, metavar="N",
                   help="the synthetic sweep of tests/test_reports_scale.py with N models instead of --results")
    p.add_argument("--vs", metavar="REV", help="the baseline: jobs/report.py at this git revision")
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args()
    if a.synthetic:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from test_reports_scale import _synthetic_sweep

        df = _synthetic_sweep(a.synthetic)
    elif not Path(a.results).is_file():
        print(f"reports.py: {a.results}: no such file (run `audit run jobs/specs/default.yaml` first)", file=sys.stderr)
        return 2
    else:
        df = pd.read_parquet(a.results)
    if a.vs:
        old = module_at(a.vs, "jobs/report.py", who="reports.py")
        names = (f"jobs/report.py at {a.vs}", "this tree's")
        times: dict[str, list[float]] = {n: [] for n in names}
        for mod in (old, report):  # first figures and fonts, in both, before timing
            _time_module(df.head(3), mod)
        for _ in range(a.repeats):
            times[names[0]].append(_time_module(df, old))
            times[names[1]].append(_time_module(df, report))
    else:
        times = {"constrained layout (before)": [], "measured layout (ours)": []}
        for _ in range(a.repeats):
            times["constrained layout (before)"].append(_time(df, _constrained))
            times["measured layout (ours)"].append(_time(df, None))
    print(f"{len(df)} results, {df.groupby(['metric', 'language']).ngroups} metric x language plots; "
          f"load average {os.getloadavg()[0]:.1f}; write_reports CPU seconds")
    for name, ts in times.items():
        print(f"  {name:32s} best {min(ts):6.2f}  median {statistics.median(ts):6.2f}")
    base, ours = (min(ts) for ts in times.values())
    print(f"  ratio before / ours: {base / ours:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
