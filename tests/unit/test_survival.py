"""The one survivor agreement and blame every backend that keeps survivors uses
(:mod:`elastic_ring.controller.backends.survival`), without processes: the wait ends once every
member said or is gone, or at its limit; what refuses a shrink; the three blame rules (the gone
members' crash records, a failure the launcher blamed already, a lost node); and the base every
backend subclasses, whose defaults say it keeps no survivors."""

from __future__ import annotations

import time

import pytest

from elastic_ring import protocol
from elastic_ring.controller.backends import survival
from elastic_ring.controller.backends.api import Backend
from elastic_ring.seam import survivor_file


def _member(name, rank, gone=False, pid=None):
    state = {"gone": gone}
    return survival.Member(name, rank, lambda: state["gone"], pid=pid, who=state)


def _say(run_dir, name, held, pid=100, segment=0, t=None, digests=None):
    rec = {"member": name, "held": held, "pid": pid, "segment": segment, "time": time.time() if t is None else t}
    if digests:
        rec["digests"] = digests
    protocol.write_json_atomic(survivor_file(run_dir, name), rec)


@pytest.fixture
def run_dir(tmp_path):
    protocol.control_dir(tmp_path).mkdir(parents=True, exist_ok=True)
    return tmp_path


def test_the_wait_ends_once_every_member_said_or_is_gone(run_dir):
    members = [_member("w1", 0), _member("w2", 1, gone=True), _member("w3", 2)]
    _say(run_dir, "w1", [6, 7])
    _say(run_dir, "w3", [7, 8])
    t0 = time.time()
    h = survival.hear(run_dir, members, 0, since=t0 - 5, wait_s=10.0)
    assert time.time() - t0 < 2.0  # not the whole wait
    assert [m.name for m in h.alive] == ["w1", "w3"] and [m.name for m in h.gone] == ["w2"] and h.silent == 0
    assert (h.step, h.refused) == (7, None)
    assert not any(survivor_file(run_dir, n).exists() for n in ("w1", "w2", "w3"))  # read once


def test_the_wait_ends_when_every_member_is_gone(run_dir):
    t0 = time.time()
    h = survival.hear(run_dir, [_member("w1", 0, gone=True), _member("w2", 1, gone=True)], 0, t0, wait_s=10.0)
    assert time.time() - t0 < 2.0
    assert h.alive == [] and len(h.gone) == 2 and (h.step, h.refused) == (None, "no survivor is left")


def test_a_silent_member_makes_the_wait_last_its_limit_and_refuses(run_dir):
    _say(run_dir, "w1", [6, 7])
    t0 = time.time()
    h = survival.hear(run_dir, [_member("w1", 0), _member("w2", 1), _member("w3", 2, gone=True)], 0, t0 - 1,
                      wait_s=0.3)
    assert time.time() - t0 >= 0.3
    assert h.silent == 1 and h.step is None
    assert h.refused == "1 worker(s) neither said which steps they hold nor were gone within the wait"


def test_a_member_that_dies_during_the_wait_is_gone(run_dir):
    m = _member("w2", 1)
    _say(run_dir, "w1", [4, 5])

    def later():
        time.sleep(0.15)
        m.who["gone"] = True

    import threading

    threading.Thread(target=later).start()
    h = survival.hear(run_dir, [_member("w1", 0), m], 0, time.time() - 1, wait_s=5.0)
    assert [g.name for g in h.gone] == ["w2"] and h.step == 5


@pytest.mark.parametrize("case", ["stale", "other process"])
def test_a_record_of_another_process_or_an_older_failure_is_not_a_word(run_dir, case):
    t0 = time.time()
    _say(run_dir, "w1", [6, 7], pid=999 if case == "other process" else 100, t=t0 - 60 if case == "stale" else None)
    h = survival.hear(run_dir, [_member("w1", 0, pid=100), _member("w2", 1, gone=True)], 0, since=t0 - 5, wait_s=0.2)
    assert h.alive == [] and h.silent == 1 and h.step is None and h.refused.startswith("1 worker(s) neither said")


