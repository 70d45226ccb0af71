"""elastic_ring.hosts.slurm: Slurm's node lists, task counts and an allocation's hosts."""

from __future__ import annotations

import pytest

from elastic_ring.hosts.api import HostsError
from elastic_ring.hosts.slurm import allocation, expand_counts, expand_nodelist, in_allocation


@pytest.mark.parametrize("text, nodes", [
    ("node01", ["node01"]),
    ("node[01-03,07],gpu-[1-2]", ["node01", "node02", "node03", "node07", "gpu-1", "gpu-2"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[08-11]", ["n08", "n09", "n10", "n11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("node[1-2]-ib,login", ["node1-ib", "node2-ib", "login"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("[1-2]x", ["1x", "2x"]),
    ("a,b.example.org,c_d", ["a", "b.example.org", "c_d"]),
    ("localhost,127.0.0.1", ["localhost", "127.0.0.1"]),
])
def test_expand_nodelist(text, nodes):
    assert expand_nodelist(text) == nodes


@pytest.mark.parametrize("text, needle", [
    ("", "empty"), ("a,,b", "an empty name"), ("n[1-3", "'[' without ']'"), ("n1-3]", "']' without '['"),
    ("n[[1]]", "nested"), ("n[]", "empty '[]'"), ("n[3-1]", "goes down"), ("n[a-b]", "is not N or N-M"),
    ("n[1-9999999]", "more than 65536 nodes"), ("bad name", "is not a node name"),
])
def test_expand_nodelist_refuses(text, needle):
    with pytest.raises(HostsError) as e:
        expand_nodelist(text)
    assert needle in str(e.value), str(e.value)


def test_expand_counts():
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert expand_counts("4") == [4] and expand_counts("1(x2)") == [1, 1]
    for bad in ("x", "2(x)", "2(3)", "", "2(x0)"):
        with pytest.raises(HostsError):
            expand_counts(bad)


def _env(**kw):
    return {"SLURM_JOB_ID": "4242", **kw}


def test_allocation_slots_from_tasks_gpus_or_one_per_node():
    assert allocation({}) is None and not in_allocation({}) and in_allocation(_env())
    a = allocation(_env(SLURM_JOB_NODELIST="node[01-03],gpu7", SLURM_TASKS_PER_NODE="2(x3),1"))
    assert a.hosts.pairs() == [("node01", 2), ("node02", 2), ("node03", 2), ("gpu7", 1)]
    assert a.line() == "Slurm job 4242: 4 nodes (node[01-03],gpu7), 7 slots from SLURM_TASKS_PER_NODE"
    g = _env(SLURM_JOB_NODELIST="g[1-2]", SLURM_TASKS_PER_NODE="1(x2)", SLURM_GPUS_ON_NODE="4")
    assert allocation(g).hosts.pairs() == [("g1", 4), ("g2", 4)] and allocation(g).slots_from == "SLURM_GPUS_ON_NODE"
    assert allocation(g, gpus=False).hosts.pairs() == [("g1", 1), ("g2", 1)]  # a CPU run: the tasks
    for per, n in (("4", 4), ("a100:2", 2), ("gpu:a100:8", 8), ("a100:2,v100:1", 3)):
        a = allocation(_env(SLURM_JOB_NODELIST="g1", SLURM_GPUS_PER_NODE=per))
        assert a.hosts.pairs() == [("g1", n)] and a.slots_from == "SLURM_GPUS_PER_NODE"
    one = allocation(_env(SLURM_NODELIST="solo"))  # the older name; no tasks or GPUs given
    assert one.hosts.pairs() == [("solo", 1)] and one.line().endswith("1 slot from one per node")


@pytest.mark.parametrize("env, needle", [
    (_env(), "SLURM_JOB_NODELIST is not"),
    (_env(SLURM_JOB_NODELIST="n[1-"), "SLURM_JOB_NODELIST='n[1-' does not parse"),
    (_env(SLURM_JOB_NODELIST="n[1-3]", SLURM_TASKS_PER_NODE="2(x2)"), "gives 2 counts for the 3 nodes"),
    (_env(SLURM_JOB_NODELIST="n1", SLURM_TASKS_PER_NODE="two"), "SLURM_TASKS_PER_NODE does not parse"),
    (_env(SLURM_JOB_NODELIST="n1", SLURM_GPUS_ON_NODE="x"), "SLURM_GPUS_ON_NODE='x'"),
    (_env(SLURM_JOB_NODELIST="n1,n1"), "listed twice"),
])
def test_allocation_refuses_variables_that_do_not_parse(env, needle):
    with pytest.raises(HostsError) as e:
        allocation(env)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_train_takes_its_hosts_from_the_allocation():
    """controller.prepare_hosts.with_slurm_hosts: what `train` does with a request inside an allocation."""
    from elastic_ring.controller.prepare_hosts import with_slurm_hosts
    from elastic_ring.controller.requests import RunRequest

    lines = []
    two = _env(SLURM_JOB_NODELIST="node[01-02]", SLURM_TASKS_PER_NODE="2(x2)")
    got = with_slurm_hosts(RunRequest(workers=4), lines.append, two)
    assert got.hosts == "node01:2,node02:2" and got.workers == 4
    assert lines == ["elastic-ring: Slurm job 4242: 2 nodes (node[01-02]), 4 slots from SLURM_TASKS_PER_NODE: "
                     "--hosts node01:2,node02:2 (--hosts, --hostfile or --slots to choose otherwise)"]
    here = _env(SLURM_JOB_NODELIST="localhost", SLURM_TASKS_PER_NODE="3")
    lines.clear()
    got = with_slurm_hosts(RunRequest(), lines.append, here)
    # this host as without Slurm (its cores or visible GPUs), not its task count
    assert got == RunRequest() and lines[0].endswith("3 slots from SLURM_TASKS_PER_NODE: this host (--slots to "
                                                     "choose how many workers it takes)"), lines
    gpu_here = _env(SLURM_JOB_NODELIST="localhost", SLURM_GPUS_ON_NODE="2")
    assert with_slurm_hosts(RunRequest(), lines.append, gpu_here) == RunRequest()  # the visible GPUs
    assert lines[-1].endswith("2 slots from SLURM_GPUS_ON_NODE: this host (--slots to choose how many workers "
                              "it takes)")
    lines.clear()
    for untouched in (RunRequest(hosts="a:1"), RunRequest(hostfile="hf"), RunRequest(slots=2),
                      RunRequest(backend="ray"), RunRequest(host_discovery_script="discover.sh")):
        assert with_slurm_hosts(untouched, lines.append, two) == untouched
    assert with_slurm_hosts(RunRequest(), lines.append, {}) == RunRequest() and lines == []


@pytest.mark.parametrize("req_kw, env, needle", [
    ({}, _env(SLURM_JOB_NODELIST="node[01-"), "inside a Slurm allocation, SLURM_JOB_NODELIST='node[01-' does "
                                              "not parse: '[' without ']' in 'node[01-' (give --hosts"),
    ({}, _env(SLURM_JOB_NODELIST="a,b", SLURM_TASKS_PER_NODE="0(x2)"), "Slurm job 4242 has no slots (a,b)"),
])
def test_train_in_an_allocation_refuses_in_one_line(req_kw, env, needle):
    from elastic_ring.controller.prepare_hosts import with_slurm_hosts
    from elastic_ring.controller.requests import RunRequest
    from elastic_ring.errors import UserError

    with pytest.raises(UserError) as e:
        with_slurm_hosts(RunRequest(**req_kw), print, env)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
