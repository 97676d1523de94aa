"""Celery (a client nobody here wrote) with Hayate's AMQP listener as its broker and the
`rpc://` result backend (results over AMQP reply queues): a worker runs tasks, results come
back, a task retries, and a group and a chain complete."""

from __future__ import annotations

import pytest

from conftest import KIND
from test_amqp import broker  # noqa: F401  (the fixture: a broker with an AMQP listener)

pytestmark = pytest.mark.skipif(KIND != "hayate", reason="Hayate's AMQP listener")

celery = pytest.importorskip("celery")


def test_worker_runs_tasks_and_results_come_back(broker):  # noqa: F811
    from celery import chain, group
    from celery.contrib.testing.worker import start_worker

    app = celery.Celery("hayate_interop",
                        broker=f"amqp://guest:guest@127.0.0.1:{broker['amqp']}//",
                        backend="rpc://")
    app.conf.update(broker_connection_retry_on_startup=False,
                    worker_hijack_root_logger=False, task_acks_late=True)

    @app.task
    def mul(x, y):
        return x * y

    @app.task(bind=True, max_retries=3)
    def flaky(self, n):
        if self.request.retries < 2:
            raise self.retry(countdown=0.1)
        return n + self.request.retries

    with start_worker(app, pool="threads", concurrency=2, perform_ping_check=False,
                      loglevel="WARNING", shutdown_timeout=15):
        assert mul.delay(6, 7).get(timeout=15) == 42
        results = [mul.delay(i, 2) for i in range(100)]
        assert [r.get(timeout=15) for r in results] == [i * 2 for i in range(100)]
        assert flaky.delay(5).get(timeout=15) == 7
        assert group(mul.s(i, i) for i in range(5))().get(timeout=15) == [0, 1, 4, 9, 16]
        assert chain(mul.s(2, 3), mul.s(4))().get(timeout=15) == 24