@pytest.mark.parametrize("case, refused", [
    ("other segment", "a survivor spoke of another segment (a failure at a resize)"),
    ("none gone", "no worker is gone"),
    ("no common step", "the survivors hold no step in common (they hold [3, 4]; [5, 6])"),
    ("copies differ", "the survivors' copies of step 7 differ (one's state is not the others')"),
])
def test_what_refuses_a_shrink(run_dir, case, refused):
    held = {"no common step": ([3, 4], [5, 6])}.get(case, ([6, 7], [6, 7]))
    digests = ({"7": "a"}, {"7": "b"}) if case == "copies differ" else (None, None)
    _say(run_dir, "w1", held[0], segment=1 if case == "other segment" else 0, digests=digests[0])
    _say(run_dir, "w2", held[1], digests=digests[1])
    members = [_member("w1", 0), _member("w2", 1), _member("w3", 2, gone=case != "none gone")]
    if case == "none gone":
        _say(run_dir, "w3", [6, 7])
    h = survival.hear(run_dir, members, 0, time.time() - 5, wait_s=0.5)
    assert (h.step, h.refused) == (None, refused)


def test_one_more_death_refuses_where_the_failure_was_blamed_already(run_dir):
    """The survivors of a failure the launcher blamed (the Ray ring): a member gone is one more
    death, a restart; the wait ends at once. Without it a gone member is the failure itself."""
    _say(run_dir, "w1", [6, 7])
    _say(run_dir, "w2", [6, 7])  # written, then its process died: gone, whatever it wrote
    t0 = time.time()
    h = survival.hear(run_dir, [_member("w1", 0), _member("w2", 1, gone=True), _member("w3", 2)], 0, t0 - 5,
                      wait_s=10.0, known_gone=1, gone_refuses=True)
    assert time.time() - t0 < 2.0 and (h.step, h.refused) == (None, "rank(s) [1] died too")
    _say(run_dir, "w1", [6, 7])
    h = survival.hear(run_dir, [_member("w1", 0)], 0, time.time() - 5, wait_s=0.5, known_gone=1, gone_refuses=True)
    assert (h.step, h.refused) == (7, None)  # the one the launcher blamed counts as gone
    _say(run_dir, "w1", [6, 7])
    h = survival.hear(run_dir, [_member("w1", 0)], 0, time.time() - 5, wait_s=0.5)
    assert (h.step, h.refused) == (None, "no worker is gone")


# ---------------------------------------------------------------------- blame
def _err(rank, kind="ValueError", message="ValueError: boom", peer_loss=False):
    return {"rank": rank, "type": kind, "message": message, "peer_loss": peer_loss, "step": 5}


PEER = dict(kind="RuntimeError", message="RuntimeError: Connection closed by peer", peer_loss=True)


def test_blame_an_own_error_before_a_silent_death_and_never_a_peer_loss():
    gone = [_member("w1", 0), _member("w3", 2)]
    # rank 0 only lost a peer, rank 2 raised: rank 2, with its record
    f = survival.blame(gone, [_err(0, **PEER), _err(2)])
    assert (f.rank, f.type, f.message, f.step) == (2, "ValueError", "ValueError: boom", 5)
    # no record of rank 2: its death without one
    f = survival.blame(gone, [_err(0, **PEER)])
    assert (f.rank, f.type) == (2, "Killed")
    assert f.message == "worker rank 2 died (its process is gone, no error reported)"
    # both silent: the lowest rank
    assert survival.blame(list(reversed(gone)), []).rank == 0
    # a rank's own error counts even when a peer-loss record of it came later
    assert survival.blame([_member("w1", 0)], [_err(0), _err(0, **PEER)]).type == "ValueError"
    # every gone member only lost a peer: no rank
    f = survival.blame(gone, [_err(0, **PEER), _err(2, **PEER)])
    assert (f.rank, f.type) == (None, "PeerLost") and f.message == "rank(s) 0, 2 only lost a peer"


