#!/usr/bin/env python3
"""The kit that lets scripts/gpu_check.sh run on a GPU machine with no package index.

Such a machine (the lent one: its own Python 3.12 and CUDA torch, pip's CMake and ninja, nvcc; no
Horovod, no pydantic; nothing outside it reachable) gets, in one folder that travels with the
working tree (git ignores it, so it travels only when the device call carries it):

- the Horovod 0.28.1 sdist, built THERE (``install``), patched for that machine's compilers
  (``patch_source``), with NCCL from torch's own ``nvidia-nccl`` wheel (scripts/find_nccl.py) and
  only that machine's GPU architecture: a CUDA build here would not match its torch anyway;
- the pure-Python (and cffi's / pydantic-core's binary) wheels it lacks, downloaded here for its
  Python version and platform;
- ``MANIFEST.json``: every file with its size and sha256, the target Python, the total size
  (below the 64 MiB the device tool carries); ``verify`` checks a kit against it.

    python scripts/gpu_kit.py build  [--kit .kit] [--python-version 3.12]   # here, with pip
    python scripts/gpu_kit.py verify [--kit .kit]
    python scripts/gpu_kit.py plan   [--target DIR]        # there: what it found, the build's settings
    python scripts/gpu_kit.py install --kit .kit [--target DIR]             # there (stdlib only)

Before building, ``install`` reads the machine (``probe``: a few seconds) and settles each risk
with its fallback (``plan_build``): CMake 4 (``CMAKE_POLICY_VERSION_MINIMUM=3.5``), no ``make``
(the Ninja generator), gcc 14+ (patches), ``libcuda.so`` missing beside ``libcuda.so.1`` (a
private link on ``LD_LIBRARY_PATH``), no ``distutils`` (setuptools' copy), no GPU architecture
answer (90). It prints ``PYTHONPATH``/``PATH`` (and maybe ``LD_LIBRARY_PATH``) lines to export
(scripts/gpu_check.sh --kit does all this). The target (default ``build/gpu-kit/site``, ignored)
keeps the built wheel: a rerun with the same kit and torch skips the build (about 3 minutes on 16
cores, an estimate). The kit is not committed (.gitignore): this script makes it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOROVOD = "horovod==0.28.1"
SDIST = "horovod-0.28.1.tar.gz"
# What elastic-ring imports that the lent machine's image does not hold (its package list), pinned
# to the versions this project's set-up installs: pydantic and its own dependencies; cffi (which
# Horovod's metadata asks for) and pycparser.
WHEELS = ("pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0",
          "typing-inspection==0.4.5", "typing-extensions==4.16.0", "cffi==2.1.1", "pycparser==3.12")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "manylinux_2_34_x86_64", "manylinux_2_31_x86_64", "manylinux_2_24_x86_64")
LIMIT_BYTES = 64 * 2**20  # what the device tool carries, the working tree included
KIT_BUDGET_BYTES = 32 * 2**20  # the kit's share of it
MANIFEST = "MANIFEST.json"
# Where ``install`` puts the wheels and the built Horovod: an ignored folder of the working tree, so
# that on a device machine that keeps ignored build outputs between calls a rerun skips the build.
DEFAULT_TARGET = ROOT / "build" / "gpu-kit" / "site"


class KitError(RuntimeError):
    """A kit that cannot be built, verified or installed; the message says why."""


def _sha256(p: Path) -> str:
    h = hashlib.sha256()
    with p.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _dist_name(filename: str) -> str:
    """``pydantic_core-2.50.5-cp312-...whl`` -> ``pydantic-core`` (normalised project name)."""
    stem = filename[:-len(".tar.gz")] if filename.endswith(".tar.gz") else filename
    return stem.split("-")[0].lower().replace("_", "-")


def _req_name(req: str) -> str:
    return req.split("==")[0].lower().replace("_", "-")


def make_manifest(kit: Path, python_version: str) -> dict:
    files = sorted(p for p in kit.rglob("*") if p.is_file() and p.name != MANIFEST)
    entries = [{"path": str(p.relative_to(kit)), "bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files]
    total = sum(e["bytes"] for e in entries)
    return {"python_version": python_version, "horovod": HOROVOD, "wheels": list(WHEELS),
            "files": entries, "total_bytes": total, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def check_manifest(kit: Path, manifest: dict | None = None) -> list[str]:
    """What is wrong with ``kit`` (empty: nothing): files missing, changed or unlisted; a required
    part absent; two versions of one package; over the size budget."""
    path = kit / MANIFEST
    if manifest is None:
        if not path.exists():
            return [f"{path} is missing: build the kit with scripts/gpu_kit.py build"]
        manifest = json.loads(path.read_text())
    problems = []
    listed = {e["path"]: e for e in manifest.get("files", [])}
    on_disk = {str(p.relative_to(kit)) for p in kit.rglob("*") if p.is_file() and p.name != MANIFEST}
    for rel in sorted(set(listed) - on_disk):
        problems.append(f"{rel}: listed in the manifest, not in the kit")
    for rel in sorted(on_disk - set(listed)):
        problems.append(f"{rel}: in the kit, not in the manifest")
    for rel in sorted(set(listed) & on_disk):
        p = kit / rel
        if p.stat().st_size != listed[rel]["bytes"] or _sha256(p) != listed[rel]["sha256"]:
            problems.append(f"{rel}: changed since the manifest was written")
    if f"src/{SDIST}" not in listed:
        problems.append(f"src/{SDIST}: the Horovod sdist is missing")
    names = [_dist_name(Path(r).name) for r in listed if r.startswith("wheels/")]
    for req in manifest.get("wheels", WHEELS):
        if _req_name(req) not in names:
            problems.append(f"wheels: no wheel for {req}")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        problems.append(f"wheels: two versions of {', '.join(dup)} (pip stops the whole install)")
    total = sum(e["bytes"] for e in listed.values())
    if total > KIT_BUDGET_BYTES:
        problems.append(f"the kit is {total / 2**20:.1f} MiB, over its {KIT_BUDGET_BYTES // 2**20} MiB budget "
                        f"(the device tool carries {LIMIT_BYTES // 2**20} MiB with the working tree)")
    return problems


def build(kit: Path, python_version: str, pip: list[str] | None = None) -> dict:
    """Download the sdist and the wheels into ``kit`` (here, where pip reaches an index)."""
    pip = pip or [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    if kit.exists():
        shutil.rmtree(kit)
    (kit / "src").mkdir(parents=True)
    (kit / "wheels").mkdir()
    r = subprocess.run([*pip, "download", "-q", "--no-deps", "--no-binary", ":all:", HOROVOD, "-d", str(kit / "src")],
                       capture_output=True, text=True)
    if r.returncode != 0 or not (kit / "src" / SDIST).exists():
        raise KitError(f"could not download the {HOROVOD} sdist: {r.stderr.strip().splitlines()[-1:]}")
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    r = subprocess.run([*pip, "download", "-q", "--no-deps", "--only-binary", ":all:", "--python-version",
                        python_version, "--implementation", "cp", *plat, "-d", str(kit / "wheels"), *WHEELS],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise KitError(f"could not download the wheels for Python {python_version}: "
                       f"{r.stderr.strip().splitlines()[-1:]}")
    for helper in ("find_nccl.py",):  # the kit installs from its own copy: no repository needed
        shutil.copy2(ROOT / "scripts" / helper, kit / helper)
    manifest = make_manifest(kit, python_version)
    (kit / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    problems = check_manifest(kit)
    if problems:
        raise KitError("; ".join(problems))
    return manifest


# ---------------------------------------------------------------- the source's patches
# Each is harmless where it is not needed, so all are applied: the first (and maybe only) build on
# the GPU machine must not be the place where one turns out to be needed.
_CMAKE_MIN = re.compile(r"cmake_minimum_required\s*\(\s*VERSION\s+([0-9][0-9.]*)", re.IGNORECASE)


def _older_than_3_5(version: str) -> bool:
    parts = [int(x) for x in version.split(".") if x.isdigit()][:2] + [0]
    return (parts[0], parts[1]) < (3, 5)


def patch_source(src: Path) -> list[str]:
    """Patch the Horovod sdist unpacked at ``src`` for the GPU machine's compilers; idempotent.
    Returns one line per file changed.

    - C++20 in both CMakeLists (torch >= 2.1 needs C++17, torch 2.14 C++20; as scripts/setup.sh),
      or the link fails (multiple definition of gloo's kDefaultTimeout);
    - ``CMAKE_CUDA_STANDARD 11`` -> 17 for Horovod's CUDA kernels: the host headers of gcc 14 and
      newer, and CUDA 13's own, no longer compile as C++11;
    - setup.py passes make's ``VERBOSE=1`` to the build tool, which Ninja (used where there is no
      make) takes for a target: only with make;
    - ``#include <cstdint>`` in gloo's ``types.h``, which uses ``uint8_t`` and gets it through
      ``<iostream>`` only up to gcc 14;
    - ``cmake_minimum_required(VERSION x)`` with x < 3.5 (gloo's 2.8.12) raised to 3.5: CMake 4
      refuses such a project ("Compatibility with CMake < 3.5 has been removed"); the build's
      ``CMAKE_POLICY_VERSION_MINIMUM=3.5`` says the same to CMake 4, this covers a CMake that
      ignores it.
    """
    done = []
    for rel in ("CMakeLists.txt", "horovod/torch/CMakeLists.txt"):
        p = src / rel
        text = p.read_text()
        if "set(CMAKE_CXX_STANDARD 20)" not in text:
            if "set(CMAKE_CXX_STANDARD 14)" not in text:
                raise KitError(f"{rel}: the C++ standard line to patch is not there")
            p.write_text(text.replace("set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 20)"))
            done.append(f"{rel}: C++14 -> C++20")
    rel = "horovod/common/ops/cuda/CMakeLists.txt"
    p = src / rel
    if p.exists() and "set(CMAKE_CUDA_STANDARD 11)" in p.read_text():
        p.write_text(p.read_text().replace("set(CMAKE_CUDA_STANDARD 11)", "set(CMAKE_CUDA_STANDARD 17)"))
        done.append(f"{rel}: CUDA C++11 -> C++17")
    rel = "setup.py"  # make's VERBOSE=1 is a target to ninja ("unknown target"): only for make
    p = src / rel
    old = "        if self.verbose:\n            make_args.append('VERBOSE=1')"
    if p.exists() and old in p.read_text():
        p.write_text(p.read_text().replace(old, "        if self.verbose and os.environ.get('CMAKE_GENERATOR') != "
                                                "'Ninja':\n            make_args.append('VERBOSE=1')"))
        done.append(f"{rel}: no VERBOSE=1 for Ninja")
    rel = "third_party/gloo/gloo/types.h"
    p = src / rel
    if p.exists() and "<cstdint>" not in p.read_text():
        text = p.read_text()
        if "#include <iostream>" not in text:
            raise KitError(f"{rel}: the include to add <cstdint> after is not there")
        p.write_text(text.replace("#include <iostream>", "#include <cstdint>\n#include <iostream>", 1))
        done.append(f"{rel}: #include <cstdint>")
    configured = [p for p in sorted(src.rglob("CMakeLists.txt"))  # third_party's others give headers only
                  if not p.relative_to(src).parts[0] == "third_party" or p.relative_to(src).parts[1] == "gloo"]
    for p in configured:
        text = p.read_text(errors="replace")
        new = _CMAKE_MIN.sub(lambda m: m.group(0).replace(m.group(1), "3.5") if _older_than_3_5(m.group(1))
                             else m.group(0), text)
        if new != text:
            p.write_text(new)
            done.append(f"{p.relative_to(src)}: cmake_minimum_required -> 3.5")
    return done


# ---------------------------------------------------------------- what the machine has
@dataclass(frozen=True)
class Machine:
    """What the GPU machine has, read in the first seconds (``probe``), so that every risk of the
    build is settled, with its fallback, before the build starts."""

    python: str  # "3.12.3"
    python_exe: str
    torch: str | None = None  # "2.11.0+cu130"; None: torch does not import
    torch_cuda: str | None = None  # "13.0"; None: a CPU build of torch
    gpus: int = 0
    cmake: str | None = None  # "4.1.2"
    make: bool = False
    ninja: str | None = None
    gcc: str | None = None
    nvcc: str | None = None  # "13.0"
    cuda_home: str | None = None
    cc_list: str | None = None  # "90", from nvidia-smi; None: the query failed
    libcuda_unversioned: bool = False  # dlopen("libcuda.so") works, as Horovod's torch extension calls it
    libcuda: str | None = None  # the file libcuda.so.1 loads from
    distutils: bool = True  # `from distutils.sysconfig import get_python_inc` works (Horovod's CMake runs it)
    distutils_src: str | None = None  # setuptools' own copy (setuptools/_distutils), the fallback
    nccl_header: str | None = None  # nccl.h: in the nvidia-nccl wheel, else in CUDA's include folder
    horovod: str | None = None  # "0.28.1 (NCCL built: yes)": a Horovod this Python already imports
    cpus: int = 2

    def line(self) -> str:
        """One line: what was found (the first line scripts/gpu_check.sh prints)."""
        gen = "make" if self.make else (f"no make, ninja {self.ninja} (Ninja generator)" if self.ninja
                                        else "no make, no ninja")
        lib = ("libcuda.so ok" if self.libcuda_unversioned else
               f"libcuda.so missing, libcuda.so.1 at {self.libcuda} (private link)" if self.libcuda else
               "no libcuda")
        return (f"python {self.python} ({self.python_exe}) | torch {self.torch or 'missing'}"
                f"{f' CUDA {self.torch_cuda}' if self.torch_cuda else ''}, {self.gpus} GPU(s) | "
                f"nvcc {self.nvcc or 'none'} | cmake {self.cmake or 'none'} | {gen} | gcc {self.gcc or 'none'} | "
                f"arch {self.cc_list or 'query failed'} | {lib} | "
                f"distutils {'ok' if self.distutils else 'missing'} | nccl.h {self.nccl_header or 'not found'} | "
                f"Horovod {self.horovod or 'none yet'} | {self.cpus} CPUs")


# Run by the Python under test: the parts a plain `python -c` sees (distutils before any import
# of setuptools, as Horovod's CMake runs it), then torch, libcuda, NCCL's header. Prints one JSON.
_PROBE = r"""
import ctypes, importlib.util, json, os, sys
r = {"python": "%d.%d.%d" % sys.version_info[:3], "python_exe": sys.executable}
try:
    from distutils.sysconfig import get_python_inc
    r["distutils"] = True
except Exception:
    r["distutils"] = False
    try:
        spec = importlib.util.find_spec("setuptools")
        d = os.path.join(os.path.dirname(spec.origin), "_distutils") if spec and spec.origin else None
        r["distutils_src"] = d if d and os.path.isdir(d) else None
    except Exception:
        r["distutils_src"] = None
try:
    import torch
    r["torch"] = torch.__version__
    r["torch_cuda"] = torch.version.cuda
    r["gpus"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
except Exception:
    pass
try:
    import horovod, horovod.torch as hvd
    r["horovod"] = "%s (NCCL built: %s)" % (horovod.__version__, "yes" if hvd.nccl_built() else "no")
except Exception:
    pass
try:
    ctypes.CDLL("libcuda.so")
    r["libcuda_unversioned"] = True
except OSError:
    r["libcuda_unversioned"] = False
try:
    ctypes.CDLL("libcuda.so.1")
    for line in open("/proc/self/maps"):
        if line.rstrip().endswith("libcuda.so.1") or "/libcuda.so.1" in line:
            r["libcuda"] = os.path.realpath(line.split()[-1])
            break
except OSError:
    pass
try:
    spec = importlib.util.find_spec("nvidia.nccl")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if os.path.exists(os.path.join(loc, "include", "nccl.h")):
            r["nccl_header"] = "nvidia-nccl wheel (%s)" % os.path.join(loc, "include")
except Exception:
    pass
print(json.dumps(r))
"""


def _version(cmd: list[str], pattern: str = r"(\d+\.\d+(?:\.\d+)?)") -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(pattern, out.stdout + out.stderr) if out.returncode == 0 else None
    return m.group(1) if m else None


def _cuda_home() -> str | None:
    for cand in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if cand and (Path(cand) / "bin" / "nvcc").exists():
            return cand
    nvcc = shutil.which("nvcc")
    return str(Path(nvcc).resolve().parents[1]) if nvcc else None


def _cc_list() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    ccs = sorted({line.strip().replace(".", "") for line in out.splitlines() if line.strip()})
    return ",".join(c for c in ccs if c.isdigit()) or None


def probe(python: str = sys.executable) -> Machine:
    """Read what this machine has (a few seconds: one Python that imports torch, and ``--version``s)."""
    try:
        r = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=120)
        seen = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else {}
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
        seen = {}
    seen.setdefault("python", "?")
    seen.setdefault("python_exe", python)
    cuda = _cuda_home()
    nvcc = str(Path(cuda) / "bin" / "nvcc") if cuda else "nvcc"
    nccl = seen.pop("nccl_header", None)
    if nccl is None and cuda and (Path(cuda) / "include" / "nccl.h").exists():
        nccl = f"CUDA include ({Path(cuda) / 'include'})"
    return Machine(**seen, cmake=_version(["cmake", "--version"]), make=shutil.which("make") is not None,
                   ninja=_version(["ninja", "--version"]),
                   gcc=_version(["gcc", "-dumpfullversion"], r"(\d+(?:\.\d+)*)"),
                   nvcc=_version([nvcc, "--version"], r"release (\d+\.\d+)"), cuda_home=cuda,
                   cc_list=_cc_list() if seen.get("torch_cuda") else None, nccl_header=nccl,
                   cpus=os.cpu_count() or 2)


# ---------------------------------------------------------------- the build's plan
DEFAULT_CC = "90"  # the lent machine's H200 (compute capability 9.0), when nvidia-smi does not answer


@dataclass(frozen=True)
class BuildPlan:
    """How Horovod is built on a machine, and what its workers then need; made by ``plan_build``
    from a ``Machine`` alone (no side effects), so a unit test reads every choice."""

    env: dict[str, str]  # the build's environment (over os.environ)
    exports: dict[str, str]  # what every later process needs (PYTHONPATH, PATH, maybe LD_LIBRARY_PATH)
    links: dict[str, str]  # private symbolic links to make first: link -> target
    notes: list[str] = field(default_factory=list)  # each fallback taken, one line each


def _prepend(first: list[str], rest: str | None) -> str:
    return os.pathsep.join([*first, *([rest] if rest else [])])


def plan_build(m: Machine, target: Path, private: Path, base_env: dict[str, str] | None = None,
               nccl_vars: dict[str, str] | None = None, root: Path = ROOT) -> BuildPlan:
    """The build's environment and the workers' variables for machine ``m``: Horovod with PyTorch
    and Gloo, and with a CUDA torch NCCL for ``m``'s GPU architecture only. ``private`` holds the
    links made for the fallbacks; existing ``PYTHONPATH``/``LD_LIBRARY_PATH`` are extended, never
    replaced. Raises KitError when no build can work (no CMake, no compiler, no build tool)."""
    base = dict(os.environ if base_env is None else base_env)
    if not m.cmake:
        raise KitError("no cmake on PATH: Horovod's build needs it (pip install cmake)")
    if not m.gcc:
        raise KitError("no gcc on PATH: Horovod's build needs a C++ compiler")
    env = {"HOROVOD_WITH_PYTORCH": "1", "HOROVOD_WITH_GLOO": "1", "HOROVOD_WITHOUT_MPI": "1",
           "HOROVOD_WITHOUT_TENSORFLOW": "1", "HOROVOD_WITHOUT_MXNET": "1", "HOROVOD_CPU_OPERATIONS": "GLOO",
           "MAKEFLAGS": f"-j{m.cpus}", "CMAKE_BUILD_PARALLEL_LEVEL": str(m.cpus),
           # CMake 4 refuses gloo's cmake_minimum_required(VERSION 2.8.12) without it; older ones ignore it
           "CMAKE_POLICY_VERSION_MINIMUM": "3.5"}
    notes, links = [], {}
    if int(m.cmake.split(".")[0]) >= 4:
        notes.append(f"CMake {m.cmake}: CMAKE_POLICY_VERSION_MINIMUM=3.5 and cmake_minimum_required lines patched")
    if not m.make:
        if not m.ninja:
            raise KitError("neither make nor ninja on PATH: CMake has no build tool (pip install ninja)")
        env["CMAKE_GENERATOR"] = "Ninja"  # Horovod's setup.py runs `cmake` with CMake's default, Makefiles
        notes.append(f"no make: CMake's Ninja generator (ninja {m.ninja})")
    if int(m.gcc.split(".")[0]) >= 14:
        notes.append(f"gcc {m.gcc}: CUDA standard C++17 and gloo's <cstdint> (patched)")
    lib_dirs, py_dirs = [], []
    if m.torch_cuda:
        if not m.cuda_home:
            raise KitError("torch is a CUDA build but no CUDA toolkit (nvcc) was found: set CUDA_HOME")
        env.update(CUDA_HOME=m.cuda_home, HOROVOD_CUDA_HOME=m.cuda_home)
        if nccl_vars:
            env["HOROVOD_GPU_OPERATIONS"] = "NCCL"
            env.update(nccl_vars)
        env["HOROVOD_BUILD_CUDA_CC_LIST"] = m.cc_list or DEFAULT_CC
        if not m.cc_list:
            notes.append(f"the GPU architecture query failed: building for {DEFAULT_CC} only")
        if not m.libcuda_unversioned:
            if m.libcuda:
                links[str(private / "lib" / "libcuda.so")] = m.libcuda
                lib_dirs.append(str(private / "lib"))
                notes.append(f"libcuda.so missing: {private / 'lib' / 'libcuda.so'} -> {m.libcuda}")
            else:
                notes.append("no libcuda.so.1 found: Horovod's CUDA operations cannot open the driver")
    if not m.distutils:
        if not m.distutils_src:
            raise KitError(f"Python {m.python} has no distutils and setuptools has no _distutils to stand in: "
                           "Horovod's CMake imports distutils.sysconfig")
        links[str(private / "py" / "distutils")] = m.distutils_src
        py_dirs.append(str(private / "py"))
        notes.append(f"no distutils in Python {m.python}: setuptools' copy ({m.distutils_src})")
    if py_dirs:
        env["PYTHONPATH"] = _prepend(py_dirs, base.get("PYTHONPATH"))
    exports = {"PYTHONPATH": _prepend([str(target), str(root), *py_dirs], base.get("PYTHONPATH")),
               "PATH": _prepend([str(target / "bin"), str(Path(m.python_exe).parent)], base.get("PATH"))}
    if lib_dirs:
        for var in ("LD_LIBRARY_PATH", "LIBRARY_PATH"):
            env[var] = _prepend(lib_dirs, base.get(var))
        exports["LD_LIBRARY_PATH"] = env["LD_LIBRARY_PATH"]
    return BuildPlan(env=env, exports=exports, links=links, notes=notes)


def make_links(links: dict[str, str]) -> None:
    for link, to in links.items():
        p = Path(link)
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink() or p.exists():
            p.unlink()
        p.symlink_to(to)


_ERROR_LINE = re.compile(r"error:|error \(|CMake Error|FAILED:|fatal error|undefined reference|\*\*\* \[|"
                         r"ninja: build stopped|make(\[\d+\])?: \*\*\*", re.IGNORECASE)


_COMPILER_ERROR = re.compile(r": (fatal )?error:|CMake Error|undefined reference")


def first_error(text: str) -> str:
    """The build log's first compiler or CMake error (not pip's own "error:" about its child)."""
    lines = text.splitlines()
    i = next((i for i, ln in enumerate(lines) if _COMPILER_ERROR.search(ln)), None)
    if i is None:
        i = next((i for i, ln in enumerate(lines) if _ERROR_LINE.search(ln)), None)
    if i is None:
        return "no error line"
    found = lines[i].strip()
    if found.endswith(":") and i + 1 < len(lines):  # "CMake Error at X (message):" then the message
        found += " " + lines[i + 1].strip()
    return found[:300]


def summarize_build_log(text: str, max_errors: int = 80, tail: int = 30) -> str:
    """What a failed build's log says: its error lines (with the line after each, where the
    message goes on), then its last lines. Under -j16 the tail alone shows only make's summary."""
    lines = text.splitlines()
    picked: list[int] = []
    for i, line in enumerate(lines):
        if _ERROR_LINE.search(line):
            picked += [i, i + 1] if i + 1 < len(lines) else [i]
    keep = sorted(set(picked))[:max_errors]
    out = [f"-- {len([i for i in set(picked) if _ERROR_LINE.search(lines[i])])} error line(s) in "
           f"{len(lines)} lines; the first {len(keep)} (with the line after each):"]
    out += [f"{i + 1}: {lines[i]}" for i in keep]
    out += [f"-- the last {min(tail, len(lines))} lines:", *lines[-tail:]]
    return "\n".join(out) + "\n"


