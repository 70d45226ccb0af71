#!/usr/bin/env python3
"""Where Horovod's CMake finds NCCL, for a build with ``HOROVOD_GPU_OPERATIONS=NCCL``.

    python scripts/find_nccl.py [--home-dir DIR]

Prints ``KEY=VALUE`` lines for the build's environment (``HOROVOD_NCCL_HOME``, ``HOROVOD_NCCL_LINK``)
and exits 0, or prints one line saying what is missing and exits 1. Looked for, in order:

1. ``$HOROVOD_NCCL_HOME`` (or ``$HOROVOD_NCCL_INCLUDE`` + ``$HOROVOD_NCCL_LIB``) as given;
2. the ``nvidia-nccl-cu*`` wheel that a CUDA torch installs (``nvidia/nccl`` in site-packages):
   the NCCL torch itself loads. Its ``lib/`` holds only ``libnccl.so.2``, which CMake's
   ``find_library(nccl)`` does not match, so ``DIR`` (default ``$ELASTIC_RING_CACHE/nccl-home``)
   gets ``include/`` and ``lib/libnccl.so`` as links into the wheel. Some versions of the wheel have
   no ``include/nccl.h``: then the header comes from the system (``libnccl-dev``) if present;
3. a system NCCL (``nccl.h`` and ``libnccl.so`` under ``/usr`` or ``$CUDA_HOME``): nothing to set.

Standard library only: it runs on a machine with no package index too (scripts/gpu_kit.sh).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import sys
from pathlib import Path

SYSTEM_INCLUDES = ["/usr/include", "/usr/local/include", "/usr/local/cuda/include"]
SYSTEM_LIBS = ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/cuda/lib64",
               "/usr/lib/aarch64-linux-gnu"]


def wheel_dir() -> Path | None:
    """``nvidia/nccl`` of the nvidia-nccl-cu* wheel, found without importing torch."""
    try:
        spec = importlib.util.find_spec("nvidia.nccl")
    except (ImportError, ValueError):
        spec = None
    locs = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locs:
        if (Path(loc) / "lib" / "libnccl.so.2").exists():
            return Path(loc)
    return None


def system_header(extra: list[str]) -> Path | None:
    for d in [*extra, *SYSTEM_INCLUDES]:
        if d and (Path(d) / "nccl.h").exists():
            return Path(d)
    return None


def system_lib(extra: list[str]) -> Path | None:
    for d in [*extra, *SYSTEM_LIBS]:
        if d and glob.glob(str(Path(d) / "libnccl.so*")):
            return Path(d)
    return None


def find(home_dir: Path, env: dict[str, str]) -> tuple[dict[str, str] | None, str]:
    """(build variables, what was found) or (None, what is missing)."""
    if env.get("HOROVOD_NCCL_HOME") or (env.get("HOROVOD_NCCL_INCLUDE") and env.get("HOROVOD_NCCL_LIB")):
        keep = {k: env[k] for k in ("HOROVOD_NCCL_HOME", "HOROVOD_NCCL_INCLUDE", "HOROVOD_NCCL_LIB") if env.get(k)}
        return {**keep, "HOROVOD_NCCL_LINK": env.get("HOROVOD_NCCL_LINK", "SHARED")}, "NCCL as given"
    cuda = env.get("CUDA_HOME", "")
    w = wheel_dir()
    if w is not None:
        header = w / "include" if (w / "include" / "nccl.h").exists() else system_header([f"{cuda}/include"])
        if header is None:
            return None, (f"NCCL's library is in torch's wheel ({w / 'lib' / 'libnccl.so.2'}) but no nccl.h "
                          "was found (not in that wheel, nor under /usr or CUDA_HOME): install the header "
                          "(apt-get install libnccl-dev, or a nvidia-nccl-cu* wheel that ships include/), "
                          "or set HOROVOD_NCCL_HOME")
        home_dir.mkdir(parents=True, exist_ok=True)
        (home_dir / "lib").mkdir(exist_ok=True)
        for link, target in ((home_dir / "include", header), (home_dir / "lib" / "libnccl.so", w / "lib" / "libnccl.so.2")):
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(target)
        return ({"HOROVOD_NCCL_HOME": str(home_dir), "HOROVOD_NCCL_LINK": "SHARED"},
                f"NCCL from torch's wheel ({w}), header from {header}")
    inc, lib = system_header([f"{cuda}/include"]), system_lib([f"{cuda}/lib64"])
    if inc is not None and lib is not None:
        return ({"HOROVOD_NCCL_INCLUDE": str(inc), "HOROVOD_NCCL_LIB": str(lib), "HOROVOD_NCCL_LINK": "SHARED"},
                f"system NCCL ({inc}, {lib})")
    missing = " and ".join(x for x, ok in (("nccl.h", inc), ("libnccl.so", lib)) if ok is None)
    return None, (f"no NCCL found: {missing} missing (no nvidia-nccl-cu* wheel beside torch, nothing under "
                  "/usr or CUDA_HOME): install a CUDA build of torch or libnccl2 + libnccl-dev, or set HOROVOD_NCCL_HOME")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cache = os.environ.get("ELASTIC_RING_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "elastic-ring")
    p.add_argument("--home-dir", type=Path, default=Path(cache) / "nccl-home")
    a = p.parse_args(argv)
    found, what = find(a.home_dir, dict(os.environ))
    if found is None:
        print(f"find_nccl: {what}", file=sys.stderr)
        return 1
    print(f"find_nccl: {what}", file=sys.stderr)
    for k, v in found.items():
        print(f"{k}={v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
