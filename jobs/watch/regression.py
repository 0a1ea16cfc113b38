"""Regression detection in ``audit watch``: is a newly audited revision more biased than the one
before it?

Each generated sweep's parent run carries its repository and revision (the ``audit.watch.*``
tags, :mod:`jobs.watch.sweeps`). When a poll finds the sweep of a revision FINISHED and the watch
spec has ``regression:`` (:class:`jobs.watch.spec.RegressionSpec`), and the parent run has no
``audit.regression`` tag yet, :func:`check_revision` compares it with

- the *previous* audited revision of the same repository: the latest FINISHED audit of another
  revision made before it (by the revisions' times, commit date or folder time, then the
  audits' start times; :meth:`jobs.watch.index.AuditIndex.previous`); while an audit of an
  earlier revision is still running the check waits for a later poll;
- and, with ``baseline: <revision>``, that pinned revision's audit (when it has one),

task by task from the stored per-item tables (:func:`jobs.compare_runs.compare_parents`: the
metric's paired comparison, Holm/BH over the compared tests of each metric) under the spec's
thresholds, with the one regression rule of :func:`audit.regression.flag_regressions`::

    regression  <=>  delta_abs >= min_increase  and  adjusted p <= alpha

Then (:func:`record`):

- the new revision's parent run gets the tags ``audit.regression`` (``true``/``false``),
  ``audit.regression_tests`` (the regressed ``language/test metric`` pairs) and
  ``audit.regression_baseline`` (the revisions compared with), and the diff report as
  artifacts under ``regression/``: ``regression.md`` (a Markdown table per baseline),
  ``comparison.json`` and ``.csv`` (every number), ``regression.png`` (both revisions' headlines
  with their intervals, per test);
- the watcher writes a ``regression`` decision (or ``compared`` when nothing regressed) and, on
  a regression, runs the notification (:func:`notify`): a command with the JSON on its standard
  input, and/or an HTTP POST of the JSON to a URL.

A check that cannot be made (the two audits share no task, a per-item table is missing) tags
``audit.regression=error`` with ``audit.regression_error`` and is an ``error`` decision, once;
a store that cannot be reached leaves no tag (the next poll tries again).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from audit import regression as core
from audit.errors import AuditError
from audit.retry import first_line
from jobs.compare_runs import compare_parents
from jobs.report import plot_comparison
from jobs.uris import redact_uri
from jobs.watch.index import (
    REGRESSION_BASELINE_TAG,
    REGRESSION_TAG,
    REGRESSION_TESTS_TAG,
    AuditIndex,
    SweepRecord,
)
from jobs.watch.spec import Notify, WatchSpec

__all__ = ["RegressionCheck", "check_revision", "record", "notify", "write_report", "REGRESSION_ERROR_TAG"]

#: Why a check could not be made (with ``audit.regression=error``).
REGRESSION_ERROR_TAG = "audit.regression_error"
_MAX_TAG = 5000


@dataclasses.dataclass
class RegressionCheck:
    """The outcome of comparing one audited revision with its baseline(s).

    regression: whether any compared (test, metric) regressed; ``None`` when the check could
                not be made (``error`` says why).
    table:      the comparison rows of every baseline (column ``baseline``: its revision).
    baselines:  the audits compared with; ``notes``: what was not compared and why.
    """

    rec: SweepRecord
    regression: bool | None
    table: pd.DataFrame
    baselines: list[SweepRecord]
    notes: list[str]
    error: str | None = None
    report_dir: Path | None = None

    @property
    def regressed(self) -> pd.DataFrame:
        if self.table.empty or "regression" not in self.table.columns:
            return self.table.iloc[0:0]
        return self.table[self.table["regression"].fillna(False).astype(bool)]

    def tests(self) -> list[str]:
        """The regressed ``language/test metric`` pairs, each once."""
        return list(dict.fromkeys(f"{r.language}/{r.test} {r.metric}" for r in self.regressed.itertuples()))

    def reason(self) -> str:
        """One line for the decision log."""
        if self.error:
            return f"regression check failed: {self.error}"
        if not self.baselines:
            return "; ".join(self.notes) or "nothing to compare with"
        against = ", ".join(b.revision or b.run_id for b in self.baselines)
        if self.regression:
            parts = [f"{r.language}/{r.test} {r.metric}: {r.value_a:.3f} -> {r.value_b:.3f} "
                     f"(|bias| {r.delta_abs:+.3f}, p adj {_adj(r):.3g}) vs {r.baseline}" for r in self.regressed.itertuples()]
            return "more biased than " + against + ": " + "; ".join(parts)
        ok = self.table[self.table["status"] == "compared"]
        top = ok["delta_abs"].max() if len(ok) else float("nan")
        extra = f"; largest |bias| change {top:+.3f}" if np.isfinite(top) else ""
        return (f"no regression against {against} ({len(ok)} (test, metric) pair(s) compared{extra})"
                + ("; " + "; ".join(self.notes) if self.notes else ""))


def _adj(row: Any) -> float:
    return float(getattr(row, "p_adjusted", getattr(row, "p_holm")))


# --------------------------------------------------------------------------------------
# The check
# --------------------------------------------------------------------------------------


def baselines_of(spec: WatchSpec, index: AuditIndex, rec: SweepRecord) -> tuple[list[SweepRecord], list[str], bool]:
    """The audits ``rec`` is compared with, notes on what is missing, and whether the check
    must wait (an earlier revision's audit still runs)."""
    rs = spec.regression
    assert rs is not None
    out: list[SweepRecord] = []
    notes: list[str] = []
    if rs.previous:
        prev = index.previous(rec)
        if index.pending_before(rec) and (prev is None or any(r.order > prev.order for r in index.pending_before(rec))):
            return [], [], True
        if prev is not None:
            out.append(prev)
        else:
            notes.append(f"no earlier audited revision of {rec.repo}")
    if rs.baseline and rs.baseline != rec.revision:
        pinned = index.revision(rec, rs.baseline)
        if pinned is None:
            notes.append(f"baseline revision {rs.baseline} has no finished audit")
        elif all(b.run_id != pinned.run_id for b in out):
            out.append(pinned)
    return out, notes, False


def check_revision(spec: WatchSpec, index: AuditIndex, rec: SweepRecord, client) -> RegressionCheck | None:
    """Compare the audit ``rec`` with its baseline(s) (module docstring); ``None`` while it
    must wait. Errors of the data (no shared task, no per-item table) are returned in
    ``error``; an unreachable store raises."""
    rs = spec.regression
    assert rs is not None
    baselines, notes, wait = baselines_of(spec, index, rec)
    if wait:
        return None
    if not baselines:
        return RegressionCheck(rec, False, pd.DataFrame(columns=core.COLUMNS), [], notes)
    new = client.get_run(rec.run_id)
    tables = []
    for b in baselines:
        try:
            df, _ = compare_parents(client, client.get_run(b.run_id), new, metrics=rs.metrics, tests=rs.tests,
                                    seed=rs.seed, n_bootstrap=rs.n_bootstrap, permutations=rs.permutations)
        except AuditError as e:
            return RegressionCheck(rec, None, pd.DataFrame(columns=core.COLUMNS), baselines, notes,
                                   error=f"against {b.revision}: {first_line(e)}")
        df = core.flag_regressions(df, min_increase=rs.min_increase, alpha=rs.alpha, adjust_method=rs.adjust)
        df.insert(0, "baseline", b.revision)
        df.insert(1, "baseline_run", b.run_id)
        df["p_adjusted"] = df["p_holm" if rs.adjust == "holm" else "p_bh"]
        tables.append(df)
    table = pd.concat(tables, ignore_index=True)
    return RegressionCheck(rec, bool(table["regression"].fillna(False).astype(bool).any()), table, baselines, notes)


# --------------------------------------------------------------------------------------
# The report, the tags, the notification
# --------------------------------------------------------------------------------------


def _short(rev: str | None) -> str:
    r = str(rev or "")
    return r.split(":", 1)[1][:12] if r.startswith("sha256:") else r[:19]


def write_report(spec: WatchSpec, check: RegressionCheck, out_dir: Path) -> Path:
    """``regression.md``, ``comparison.json``, ``comparison.csv`` and ``regression.png`` of a
    check in ``out_dir`` (created); returns ``out_dir``."""
    rs = spec.regression
    assert rs is not None
    out_dir.mkdir(parents=True, exist_ok=True)
    rec = check.rec
    rule = (f"|bias| (|headline - neutral|) up by >= {rs.min_increase:g} and {rs.adjust}-adjusted p <= {rs.alpha:g} "
            "(family: the compared tests of each metric)")
    verdict = ("REGRESSION: " + ", ".join(check.tests())) if check.regression else (
        "error: " + str(check.error) if check.error else "no regression")
    lines = [f"# Bias regression check: {rec.repo} at {rec.revision}", "",
             f"- watch `{spec.name}`, sweep `{rec.name}` (parent run `{rec.run_id}`)",
             f"- rule: {rule}", f"- result: **{verdict}**"]
    lines += [f"- note: {n}" for n in check.notes]
    for b in check.baselines:
        sub = check.table[check.table["baseline"] == b.revision] if "baseline" in check.table.columns else check.table
        lines += ["", f"## Against {b.revision} (sweep `{b.name}`, parent run `{b.run_id}`)", "",
                  core.format_markdown(sub.drop(columns=["baseline", "baseline_run"], errors="ignore"),
                                       label_a=_short(b.revision) or "A", label_b=_short(rec.revision) or "B")]
    (out_dir / "regression.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out_dir / "comparison.json").write_text(core.to_json(
        check.table, {"new": {"revision": rec.revision, "run_id": rec.run_id, "sweep": rec.name},
                      "baselines": [{"revision": b.revision, "run_id": b.run_id, "sweep": b.name} for b in check.baselines]},
        rule={"min_increase": rs.min_increase, "alpha": rs.alpha, "adjust": rs.adjust}, regression=check.regression,
        notes=check.notes), encoding="utf-8")
    check.table.to_csv(out_dir / "comparison.csv", index=False)
    if len(check.table) and (check.table["status"] == "compared").any():
        plot_comparison(check.table, out_dir / "regression.png", new_label=f"new {_short(rec.revision)}",
                        title=f"{rec.repo}: {_short(rec.revision)} vs "
                              f"{', '.join(_short(b.revision) for b in check.baselines)}",
                        baseline_label=lambda b: f"baseline {_short(b)}")
    check.report_dir = out_dir
    return out_dir


