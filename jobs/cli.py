"""The installed ``audit`` command: the core commands of :mod:`audit.cli` plus the service
commands, which need Ray and MLflow:

    audit run SPEC [--dry-run] [...]      a sweep (:mod:`jobs.sweep`)
    audit sync SPEC [...]                 upload results left in a sweep's write-ahead log (:mod:`jobs.wal`)
    audit watch SPEC [--once] [...]       audit new model releases (:mod:`jobs.watch`)
    audit compare run:ID run:ID [...]     two finished sweeps in MLflow (:mod:`jobs.compare_runs`);
                                          two models: the core command (:mod:`audit.regression`)

It lives above the core so that :mod:`audit` never imports :mod:`jobs`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from actors.gc_tuning import tune_gc
from audit.cli import OneLineParser
from audit import cli as core_cli
from audit.regression import RUN_PREFIXES
from jobs import compare_runs, sweep, wal, watch


def quiet_mlflow_downloads() -> None:
    """No "Downloading artifacts" progress bars from MLflow in the output of `audit compare` and
    `audit watch` (they read per-item tables from the store; the bars are noise in a table or a log)."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="audit", description="Audit embeddings and language models for social bias.")
    sub = p.add_subparsers(dest="command", required=True)
    core_cli.add_core_commands(sub)
    compare_runs.add_options(sub.choices["compare"])
    sub.add_parser("watch", help="watch model repositories and submit an audit for each new revision", add_help=False)
    r = sub.add_parser("run", help="run a sweep spec (YAML) on Ray")
    r.add_argument("spec", help="sweep spec (YAML; jobs/specs/smoke.yaml, docs/service.md)")
    r.add_argument("--dry-run", action="store_true", help="print the plan (tasks per model and metric); run nothing")
    r.add_argument("rest", nargs=argparse.REMAINDER, help="further options of `python -m jobs.sweep` (--output-dir, "
                                                          "--tracking-uri, --address, --no-progress ...)")
    y = sub.add_parser("sync", help="upload the results a sweep could not log to MLflow (its write-ahead log)")
    y.add_argument("spec", help="the sweep spec whose write-ahead log to upload")
    y.add_argument("rest", nargs=argparse.REMAINDER, help="--output-dir DIR, --tracking-uri URI")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    tune_gc()  # the driver's collector thresholds (actors.gc_tuning)
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "watch":  # the watcher has its own options (jobs/watch)
        quiet_mlflow_downloads()
        return watch.main(argv[1:])
    a = build_parser().parse_args(argv)
    if a.command == "run":
        return sweep.main([a.spec] + (["--dry-run"] if a.dry_run else []) + list(a.rest))
    if a.command == "sync":
        return wal.main([a.spec] + list(a.rest))
    if a.command == "compare" and (a.a.startswith(RUN_PREFIXES) or a.b.startswith(RUN_PREFIXES)):
        quiet_mlflow_downloads()
        return core_cli.run_command(a, compare_runs.command)  # one line and status 2 / 130 / 143 as the core's
    return core_cli.run_command(a)


if __name__ == "__main__":
    sys.exit(main())
