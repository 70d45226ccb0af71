"""The environment variables elastic-ring reads, one accessor each (elastic_ring.env): defaults,
parsing, and that no other module reads the environment itself."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import elastic_ring
from elastic_ring import env


def test_defaults_when_nothing_is_set():
    e: dict[str, str] = {}
    assert env.device(e) == "cpu" and env.collective(e) == "" and env.ring_mode(e) is None
    assert not env.survive(e) and not env.slot_hosts(e) and not env.started_by_elastic_ring(e)
    assert env.member(e) is None and env.member(e, default="3") == "3" and env.store(e) is None
    assert env.cpu_threads(e) is None and env.stop_latency_ms(e) is None and env.steps(e) is None
    assert env.launched_at(e) is None and env.process_start(e) is None
    assert env.tensorboard_on(e) and env.tensorboard_dir(e) is None and env.cluster_dir(e) == "cluster"
    assert env.cache_dir(e).endswith(".cache/elastic-ring") and env.ps_fail(e) is None
    assert env.horovod_ranks(e) is None and env.torch_ranks(e) is None and env.launcher_rank(e) is None
    assert env.master_addr(e) == "127.0.0.1" and env.master_port(e) is None and env.take_store_fd(e) is None


def test_values_are_parsed_as_the_workers_use_them():
    e = {env.SURVIVE: "1", env.SLOT_HOSTS: "0", env.INPLACE: env.RING_BY_CONTROLLER, env.MEMBER: "w2",
         env.COLLECTIVE: " torch ", env.CPU_THREADS: "0", env.STOP_LATENCY_MS: "250", env.STEPS: "40",
         env.LAUNCHED_AT: "12.5", env.PROCESS_START: "x", env.PS_FAIL: "1", env.TENSORBOARD: "0"}
    assert env.survive(e) and not env.slot_hosts(e) and env.ring_mode(e) == "controller"
    assert env.member(e, default="0") == "w2" and env.collective(e) == "torch"
    assert env.cpu_threads(e) == 1 and env.stop_latency_ms(e) == 250 and env.steps(e) == 40
    assert env.launched_at(e) == 12.5 and env.process_start(e) is None  # not a number: as unset
    assert env.ps_fail(e) == (1, 1) and not env.tensorboard_on(e)
    assert env.cpu_threads({env.CPU_THREADS: "many"}) is None and env.cpu_threads({env.CPU_THREADS: "3"}) == 3


@pytest.mark.parametrize("raw", ["-1", "soon", "1.5"])
def test_a_bad_stop_latency_is_one_line_naming_the_variable(raw):
    with pytest.raises(ValueError) as e:
        env.stop_latency_ms({env.STOP_LATENCY_MS: raw})
    assert str(e.value) == f"{env.STOP_LATENCY_MS}={raw!r}: give whole milliseconds >= 0"


def test_launch_variables():
    hvd = {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2"}
    assert env.horovod_ranks(hvd) == (1, 4, 1, 2) and env.horovod_ranks({"HOROVOD_RANK": "1"}) is None
    tr = {"RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "0"}
    assert env.torch_ranks(tr) is None and env.missing_torch_keys(tr) == ["LOCAL_WORLD_SIZE"]
    assert env.torch_ranks({**tr, "LOCAL_WORLD_SIZE": "1"}) == (2, 3, 0, 1)
    assert env.launcher_rank({"OMPI_COMM_WORLD_RANK": "5", "RANK": "6"}) == 5
    assert env.launcher_rank({"HOROVOD_RANK": "x"}) is None and env.master_port({"MASTER_PORT": "29a"}) is None
    assert env.launched_by_torchrun({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    assert env.launched_by_horovodrun({"PMI_RANK": "0"}) and not env.launched_by_horovodrun(tr)


def test_the_rendezvous_socket_is_taken_once():
    e = {env.STORE_FD: "7"}
    assert env.store_fd_given(e) and env.take_store_fd(e) == 7
    assert not env.store_fd_given(e) and env.take_store_fd(e) is None


def test_the_process_environment_is_read_at_the_call(monkeypatch):
    monkeypatch.delenv(env.SURVIVE, raising=False)
    assert not env.survive()
    monkeypatch.setenv(env.SURVIVE, "1")
    monkeypatch.setenv(env.MEMBER, "w7")
    assert env.survive() and env.member() == "w7"


def test_no_other_module_reads_the_environment_itself():
    """Reads go through elastic_ring.env (a function taking a mapping may default it to
    ``os.environ``, and the environment may be written or handed on whole)."""
    read = re.compile(r"os\.environ\.get\(|os\.getenv\(|os\.environ\[[^\]]+\](?!\s*=[^=])| in os\.environ\b(?!\.)")
    root = Path(elastic_ring.__file__).parent
    found = [f"{p.relative_to(root)}:{i}: {line.strip()}" for p in sorted(root.rglob("*.py")) if p.name != "env.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if read.search(line)]
    assert found == []
