"""Prometheus metrics: `gov serve`'s /metrics read from a real database
after real sends and deliveries, the in-process attempt metrics, and a looping
`gov dispatch --metrics-port` scraped over real HTTP."""

from __future__ import annotations

import http.client
import os
import secrets
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gov import Governor, Message
from gov.delivery.vapid import VapidSigner
from gov.http.app import create_app
from gov.ops import metrics as gov_metrics
from gov.testing import PushService

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r"Using `httpx` with `starlette.testclient` is deprecated")
    from starlette.testclient import TestClient

SUBJECT = "mailto:push-ops@example.com"
TOKEN = secrets.token_urlsafe(24)
SCRAPE_TOKEN = secrets.token_urlsafe(24)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> tuple[Samples, dict[str, Any]]:
    """Every sample by (name, sorted labels), and every family by name."""
    samples: Samples = {}
    families = {}
    for family in text_string_to_metric_families(text):
        families[family.name] = family
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, families


def family_values(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (n, labels), value in samples.items() if n == name}


def L(**labels: str) -> tuple[tuple[str, str], ...]:  # a label set, sorted as parse() keys it
    return tuple(sorted(labels.items()))


@pytest.fixture
def governor(db_url: str, signer: VapidSigner) -> Iterator[Governor]:
    with Governor(db_url, signer=signer, allow_loopback_http=True, delivery_timeout_s=2.0, pool_size=2) as g:
        yield g


@pytest.fixture
def client(governor: Governor) -> Iterator[TestClient]:
    with TestClient(create_app(governor, TOKEN, metrics_token=SCRAPE_TOKEN)) as c:
        yield c


def scrape(client: TestClient, token: str = SCRAPE_TOKEN) -> Samples:
    response = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)[0]


def msg(user: str, mid: str, tier: str) -> Message:
    return Message(user_id=user, id=mid, tier=tier, title=f"title {mid}", body="b", url="https://shop.example/x")


