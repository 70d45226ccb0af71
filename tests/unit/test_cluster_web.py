"""The cluster page's data, server and metrics on a cluster store written by hand: the timeline of
slots, a job's numbers, the real server (uvicorn on a free port) answering GET only, the
Prometheus text parsed back, and the one-line errors of bad input."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest

from elastic_ring.cluster.api import ClusterConfig, JobRequest, JobState
from elastic_ring.cluster.store import Store
from elastic_ring.cluster.web import ClusterView, WebServer, bind, check_dir, parse_bind, timeline
from tests.conftest import run_cli

EVIL = "<script>alert(1)</script>"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def cluster(tmp_path):
    clock = Clock()
    st = Store(tmp_path, create=True, clock=clock)
    st.set_meta("config", ClusterConfig(hosts=(("localhost", 4),)).to_dict())
    st.set_meta("scheduler_pid", 2 ** 22 + 7)  # no such process
    a = st.submit(JobRequest(name=EVIL, kind="script", path="x.py", steps=100))
    b = st.submit(JobRequest(name="b", kind="script", path="y.py", steps=50))
    clock.t = 1010.0
    st.decision("arrival", a, {a: 4})
    st.update(a, state=JobState.RUNNING, slots=[0, 1, 2, 3], started=1010.0, step=40, total=100, workers=2,
              images_per_s=123.0)
    st.event(a, "started", workers=4, slots=[0, 1, 2, 3])
    clock.t = 1020.0
    st.decision("arrival", b, {a: 2, b: 2})
    st.event(a, "resize_requested", frm=4, to=2)
    clock.t = 1025.0
    st.event(a, "resized", workers=2, slots=[0, 1])
    st.update(a, slots=[0, 1])
    st.event(b, "started", workers=2, slots=[2, 3])
    clock.t = 1040.0
    st.update(b, state=JobState.FINISHED, finished=1040.0, step=50, total=50)
    st.event(b, "succeeded", step=50, outcome="succeeded")
    run = tmp_path / "jobs" / str(a)
    run.mkdir(parents=True)
    evs = [{"kind": "launch", "time": 1011.0, "world_size": 4, "segment": 0},
           {"kind": "throughput", "time": 1015.0, "step": 10, "loss": 2.0, "images_per_s": 200.0,
            "steps_per_s": 2.0, "world_size": 4},
           {"kind": "resize_overhead", "time": 1024.0, "from_workers": 4, "to_workers": 2, "step": 20,
            "stop_latency_s": 1.0, "checkpoint_s": 0.2, "relaunch_to_first_step_s": 2.5, "total_lost_s": 3.25},
           {"kind": "restart", "time": 1030.0, "attempt": 1, "cause": "rank 1 died", "rank": 1,
            "failed_at_step": 35, "steps_redone": 3, "gave_up": False},
           {"kind": "throughput", "time": 1035.0, "step": 40, "loss": 1.0, "images_per_s": 123.0,
            "steps_per_s": 1.5, "world_size": 2}]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs) + '{"kind": "thr')
    clock.t = 1050.0
    st.close()
    return tmp_path, a, b


def test_timeline_and_job_numbers(cluster):
    d, a, b = cluster
    s = ClusterView(d, clock=lambda: 1060.0).state()
    bars = [(x["job_id"], x["from"], x["to"], x["slots"]) for x in s["timeline"]]
    assert bars == [(a, 1010.0, 1025.0, 4), (a, 1025.0, None, 2), (b, 1025.0, 1040.0, 2)]
    ja, jb = s["jobs"]
    assert ja["name"] == EVIL and ja["state"] == "running" and ja["slots"] == 2
    assert ja["remaining_s"] == pytest.approx(60 / 1.5)  # (total - step) / latest steps/s
    assert ja["resizes"] == 1 and ja["resize_lost_s"] == 3.25 and ja["restarts"] == 1
    assert [list(p) for p in ja["curves"]["loss"]] == [[1015.0, 2.0], [1035.0, 1.0]]  # partial line skipped
    assert jb["jct_s"] == 40.0  # submitted at 1000, finished at 1040
    assert jb["remaining_s"] is None and jb["images_per_s"] == 0.0
    assert s["slots_used"] == 2 and s["cluster"]["slots"] == 4
    assert [x["cause"] for x in s["decisions"]] == ["arrival", "arrival"]
    assert s["scheduler"]["alive"] is False and len(s["scheduler"]["gaps"]) == 1


# requests to our own server on 127.0.0.1 never go through a proxy (http_proxy in the environment,
# or a global opener some other test built while one was set)
LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _get(url: str) -> tuple[int, str, str]:
    try:
        with LOCAL.open(url, timeout=10) as r:
            return r.status, r.headers.get("content-type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, "", ""


def wait_answers(srv: WebServer, timeout: float = 120.0) -> None:
    """Poll the server's page until it answers (any HTTP status): under load uvicorn's thread can
    take many seconds to start serving. Fails with the last error, and whether the thread lives."""
    t0, last = time.time(), None
    while time.time() - t0 < timeout:
        try:
            with LOCAL.open(srv.url, timeout=10) as r:
                r.read()
            return
        except urllib.error.HTTPError:
            return
        except OSError as e:  # refused, reset, timed out: not serving yet
            last = e
        time.sleep(0.2)
    alive = srv.thread is not None and srv.thread.is_alive()
    raise AssertionError(f"{srv.url} did not answer in {timeout:.0f} s (last: {last!r}; server thread "
                         f"{'alive' if alive else 'ended'}, started={srv.server.started})")


def test_a_failed_jobs_reason_and_log_and_the_end_state_word(cluster):
    """The page gets a failed job's one-line reason and its log's path; a job that ran its steps is
    "finished" (the word of `status` and `jobs`), also in a store written as "succeeded"."""
    d, a, b = cluster
    st = Store(d)
    c = st.submit(JobRequest(name="c", kind="config", path="c.yaml"))
    st.update(c, state=JobState.FAILED, finished=1045.0, message="unknown key 'bogus'")
    (d / "logs").mkdir()
    (d / "logs" / f"job-{c}.log").write_text("elastic-ring: error: unknown key 'bogus'\n")
    st.db.execute("UPDATE jobs SET state='succeeded' WHERE id=?", (b,))
    st.close()
    s = ClusterView(d, clock=lambda: 1060.0).state()
    jobs = {j["id"]: j for j in s["jobs"]}
    assert jobs[c]["state"] == "failed" and jobs[c]["message"] == "unknown key 'bogus'"
    assert jobs[c]["log"] == str((d / "logs" / f"job-{c}.log").resolve())
    assert jobs[a]["run_dir"] == str((d / "jobs" / str(a)).resolve()) and jobs[a]["log"] is None
    assert jobs[b]["state"] == "finished" and jobs[b]["jct_s"] == 40.0


def test_a_ray_clusters_slots_are_its_nodes_at_the_last_pass(cluster):
    d, a, b = cluster
    st = Store(d)
    st.set_meta("config", ClusterConfig(hosts=(("10.0.0.1/aa", 1),), ray="").to_dict())  # the nodes at `up`
    st.set_meta("nodes", [["10.0.0.1/aa", 1], ["10.0.0.2/bb", 3]])  # a node joined since
    st.close()
    s = ClusterView(d, clock=lambda: 1060.0).state()
    assert s["cluster"]["slots"] == 4 and s["cluster"]["hosts"] == [["10.0.0.1/aa", 1], ["10.0.0.2/bb", 3]]


def test_server_page_state_metrics_and_no_actions(cluster):
    from prometheus_client.parser import text_string_to_metric_families

    d, a, b = cluster
    srv = WebServer(d, bind("127.0.0.1", 0))
    srv.start()
    try:
        wait_answers(srv)
        code, ctype, page = _get(srv.url)
        assert code == 200 and "text/html" in ctype and "static/app.js" in page
        assert _get(srv.url + "static/app.js")[0] == 200
        code, _, body = _get(srv.url + "api/state")
        assert code == 200 and json.loads(body)["jobs"][0]["name"] == EVIL
        code, ctype, text = _get(srv.url + "metrics")
        assert code == 200 and ctype.startswith("text/plain")
        fam = {f.name: f for f in text_string_to_metric_families(text)}
        jobs = {s.labels["state"]: s.value for s in fam["elastic_ring_jobs"].samples}
        assert jobs["running"] == 1 and jobs["finished"] == 1 and jobs["queued"] == 0
        assert fam["elastic_ring_slots_total"].samples[0].value == 4
        assert fam["elastic_ring_slots_used"].samples[0].value == 2
        assert fam["elastic_ring_resizes"].samples[0].value == 1
        assert fam["elastic_ring_restarts"].samples[0].value == 1
        assert fam["elastic_ring_resize_lost_seconds"].samples[0].value == 3.25
        ips = fam["elastic_ring_job_images_per_second"].samples
        assert [(s.labels["job"], s.labels["name"], s.value) for s in ips] == [(str(a), EVIL, 123.0)]
        assert fam["elastic_ring_scheduler_up"].samples[0].value == 0
        # read-only: anything but GET is refused
        req = urllib.request.Request(srv.url + "api/state", data=b"{}", method="POST")
        with pytest.raises(urllib.error.HTTPError) as e:
            LOCAL.open(req, timeout=10)
        assert e.value.code == 405
    finally:
        srv.stop()


def test_parse_bind():
    assert parse_bind("8080") == ("127.0.0.1", 8080)
    assert parse_bind("0.0.0.0:9") == ("0.0.0.0", 9)
    assert parse_bind("[::1]:80") == ("::1", 80)


def test_bad_input_one_line_exit_2(tmp_path, cluster):
    d, _, _ = cluster
    r = run_cli("cluster", "web", "--dir", str(tmp_path / "none"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "no cluster" in r.stderr
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "cluster.db").write_bytes(b"not a database at all" * 100)
    r = run_cli("cluster", "web", "--dir", str(bad))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "cannot read" in r.stderr
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        port = taken.getsockname()[1]
        r = run_cli("cluster", "web", "--dir", str(d), "--bind", f"127.0.0.1:{port}")
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and str(port) in r.stderr, r.stderr
    finally:
        taken.close()
    r = run_cli("cluster", "web", "--dir", str(d), "--bind", "nope")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--bind wants" in r.stderr
    with pytest.raises(Exception):
        check_dir(tmp_path / "none")
