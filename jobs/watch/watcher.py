"""The watcher: one poll resolves every entry, decides from the tracking store and the Ray jobs,
and submits; :meth:`Watcher.run` repeats polls."""

from __future__ import annotations

import copy
import dataclasses
import datetime as _dt
import os
import random
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Mapping, TextIO

from filelock import FileLock, Timeout

from audit.errors import AuditError
from audit.outputs import write_text_atomic
from jobs.lease import BUSY_EXIT_CODE
from jobs.tracker import driver_alive, tracking_client
from jobs.uris import redact_uri, store_identity
from jobs.watch.backoff import SourceUnavailable, retry
from jobs.watch.decisions import Decision, DecisionLog, PollReport, worst
from jobs.watch.index import REGRESSION_TAG, STUCK_EXIT_CODE, AuditIndex, SweepRecord
from jobs.watch.regression import check_revision, notify, payload, record, write_report
from jobs.watch.sources import HubSource, LocalSource, Source
from jobs.watch.spec import SPEC_ENV, WatchEntry, WatchSpec
from jobs.watch.submit import ACTIVE_STATES, AlreadySubmitted, JobState, RaySubmitter, SubmitError, Submitter, job_state
from jobs.watch.sweeps import GeneratedSweep, Release, generate_sweep, safe_name, submission_id


