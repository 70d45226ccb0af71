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
    root = os.environ.get("ELASTIC_RING_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "elastic-ring")
    return Path(root) / CACHE_FILE


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


def main() -> None:
    from horovod.runner import launch

    launch.gloo_built = cached_check(launch.gloo_built)
    sys.argv[0] = "horovodrun"
    sys.exit(launch.run_commandline())


if __name__ == "__main__":
    main()
