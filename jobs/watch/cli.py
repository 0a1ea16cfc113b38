"""``audit watch`` / ``python -m jobs.watch``: the command line, and the entrypoint of a
submitted job (``--run-spec-env``)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Sequence

from audit import schema
from audit.cli import OneLineParser
from audit.errors import AuditError, one_line
from audit.outputs import ensure_output_dir
from jobs import sweep
from jobs.spec import parse_spec
from jobs.validators import parse_yaml
from jobs.watch.spec import load_watch_spec
from jobs.watch.watcher import Watcher


def run_spec_from_env(var: str, sweep_args: Sequence[str]) -> int:
    """Write the sweep spec carried by ``$var`` into its output directory and run it with
    :func:`jobs.sweep.main` (what a submitted job's entrypoint does)."""
    text = os.environ.get(var)
    if not text:
        print(f"audit: error: environment variable {var} is not set (it carries the sweep spec)", file=sys.stderr)
        return 2
    try:
        spec = parse_spec(parse_yaml(text, f"${var}"), source=f"${var}")
    except AuditError as e:
        print(f"audit: error: {one_line(e)}", file=sys.stderr)
        return 2
    try:
        out = ensure_output_dir(spec.output_dir, f"${var}: output_dir")
    except AuditError as e:
        print(f"audit: error: {one_line(e)}", file=sys.stderr)
        return 2
    path = out / f"{spec.name}.yaml"
    path.write_text(text, encoding="utf-8")
    return sweep.main([str(path), *sweep_args])


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="audit watch", description=(
        "Watch model repositories (Hugging Face hub or a local directory) and submit an audit sweep "
        "to Ray for each new revision, once."))
    p.add_argument("spec", nargs="?", help="watch spec (YAML; see jobs/specs/watch-example.yaml, docs/scheduling.md)")
    p.add_argument("--once", action="store_true", help="poll once and exit (cron, systemd timers, Kubernetes CronJobs)")
    p.add_argument("--dry-run", action="store_true", help="decide and write the specs; submit nothing")
    p.add_argument("--address", default=None, help="Ray job API address (default: the spec's ray.address, else $RAY_ADDRESS)")
    p.add_argument("--tracking-uri", default=None,
                   help="MLflow store (default: the spec's tracking.uri, else $MLFLOW_TRACKING_URI, "
                        "else sqlite:///<output_dir>/mlflow.db)")
    p.add_argument("--output-dir", default=None, help="override the spec's output_dir")
    p.add_argument("--interval", type=float, default=None, help="seconds between polls (override)")
    p.add_argument("--max-polls", type=int, default=None, help="stop after this many polls")
    p.add_argument("--quiet", action="store_true", help="print nothing (the decision log is still written)")
    p.add_argument("--run-spec-env", metavar="VAR", default=None,
                   help="(inside a submitted job) run the sweep spec carried by $VAR; other options go to jobs.sweep")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``audit watch`` / ``python -m jobs.watch``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no download bars in the decision log
    if "--run-spec-env" in argv:
        i = argv.index("--run-spec-env")
        if i + 1 >= len(argv):
            print("audit: error: --run-spec-env needs a variable name", file=sys.stderr)
            return 2
        return run_spec_from_env(argv[i + 1], argv[:i] + argv[i + 2:])
    a = build_parser().parse_args(argv)
    if not a.spec:
        print("audit: error: a watch spec is required", file=sys.stderr)
        return 2
    try:
        if a.max_polls is not None:
            schema.integer(a.max_polls, "--max-polls", 1)
        spec = load_watch_spec(a.spec, output_dir=a.output_dir, tracking_uri=a.tracking_uri, address=a.address,
                               interval=a.interval)
        ensure_output_dir(spec.output_dir, f"{spec.source}: output_dir")  # the decision log goes there, dry run too
    except AuditError as e:
        print(f"audit: error: {one_line(e)}", file=sys.stderr)
        return 2
    stop = threading.Event()
    watcher = Watcher(spec, dry_run=a.dry_run, out=None if a.quiet else sys.stdout, sleep=stop.wait)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    return watcher.run(once=a.once, max_polls=a.max_polls, stop=stop)


__all__ = ["main", "build_parser", "run_spec_from_env"]