def test_blame_keeps_the_failure_the_launcher_blamed_and_names_a_lost_nodes_ranks():
    blamed = protocol.Failure(1, "ActorUnavailableError", "worker rank 1 on Ray node n1 failed", node="n1")
    assert survival.blame([], [], blamed=blamed) == blamed
    f = survival.blame([_member("w1", 0)], [_err(0)], blamed=blamed, lost=[1, 2])
    assert (f.rank, f.type, f.node) == (1, "ActorUnavailableError", "n1")
    assert f.message == "worker rank 1 on Ray node n1 failed: rank(s) 1, 2 on it lost"
    f = survival.blame([_member("w2", 1)], [], lost=[1])  # a lost node without a launcher's blame
    assert f.rank == 1 and f.message.endswith(": rank(s) 1 on it lost")


# ---------------------------------------------------------------------- the base of every backend
def test_every_backend_subclasses_the_base_and_a_plain_one_keeps_no_survivors():
    from elastic_ring.controller.backends.elastic import ElasticBackend
    from elastic_ring.controller.backends.horovodrun import HorovodrunBackend
    from elastic_ring.controller.backends.local import LocalBackend, LocalRingBackend
    from elastic_ring.controller.backends.ray import RayBackend
    from elastic_ring.controller.backends.torch_hosts import TorchHostsBackend

    for cls in (ElasticBackend, HorovodrunBackend, LocalBackend, LocalRingBackend, RayBackend, TorchHostsBackend):
        assert issubclass(cls, Backend), cls
    b = Backend()
    assert b.survivors() is None and b.refused is None and b.rejoins is False
    assert b.end_ranks([1]) is False and b.heal_target() is None
    assert LocalRingBackend.rejoins and ElasticBackend.rejoins and not RayBackend.rejoins
    assert RayBackend.heal_target is not Backend.heal_target and LocalBackend.heal_target is Backend.heal_target


def test_the_segment_log_lines(tmp_path):
    from elastic_ring.controller.backends.api import describe, note

    log = tmp_path / "logs" / "segment-000-w2.log"
    note(log, describe("local", 0, ["rank 0: w1 pid 5", "rank 1: w2 pid 6"]))
    note(log, "second")
    assert log.read_text() == "[local] segment 0: 2 worker(s): rank 0: w1 pid 5, rank 1: w2 pid 6\nsecond\n"


def test_a_silent_actor_writes_its_threads_stacks_to_its_log_when_asked(tmp_path):
    """What the Ray backend does with a survivor that said nothing within the wait: the actor's
    process registered faulthandler as WorkerActor.run does (its stderr is its log), and
    :func:`survival.dump_stacks` makes it write where each thread stood; a pid that is gone is skipped."""
    import subprocess
    import sys

    log = tmp_path / "ray-w1.log"
    child = tmp_path / "actor.py"
    child.write_text(
        "import time\n"
        "from elastic_ring.controller.backends.ray_worker import _stacks_on_signal\n"
        "_stacks_on_signal()\n"
        "def stuck_in_its_collective():\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(60)\n"
        "stuck_in_its_collective()\n")
    with open(log, "w") as err:
        p = subprocess.Popen([sys.executable, str(child)], stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        assert survival.dump_stacks([p.pid], settle_s=0.5) == [p.pid]
        deadline = time.time() + 10
        while "stuck_in_its_collective" not in log.read_text() and time.time() < deadline:
            time.sleep(0.05)
        text = log.read_text()
        assert "stuck_in_its_collective" in text and "actor.py" in text, text
        assert p.poll() is None  # it dumped and went on; the restart ends it
    finally:
        p.kill()
        p.wait()
    assert survival.dump_stacks([p.pid], settle_s=0.0) == []  # reaped: nothing to ask
