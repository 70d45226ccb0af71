"""The launcher's cached build check (elastic_ring.controller.hvdrun), without processes."""

from __future__ import annotations

import json
import sys
import sysconfig

from elastic_ring.controller import hvdrun
from elastic_ring.hvd_patches import apply


class Asker:
    """Stands for Horovod's gloo_built: counts the questions, gives a fixed answer."""

    def __init__(self, answer):
        self.answer, self.calls = answer, 0

    def __call__(self, verbose=False):
        self.calls += 1
        return self.answer


def test_a_yes_is_asked_once_per_install(tmp_path, monkeypatch):
    path = tmp_path / "c" / "horovod-build.json"
    key = {"k": "install-1"}
    monkeypatch.setattr(hvdrun, "install_key", lambda: key["k"])
    real = Asker(True)
    check = hvdrun.cached_check(real, path)
    assert check() is True and check() is True and real.calls == 1
    assert json.loads(path.read_text()) == {"install-1": True}
    # a fresh process (a new cached_check on the same file) does not ask again
    assert hvdrun.cached_check(real, path)() is True and real.calls == 1
    key["k"] = "install-2"  # Horovod reinstalled: asked again, both remembered
    assert check() is True and real.calls == 2
    assert json.loads(path.read_text()) == {"install-1": True, "install-2": True}


def test_a_no_is_not_remembered(tmp_path, monkeypatch):
    path = tmp_path / "horovod-build.json"
    monkeypatch.setattr(hvdrun, "install_key", lambda: "k")
    real = Asker(False)
    check = hvdrun.cached_check(real, path)
    assert not check() and not check() and real.calls == 2 and not path.exists()


def test_a_corrupt_cache_file_is_asked_again_and_rewritten(tmp_path, monkeypatch):
    path = tmp_path / "horovod-build.json"
    path.write_text("{not json")
    monkeypatch.setattr(hvdrun, "install_key", lambda: "k")
    real = Asker(True)
    assert hvdrun.cached_check(real, path)() is True and real.calls == 1
    assert json.loads(path.read_text()) == {"k": True}


def test_install_key_names_the_torch_extension_and_changes_with_it(tmp_path, monkeypatch):
    key = hvdrun.install_key()
    assert "horovod 0.28.1" in key and "mpi_lib_v2" in key and sys.executable in key
    import horovod

    ext = tmp_path / "horovod" / "torch" / ("mpi_lib_v2" + sysconfig.get_config_var("EXT_SUFFIX"))
    ext.parent.mkdir(parents=True)
    ext.write_bytes(b"x")
    monkeypatch.setattr(horovod, "__file__", str(tmp_path / "horovod" / "__init__.py"))
    first = hvdrun.install_key()
    assert str(ext) in first and first != key
    ext.write_bytes(b"xy")  # rebuilt: another size
    assert hvdrun.install_key() != first


def test_command_prefix_and_the_plain_horovodrun_switch(monkeypatch):
    monkeypatch.delenv("ELASTIC_RING_PLAIN_HOROVODRUN", raising=False)
    assert hvdrun.command_prefix() == [sys.executable, "-m", "elastic_ring.controller.hvdrun"]
    monkeypatch.setenv("ELASTIC_RING_PLAIN_HOROVODRUN", "1")
    assert hvdrun.command_prefix()[-1].endswith("horovodrun")


def test_cache_path_follows_elastic_ring_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTIC_RING_CACHE", str(tmp_path))
    assert hvdrun.cache_path() == tmp_path / "horovod-build.json"


def test_the_driver_reads_the_controllers_host_list_itself_and_runs_other_scripts(tmp_path, monkeypatch):
    from horovod.runner.elastic import discovery, driver

    from elastic_ring.controller.backends.elastic import discovery_files, elastic_horovodrun_command, write_hosts

    class Spec:
        run_dir, slots, script, script_args = tmp_path, 2, None, []

    monkeypatch.setattr(discovery.HostDiscoveryScript, "_execute_discovery_script",
                        discovery.HostDiscoveryScript._execute_discovery_script)
    monkeypatch.setattr(driver, "DISCOVER_HOSTS_FREQUENCY_SECS", driver.DISCOVER_HOSTS_FREQUENCY_SECS)
    monkeypatch.setattr("elastic_ring.controller.backends.elastic.worker_args", lambda *a: [])
    elastic_horovodrun_command(Spec, 1, 1, 10)
    script, hosts = discovery_files(tmp_path)
    other = tmp_path / "other.sh"
    other.write_text("#!/bin/sh\necho otherhost:3\n")
    other.chmod(0o755)
    assert hvdrun.hosts_file_of(script) == hosts and hvdrun.hosts_file_of(other) is None
    apply("discovery")
    apply("discovery")  # twice: still one layer
    assert discovery.HostDiscoveryScript(str(other), 1).find_available_hosts_and_slots() == {"otherhost": 3}
    assert driver.DISCOVER_HOSTS_FREQUENCY_SECS == 1.0  # another script: Horovod's own interval
    ours = discovery.HostDiscoveryScript(str(script), 1)
    assert ours.find_available_hosts_and_slots() == {"localhost": 1}
    write_hosts(tmp_path, 2)
    assert ours.find_available_hosts_and_slots() == {"localhost": 2}
    assert driver.DISCOVER_HOSTS_FREQUENCY_SECS == hvdrun.DISCOVERY_POLL_S


def test_the_late_exit_of_a_worker_whose_slot_was_removed_is_not_its_next_workers_failure(monkeypatch):
    """A shrink removes slot 1, a grow gives it back and a new worker starts there; then the old
    worker's abort is handled: ignored (it would have blacklisted the host). The new worker's own
    failure, and a worker whose slot was never removed, still count."""
    from collections import namedtuple

    from horovod.runner.elastic.driver import ElasticDriver

    Slot = namedtuple("Slot", "hostname local_rank")

    class Fake:  # the three methods the patches wrap, as Horovod's ElasticDriver has them, minus the processes
        def _start_worker_process(self, slot_info):
            self.started.append(slot_info)

        def _update_host_assignments(self, current_hosts):
            self._host_assignments = {"localhost": [Slot("localhost", i) for i in range(current_hosts)]}
            return []

        def _handle_worker_exit(self, slot_info, exit_code, timestamp):
            self.exits.append((slot_info.local_rank, exit_code))

    class Driver(ElasticDriver):  # Horovod's class, patched, without its constructor's thread
        def __init__(self):
            self._host_assignments, self.exits, self.started = {}, [], []

    for name in ("_start_worker_process", "_update_host_assignments", "_handle_worker_exit"):
        monkeypatch.setattr(ElasticDriver, name, getattr(Fake, name))
    apply("start_worker", "update_assignments", "worker_exit")
    apply("start_worker", "update_assignments", "worker_exit")  # once
    d = Driver()
    d._update_host_assignments(2)
    old0, old1 = d._host_assignments["localhost"]
    d._start_worker_process(old0)
    d._start_worker_process(old1)
    d._update_host_assignments(1)  # the shrink: slot 1 removed
    d._update_host_assignments(2)  # the grow: slot 1 back, a new worker there
    new1 = d._host_assignments["localhost"][1]
    d._start_worker_process(new1)
    d._handle_worker_exit(old1, 134, 0.0)  # the old worker's late abort
    assert d.exits == []
    d._handle_worker_exit(old1, 134, 0.0)  # (once retired, once ignored: then as before)
    d._handle_worker_exit(new1, 1, 0.0)
    d._handle_worker_exit(old0, 1, 0.0)
    assert d.exits == [(1, 134), (1, 1), (0, 1)]