def record(client, spec: WatchSpec, check: RegressionCheck) -> None:
    """Tag the new revision's parent run and attach the report (``regression/``)."""
    tags = {REGRESSION_TAG: "error" if check.regression is None else str(bool(check.regression)).lower(),
            REGRESSION_TESTS_TAG: ", ".join(check.tests())[:_MAX_TAG],
            REGRESSION_BASELINE_TAG: ", ".join(b.revision or b.run_id for b in check.baselines) or "none"}
    if check.error:
        tags[REGRESSION_ERROR_TAG] = check.error[:_MAX_TAG]
    if check.report_dir is not None:
        client.log_artifacts(check.rec.run_id, str(check.report_dir), "regression")
    for k, v in tags.items():
        client.set_tag(check.rec.run_id, k, v)


def payload(spec: WatchSpec, check: RegressionCheck) -> dict[str, Any]:
    """The JSON a notification carries: the watch, the revision, the regressed rows, the
    baselines, the rule and where the report is."""
    rs = spec.regression
    assert rs is not None
    keep = ["baseline", "language", "test", "metric", "value_a", "value_b", "delta", "ci_low", "ci_high", "delta_abs",
            "p_value", "p_method", "p_holm", "p_bh"]
    rows = json.loads(check.regressed[[c for c in keep if c in check.table.columns]].to_json(orient="records"))
    return {
        "event": "bias_regression", "watch": spec.name, "repo": check.rec.repo, "revision": check.rec.revision,
        "sweep": check.rec.name, "run_id": check.rec.run_id, "tracking_uri": redact_uri(spec.resolved_tracking_uri),
        "experiment": spec.resolved_experiment, "baselines": [b.revision for b in check.baselines],
        "tests": check.tests(), "regressions": rows,
        "rule": {"min_increase": rs.min_increase, "alpha": rs.alpha, "adjust": rs.adjust},
        "report": str(check.report_dir / "regression.md") if check.report_dir else None,
    }


