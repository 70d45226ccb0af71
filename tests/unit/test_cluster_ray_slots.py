"""The scheduler's slots from a Ray cluster (``cluster up --ray``), with fake ``ray.nodes()`` and
``ray.available_resources()`` (no Ray): nodes that join and leave change the capacity; the
scheduler decides again, grows a job onto a new node, takes back the slots of a job that restarted
on fewer workers, never hands out more slots than the nodes hold, and waits for what Ray can place."""

from __future__ import annotations

import dataclasses

from elastic_ring.cluster.api import ClusterConfig, JobState
from elastic_ring.cluster.ray_slots import Capacity, FixedSlots, Node, RaySlots, free_slots, node_slots, slot_source
from elastic_ring.cluster.runner import ProcessRunner
from elastic_ring.cluster.scheduler import Scheduler
from elastic_ring.cluster.store import Store
from elastic_ring.sched import make_policy
from tests.unit.test_cluster_scheduler import FakeRunner, _submit


def _node(i: int, cpus: float = 1, gpus: float = 0, alive: bool = True) -> dict:
    res = {"CPU": cpus, "memory": 1e9, **({"GPU": gpus} if gpus else {})}
    return {"NodeID": f"{i:02d}" + "ab" * 20, "NodeManagerAddress": "10.0.0.1", "Alive": alive, "Resources": res}


class FakeRay:
    """The cluster a test changes: its nodes, and the CPUs not held (None: all of them)."""

    def __init__(self, *nodes: dict) -> None:
        self.nodes = list(nodes)
        self.free: float | None = None

    def source(self, device: str = "cpu") -> RaySlots:
        return RaySlots("fake", device, nodes=lambda: list(self.nodes), available=self.available)

    def available(self) -> dict[str, float]:
        total = sum(n["Resources"]["CPU"] for n in self.nodes if n["Alive"])
        return {"CPU": total if self.free is None else self.free}


class ElasticRunner(FakeRunner):
    """The fake runner, plus a job's controller that restarts (after a node loss) at a size."""

    def __init__(self, lag: int = 2) -> None:
        super().__init__(lag)
        self.restarts: dict[int, int] = {}

    def restart(self, jid: int, world: int) -> None:
        fj = self.jobs[jid]
        fj.world, fj.pending = world, None
        fj.launches += 1
        self.restarts[jid] = self.restarts.get(jid, 0) + 1

    def observe(self, job):
        return dataclasses.replace(super().observe(job), restarts=self.restarts.get(job["id"], 0))


def _setup(tmp_path, ray: FakeRay, policy: str = "precompute"):
    store = Store(tmp_path, create=True, clock=lambda: 0.0)
    cfg = ClusterConfig(hosts=(), policy=policy, ray="fake")
    runner = ElasticRunner()
    clock = iter(range(10 ** 6))
    sched = Scheduler(store, cfg, make_policy(policy), runner, rate_for=lambda j: (lambda w: float(w) ** 0.9),
                      clock=lambda: float(next(clock)), slots=ray.source())
    return store, runner, sched


def _held(store) -> int:
    return sum(len(j["slots"]) for j in store.jobs(active_only=True))


def _ticks(sched, store, n: int) -> None:
    for _ in range(n):
        sched.tick()
        held = [s for j in store.jobs() for s in j["slots"]]
        assert len(held) == len(set(held)), f"a slot held twice: {held}"


def test_node_slots_count_alive_nodes_cpus_or_gpus():
    nodes = [_node(2, cpus=4), _node(1, cpus=3.5, gpus=2), _node(3, cpus=8, alive=False)]
    cpu = node_slots(nodes, "cpu")
    assert [n.slots for n in cpu] == [3, 4]  # the dead node left out; sorted by name (id 01 first)
    assert cpu[0].name == "10.0.0.1/01" + "ab" * 5 and len(cpu[0].name.split("/")[1]) == 12
    assert [n.slots for n in node_slots(nodes, "cuda")] == [2, 0]
    assert [n.slots for n in node_slots(nodes, "cpu", cpus_per_slot=2)] == [1, 2]
    assert free_slots({"CPU": 2.5, "GPU": 1}, "cpu") == 2 and free_slots({"CPU": 2.5, "GPU": 1}, "cuda") == 1
    assert free_slots({}, "cuda") == 0


def test_capacity_follows_nodes_that_join_and_leave():
    ray = FakeRay(_node(1))
    src = ray.source()
    assert src.elastic and src.live_resize and src.connect() == "fake"
    assert src.capacity().total == 1
    ray.nodes.append(_node(2, cpus=2))
    assert src.capacity().total == 3 and src.capacity().free == 3
    ray.nodes[0]["Alive"] = False  # Ray found it dead
    assert src.capacity().total == 2
    ray.free = 1
    cap = src.capacity()
    assert cap.can_place(1) and not cap.can_place(2) and not cap.placed(1).can_place(1)


