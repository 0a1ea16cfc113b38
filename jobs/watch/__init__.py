"""Scheduled audits of new model releases: watch model repositories, submit a sweep per new revision.

    audit watch SPEC [--once] [--dry-run] [--address ADDR] [--tracking-uri URI] [--output-dir DIR]
    python -m jobs.watch SPEC [...]                        (the same)
    python -m jobs.watch --run-spec-env VAR [sweep options] (inside a Ray job: run the sweep whose
                                                            YAML the watcher put in $VAR)

A *watch spec* (YAML, see ``docs/scheduling.md`` and ``jobs/specs/watch-example.yaml``) lists
what to watch and which audit to run on it::

    name: hub-releases               # required; letters, digits, '-', '_', '.'
    output_dir: out/watch/hub-releases   # decisions.jsonl, generated specs (default out/watch/<name>)
    interval: 3600                   # seconds between polls without --once
    max_attempts: 2                  # submissions of one audit whose earlier runs failed
    backoff: {initial: 2, factor: 2, max: 300, retries: 4, jitter: 0.1, seed: 0, max_interval: 21600}
    tracking: {uri: null, experiment: null}   # default $MLFLOW_TRACKING_URI, else sqlite:///<output_dir>/mlflow.db;
                                              # biasaudit-watch-<name>
    sweep_output_dir: null           # output_dir of the generated sweeps (default <output_dir>/sweeps)
    hub: {endpoint: null, branch: main, timeout: 15}   # endpoint default: $HF_ENDPOINT, else huggingface.co
    ray:
      address: null                  # job API, e.g. http://head:8265 (default: $RAY_ADDRESS)
      runtime_env: {working_dir: ., env_vars: {BIASAUDIT_DATA: /shared/data}}
      entrypoint: null               # default: python -m jobs.watch --run-spec-env BIASAUDIT_SWEEP_SPEC --no-progress
      entrypoint_num_cpus: null      # resources reserved for the sweep's driver (default none: keep it so)
      entrypoint_num_gpus: null
      max_jobs: null                 # at most this many of this watch's sweeps pending or running at once
    audit:                           # the audit of every watched model (each entry may override it)
      spec: jobs/specs/hub-example.yaml   # a sweep spec used as template (relative to the current directory)
      overrides: {tests: [weat1], metrics: [seat]}   # merged into the template (mappings recursively)
      model: {backend: hf-mlm, languages: [en]}      # fields of the model entry (ref/name/revision are set here)
    watch:
      - repo: google-bert/bert-base-uncased          # an exact hub id
      - author: FacebookAI                            # every repo of an author/organisation ...
        search: roberta                               # ... whose name contains this (hub search)
        limit: 20
        model: {backend: hf-mlm}                      # shorthand for audit.model of this entry
      - local: /srv/models                            # a directory of model folders
        layout: revisions                             # <model>/<revision>/ sub-folders, or `digest`
        revisions: 1                                  # how many newest revisions to audit
        settle: 60                                    # ignore folders modified in the last 60 s
    regression:                      # compare each audited revision with the previous one (optional)
      metrics: [weat]                # default: every metric of the audit with a paired comparison
      min_increase: 0.2              # |bias| (|effect size| for WEAT) must grow by at least this ...
      alpha: 0.05                    # ... with a Holm-adjusted p-value (adjust: holm | bh) at most this
      baseline: v1.0                 # also compare with this pinned revision (optional)
      notify: {command: "notify-team --channel bias", url: "http://hooks.example/bias", timeout: 10}
    notify: {command: "page-oncall", url: null}   # failed / given-up / unsubmittable audits (default regression.notify)

What happens in one poll (:meth:`Watcher.poll`):

1. Read the tracking store once: the parent runs of the watch's experiment (tag ``audit.sweep``,
   status, ``audit.invocations``, ``tasks_failed``) and the finished child runs per (``model``,
   ``revision``) param (:class:`AuditIndex`; written by :mod:`jobs.tracker`).
2. For each entry, list its repositories (the id itself; ``HfApi.list_models(author=, search=)``;
   the sub-folders of a local directory) and resolve each one's newest revision(s): the commit of
   the followed branch (``HfApi.model_info(repo, revision=branch).sha``, or the newest
   ``revisions`` commits of ``HfApi.list_repo_commits``); for a local model, the newest
   revision sub-folders (by modification time, then name) or the content digest of the folder
   (:func:`jobs.resolve.probe_revision`, the digest the backend reports after loading).
   Transient failures (connection errors, HTTP 429 and 5xx, a locked SQLite store) are retried
   with exponential back-off: attempt ``k`` (from 0) waits ``min(max, initial * factor**k)``
   seconds, multiplied by a uniform factor in ``[1 - jitter, 1 + jitter]`` drawn from
   ``random.Random(seed)`` and capped at ``max``; after ``retries`` retries the repository is
   reported as an error and the poll goes on with the next one. A missing repository, a gated
   one or a bad revision is not retried.
3. For each (repository, revision) write a concrete sweep spec: the template with the overrides,
   one model pinned at the revision (hub: ``ref: org/name``, ``revision: <commit>``; local: the
   revision folder), the watch's tracking store and experiment, and the name
   ``<watch>-<model>-<revision[:12]>-<digest[:8]>``; ``digest`` (:func:`spec_digest`) hashes what
   defines the sweep's tasks (every field but name, output_dir, tracking, ray and description),
   *before* environment variables are expanded, so it is the same on every machine.
4. Decide: a parent run of that sweep name that is FINISHED -> skipped ("already audited");
   RUNNING -> skipped ("in progress"), or *stuck* when the sweep tagged it ``audit.state=stuck``
   (its tasks waited too long for resources; ``audit.stuck_reason`` names the pending demand);
   FAILED/KILLED -> submitted again while its ``audit.invocations`` is below ``max_attempts``,
   else skipped ("gave up"), with a ``stuck`` decision first when the sweep was stuck (the tag,
   or its Ray job ended FAILED with exit status 4); no parent -> submitted ("new revision"),
   or deferred to a later poll while ``ray.max_jobs`` of this watch's sweeps are pending or
   running.
5. Submit through Ray's :class:`ray.job_submission.JobSubmissionClient` with the deterministic
   submission id :func:`submission_id`
   ``audit-<sha256(source, repo, revision, digest, scope)[:16]>`` (attempt ``n > 1``: ``-<n>``
   appended), where ``scope`` (:attr:`WatchSpec.scope`) is the watch's name, experiment and
   tracking store: two watchers of one watch on one store share ids, a watch on another store
   does not (and audits into its own store). Ray refuses a second job with the same id,
   atomically in its GCS, so two watchers racing (or a re-run before the sweep has started)
   submit the job once: the loser gets "already exists", asks the job's status and records
   "skipped" (a FAILED/STOPPED job there moves on to the next attempt id). The sweep travels in
   the job's ``runtime_env`` (env var ``BIASAUDIT_SWEEP_SPEC``), so the cluster needs no access
   to the watcher's disk.

6. Regression detection (with ``regression:``, :mod:`jobs.watch.regression`): a revision whose
   sweep is FINISHED and not yet checked is compared with the previous audited revision of its
   repository (and the pinned ``baseline``), task by task from the stored per-item tables, with
   the rule of :func:`audit.regression.flag_regressions`. Its parent run gets
   ``audit.regression=true|false``, ``audit.regression_tests``, ``audit.regression_baseline`` and
   the diff report under ``regression/`` (also in ``<output_dir>/regressions/<sweep>/``); a
   regression is a ``regression`` decision and runs the notification (a command with the JSON on
   stdin, an HTTP POST of the JSON); no regression is a ``compared`` decision.

Every decision (``found``, ``submitted``, ``skipped``, ``deferred``, ``stuck``, ``error``,
``retry``, ``dry_run``, ``regression``, ``compared``, with the reason, the repository, the
revision, the sweep name and the submission id) is printed and appended as a JSON line to
``<output_dir>/decisions.jsonl``; the generated specs are kept in ``<output_dir>/specs/``
(``audit run`` one of them to re-run or resume an audit by hand).

Exit status (``--once``): 0 when every repository was resolved and every decision made, 1 when any
error was recorded (hub unreachable after the retries, a submission refused, a notification that
failed), an audit failed (``failed``: its Ray job or sweep run failed and it is submitted again, or
it was given up after ``max_attempts``) or a sweep is stuck, 3 when a revision regressed (and
nothing else went wrong), 2 for an invalid watch spec or template (one line naming the file and
field). Without ``--once``: the worst status of all polls. A failed, given-up or unsubmittable
audit runs the notification (``notify:``, else ``regression.notify``) once (a marker in
``<output_dir>/alerts/``).

The package, one module per job: :mod:`~jobs.watch.spec` (the watch spec),
:mod:`~jobs.watch.regression` (regression detection between audited revisions),
:mod:`~jobs.watch.sweeps` (generated sweeps, digests, submission ids), :mod:`~jobs.watch.sources`
(hub and local sources), :mod:`~jobs.watch.index` (what the MLflow store holds),
:mod:`~jobs.watch.submit` (Ray jobs), :mod:`~jobs.watch.decisions` (the decision log),
:mod:`~jobs.watch.backoff` (retries), :mod:`~jobs.watch.watcher` (the poll and the loop),
:mod:`~jobs.watch.cli` (the command line). Their public names are re-exported here.
"""