class Watcher:
    """Polls the entries of a watch spec and submits one sweep per new revision.

    submitter: a :class:`~jobs.watch.submit.RaySubmitter` (default, at ``spec.ray.address``) or
               any object with its ``submit``/``status`` methods (and, optionally, ``state`` for
               exit statuses and ``active`` for ``ray.max_jobs``).
    sources:   ``{"hub": ..., "local": ...}`` replacements (default :class:`HubSource`,
               :class:`LocalSource`).
    sleep:     the wait between retries (tests pass a recorder).
    dry_run:   decide and write the specs, submit nothing.
    out:       where decision lines are printed (``None``: nowhere).
    """

    def __init__(self, spec: WatchSpec, *, submitter: Submitter | None = None,
                 sources: Mapping[str, Source] | None = None, sleep: Callable[[float], None] = time.sleep,
                 dry_run: bool = False, out: TextIO | None = sys.stdout):
        self.spec = spec
        self.submitter = submitter if submitter is not None else RaySubmitter(spec.ray.address)
        srcs = dict(sources or {})
        srcs.setdefault("hub", HubSource(spec.hub_endpoint, timeout=spec.hub_timeout))
        srcs.setdefault("local", LocalSource())
        self.sources = srcs
        self.sleep = sleep
        self.dry_run = dry_run
        self.out = out
        self.rng = random.Random(spec.backoff.seed)
        self.out_dir = spec.output_dir.resolve()
        self.log_path = self.out_dir / "decisions.jsonl"
        self.log = DecisionLog(self.log_path, spec.name, out)
        self._report: PollReport | None = None
        self._active: int | None = None  # this watch's pending/running jobs, counted once per poll

    # ------------------------------------------------------------------ logging
    def _record(self, d: Decision) -> Decision:
        assert self._report is not None
        self._report.decisions.append(d)
        return self.log.record(d, self._report.poll)

    def _retrying(self, fn: Callable[[], Any], entry: WatchEntry, repo: str | None = None) -> Any:
        def on_retry(k: int, delay: float, e: BaseException) -> None:
            self._record(Decision("retry", f"{e} (retry {k} of {self.spec.backoff.retries} in {delay:.2f} s)",
                                  entry.describe(), repo=repo, delay=round(delay, 3)))

        return retry(fn, backoff=self.spec.backoff, rng=self.rng, sleep=self.sleep, on_retry=on_retry)

    # ------------------------------------------------------------------ one poll
    def poll(self) -> PollReport:
        """Resolve every entry, decide, submit; never raises for a source or submission failure
        (those are ``error`` decisions)."""
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
        self._report = report = PollReport(poll=f"{stamp}-{os.getpid()}-{uuid.uuid4().hex[:6]}")
        self._active = None
        try:
            index = retry(lambda: AuditIndex.load(self.spec.resolved_tracking_uri, self.spec.resolved_experiment),
                          backoff=self.spec.backoff, rng=self.rng, sleep=self.sleep,
                          on_retry=lambda k, d, e: self._record(Decision(
                              "retry", f"{e} (retry {k} of {self.spec.backoff.retries} in {d:.2f} s)", "tracking",
                              delay=round(d, 3))))
        except SourceUnavailable as e:
            self._record(Decision("error", f"cannot read what was audited: {e}; nothing submitted", "tracking"))
            return report
        for entry in self.spec.entries:
            self._poll_entry(entry, index)
        self.log.say(f"{report.summary()}; log {self.log_path}")
        return report

    def _poll_entry(self, entry: WatchEntry, index: AuditIndex) -> None:
        source = self.sources["local" if entry.kind == "local" else "hub"]
        try:
            repos = self._retrying(lambda: source.repos(entry), entry)
        except (SourceUnavailable, AuditError) as e:
            self._record(Decision("error", f"{e}", entry.describe()))
            return
        if not repos:
            self._record(Decision("skipped", "no repository matches", entry.describe()))
        for repo in repos:
            try:
                releases = self._retrying(lambda r=repo: source.releases(r, entry), entry, repo)
            except (SourceUnavailable, AuditError) as e:
                self._record(Decision("error", f"{e}", entry.describe(), repo=repo))
                continue
            for path, age in getattr(source, "unsettled", []) or []:
                self._record(Decision("skipped", f"{path} changed {age:.0f} s ago (settle: {entry.settle:.0f} s); "
                                      "next poll", entry.describe(), repo=repo))
            for rel in releases:
                self._decide(entry, rel, index)

    def _decide(self, entry: WatchEntry, rel: Release, index: AuditIndex) -> None:
        known = index.finished_revisions(rel.ref)
        self._record(Decision("found", f"revision{' (' + rel.when + ')' if rel.when else ''}; "
                              f"{len(known)} revision(s) of {rel.ref} with finished runs in the store",
                              entry.describe(), repo=rel.repo, revision=rel.revision, when=rel.when))
        try:
            gen = generate_sweep(self.spec, entry, rel)
        except AuditError as e:
            d = self._record(Decision("error", f"invalid generated sweep: {e}", entry.describe(), repo=rel.repo,
                                      revision=rel.revision))
            self._alert(f"invalid-{rel.source}-{rel.repo}-{rel.revision}", "audit_not_submitted", d)
            return
        spec_path = self._write_spec(gen)
        base = dict(entry=entry.describe(), repo=rel.repo, revision=rel.revision, sweep=gen.name, spec_path=str(spec_path))
        rec = index.sweeps.get(gen.name)
        first = 1
        if rec is not None:
            if rec.status == "FINISHED":
                self._record(Decision("skipped", f"already audited: sweep run {rec.run_id} finished", **base))
                if self.spec.regression is not None and rec.regression is None and not self.dry_run:
                    self._check_regression(rec, index, base)
                return
            jobs = self._jobs(rel, gen)
            if rec.status in ("RUNNING", "SCHEDULED"):
                stale = self._stale(rec, jobs)
                if not stale:
                    if rec.stuck:
                        self._record(Decision("stuck", f"{rec.stuck_reason or 'its tasks wait for resources'} "
                                              f"(sweep run {rec.run_id}; the sweep ends with exit status "
                                              f"{STUCK_EXIT_CODE})", **base))
                        return
                    self._record(Decision("skipped", f"in progress: sweep run {rec.run_id} is running", **base))
                    return
                rec = dataclasses.replace(rec, status=f"RUNNING-but-{stale}")
            stuck = self._stuck_reason(rec, jobs)
            if stuck:
                self._record(Decision("stuck", stuck, **base))
            failed = f"{rec.tasks_failed} failed task(s)" if rec.tasks_failed is not None else "interrupted"
            last = f"{rec.status}, stuck" if stuck else rec.status
            if rec.invocations >= self.spec.max_attempts:
                self._failed(f"{gen.name}-gave-up", "audit_gave_up",
                             f"gave up: the sweep ran {rec.invocations} time(s), last {last} ({failed}); max_attempts "
                             f"is {self.spec.max_attempts}; `audit run {spec_path}` re-runs the failed tasks by hand",
                             base, every_poll=True)
                return
            self._failed(f"{gen.name}-run-{rec.invocations}", "audit_failed",
                         f"sweep run {rec.run_id} ended {last} ({failed}) after {rec.invocations} of "
                         f"{self.spec.max_attempts} attempt(s); submitting it again", base)
            first = rec.invocations + 1
            why = f"re-run after a {'stuck' if stuck else rec.status} sweep ({failed})"
        else:
            why = "new revision" if not known.get(rel.revision) else \
                f"revision has {known[rel.revision]} finished run(s) under other specs; this audit is new"
        self._submit(entry, rel, gen, first, why, base)

    # ------------------------------------------------------------------ failed audits
    def _alert_marker(self, key: str) -> Path:
        return self.out_dir / "alerts" / safe_name(key, 200)

    def _alert(self, key: str, event: str, d: Decision) -> bool:
        """Announce ``d`` through the watch's notification (:attr:`WatchSpec.alerts`) once per
        ``key``: the first watcher to create ``<output_dir>/alerts/<key>`` (``O_EXCL``, so racing
        watchers announce once) runs it; a notification that fails is an ``error`` decision and
        its marker is removed, so the next poll tries again. Returns whether this call was the
        first for ``key`` (nothing is written in a dry run)."""
        if self.dry_run:
            return False
        marker = self._alert_marker(key)
        marker.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(d.line() + "\n")
        n = self.spec.alerts
        if n is None:
            return True
        body = {"event": event, "watch": self.spec.name, "action": d.action, "reason": d.reason, "entry": d.entry,
                "repo": d.repo, "revision": d.revision, "sweep": d.sweep, "submission_id": d.submission_id,
                "attempt": d.attempt, "spec_path": d.spec_path,
                "tracking_uri": redact_uri(self.spec.resolved_tracking_uri),
                "experiment": self.spec.resolved_experiment}
        done, failed = notify(n, body)
        if done:
            self.log.say(f"notified ({event}): {'; '.join(done)}")
        if failed:
            marker.unlink(missing_ok=True)
        keep = {k: v for k, v in dataclasses.asdict(d).items() if k in ("entry", "repo", "revision", "sweep",
                                                                        "submission_id", "attempt", "spec_path")}
        for f in failed:
            self._record(Decision("error", f, **keep))
        return True

    def _failed(self, key: str, event: str, reason: str, base: dict[str, Any], *, every_poll: bool = False,
                **kw: Any) -> None:
        """A ``failed`` decision (exit status 1) and its notification: once per ``key`` (a failed
        attempt that is submitted again), or on every poll with the notification once
        (``every_poll``: an audit given up stays failed until someone re-runs it)."""
        d = Decision("failed", reason, **base, **kw)
        if self.dry_run:
            self._record(d)
            return
        marker = self._alert_marker(key)
        if marker.exists() and not every_poll:
            return
        self._record(d)
        self._alert(key, event, d)

    # ------------------------------------------------------------------ regression detection
    def _check_regression(self, rec: SweepRecord, index: AuditIndex, base: dict[str, Any]) -> None:
        """Compare a finished audit with its baseline(s) once (:mod:`jobs.watch.regression`):
        tags and report on its parent run, a ``regression``/``compared`` decision, the
        notification. Racing watchers of one output directory take turns (a file lock) and the
        second sees the first one's tag."""
        lock = FileLock(str(self.out_dir / "regression.lock"), timeout=600)
        try:
            with lock:
                client = tracking_client(self.spec.resolved_tracking_uri)
                if client.get_run(rec.run_id).data.tags.get(REGRESSION_TAG):
                    return  # another watcher checked it meanwhile
                check = check_revision(self.spec, index, rec, client)
                if check is None:
                    return  # an earlier revision's audit still runs: its result may be the baseline
                write_report(self.spec, check, self.out_dir / "regressions" / rec.name)
                record(client, self.spec, check)
        except Timeout:
            self._record(Decision("error", f"regression check waits for {lock.lock_file} (another watcher)", **base))
            return
        except AuditError as e:
            self._record(Decision("error", f"regression check: {e}", **base))
            return
        except Exception as e:  # noqa: BLE001 - the store went away: no tag, the next poll tries again
            self._record(Decision("error", f"regression check: tracking store "
                                  f"{redact_uri(self.spec.resolved_tracking_uri)}: {type(e).__name__}: "
                                  f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}", **base))
            return
        if check.error:
            self._record(Decision("error", check.reason(), **base))
            return
        if not check.regression:
            self._record(Decision("compared", check.reason(), **base))
            return
        done, failed = ([], [])
        if self.spec.regression.notify is not None:
            done, failed = notify(self.spec.regression.notify, payload(self.spec, check))
        note = f" (notified: {'; '.join(done)})" if done else ""
        self._record(Decision("regression", check.reason() + note, **base))
        for f in failed:
            self._record(Decision("error", f, **base))

    # ------------------------------------------------------------------ Ray jobs of an audit
    def _sid(self, rel: Release, gen: GeneratedSweep, attempt: int) -> str:
        return submission_id(rel.source, rel.repo, rel.revision, gen.digest, attempt, scope=self.spec.scope)

    def _jobs(self, rel: Release, gen: GeneratedSweep) -> list[tuple[str, JobState]] | None:
        """The Ray jobs of this audit's attempts that exist, oldest attempt first; ``None`` when
        the job API cannot tell (unreachable) or in a dry run (which asks the cluster nothing)."""
        if self.dry_run:
            return None
        out = []
        for attempt in range(1, self.spec.max_attempts + 1):
            sid = self._sid(rel, gen, attempt)
            try:
                sid, st = self._latest(sid)
            except SubmitError:
                return None
            if st is not None:
                out.append((sid, st))
        return out

    def _latest(self, sid: str) -> tuple[str, JobState | None]:
        """The job of one attempt: ``sid``, or its newest busy retry (:func:`busy_retry_id`) when
        ``sid`` exited busy, with its state (``None``: not submitted)."""
        st = job_state(self.submitter, sid)
        k, cur = 0, sid
        while _busy(st):
            k += 1
            nxt = job_state(self.submitter, busy_retry_id(sid, k))
            if nxt is None:
                break
            cur, st = busy_retry_id(sid, k), nxt
        return cur, st

    def _stale(self, rec: SweepRecord, jobs: list[tuple[str, JobState]] | None) -> str | None:
        """Why a RUNNING parent run is not really running (its driver process is gone on this
        host, or none of the audit's Ray jobs is active any more), or ``None``."""
        if rec.driver and driver_alive(rec.driver) is False:
            return "driver-gone"
        jobs = [(sid, st) for sid, st in jobs or () if not _busy(st)]  # a busy job never ran the sweep
        if not jobs:
            return None  # no job known (or cannot tell), or only busy ones: trust the store
        if not any(st.status in ACTIVE_STATES for _, st in jobs):
            return "job-" + jobs[-1][1].status.lower()
        return None

    @staticmethod
    def _stuck_reason(rec: SweepRecord, jobs: list[tuple[str, JobState]] | None) -> str | None:
        """Why an ended sweep counts as stuck (its tag, or its last job's exit status 4), or ``None``."""
        if rec.stuck:
            return f"{rec.stuck_reason or 'its tasks waited too long for resources'} (sweep run {rec.run_id})"
        jobs = [(sid, st) for sid, st in jobs or () if not _busy(st)]
        if jobs:
            sid, st = jobs[-1]
            if st.status == "FAILED" and st.exit_code == STUCK_EXIT_CODE:
                return _stuck_job_reason(sid)
        return None

    def _active_jobs(self) -> int:
        """This watch's pending or running Ray jobs (on its store), counted once per poll."""
        if self._active is None:
            active = getattr(self.submitter, "active", None)
            self._active = 0 if self.dry_run or active is None else active(self._metadata_scope())
        return self._active

    def _exists(self, sid: str) -> bool:
        """Whether a job with this id exists (then submitting it again is answered "already
        submitted", which needs no room on the cluster)."""
        if self.dry_run:
            return False
        try:
            return job_state(self.submitter, sid) is not None
        except SubmitError:
            return False

    def _metadata_scope(self) -> dict[str, str]:
        return {"biasaudit.watch": self.spec.name, "biasaudit.store": store_identity(self.spec.resolved_tracking_uri)}

    def _write_spec(self, gen: GeneratedSweep) -> Path:
        # atomic: a racing watcher writes the same bytes
        return write_text_atomic(self.out_dir / "specs" / f"{gen.name}.yaml", gen.text)

    def _submit(self, entry: WatchEntry, rel: Release, gen: GeneratedSweep, first: int, why: str,
                base: dict[str, Any]) -> None:
        ray = self.spec.ray
        env = copy.deepcopy(dict(ray.runtime_env))
        env_vars = dict(env.get("env_vars") or {})
        env_vars[SPEC_ENV] = gen.text
        env["env_vars"] = {k: str(v) for k, v in env_vars.items()}
        resources = {"num_cpus": ray.entrypoint_num_cpus, "num_gpus": ray.entrypoint_num_gpus}
        busy_k = 0
        attempt = first
        while attempt <= self.spec.max_attempts:
            sid = self._sid(rel, gen, attempt)
            if busy_k:
                sid = busy_retry_id(sid, busy_k)
            meta = {**self._metadata_scope(), "biasaudit.repo": rel.repo, "biasaudit.revision": rel.revision,
                    "biasaudit.sweep": gen.name, "biasaudit.attempt": str(attempt)}
            if ray.max_jobs is not None:
                try:
                    active = self._active_jobs()
                except SubmitError as e:
                    self._record(Decision("error", f"cannot count this watch's running jobs (ray.max_jobs): {e}",
                                          submission_id=sid, attempt=attempt, **base))
                    return
                if active >= ray.max_jobs and not self._exists(sid):
                    self._record(Decision("deferred", f"{why}; waits for a later poll: {active} of this watch's "
                                          f"sweeps pending or running, ray.max_jobs is {ray.max_jobs}",
                                          submission_id=sid, attempt=attempt, **base))
                    return
            if self.dry_run:
                self._record(Decision("dry_run", f"{why}; would submit (attempt {attempt})", submission_id=sid,
                                      attempt=attempt, **base))
                self._active = (self._active or 0) + 1
                return
            try:
                self.submitter.submit(sid, ray.entrypoint, env, meta, resources)
            except AlreadySubmitted:
                try:
                    js = job_state(self.submitter, sid)
                except SubmitError as e:
                    self._record(Decision("error", f"submitted before, status unknown: {e}", submission_id=sid,
                                          attempt=attempt, **base))
                    return
                st = js.status if js is not None else None
                if _busy(js):  # another driver held the sweep: this job ran nothing; not an attempt
                    busy_k += 1
                    nxt = busy_retry_id(self._sid(rel, gen, attempt), busy_k)
                    if not self._exists(nxt):
                        self._record(Decision("busy", f"job {sid} exited with status {BUSY_EXIT_CODE}: another "
                                              f"driver holds this sweep (it ran nothing); submitting it again as "
                                              f"{nxt}, not counted towards max_attempts ({attempt} of "
                                              f"{self.spec.max_attempts})", submission_id=sid, attempt=attempt,
                                              **base))
                    why = f"re-submitted after busy job {sid}"
                    continue
                if st == "FAILED" and js.exit_code == STUCK_EXIT_CODE:
                    self._record(Decision("stuck", _stuck_job_reason(sid), submission_id=sid, attempt=attempt, **base))
                if st in ("FAILED", "STOPPED") and attempt < self.spec.max_attempts:
                    self._failed(sid, "audit_failed", f"job {sid} {st}{_exit(js)}; submitting attempt {attempt + 1} "
                                 f"of {self.spec.max_attempts} (`ray job logs {sid}`)", base, submission_id=sid,
                                 attempt=attempt)
                    attempt, busy_k = attempt + 1, 0
                    continue
                if st in ("FAILED", "STOPPED"):
                    self._failed(f"{sid}-gave-up", "audit_gave_up", f"gave up: job {sid} {st}{_exit(js)} and "
                                 f"max_attempts is {self.spec.max_attempts} (`ray job logs {sid}`)", base,
                                 every_poll=True, submission_id=sid, attempt=attempt)
                    return
                note = "" if st in ACTIVE_STATES or st is None else \
                    f"; no sweep run in {redact_uri(self.spec.resolved_tracking_uri)} yet: check the job's tracking URI"
                self._record(Decision("skipped", f"already submitted as {sid} (Ray job status {st or 'unknown'}){note}",
                                      submission_id=sid, attempt=attempt, **base))
                return
            except SubmitError as e:
                d = self._record(Decision("error", str(e), submission_id=sid, attempt=attempt, **base))
                self._alert(f"{sid}-not-submitted", "audit_not_submitted", d)
                return
            self._alert_marker(f"{sid}-not-submitted").unlink(missing_ok=True)  # a later refusal is news again
            self._record(Decision("submitted", why, submission_id=sid, attempt=attempt, **base))
            if self._active is not None:
                self._active += 1
            return

    # ------------------------------------------------------------------ the loop
    def run(self, *, once: bool = False, max_polls: int | None = None,
            stop: threading.Event | None = None) -> int:
        """Poll once (``once``) or every ``interval`` seconds (longer after failed polls, see
        :meth:`~jobs.watch.backoff.Backoff.poll_delay`) until ``stop`` is set or ``max_polls``
        polls ran. Returns the worst exit status of its polls (:func:`~jobs.watch.decisions.worst`): a
        failure seen in any poll is not hidden by a quiet poll after it."""
        stop = stop or threading.Event()
        failed_in_a_row = 0
        n = 0
        codes: list[int] = []
        while True:
            report = self.poll()
            codes.append(report.exit_code)
            n += 1
            if once or (max_polls is not None and n >= max_polls) or stop.is_set():
                return worst(codes)
            failed_in_a_row = failed_in_a_row + 1 if report.errors else 0
            delay = self.spec.backoff.poll_delay(self.spec.interval, failed_in_a_row)
            self.log.say(f"next poll in {delay:.0f} s")
            if stop.wait(delay):
                return worst(codes)


def _exit(js: JobState | None) -> str:
    if js is None:
        return ""
    bits = [f"exit status {js.exit_code}"] if js.exit_code is not None else []
    bits += [js.message[:200]] if js.message else []
    return f" ({'; '.join(bits)})" if bits else ""


def busy_retry_id(sid: str, k: int) -> str:
    """The submission id of the ``k``-th re-submission of job ``sid`` after it exited busy
    (:data:`jobs.lease.BUSY_EXIT_CODE`): ``<sid>-busy<k>``. Ray refuses a repeated id, and a busy
    job ran nothing, so its retry keeps the attempt number."""
    return f"{sid}-busy{k}"


def _busy(js: JobState | None) -> bool:
    """Whether a job ended with the busy status (another driver held the sweep's lease)."""
    return js is not None and js.status == "FAILED" and js.exit_code == BUSY_EXIT_CODE


def _stuck_job_reason(sid: str) -> str:
    return (f"job {sid} exited with status {STUCK_EXIT_CODE}: its tasks waited too long for resources "
            f"(the pending demand is in `ray job logs {sid}`)")


__all__ = ["Watcher", "busy_retry_id"]