class BuildFailed(KitError):
    """Horovod's build failed; ``log`` is its full log."""

    def __init__(self, message: str, log: Path):
        super().__init__(message)
        self.log = log


@dataclass(frozen=True)
class Installed:
    """What ``install`` did: the variables to export, and whether Horovod was built now."""

    exports: dict[str, str]
    built: str  # "built in 183 s", "wheel from an earlier build", "already installed"
    plan: BuildPlan
    patches: list[str] = field(default_factory=list)


def install(kit: Path, target: Path, python: str = sys.executable, log=print,
            machine: Machine | None = None, build_timeout: float | None = None) -> Installed:
    """On the GPU machine: the wheels into ``target``, then Horovod built there and installed into
    it. Once per target: a stamp records what is installed, and the built wheel stays in
    ``<target>-build/dist`` (a rerun with the same kit and torch skips the build). A build stopped
    at ``build_timeout`` seconds leaves its folder, and a rerun continues it."""
    problems = check_manifest(kit)
    if problems:
        raise KitError("the kit does not match its manifest: " + "; ".join(problems[:3]))
    manifest = json.loads((kit / MANIFEST).read_text())
    m = machine or probe(python)
    want, have = manifest["python_version"], ".".join(m.python.split(".")[:2])
    if want != have:
        raise KitError(f"the kit's wheels are for Python {want}; this is Python {have}: rebuild it with "
                       f"scripts/gpu_kit.py build --python-version {have}")
    work = target.parent / (target.name + "-build")
    private = target.parent / (target.name + "-links")
    plan = plan_build(m, target, private)
    make_links(plan.links)
    stamp = target / ".elastic-ring-kit"
    key = json.dumps({"files": manifest["files"], "python": m.python_exe, "torch": m.torch,
                      "cc": plan.env.get("HOROVOD_BUILD_CUDA_CC_LIST")}, sort_keys=True)
    if stamp.exists() and stamp.read_text() == key:
        log("gpu_kit: already installed in this target")
        return Installed(plan.exports, "already installed", plan)
    target.mkdir(parents=True, exist_ok=True)
    pip = [python, "-m", "pip", "--disable-pip-version-check", "install", "-q", "--no-index", "--no-deps",
           "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(target)]
    r = subprocess.run([*pip, *map(str, sorted((kit / "wheels").glob("*.whl")))], capture_output=True, text=True)
    if r.returncode != 0:
        raise KitError(f"installing the wheels failed: {r.stderr.strip()[-400:]}")
    dist = work / "dist"
    wheel_key = dist / "KEY"
    whl = next(iter(sorted(dist.glob("horovod-*.whl"))), None) if wheel_key.exists() else None
    patches: list[str] = []
    if whl is not None and wheel_key.read_text() == key:
        built = "wheel from an earlier build"
        log(f"gpu_kit: Horovod's wheel from an earlier build ({whl.name})")
    else:
        src = work / SDIST[:-len(".tar.gz")]
        if (work / "KEY").exists() and (work / "KEY").read_text() == key and src.is_dir():
            log(f"gpu_kit: continuing the unfinished build in {work}")  # CMake's and ninja's own state
        else:
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            with tarfile.open(kit / "src" / SDIST) as tf:
                tf.extractall(work, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
            (work / "KEY").write_text(key)
        patches = patch_source(src)
        nccl_vars: dict[str, str] = {}
        if m.torch_cuda:
            r = subprocess.run([python, str(kit / "find_nccl.py"), "--home-dir", str(work / "nccl-home")],
                               capture_output=True, text=True, env=dict(os.environ, CUDA_HOME=m.cuda_home or ""))
            if r.returncode != 0:
                raise KitError(r.stderr.strip())
            log(r.stderr.strip())
            nccl_vars = dict(line.split("=", 1) for line in r.stdout.split() if "=" in line)
        plan = plan_build(m, target, private, nccl_vars=nccl_vars)
        for note in plan.notes:
            log(f"gpu_kit: {note}")
        log(f"gpu_kit: building Horovod (NCCL: {'yes' if nccl_vars else 'no'}, GPU architectures: "
            f"{plan.env.get('HOROVOD_BUILD_CUDA_CC_LIST', 'none')}, log {work / 'build.log'})")
        t0 = time.time()
        with open(work / "build.log", "w") as fh:
            proc = subprocess.Popen([python, "-m", "pip", "--disable-pip-version-check", "wheel", "--no-deps",
                                     "--no-build-isolation", str(src), "-w", str(dist)],
                                    stdout=fh, stderr=subprocess.STDOUT, env=dict(os.environ, **plan.env),
                                    start_new_session=True)
            try:
                proc.wait(timeout=build_timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the compilers too
                proc.wait()
                raise BuildFailed(f"the Horovod build did not end in {build_timeout:.0f} s (a rerun continues it)",
                                  work / "build.log") from None
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        whl = next(iter(sorted(dist.glob("horovod-*.whl"))), None)
        if proc.returncode != 0 or whl is None:
            raise BuildFailed(f"the Horovod build failed after {time.time() - t0:.0f} s: "
                              f"{first_error((work / 'build.log').read_text(errors='replace'))}", work / "build.log")
        wheel_key.write_text(key)
        built = f"built in {time.time() - t0:.0f} s"
    r = subprocess.run([*pip, str(whl)], capture_output=True, text=True)
    if r.returncode != 0:
        raise KitError(f"installing the built Horovod failed: {r.stderr.strip()[-400:]}")
    log(f"gpu_kit: Horovod {built}, installed in {target}")
    stamp.write_text(key)
    return Installed(plan.exports, built, plan, patches)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu_kit.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="download the sdist and wheels into the kit (here)")
    b.add_argument("--kit", type=Path, default=ROOT / ".kit")
    b.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    v = sub.add_parser("verify", help="check a kit against its manifest")
    v.add_argument("--kit", type=Path, default=ROOT / ".kit")
    i = sub.add_parser("install", help="install the kit (on the GPU machine): wheels, then Horovod built there")
    i.add_argument("--kit", type=Path, default=ROOT / ".kit")
    i.add_argument("--target", type=Path, default=DEFAULT_TARGET)
    pl = sub.add_parser("plan", help="what this machine has and how Horovod would be built on it (builds nothing)")
    pl.add_argument("--target", type=Path, default=DEFAULT_TARGET)
    a = p.parse_args(argv)
    try:
        if a.cmd == "build":
            m = build(a.kit, a.python_version)
            print(f"gpu_kit: {len(m['files'])} files, {m['total_bytes'] / 2**20:.1f} MiB, for Python "
                  f"{a.python_version}, in {a.kit}")
        elif a.cmd == "verify":
            problems = check_manifest(a.kit)
            for line in problems:
                print(f"gpu_kit: {line}", file=sys.stderr)
            if problems:
                return 1
            print(f"gpu_kit: {a.kit} matches its manifest")
        elif a.cmd == "plan":
            m = probe()
            print(f"found: {m.line()}")
            plan = plan_build(m, a.target, a.target.parent / (a.target.name + "-links"))
            for k in sorted(plan.env):
                print(f"build {k}={plan.env[k]}")
            for k in sorted(plan.exports):
                print(f"export {k}={plan.exports[k]}")
            for link, to in plan.links.items():
                print(f"link {link} -> {to}")
            for note in plan.notes:
                print(f"note {note}")
        else:
            done = install(a.kit, a.target, log=lambda s: print(s, file=sys.stderr, flush=True))
            for k, val in done.exports.items():
                print(f"{k}={val}")
    except BuildFailed as e:
        print(f"gpu_kit: {e} (log: {e.log})", file=sys.stderr)
        return 1
    except KitError as e:
        print(f"gpu_kit: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
