"""One task's child run in a new SQLite store (``jobs.tracker.Tracker.log_record``: create the run
with its tags, one batch of params and metrics, the result artifact, terminate it), in the store
biasaudit seeds (``jobs.tracker.seed_sqlite_store``: SQLite's write-ahead journal) against the
same seeded store switched back to SQLite's default rollback journal (``PRAGMA
journal_mode=DELETE``, what MLflow's own new store uses), in the same run, alternating::

    .venv/bin/python benchmarks/tracker.py                 # 150 records a store, 3 rounds

Prints wall and CPU milliseconds a record (best round) and the ratio."""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("MLFLOW_ENABLE_TELEMETRY", "false")


def record(i: int) -> dict:
    return {"tags": {"audit.key": f"k{i}", "audit.metric": "weat"}, "id": f"r{i}", "run_name": f"run{i}",
            "metrics": {f"m{j}": j * 1.0 for j in range(12)}, "params": {f"p{j}": str(j) for j in range(15)},
            "items_json": None, "result_json": "{}", "status": "finished"}


def one_round(journal: str, n: int) -> tuple[float, float]:
    from jobs.tracker import Tracker, seed_sqlite_store

    db = Path(tempfile.mkdtemp(prefix=f"tracker-{journal}-")) / "mlflow.db"
    assert seed_sqlite_store(f"sqlite:///{db}")
    if journal == "delete":
        con = sqlite3.connect(db)
        assert con.execute("PRAGMA journal_mode=DELETE").fetchone()[0] == "delete"
        con.close()
    tr = Tracker(f"sqlite:///{db}", "bench")
    t, c = time.perf_counter(), time.process_time()
    for i in range(n):
        tr.log_record(record(i), parent_id="bench")
    return (time.perf_counter() - t) / n * 1e3, (time.process_time() - c) / n * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    best: dict[str, tuple[float, float]] = {}
    for _ in range(a.rounds):
        for journal in ("delete", "wal"):
            w, c = one_round(journal, a.records)
            bw, bc = best.get(journal, (float("inf"), float("inf")))
            best[journal] = (min(w, bw), min(c, bc))
    for journal, (w, c) in best.items():
        print(f"{journal:6s} {w:7.1f} ms a record (wall), {c:6.1f} CPU-ms")
    print(f"wal vs delete: {best['delete'][0] / best['wal'][0]:.2f}x wall, {best['delete'][1] / best['wal'][1]:.2f}x CPU")


if __name__ == "__main__":
    main()