def test_metrics_count_decisions_suppressions_depths_and_deliveries(
    governor: Governor, push: PushService, client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    # u1: two P2 delivered at once (201), the third dropped by P2's 2 / 24 h
    governor.subscribe("u1", push.subscribe().info)
    for mid in ("m1", "m2", "m3"):
        governor.send(msg("u1", mid, "P2"))
    # u2: six P1 queued for the runner; the seventh would wait past P1's 6 h defer_max: dropped
    governor.subscribe("u2", push.subscribe().info)
    for i in range(7):
        governor.send(msg("u2", f"a{i}", "P1"), deliver=False)
    # u4: a P3 digest goes out; the next, over P3's 1 / 7 d, is held for collapse
    governor.subscribe("u4", push.subscribe().info)
    for mid in ("d1", "d2"):
        governor.send(Message(user_id="u4", id=mid, tier="P3", title=mid, collapse_key="digest"), deliver=False)
    # u3: a P0 whose endpoint answers 410 (a 4xx, gone)
    gone = push.subscribe()
    push.script(gone.endpoint, [410])
    governor.subscribe("u3", gone.info)
    governor.send(msg("u3", "t1", "P0"))

    samples = scrape(client)
    assert samples[("gov_database_up", ())] == 1
    assert family_values(samples, "gov_decisions_24h") == {
        L(verdict="allow", reason=""): 2 + 6 + 1 + 1,
        L(verdict="drop", reason="cap_86400000ms"): 1,
        L(verdict="drop", reason="defer_expired"): 1,
        L(verdict="collapse", reason="cap_604800000ms"): 1,
    }
    assert family_values(samples, "gov_suppressions_24h") == {
        L(tier="P2", blocked_by="cap_86400000ms", action="drop"): 1,
        L(tier="P1", blocked_by="cap_86400000ms", action="drop"): 1,
        L(tier="P3", blocked_by="cap_604800000ms", action="collapse"): 1,
    }
    assert family_values(samples, "gov_outbox_rows") == {L(state="pending"): 6 + 1, L(state="sending"): 0}
    assert samples[("gov_outbox_oldest_due_seconds", ())] >= 0
    assert family_values(samples, "gov_held_messages") == {L(tier="P3", kind="collapse"): 1}
    assert family_values(samples, "gov_delivery_attempts_24h") == {
        L(status_class="2xx", outcome="accepted"): 2,
        L(status_class="4xx", outcome="gone"): 1,
    }

    # the windows are 24 h by the database's clock: what is older drops out; depths are
    # what is still to do now (a held message that ended is no longer held)
    conn.execute("UPDATE gov.messages SET decided_at = now() - interval '25 hours' WHERE message_id = 'm3'")
    conn.execute("UPDATE gov.push_suppressions SET created_at = now() - interval '25 hours' WHERE message_id = 'm3'")
    conn.execute("UPDATE gov.delivery_attempts SET attempted_at = now() - interval '25 hours' WHERE status = 410")
    conn.execute("UPDATE gov.outbox SET next_attempt_at = now() - interval '1 day' WHERE message_id = 'a0'")
    conn.execute("UPDATE gov.outbox SET state = 'delivered', finished_at = now() WHERE message_id = 'a1'")
    conn.execute("UPDATE gov.deferred SET state = 'expired', finished_at = now() WHERE message_id = 'd2'")
    samples = scrape(client)
    assert L(verdict="drop", reason="cap_86400000ms") not in family_values(samples, "gov_decisions_24h")
    assert L(tier="P2", blocked_by="cap_86400000ms", action="drop") not in family_values(
        samples, "gov_suppressions_24h"
    )
    assert family_values(samples, "gov_delivery_attempts_24h") == {L(status_class="2xx", outcome="accepted"): 2}
    # the oldest due row is the one a day overdue (not a fresh one, not one twice as old)
    assert 86_400 <= samples[("gov_outbox_oldest_due_seconds", ())] < 2 * 86_400
    assert family_values(samples, "gov_outbox_rows") == {L(state="pending"): 6, L(state="sending"): 0}
    assert family_values(samples, "gov_held_messages") == {}


def test_metrics_read_is_one_call_of_the_sql_function(governor: Governor, conn: psycopg.Connection[Any]) -> None:
    calls = []

    class Counting:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def execute(self, query: Any, params: Any = None) -> Any:
            calls.append(query)
            return self.inner.execute(query, params)

    import contextlib

    @contextlib.contextmanager
    def connect() -> Iterator[Counting]:
        with governor.source.connection() as c:
            yield Counting(c)

    families = list(gov_metrics.DatabaseCollector(connect).collect())
    assert len(calls) == 1 and "gov.metrics_v1" in calls[0]
    assert {f.name for f in families} >= {"gov_decisions_24h", "gov_outbox_rows", "gov_held_messages"}


def test_metrics_need_a_bearer_token(client: TestClient) -> None:
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer not-the-token-at-all"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": f"Basic {SCRAPE_TOKEN}"}).status_code == 401
    scrape(client, SCRAPE_TOKEN)  # the scrape-only token
    scrape(client, TOKEN)  # and the API token
    # the scrape-only token opens nothing else
    send = client.post("/internal/send", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"}, json={})
    assert send.status_code == 401


def test_a_database_that_does_not_answer_is_a_gauge_not_a_failed_scrape(
    client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("DROP FUNCTION gov.metrics_v1(bigint)")
    samples = scrape(client)
    assert samples[("gov_database_up", ())] == 0
    assert not family_values(samples, "gov_outbox_rows")
    assert ("gov_push_attempt_seconds_count", ()) in samples  # the process's own metrics still


def test_observed_attempts_show_in_the_counter_and_histogram(client: TestClient) -> None:
    before = scrape(client)
    gov_metrics.observe_attempt("accepted", 201, 0.02)
    gov_metrics.observe_attempt("transient", 503, 3.0)
    gov_metrics.observe_attempt("transient", None, 0.3)
    after = scrape(client)

    def delta(name: str, labels: tuple[tuple[str, str], ...] = ()) -> float:
        return after.get((name, labels), 0) - before.get((name, labels), 0)

    assert delta("gov_push_attempts_total", L(outcome="accepted", status_class="2xx")) == 1
    assert delta("gov_push_attempts_total", L(outcome="transient", status_class="5xx")) == 1
    assert delta("gov_push_attempts_total", L(outcome="transient", status_class="none")) == 1
    assert delta("gov_push_attempt_seconds_count") == 3
    assert delta("gov_push_attempt_seconds_sum") == pytest.approx(3.32)
    assert delta("gov_push_attempt_seconds_bucket", L(le="0.025")) == 1
    assert delta("gov_push_attempt_seconds_bucket", L(le="0.5")) == 2
    assert delta("gov_push_attempt_seconds_bucket", L(le="+Inf")) == 3


@pytest.mark.parametrize(
    ("status", "expected"), [(201, "2xx"), (410, "4xx"), (429, "4xx"), (503, "5xx"), (None, "none"), (0, "none")]
)
def test_status_class(status: int | None, expected: str) -> None:
    assert gov_metrics.status_class(status) == expected


# ---------------------------------------------------------------- a looping runner


def _get(port: int, path: str = "/metrics") -> str:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        assert response.status == 200
        return response.read().decode()
    finally:
        connection.close()


@pytest.mark.parametrize("processes", ["1", "2"])
def test_looping_dispatcher_exposes_its_attempts(
    db_url: str, push: PushService, key_path: Path, processes: str
) -> None:
    with Governor(db_url, allow_loopback_http=True, pool_size=1) as g:
        for i in range(6):
            g.subscribe(f"user{i}", push.subscribe().info)
            g.send(Message(user_id=f"user{i}", id=f"msg{i}", tier="P0", title="hello"), deliver=False)
    # PYTHONFAULTHANDLER: if it ever hangs on SIGTERM again (once, under CI's load, at stop 45),
    # the SIGABRT below makes it print where each of its threads was
    env = {**os.environ, "GOV_DATABASE_URL": db_url, "GOV_VAPID_PRIVATE_KEY": str(key_path),
           "GOV_VAPID_SUBJECT": SUBJECT, "GOV_ALLOW_LOOPBACK_HTTP": "1", "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gov.cli", "dispatch", "--idle", "0.05", "--processes", processes,
         "--metrics-port", "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stderr is not None
        port = None
        for line in proc.stderr:
            if line.startswith("gov: metrics on http://127.0.0.1:"):
                port = int(line.strip().rsplit(":", 1)[1].split("/", 1)[0])
                break
        assert port is not None, "gov dispatch did not announce its metrics server"
        # the runner delivers the six rows (with two processes, each some); its metrics say so
        import time

        deadline = time.monotonic() + 30
        while True:
            samples, families = parse(_get(port))
            delivered = samples.get(("gov_push_attempts_total", L(outcome="accepted", status_class="2xx")), 0)
            if delivered >= 6 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert families["gov_push_attempts"].type == "counter"
        assert families["gov_push_attempt_seconds"].type == "histogram"
        assert delivered == 6
        assert samples[("gov_push_attempt_seconds_count", ())] == 6
        assert len(push.delivered()) == 6
        assert "gov_decisions_24h" not in families  # the database figures are gov serve's
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGABRT)
            _out, err = proc.communicate(timeout=30)
            pytest.fail(f"gov dispatch did not stop within 30 s of SIGTERM; its threads:\n{err}")
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err


def test_metrics_port_in_use_is_a_one_line_error(db_url: str, key_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        env = {**os.environ, "GOV_DATABASE_URL": db_url, "GOV_VAPID_PRIVATE_KEY": str(key_path),
               "GOV_VAPID_SUBJECT": SUBJECT}
        done = subprocess.run(
            [sys.executable, "-m", "gov.cli", "dispatch", "--once", "--metrics-port", str(port)],
            env=env, capture_output=True, text=True, timeout=60,
        )
    assert done.returncode == 1
    assert done.stderr.startswith("gov: error: cannot serve metrics on 127.0.0.1:"), done.stderr
    assert "Traceback" not in done.stderr


MULTIPROCESS_SCRIPT = '''
import multiprocessing
import sys
import urllib.request

import prometheus_client  # imported before multiprocess mode is chosen, as another library might

from gov.ops import metrics


def work(n):
    for _ in range(n):
        metrics.observe_attempt("accepted", 201, 0.01)


if __name__ == "__main__":
    exposed = metrics.expose(0, processes=3)  # in the parent, before the processes start
    context = multiprocessing.get_context(sys.argv[1])
    workers = [context.Process(target=work, args=(5,)) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    work(1)  # the parent's own attempt counts too
    print(urllib.request.urlopen(f"http://127.0.0.1:{exposed.port}/metrics", timeout=10).read().decode())
    exposed.stop()
'''


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_several_processes_are_summed(tmp_path: Path, start_method: str) -> None:
    """The plan for `gov dispatch --processes N`: expose(port, processes=N) in the parent,
    then every worker process's attempts reach the parent's server (multiprocess mode)."""
    script = tmp_path / "runner.py"
    script.write_text(MULTIPROCESS_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in (gov_metrics.MULTIPROC_ENV, "GOV_METRICS_MULTIPROC")}
    done = subprocess.run([sys.executable, str(script), start_method], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    samples, _ = parse(done.stdout)
    assert samples[("gov_push_attempts_total", L(outcome="accepted", status_class="2xx"))] == 3 * 5 + 1
    assert samples[("gov_push_attempt_seconds_count", ())] == 3 * 5 + 1


EMPTY_FILE_SCRIPT = '''
import multiprocessing
import os
import urllib.request

from gov.ops import metrics


def work(n):
    for _ in range(n):
        metrics.observe_attempt("accepted", 201, 0.01)


if __name__ == "__main__":
    exposed = metrics.expose(0, processes=2)
    worker = multiprocessing.get_context("fork").Process(target=work, args=(4,))
    worker.start()
    worker.join()
    # a process's file as it is between its creation and its sizing: left behind for good
    # when the process is killed in that moment
    open(os.path.join(os.environ[metrics.MULTIPROC_ENV], "counter_4194301.db"), "wb").close()
    print(urllib.request.urlopen(f"http://127.0.0.1:{exposed.port}/metrics", timeout=10).read().decode())
    exposed.stop()
'''


def test_a_process_file_still_empty_does_not_fail_the_scrape(tmp_path: Path) -> None:
    """prometheus/client_python#1199: the library's collector fails every scrape (500) on
    an empty file, which a runner process leaves behind when killed right after creating it."""
    script = tmp_path / "runner.py"
    script.write_text(EMPTY_FILE_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in (gov_metrics.MULTIPROC_ENV, "GOV_METRICS_MULTIPROC")}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    samples, _ = parse(done.stdout)
    assert samples[("gov_push_attempts_total", L(outcome="accepted", status_class="2xx"))] == 4


def test_gov_serve_process_takes_the_scrape_token_from_the_environment(db_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOV_VAPID")}
    env.update({"GOV_DATABASE_URL": db_url, "GOV_API_TOKEN": TOKEN, "GOV_METRICS_TOKEN": SCRAPE_TOKEN})
    proc = subprocess.Popen([sys.executable, "-m", "gov.cli", "serve", "--port", "0"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        port = None
        for line in proc.stderr:
            if line.startswith("gov: serving on http://"):
                port = int(line.strip().rsplit(":", 1)[1])
                break
        assert port is not None, "gov serve did not start"
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", "/metrics", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"})
        response = connection.getresponse()
        body = response.read().decode()
        connection.close()
        assert response.status == 200, body
        samples, _ = parse(body)
        assert family_values(samples, "gov_outbox_rows") == {L(state="pending"): 0, L(state="sending"): 0}
        assert samples[("gov_database_up", ())] == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