from __future__ import annotations

from jobs.watch.backoff import Backoff, SourceUnavailable, retry
from jobs.watch.cli import build_parser, main, run_spec_from_env
from jobs.watch.decisions import ACTIONS, REGRESSION_EXIT_CODE, Decision, DecisionLog, PollReport
from jobs.watch.index import (
                             REGRESSION_BASELINE_TAG,
                             REGRESSION_TAG,
                             REGRESSION_TESTS_TAG,
                             STATE_TAG,
                             STUCK,
                             STUCK_EXIT_CODE,
                             STUCK_REASON_TAG,
                             AuditIndex,
                             SweepRecord,
)
from jobs.watch.regression import RegressionCheck, check_revision
from jobs.watch.sources import HubSource, LocalSource, Source, backend_hint, iso_time, local_revision
from jobs.watch.spec import (
                             DEFAULT_ENTRYPOINT,
                             SPEC_ENV,
                             AuditTemplate,
                             Notify,
                             RaySubmit,
                             RegressionSpec,
                             WatchEntry,
                             WatchSpec,
                             deep_merge,
                             load_watch_spec,
                             parse_watch_spec,
)
from jobs.watch.submit import ACTIVE_STATES, AlreadySubmitted, JobState, RaySubmitter, SubmitError, Submitter, job_state
from jobs.watch.sweeps import (
                             GeneratedSweep,
                             Release,
                             generate_sweep,
                             safe_name,
                             short_revision,
                             spec_digest,
                             submission_id,
)
from jobs.watch.watcher import Watcher

__all__ = [
    "ACTIONS", "ACTIVE_STATES", "AlreadySubmitted", "AuditIndex", "AuditTemplate", "Backoff", "DEFAULT_ENTRYPOINT",
    "Notify", "REGRESSION_BASELINE_TAG", "REGRESSION_EXIT_CODE", "REGRESSION_TAG", "REGRESSION_TESTS_TAG",
    "RegressionCheck", "RegressionSpec", "check_revision",
    "Decision", "DecisionLog", "GeneratedSweep", "HubSource", "JobState", "LocalSource", "PollReport", "RaySubmit",
    "RaySubmitter", "Release", "SPEC_ENV", "STATE_TAG", "STUCK", "STUCK_EXIT_CODE", "STUCK_REASON_TAG", "Source",
    "SourceUnavailable", "SubmitError", "Submitter", "SweepRecord", "Watcher", "WatchEntry", "WatchSpec",
    "backend_hint", "build_parser", "deep_merge", "generate_sweep", "iso_time", "job_state", "load_watch_spec",
    "local_revision", "main", "parse_watch_spec", "retry", "run_spec_from_env", "safe_name", "short_revision",
    "spec_digest", "submission_id",
]