def notify(n: Notify, body: dict[str, Any]) -> tuple[list[str], list[str]]:
    """Run the notification: the command (JSON on stdin, ``AUDIT_REGRESSION_JSON`` = a file
    holding it) and/or an HTTP POST of the JSON. Returns (what was done, what failed), one line
    each."""
    text = json.dumps(body, ensure_ascii=False, default=str)
    done: list[str] = []
    failed: list[str] = []
    if n.command:
        argv = shlex.split(n.command)
        with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="biasaudit-regression-", delete=False,
                                         encoding="utf-8") as fh:
            fh.write(text)
        try:
            r = subprocess.run(argv, input=text, text=True, capture_output=True, timeout=n.timeout,
                               env={**os.environ, "AUDIT_REGRESSION_JSON": fh.name}, check=False)
            if r.returncode == 0:
                done.append(f"command {argv[0]} exited 0")
            else:
                err = (r.stderr or r.stdout or "").strip().splitlines()
                failed.append(f"notification command {argv[0]} exited {r.returncode}" + (f": {err[-1][:200]}" if err else ""))
        except (OSError, subprocess.SubprocessError) as e:
            failed.append(f"notification command {argv[0]}: {type(e).__name__}: {first_line(e)}")
        finally:
            Path(fh.name).unlink(missing_ok=True)
    if n.url:
        req = urllib.request.Request(n.url, data=text.encode("utf-8"), method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "biasaudit-watch"})
        where = redact_uri(n.url)
        try:
            with urllib.request.urlopen(req, timeout=n.timeout) as resp:  # noqa: S310 (http(s) checked by the spec)
                done.append(f"POST {where} {resp.status}")
        except urllib.error.HTTPError as e:
            failed.append(f"notification POST {where}: HTTP {e.code}")
        except (urllib.error.URLError, OSError) as e:
            reason = e.reason if isinstance(e, urllib.error.URLError) else e
            failed.append(f"notification POST {where}: {str(reason).strip().splitlines()[0] if str(reason).strip() else type(e).__name__}")
    return done, failed
