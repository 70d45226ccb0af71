"""The hosts of a run under host discovery as data: what the controller keeps in ``controller.json``
(a HostManager over fixed hosts, a fake clock), one row per host (:func:`host_rows`), the
Prometheus lines (:func:`metric_families`, parsed back), and the cluster page's state and
``/metrics`` (a cluster store written by hand, as test_cluster_web's)."""

from __future__ import annotations

import json

import pytest

from elastic_ring import protocol
from elastic_ring.cluster.web import ClusterView, WebServer, bind
from elastic_ring.controller.segment import Segment
from elastic_ring.hosts.exclusion import CooldownRange
from elastic_ring.telemetry.hosts import STATES, host_rows, metric_families, read_host_state
from tests.unit.test_cluster_web import EVIL, _get, cluster, wait_answers  # noqa: F401 - the fixture
from tests.unit.test_controller_hosts import FakeClock, _controller

STATE = {"discovered": [["a", 2], ["b", 1], ["c", 4]], "usable": [["a", 2], ["c", 4]], "in_use": [["a", 2], ["c", 1]],
         "excluded": [{"host": "b", "until": 1234.5, "failures": 2}], "draining": [{"host": "c", "deadline": 1300.0}],
         "target": 3, "need": 1}


def test_the_controller_keeps_the_hosts_as_data(tmp_path):
    clock = FakeClock()
    ctl, _, _ = _controller(tmp_path, [("a", 1), ("b", 2), ("c", 1)], clock=clock, cooldown=CooldownRange(3, 5))
    watch = ctl.hosts
    seg = Segment(0, 3, 30)
    watch.view(0)
    watch.place(seg)
    st = json.loads((tmp_path / protocol.CONTROLLER_FILE).read_text())["host_state"]
    assert st["discovered"] == [["a", 1], ["b", 2], ["c", 1]] and st["in_use"] == [["a", 1], ["b", 2]]
    assert st["excluded"] == [] and st["draining"] == [] and (st["target"], st["need"]) == (4, 1)
    ex = watch.failed(seg, 1)  # rank 1 ran on b
    watch.view(1)
    st = read_host_state(tmp_path)
    assert st["usable"] == [["a", 1], ["c", 1]] and st["target"] == 2
    # until when, in wall-clock seconds (the controller's clock: time.time())
    assert [(e["host"], e["failures"]) for e in st["excluded"]] == [("b", 1)]
    assert st["excluded"][0]["until"] == pytest.approx(ex.until + watch._to_wall, abs=1e-3)
    rows = host_rows(st)
    assert [(r["host"], r["state"], r["slots"], r["discovered"]) for r in rows] == [
        ("a", "in_use", 1, True), ("b", "excluded", 2, True), ("c", "idle", 1, True)]


def test_one_row_per_host_the_most_telling_state_first():
    rows = host_rows(STATE)
    assert [(r["host"], r["state"], r["slots"], r["in_use_slots"], r["until"]) for r in rows] == [
        ("a", "in_use", 2, 2, None), ("b", "excluded", 1, 0, 1234.5), ("c", "draining", 4, 1, 1300.0)]
    gone = dict(STATE, discovered=[["a", 2]], excluded=[], draining=[])  # c dropped by discovery, still in use
    assert [(r["host"], r["state"], r["discovered"], r["slots"]) for r in host_rows(gone)] == [
        ("a", "in_use", True, 2), ("c", "in_use", False, 1)]
    assert host_rows(None) == [] and host_rows({"discovered": None}) == []


def _metrics(jobs) -> dict:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    class C:
        def collect(self):
            return metric_families(jobs)

    reg = CollectorRegistry(auto_describe=False)
    reg.register(C())
    text = generate_latest(reg).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}, text


def test_the_metrics_lines():
    fam, text = _metrics([("7", "job<x>", host_rows(STATE)), ("8", "idle", host_rows({"discovered": [["z", 3]]}))])
    by_state = {(s.labels["job"], s.labels["state"]): s.value for s in fam["elastic_ring_job_hosts"].samples}
    assert {k: v for k, v in by_state.items() if k[0] == "7"} == {
        ("7", "in_use"): 1, ("7", "idle"): 0, ("7", "excluded"): 1, ("7", "draining"): 1}
    assert {st for j, st in by_state if j == "8"} == set(STATES) and by_state[("8", "idle")] == 1
    found = {s.labels["job"]: s.value for s in fam["elastic_ring_job_hosts_discovered"].samples}
    assert found == {"7": 3, "8": 1}
    slots = {(s.labels["job"], s.labels["host"], s.labels["state"]): s.value
             for s in fam["elastic_ring_job_host_slots"].samples}
    assert slots == {("7", "a", "in_use"): 2, ("7", "b", "excluded"): 1, ("7", "c", "draining"): 4,
                     ("8", "z", "idle"): 3}
    (until,) = fam["elastic_ring_job_host_excluded_until_seconds"].samples
    assert (until.labels["host"], until.value) == ("b", 1234.5)
    assert 'elastic_ring_job_hosts{job="7",name="job<x>",state="excluded"} 1.0' in text


def test_the_cluster_page_and_metrics_show_a_running_job_s_hosts(cluster):  # noqa: F811 - the fixture
    d, a, b = cluster
    protocol.write_json_atomic(d / "jobs" / str(a) / protocol.CONTROLLER_FILE, {"state": "running", "host_state": STATE})
    s = ClusterView(d, clock=lambda: 1060.0).state()
    ja, jb = s["jobs"]
    assert [(h["host"], h["state"]) for h in ja["hosts"]] == [("a", "in_use"), ("b", "excluded"), ("c", "draining")]
    assert jb["hosts"] == []  # finished: no hosts shown
    srv = WebServer(d, bind("127.0.0.1", 0))
    srv.start()
    try:
        wait_answers(srv)
        page = _get(srv.url)[2]
        assert 'id="hosts"' in page and 'id="hosts-section"' in page
        js = _get(srv.url + "static/app.js")[2]
        assert "function drawHosts" in js and "drawHosts(st)" in js
        assert ".innerHTML" not in js  # a host's name goes in as text
        code, _, text = _get(srv.url + "metrics")
        assert code == 200
        assert f'elastic_ring_job_host_slots{{host="c",job="{a}",name="{EVIL}",state="draining"}} 4.0' in text
        assert f'elastic_ring_job_host_excluded_until_seconds{{host="b",job="{a}",name="{EVIL}"}} 1234.5' in text
    finally:
        srv.stop()
