"""The decision log: what the watcher decided, printed and appended as JSON lines to
``<output_dir>/decisions.jsonl``."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
from pathlib import Path
from typing import TextIO

#: Every action a decision can have.
ACTIONS = ("found", "submitted", "skipped", "deferred", "stuck", "dry_run", "retry", "error", "failed", "regression",
           "compared", "busy")

#: ``audit watch --once`` exit status when a poll found a regression (and recorded no error).
REGRESSION_EXIT_CODE = 3


@dataclasses.dataclass
class Decision:
    """One thing the watcher decided.

    action: ``submitted``, ``skipped``, ``dry_run`` (would submit), ``deferred`` (a new audit
            waits for a later poll: ``ray.max_jobs`` of this watch's sweeps are pending or
            running), ``stuck`` (a sweep whose tasks wait too long for resources, with the
            pending demand), ``error``, ``retry`` (a transient failure about to be retried),
            ``found`` (a revision seen), ``failed`` (an audit's Ray job or sweep failed, told once
            per attempt, or the audit was given up after ``max_attempts``, told on every poll),
            ``regression`` (an audited revision is more biased
            than the one it was compared with: :mod:`jobs.watch.regression`), ``compared`` (an
            audited revision was compared and did not regress, or had nothing to compare with),
            ``busy`` (an audit's Ray job exited 5, :data:`jobs.lease.BUSY_EXIT_CODE`: another
            driver held the sweep, so the job ran nothing; it is submitted again at the poll that
            sees it, not counted towards ``max_attempts``, not a failure, no notification).
    """

    action: str
    reason: str
    entry: str
    repo: str | None = None
    revision: str | None = None
    sweep: str | None = None
    submission_id: str | None = None
    attempt: int | None = None
    spec_path: str | None = None
    when: str | None = None
    delay: float | None = None

    def line(self) -> str:
        what = self.repo or self.entry
        if self.revision:
            what += f"@{self.revision[:19]}"
        sid = f" [{self.submission_id}]" if self.submission_id else ""
        return f"{self.action:9s} {what}{sid}: {self.reason}"


@dataclasses.dataclass
class PollReport:
    """The decisions of one poll."""

    poll: str
    decisions: list[Decision] = dataclasses.field(default_factory=list)

    def count(self, action: str) -> int:
        return sum(d.action == action for d in self.decisions)

    @property
    def submitted(self) -> list[Decision]:
        return [d for d in self.decisions if d.action == "submitted"]

    @property
    def errors(self) -> list[Decision]:
        return [d for d in self.decisions if d.action == "error"]

    @property
    def failed(self) -> list[Decision]:
        return [d for d in self.decisions if d.action == "failed"]

    @property
    def stuck(self) -> list[Decision]:
        return [d for d in self.decisions if d.action == "stuck"]

    @property
    def regressions(self) -> list[Decision]:
        return [d for d in self.decisions if d.action == "regression"]

    @property
    def exit_code(self) -> int:
        """1 when an error was recorded, an audit failed or was given up, or a sweep is stuck
        (someone should look), else :data:`REGRESSION_EXIT_CODE` (3) when a revision regressed,
        else 0."""
        if self.errors or self.stuck or self.failed:
            return 1
        return REGRESSION_EXIT_CODE if self.regressions else 0

    def summary(self) -> str:
        return (f"{self.count('found')} revision(s) seen: {self.count('submitted')} submitted, "
                f"{self.count('skipped')} skipped, {self.count('dry_run')} to submit (dry run), "
                f"{self.count('error')} error(s), {self.count('failed')} failed, {self.count('stuck')} stuck, "
                f"{self.count('deferred')} deferred, {self.count('busy')} busy, "
                f"{self.count('retry')} retried failure(s), {self.count('regression')} regression(s)")


class DecisionLog:
    """Appends each decision of a watch as one JSON line to ``path`` (one ``write`` per line on
    a file opened with ``O_APPEND``, so lines of racing watchers stay whole) and prints it as
    ``watch <name>: <action> <repo>@<revision> [<submission id>]: <reason>`` to ``out``."""

    def __init__(self, path: Path, watch: str, out: TextIO | None = None):
        self.path = Path(path)
        self.watch = watch
        self.out = out

    def record(self, d: Decision, poll: str) -> Decision:
        rec = {"time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds"), "watch": self.watch,
               "poll": poll, "pid": os.getpid()}
        rec.update({k: v for k, v in dataclasses.asdict(d).items() if v is not None})
        line = json.dumps(rec, ensure_ascii=False) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line)
        self.say(d.line())
        return d

    def say(self, text: str) -> None:
        if self.out is not None:
            print(f"watch {self.watch}: {text}", file=self.out, flush=True)


def worst(codes: list[int]) -> int:
    """The exit status of several polls: 1 if any poll had an error, a failed audit or a stuck
    sweep, else 3 if any found a regression, else 0."""
    return 1 if 1 in codes else (REGRESSION_EXIT_CODE if REGRESSION_EXIT_CODE in codes else 0)


__all__ = ["ACTIONS", "REGRESSION_EXIT_CODE", "Decision", "PollReport", "DecisionLog", "worst"]
