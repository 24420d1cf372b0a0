"""The worker pool's shutdown: `close()` while workers are still starting races their admitter
threads for each worker's connection; it must end every worker and raise in no thread (an
exception in a thread fails a test here: filterwarnings=error)."""

from __future__ import annotations

import os
import threading
import time

from rstar2_verify.pool import WorkerPool, _Worker


def test_a_worker_connection_closes_once_whoever_gets_there_first():
    worker = _Worker(memory_mb=256, max_digits=100)
    worker.process.kill()
    worker.process.wait(timeout=5)
    os.close(worker.conn.fileno())  # what the other thread's close leaves: the descriptor gone
    worker.kill()  # the admitter's path: no EBADF
    worker.close_conn()  # and again, a no-op
    assert worker.process.returncode is not None


def test_closing_a_pool_while_its_workers_start_ends_them_quietly():
    before = threading.active_count()
    pools = []
    for _ in range(2):
        pool = WorkerPool(2)
        pool.start()
        pool.close()  # before any worker is ready: their admitters are still polling
        pools.append(pool)
    deadline = time.monotonic() + 30
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before  # every admitter ended
    assert all(pool.pids() == [] for pool in pools)