def test_fixed_slots_unchanged():
    cfg = ClusterConfig(hosts=(("a", 2), ("b", 3)))
    src = slot_source(cfg)
    assert isinstance(src, FixedSlots) and not src.elastic and not src.live_resize  # several hosts
    assert src.capacity() == Capacity((Node("a", 2), Node("b", 3))) and src.capacity().can_place(10 ** 6)
    assert slot_source(ClusterConfig(hosts=(("localhost", 4),))).live_resize
    assert isinstance(slot_source(ClusterConfig(hosts=(), ray="")), RaySlots)


def test_a_node_that_joins_grows_the_job_onto_it(tmp_path):
    ray = FakeRay(_node(1))
    store, runner, sched = _setup(tmp_path, ray)
    jid = _submit(store, "a", 10 ** 6, max_workers=2)
    sched.recover()
    _ticks(sched, store, 3)
    assert store.job(jid)["slots"] == [0] and runner.starts == [(jid, 1, False)]
    ray.nodes.append(_node(2))
    _ticks(sched, store, 6)
    j = store.job(jid)
    assert j["slots"] == [0, 1] and j["resize_to"] is None and runner.jobs[jid].world == 2
    assert [d["cause"] for d in store.decisions()][-1] == "capacity"
    assert store.get_meta("nodes") == [[n.name, 1] for n in node_slots(ray.nodes, "cpu")]
    kinds = [e["kind"] for e in store.events(jid)]
    assert kinds.index("resize_requested") < kinds.index("resized")


def test_a_node_that_leaves_takes_back_the_slots_of_the_job_that_restarted_smaller(tmp_path):
    ray = FakeRay(_node(1), _node(2), _node(3), _node(4))
    store, runner, sched = _setup(tmp_path, ray)
    a, b = _submit(store, "a", 10 ** 6, max_workers=2), _submit(store, "b", 10 ** 6, max_workers=2)
    sched.recover()
    _ticks(sched, store, 3)
    assert [store.job(x)["slots"] for x in (a, b)] == [[0, 1], [2, 3]]
    del ray.nodes[0]  # a node of a leaves: 3 slots for 4 held
    _ticks(sched, store, 1)
    assert sched.slots == 3 and store.decisions()[-1]["cause"] == "capacity"
    assert sum(store.decisions()[-1]["allocation"].values()) == 3
    runner.restart(a, 1)  # a's Ray backend restarted it on 1 worker
    _ticks(sched, store, 2)
    ev = [e for e in store.events(a) if e["kind"] == "restarted_smaller"]
    assert len(ev) == 1 and ev[0]["data"] == {"workers": 1, "slots": [0]}
    assert store.job(a)["slots"] == [0] and store.job(a)["resize_to"] is None
    _ticks(sched, store, 10)
    assert _held(store) == sched.slots == 3 and all(store.job(x)["state"] == JobState.RUNNING for x in (a, b))
    assert sorted(runner.jobs[x].world for x in (a, b)) == [1, 2]
    assert not [e for e in store.events(b) if e["kind"] == "restarted_smaller"]


def test_a_restart_during_a_resize_ends_the_resize(tmp_path):
    ray = FakeRay(_node(1))
    store, runner, sched = _setup(tmp_path, ray)
    runner.lag = 10 ** 6  # the grow never completes by itself
    jid = _submit(store, "a", 10 ** 6, max_workers=2)
    sched.recover()
    _ticks(sched, store, 2)
    ray.nodes.append(_node(2))
    _ticks(sched, store, 2)
    assert store.job(jid)["resize_to"] == 2
    del ray.nodes[1]
    runner.restart(jid, 1)  # the new node died mid-grow: the job relaunched on 1 worker
    _ticks(sched, store, 2)
    j = store.job(jid)
    assert j["resize_to"] is None and j["slots"] == [0]


def test_a_start_waits_for_what_ray_can_place(tmp_path):
    ray = FakeRay(_node(1), _node(2))
    ray.free = 1  # one CPU held outside the scheduler's accounts (another Ray user, a shrink's bundle)
    store, runner, sched = _setup(tmp_path, ray)
    jid = _submit(store, "a", 10 ** 6, min_workers=2, max_workers=2)
    sched.recover()
    _ticks(sched, store, 3)
    assert store.job(jid)["target"] == 2 and store.job(jid)["state"] == JobState.QUEUED and not runner.starts
    ray.free = 2
    _ticks(sched, store, 2)
    assert runner.starts == [(jid, 2, False)]


def test_no_slots_no_decision_until_a_node_joins(tmp_path):
    ray = FakeRay(_node(1, cpus=0))  # a head without CPUs
    store, runner, sched = _setup(tmp_path, ray, policy="eight")
    jid = _submit(store, "a", 100)
    sched.recover()
    _ticks(sched, store, 3)
    assert sched.slots == 0 and not runner.starts
    ray.nodes.append(_node(2, cpus=4))
    _ticks(sched, store, 3)
    assert runner.starts == [(jid, 4, False)]


