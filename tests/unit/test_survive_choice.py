"""The default of ``--survive``: the choice at the start (:func:`initial`), the word from the ranks'
measured copy/step ratios (:func:`decide`), the workers' timing of their copy (:class:`CostMeter`,
:class:`MemoryCopy`) and the controller's side (:class:`SurviveWatch`), with fakes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from elastic_ring import protocol
from elastic_ring.controller import survive_choice as sc
from elastic_ring.events.api import EventLog, read_events
from elastic_ring.worker import survive
from elastic_ring.worker.survive import SKIP_COPIES, TIMED_COPIES, CostMeter, MemoryCopy


@pytest.mark.parametrize("args, mode, why", [
    ((None, "horovodrun", "overlap", "horovod", "cpu"), "off",
     "--relaunch overlap keeps no survivors; --relaunch inplace and --backend ray do"),
    ((None, "horovodrun", "inplace", "horovod", "cpu"), "auto", None),
    ((None, "ray", "auto", "torch", "cpu"), "auto", None),
    ((None, "ray", "auto", "torch", "cuda"), "off", "--collective torch on GPUs: NCCL after a peer's death is not handled"),
    ((True, "horovodrun", "inplace", "horovod", "cpu"), "on", "--survive"),
    ((False, "ray", "auto", "horovod", "cpu"), "off", "--no-survive"),
    ((False, "horovodrun", "overlap", "horovod", "cpu"), "off", "--no-survive"),
])
def test_the_choice_at_the_start(args, mode, why):
    c = sc.initial(*args)
    assert c.mode == mode
    if why is not None:
        assert c.why == why and c.line() == f"survive: {mode} ({why})"
    assert c.forced == (args[0] is not None)
    assert c.launches_survivors == (mode != "off")
    assert c.worker_env == ("auto" if mode == "auto" else "1")


def test_a_torchrun_script_and_a_horovod_elastic_script():
    assert sc.initial(None, "horovodrun", "inplace", "torch", "cpu", torchrun=True).mode == "off"
    he = sc.initial(None, "horovodrun", "inplace", "horovod", "cpu", hvd_elastic=True)
    assert he.mode == "on" and "commits" in he.why and not he.forced  # no per-step copy to measure
    assert sc.initial(False, "horovodrun", "inplace", "horovod", "cpu", hvd_elastic=True).mode == "off"


def test_the_word_is_the_dearest_rank_s_against_2_percent():
    on = sc.decide([0.004, 0.001])
    assert (on.mode, on.ratio) == ("on", 0.004)
    assert on.line() == "survive: on (state copy 0.4% of a step, <= 2.0%)"
    assert sc.decide([0.02]).mode == "on"  # at most 2%
    off = sc.decide([0.001, 0.071])  # one dear rank decides for all
    assert (off.mode, off.ratio) == ("off", 0.071)
    assert off.line() == "survive: off (state copy 7.1% of a step > 2.0%; --survive forces it)"
    assert sc.decide([0.0201]).mode == "off"


def _timed(meter: CostMeter, steps, copy_s: float, step_s: float, t: float = 100.0) -> float:
    for s in steps:
        t += step_s
        meter.timed(s, t, t + copy_s)
        t += copy_s
    return t


def test_the_meter_times_consecutive_copies_after_the_first_and_reports_once():
    reports: list[dict] = []
    m = CostMeter(reports.append, lambda: None)
    n = SKIP_COPIES + TIMED_COPIES
    _timed(m, range(1, n), copy_s=0.001, step_s=0.1)
    assert not reports  # one copy short
    _timed(m, [n], copy_s=0.001, step_s=0.1)
    (r,) = reports
    assert r["ratio"] == pytest.approx(0.01) and r["steps"] == TIMED_COPIES and not r["forced"]
    _timed(m, range(n + 1, n + 5), copy_s=0.5, step_s=0.1)
    assert len(reports) == 1


def test_a_gap_in_the_steps_is_not_a_step_and_a_test_may_force_the_ratio():
    reports: list[dict] = []
    m = CostMeter(reports.append, lambda: None, forced=0.07)
    _timed(m, [1, 2, 3], copy_s=0.001, step_s=0.1)  # (1, 2: the first copies; 3 timed)
    _timed(m, [10, 11, 12, 13], copy_s=0.001, step_s=0.1, t=500.0)  # step 10 follows 3: untimed
    assert not reports
    _timed(m, [14], copy_s=0.001, step_s=0.1, t=600.0)
    (r,) = reports
    assert r["ratio"] == 0.07 and r["forced"] and r["copy_s"] == pytest.approx(0.001)


@pytest.mark.parametrize("word", [True, False])
def test_a_copy_follows_the_controller_s_word(word):
    said: list[bool | None] = [None]
    m = CostMeter(lambda r: None, lambda: said[0])
    copy = MemoryCopy(lambda step, into: {"step": step}, meter=m)
    n = SKIP_COPIES + TIMED_COPIES
    for s in range(1, n + 3):
        copy.keep(s)
    assert copy.held() == [n + 1, n + 2] and copy.meter is m  # reported, no word yet: copies go on
    said[0] = word
    copy.keep(n + 3)
    assert copy.meter is None and copy.off is (not word)
    copy.keep(n + 4)
    assert copy.held() == ([n + 3, n + 4] if word else [])


def test_a_worker_started_after_an_off_keeps_no_copy(tmp_path, monkeypatch):
    monkeypatch.setenv(survive.SURVIVE_ENV, "auto")
    survive.reset()
    job = SimpleNamespace(ring=SimpleNamespace(in_place=True), run_dir=tmp_path, rank=0,
                          state=SimpleNamespace(snapshot=lambda step, into: {"step": step}, sharded=False))
    protocol.control_dir(tmp_path).mkdir(parents=True)
    try:
        assert survive.memory_copy(job).meter is not None  # no word yet: it measures
        survive.reset()
        protocol.write_json_atomic(survive.choice_file(tmp_path), {"on": False})
        assert survive.memory_copy(job) is None
        survive.reset()
        protocol.write_json_atomic(survive.choice_file(tmp_path), {"on": True})
        c = survive.memory_copy(job)
        assert c is not None and c.meter is None and not c.off
    finally:
        survive.reset()


def _watch(tmp_path, choice):
    out, shown = [], []
    w = sc.SurviveWatch(choice, tmp_path, EventLog(tmp_path / "events.jsonl"), out.append, shown.append,
                        check_every_s=0.0)
    protocol.control_dir(tmp_path).mkdir(parents=True, exist_ok=True)
    return w, out, shown


def _report(tmp_path, member: str, ratio: float) -> None:
    protocol.write_json_atomic(survive.cost_file(tmp_path, member), {"ratio": ratio, "member": member})


def test_the_controller_decides_once_every_rank_has_said(tmp_path):
    w, out, shown = _watch(tmp_path, sc.initial(None, "ray", "auto", "horovod", "cpu"))
    _report(tmp_path, "old", 0.9)  # an earlier controller's: cleared at the start
    protocol.write_json_atomic(survive.choice_file(tmp_path), {"on": False})
    w.start()
    assert survive.read_choice(tmp_path) is None and not out and shown[0].startswith("survive: measuring")
    _report(tmp_path, "0", 0.003)
    assert w.check(2) is None and w.measuring
    _report(tmp_path, "1", 0.005)
    c = w.check(2)
    assert c is not None and c.mode == "on" and not w.measuring
    assert out == shown[1:] == ["survive: on (state copy 0.5% of a step, <= 2.0%)"]
    assert survive.read_choice(tmp_path) is True
    ev = read_events(tmp_path / "events.jsonl", kind="survive_choice")
    assert [(e["on"], e["ratio"]) for e in ev] == [(None, None), (True, 0.005)]
    assert w.off_refusal() is None
    backend = SimpleNamespace(survive=True)
    w.launching(backend)
    assert backend.survive is True


def test_an_off_ends_the_survivors_at_the_next_failure_and_launch(tmp_path):
    w, out, _ = _watch(tmp_path, sc.initial(None, "horovodrun", "inplace", "horovod", "cpu"))
    w.start()
    _report(tmp_path, "0", 0.05)
    assert w.check(1).mode == "off" and survive.read_choice(tmp_path) is False
    assert w.off_refusal() == out[0] == "survive: off (state copy 5.0% of a step > 2.0%; --survive forces it)"
    backend = SimpleNamespace(survive=True)
    w.launching(backend)
    assert backend.survive is False


def test_forced_and_impossible_choices_are_recorded_and_said_where_relevant(tmp_path):
    w, out, shown = _watch(tmp_path, sc.initial(True, "ray", "auto", "horovod", "cpu"))
    w.start()
    assert out == ["survive: on (--survive)"] and w.check(4) is None and w.restart_note() == ""
    w, out, shown = _watch(tmp_path, sc.initial(None, "horovodrun", "overlap", "horovod", "cpu"))
    w.start()
    assert not out and shown == [w.choice.line()]  # nothing said at the start ...
    assert w.restart_note() == f"; {w.choice.line()}" and w.restart_note() == ""  # ... once at the first restart
    assert w.off_refusal() is None  # nothing to end: its launcher keeps no survivors
    assert read_events(tmp_path / "events.jsonl", kind="survive_choice")[-1]["on"] is False


def test_status_gives_the_newest_choice(tmp_path, cli_inproc):
    from elastic_ring.events.api import SurviveChoice

    log = EventLog(tmp_path / "events.jsonl")
    assert sc.recorded(read_events(tmp_path / "events.jsonl")) == (None, None)
    log.write(sc.initial(None, "horovodrun", "overlap", "horovod", "cpu").event())
    rec, line = sc.recorded(read_events(tmp_path / "events.jsonl"))
    assert rec["on"] is False and line is None  # a launcher that cannot: no news in `status`
    log.write(sc.initial(None, "ray", "auto", "horovod", "cpu").event())
    assert sc.recorded(read_events(tmp_path / "events.jsonl"))[1].startswith("survive: measuring (")
    log.write(SurviveChoice(on=True, why="state copy 0.4% of a step, <= 2.0%", ratio=0.004))
    rec, line = sc.recorded(read_events(tmp_path / "events.jsonl"))
    assert rec == {"on": True, "why": "state copy 0.4% of a step, <= 2.0%", "ratio": 0.004, "forced": False}
    assert line == "survive: on (state copy 0.4% of a step, <= 2.0%)"
    (tmp_path / "run.json").write_text('{"total_steps": 10}')
    p = cli_inproc("status", str(tmp_path))
    assert p.returncode == 0 and line in p.stdout.splitlines(), p.stdout
    import json

    assert json.loads(cli_inproc("status", str(tmp_path), "--json").stdout)["survive"] == rec


def test_after_an_off_a_survivor_says_nothing(tmp_path, monkeypatch):
    from elastic_ring.worker.survive import rollback_word

    class HorovodInternalError(Exception):
        pass

    monkeypatch.setenv(survive.SURVIVE_ENV, "auto")
    protocol.control_dir(tmp_path).mkdir(parents=True)
    protocol.write_json_atomic(survive.choice_file(tmp_path), {"on": False})
    job = SimpleNamespace(ring=SimpleNamespace(in_place=True), run_dir=tmp_path, rank=0,
                          seg=SimpleNamespace(number=0, step=5))
    exc = HorovodInternalError("Horovod has been shut down: a peer was lost")
    assert survive._peer_loss(exc)
    assert rollback_word(exc, job, [4, 5]) is None
    assert not list(protocol.control_dir(tmp_path).glob("survivor-*"))  # no record: the controller's wait ends
