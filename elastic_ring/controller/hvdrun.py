"""``horovodrun``, with Horovod's build check asked once per install instead of at every launch.

``python -m elastic_ring.controller.hvdrun ARGS`` is ``horovodrun ARGS``: it runs Horovod's own
launcher (``horovod.runner.launch.run_commandline``) on the same arguments, and nothing else
changes. The one difference: before it starts any worker, horovodrun asks whether Horovod was built
with Gloo (``horovod.common.util.gloo_built``) by forking a process that imports the framework's
extension, torch included. On two CPU cores that takes 1.7 s (1.5 s of CPU) of every launch, on the
critical path of every relaunch and resize. Here a "yes" is remembered per installed extension (its
path, size and modification time; a reinstalled Horovod asks again) in
``$ELASTIC_RING_CACHE/horovod-build.json`` (default ``~/.cache/elastic-ring``). A "no" is not
remembered: Horovod's own error follows, as from horovodrun.

Under Horovod Elastic (``--relaunch inplace``) a second difference: when the host discovery script
is the one the controller wrote (it only prints ``control/hosts``), the driver reads that file
itself, every 0.05 s, instead of running the script in a subprocess once a second. The paused
workers of an in-place resize wait for the driver to see the new host list; a file read is cheap
enough to poll often, so they wait tens of milliseconds instead of up to a second. Another
discovery script is run as horovodrun runs it.

With ``--survive`` (``ELASTIC_RING_SURVIVE=1`` in its environment) a third: a worker's failure no
longer blacklists its host (on one host that would end the job). The survivors go on in their
processes, and the controller shrinks the slot count in the host list (:func:`keep_hosts_on_failure`).

The controller uses it for every segment; ``ELASTIC_RING_PLAIN_HOROVODRUN=1`` makes it launch the
plain ``horovodrun`` instead (for comparisons: ``scripts/bench_launcher.py``).
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from pathlib import Path

CACHE_FILE = "horovod-build.json"


def cache_path() -> Path:
    from elastic_ring.data.check import machine_cache_root

    return machine_cache_root() / CACHE_FILE


def install_key() -> str:
    """Identifies the installed Horovod extensions: what ``gloo_built`` would load, as found on disk."""
    import horovod

    pkg = Path(horovod.__file__).parent
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    parts = [f"horovod {horovod.__version__}", sys.executable]
    for rel in ("tensorflow/mpi_lib", "torch/mpi_lib_v2", "mxnet/mpi_lib"):
        f = pkg / (rel + suffix)
        try:
            st = f.stat()
        except OSError:
            continue
        parts.append(f"{f}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def cached_check(real, path: Path | None = None):
    """``real`` (Horovod's ``gloo_built``) behind the cache: a remembered yes, or ask and remember it."""
    path = path or cache_path()

    def gloo_built(verbose: bool = False):
        key = install_key()
        if _read(path).get(key) is True:
            return True
        answer = real(verbose=verbose)
        if answer:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                data = _read(path)
                data[key] = True
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps(data, indent=1) + "\n")
                os.replace(tmp, path)
            except OSError:
                pass  # a read-only home: ask every time, as horovodrun does
        return answer

    return gloo_built


def command_prefix(plain: bool | None = None) -> list[str]:
    """How the controller starts horovodrun: this module, or the plain script where asked
    (``plain``; by default ``ELASTIC_RING_PLAIN_HOROVODRUN=1``)."""
    if plain is None:
        plain = os.environ.get("ELASTIC_RING_PLAIN_HOROVODRUN") == "1"
    if plain:
        hr = Path(sys.executable).parent / "horovodrun"
        return [str(hr) if hr.exists() else "horovodrun"]
    return [sys.executable, "-m", "elastic_ring.controller.hvdrun"]


DISCOVERY_POLL_S = 0.05  # how often the driver reads the controller's host list


def discovery_script_text(hosts: Path) -> str:
    """The discovery script of ``--relaunch inplace``: it prints the hosts file (the horovodrun this
    tool starts reads that file itself instead: :func:`read_hosts_directly`)."""
    return f"#!/bin/sh\ncat '{hosts}'\n"


def hosts_file_of(script: str | os.PathLike) -> Path | None:
    """The file the controller's discovery script prints (``cat 'FILE'``), or None when the script
    is another one."""
    try:
        text = Path(script).read_text()
    except (OSError, ValueError):
        return None
    hosts = Path(script).with_name("hosts")
    return hosts if text == discovery_script_text(hosts) else None


def read_hosts_directly() -> None:
    """Horovod Elastic's driver reads the controller's host list itself, often (see the module
    docstring); any other discovery script runs as before, at Horovod's own interval."""
    from horovod.runner.elastic import discovery, driver

    run_script = discovery.HostDiscoveryScript._execute_discovery_script
    if getattr(run_script, "_elastic_ring", False):
        return

    def execute(self) -> str:
        hosts = hosts_file_of(self._discovery_script)
        if hosts is None:
            return run_script(self)
        driver.DISCOVER_HOSTS_FREQUENCY_SECS = DISCOVERY_POLL_S
        return hosts.read_text()

    execute._elastic_ring = True  # type: ignore[attr-defined]
    discovery.HostDiscoveryScript._execute_discovery_script = execute


def keep_hosts_on_failure() -> None:
    """Horovod Elastic's driver keeps a host whose worker failed, and reads the host list again
    before it assigns the ranks of the next ring: the survivors of ``--survive`` re-form their ring
    at the slot count the controller wrote for them (see the module docstring)."""
    from horovod.runner.elastic import driver
    from horovod.runner.elastic.discovery import HostManager

    if getattr(driver.ElasticDriver.resume, "_elastic_ring", False):
        return
    resume = driver.ElasticDriver.resume

    def no_blacklist(self, host):
        return None

    def resume_with_hosts_read(self):
        with self._wait_hosts_cond:
            self._host_manager.update_available_hosts()
        resume(self)

    resume_with_hosts_read._elastic_ring = True  # type: ignore[attr-defined]
    driver.ElasticDriver.resume = resume_with_hosts_read
    HostManager.blacklist = no_blacklist


def main() -> None:
    from horovod.runner import launch

    launch.gloo_built = cached_check(launch.gloo_built)
    read_hosts_directly()
    if os.environ.get("ELASTIC_RING_SURVIVE") == "1":
        keep_hosts_on_failure()
    sys.argv[0] = "horovodrun"
    sys.exit(launch.run_commandline())


if __name__ == "__main__":
    main()