def test_ray_jobs_run_train_on_the_same_cluster_without_pinning(tmp_path):
    cfg = ClusterConfig(hosts=(("10.0.0.1/ab", 2),), ray="", device="cuda")
    r = ProcessRunner(tmp_path, cfg, ray_address="10.0.0.1:6379")
    store = Store(tmp_path, create=True)
    jid = _submit(store, "a", 50)
    cmd, env = r.command(store.job(jid), [0, 1], 2, resume=False)
    i = cmd.index("--backend")
    assert cmd[i:i + 6] == ["--backend", "ray", "--ray-address", "10.0.0.1:6379", "--warm-spares", "0"]
    assert cmd[cmd.index("--slots") + 1] == "1024" and "--hosts" not in cmd
    assert r.cores([0, 1]) == set()
    assert env.get("CUDA_VISIBLE_DEVICES") == __import__("os").environ.get("CUDA_VISIBLE_DEVICES")
    jid2 = _submit(store, "b", 50, max_workers=3)
    cmd, _ = r.command(store.job(jid2), [0], 1, resume=True)
    assert cmd[cmd.index("--slots") + 1] == "3" and "--resume" in cmd and "ray" in cmd


def test_an_address_where_nothing_listens_is_one_line_at_once():
    import socket

    import pytest

    from elastic_ring.cluster.api import ClusterError

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(ClusterError, match=f"cannot connect to Ray at 127.0.0.1:{port}"):
        RaySlots(f"127.0.0.1:{port}").connect()


def test_a_survived_failure_is_seen_as_a_shrink_and_the_freed_slot_goes_to_the_policy(tmp_path):
    """A Ray job with ``--survive`` loses a worker, no node leaves. Its run folder says so as for a
    restart: a ``restart`` event (path memory) and the survivors' launch at 1 worker, which the runner
    reads as a restart at 1; a later grow is a launch at 2 and no restart. The scheduler takes back
    the slot the job no longer uses (``restarted_smaller``), the policy decides again (cause
    ``restart``) and gives it back by a resize, which the job takes as any grow."""
    from elastic_ring.cluster.api import job_dir
    from elastic_ring.events.api import EventLog, Launch, Restart

    ray = FakeRay(_node(1), _node(2))
    store, runner, sched = _setup(tmp_path, ray)
    a = _submit(store, "a", 10 ** 6, max_workers=2)
    log = EventLog(job_dir(tmp_path, a) / "events.jsonl")
    reader = ProcessRunner(tmp_path, ClusterConfig(hosts=(), ray="fake"))

    def launch(seg: int, world: int) -> None:
        log.write(Launch(segment=seg, world_size=world, start_step=1, stop_step=100, command=["ray"], device="cpu"))

    launch(0, 2)
    log.write(Restart(attempt=1, cause="worker rank 1 failed", rank=1, returncode=1, segment=0, world_size=2,
                      from_step=6, failed_at_step=6, steps_redone=0, new_world_size=1, path="memory"))
    launch(1, 1)
    obs = reader.observe(store.job(a))
    assert (obs.world_size, obs.restarts, obs.launches) == (1, 1, 2)
    launch(2, 2)  # the grow back
    obs = reader.observe(store.job(a))
    assert (obs.world_size, obs.restarts, obs.launches) == (2, 1, 3)

    sched.recover()
    _ticks(sched, store, 3)
    assert store.job(a)["slots"] == [0, 1] and runner.jobs[a].world == 2
    runner.restart(a, 1)  # its survivor went on alone
    _ticks(sched, store, 1)
    ev = [e for e in store.events(a) if e["kind"] == "restarted_smaller"]
    assert len(ev) == 1 and ev[0]["data"] == {"workers": 1, "slots": [0]}
    assert "restart" in [d["cause"] for d in store.decisions()]
    _ticks(sched, store, 6)
    kinds = [e["kind"] for e in store.events(a)]
    assert kinds.index("restarted_smaller") < kinds.index("resize_requested") < kinds.index("resized")
    assert store.job(a)["slots"] == [0, 1] and runner.jobs[a].world == 2 and _held(store) == 2

    # again, where Ray shows the CPU as held (the job's placement group keeps the failed worker's
    # bundle): the scheduler cannot grow it, and the job grows back by itself into that bundle
    ray.free = 0
    runner.restart(a, 1)
    _ticks(sched, store, 2)
    assert store.job(a)["slots"] == [0] and store.job(a)["resize_to"] is None
    runner.jobs[a].world = 2
    _ticks(sched, store, 1)
    ev = [e for e in store.events(a) if e["kind"] == "resized"]
    assert ev[-1]["data"] == {"workers": 2, "slots": [0, 1]} and store.job(a)["slots"] == [0, 1]
    _ticks(sched, store, 3)
    assert store.job(a)["slots"] == [0, 1] and _held(store) == 2
