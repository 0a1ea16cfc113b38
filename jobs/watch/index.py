"""What the tracking store already holds: the watch's sweeps (parent runs) and the revisions
with finished runs, read once per poll from MLflow (as written by :mod:`jobs.tracker`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from audit.errors import AuditError
from audit.retry import first_line
from jobs.tracker import STATE_TAG, STUCK, STUCK_EXIT_CODE, STUCK_REASON_TAG, search_all, tracking_client
from jobs.uris import redact_uri
from jobs.watch.backoff import SourceUnavailable
from jobs.watch.sweeps import REPO_TAG, REVISION_TAG, SOURCE_TAG, WHEN_TAG

#: Parent-run tags of the regression check (:mod:`jobs.watch.regression`, their writer):
#: ``audit.regression`` is ``true`` or ``false`` once a revision was checked, with the tests
#: that regressed and the baseline revision(s) it was compared with.
REGRESSION_TAG, REGRESSION_TESTS_TAG, REGRESSION_BASELINE_TAG = (
    "audit.regression", "audit.regression_tests", "audit.regression_baseline")

# The contract with the sweep (its parent-run tags and exit status) is defined by the tracker,
# the writer of those tags: jobs.tracker.STATE_TAG, STUCK_REASON_TAG, STUCK, STUCK_EXIT_CODE.


@dataclasses.dataclass(frozen=True)
class SweepRecord:
    """A generated sweep's parent run: status, how often it ran, how many tasks failed, and the
    state the sweep declared (``state``: the ``audit.state`` tag, e.g. ``stuck``, with
    ``stuck_reason``)."""

    run_id: str
    status: str
    invocations: int
    tasks_failed: int | None = None
    driver: str | None = None
    state: str | None = None
    stuck_reason: str | None = None
    name: str = ""
    source: str | None = None
    repo: str | None = None
    revision: str | None = None
    when: str = ""
    start_time: int = 0
    regression: str | None = None

    @property
    def stuck(self) -> bool:
        return self.state == STUCK

    @property
    def order(self) -> tuple[str, int]:
        """When the revision was made (commit date, folder time), then when it was audited."""
        return (self.when or "", self.start_time)


@dataclasses.dataclass
class AuditIndex:
    """The parent runs of the watch's experiment by sweep name, and the finished/failed child
    runs per (``model`` param, ``revision`` param), as written by :mod:`jobs.tracker`."""

    sweeps: dict[str, SweepRecord] = dataclasses.field(default_factory=dict)
    revisions: dict[tuple[str, str], dict[str, int]] = dataclasses.field(default_factory=dict)

    def audits_of(self, source: str | None, repo: str | None) -> list[SweepRecord]:
        """The sweeps of one watched repository (by their ``audit.watch.*`` tags), oldest
        revision first (:attr:`SweepRecord.order`)."""
        return sorted((r for r in self.sweeps.values() if r.repo is not None and r.repo == repo and r.source == source),
                      key=lambda r: r.order)

    def previous(self, rec: SweepRecord) -> SweepRecord | None:
        """The latest FINISHED audit of another revision of ``rec``'s repository made before it."""
        older = [r for r in self.audits_of(rec.source, rec.repo)
                 if r.status == "FINISHED" and r.revision != rec.revision and r.order < rec.order]
        return older[-1] if older else None

    def pending_before(self, rec: SweepRecord) -> list[SweepRecord]:
        """Audits of earlier revisions of ``rec``'s repository still running (the previous
        revision may not be known yet)."""
        return [r for r in self.audits_of(rec.source, rec.repo)
                if r.status in ("RUNNING", "SCHEDULED") and r.revision != rec.revision and r.order < rec.order]

    def revision(self, rec: SweepRecord, revision: str) -> SweepRecord | None:
        """The latest FINISHED audit of ``revision`` of ``rec``'s repository."""
        found = [r for r in self.audits_of(rec.source, rec.repo) if r.status == "FINISHED" and r.revision == revision]
        return found[-1] if found else None

    def finished_revisions(self, ref: str) -> dict[str, int]:
        """revision -> count of FINISHED task runs of model ``ref`` ("which revisions of this
        model have finished runs")."""
        return {rev: c.get("FINISHED", 0) for (m, rev), c in self.revisions.items() if m == ref and c.get("FINISHED")}

    @classmethod
    def load(cls, uri: str, experiment: str) -> AuditIndex:
        """Read the store; a missing SQLite file or experiment is an empty index (nothing is
        created). A locked or unreachable store raises :class:`SourceUnavailable`."""
        if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
            return cls()
        try:
            client = tracking_client(uri)
            exp = client.get_experiment_by_name(experiment)
            if exp is None:
                return cls()
            idx = cls()
            started: dict[str, int] = {}
            for r in search_all(client, [exp.experiment_id], "tags.`audit.role` = 'sweep'"):
                name = r.data.tags.get("audit.sweep")
                if not name:
                    continue
                start = r.info.start_time or 0
                if name in started and started[name] <= start:
                    continue  # the tracker resumes the earliest parent of a sweep
                started[name] = start
                failed = r.data.metrics.get("tasks_failed")
                tags = r.data.tags
                idx.sweeps[name] = SweepRecord(r.info.run_id, r.info.status, int(tags.get("audit.invocations") or 1),
                                               int(failed) if failed is not None else None, tags.get("audit.driver"),
                                               tags.get(STATE_TAG) or None, tags.get(STUCK_REASON_TAG) or None,
                                               name=name, source=tags.get(SOURCE_TAG), repo=tags.get(REPO_TAG),
                                               revision=tags.get(REVISION_TAG), when=tags.get(WHEN_TAG) or "",
                                               start_time=int(start), regression=tags.get(REGRESSION_TAG))
            for r in search_all(client, [exp.experiment_id], "tags.`audit.role` = 'task'"):
                key = (r.data.params.get("model", ""), r.data.params.get("revision", ""))
                c = idx.revisions.setdefault(key, {})
                c[r.info.status] = c.get(r.info.status, 0) + 1
            return idx
        except AuditError:
            raise
        except Exception as e:  # noqa: BLE001 - connection refused, database locked, HTTP 5xx
            raise SourceUnavailable(f"tracking store {redact_uri(uri)} (experiment {experiment}): "
                                    f"{type(e).__name__}: {first_line(e)}") from None


__all__ = ["SweepRecord", "AuditIndex", "STATE_TAG", "STUCK_REASON_TAG", "STUCK", "STUCK_EXIT_CODE", "REGRESSION_TAG",
           "REGRESSION_TESTS_TAG", "REGRESSION_BASELINE_TAG"]
