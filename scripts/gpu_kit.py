#!/usr/bin/env python3
"""The kit that lets scripts/gpu_check.sh run on a GPU machine with no package index.

Such a machine (the lent one: its own Python 3.12 and CUDA torch, CMake, nvcc; no Horovod, no
pydantic; nothing outside it reachable) gets, in one folder that travels with the working tree:

- the Horovod 0.28.1 sdist, built THERE (``install``) with the C++20 patch of scripts/setup.sh,
  NCCL from torch's own wheel (scripts/find_nccl.py) and only that machine's GPU architecture
  (``nvidia-smi --query-gpu=compute_cap``): a CUDA build here would not match its torch anyway;
- the pure-Python (and cffi's / pydantic-core's binary) wheels it lacks, downloaded here for its
  Python version and platform;
- ``MANIFEST.json``: every file with its size and sha256, the target Python, the total size
  (below the 64 MiB the device tool carries); ``verify`` checks a kit against it.

    python scripts/gpu_kit.py build  [--kit .kit] [--python-version 3.12]   # here, with pip
    python scripts/gpu_kit.py verify [--kit .kit]
    python scripts/gpu_kit.py install --kit .kit --target DIR              # there (stdlib only)

``install`` prints ``PYTHONPATH``/``PATH`` lines to use (scripts/gpu_check.sh --kit does all this);
it builds Horovod once per kit and target (a stamp file), in 2-4 minutes on 16 cores.
The kit is not committed (.gitignore): this script makes it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
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


def _patch_cxx20(src: Path) -> None:
    """The release hard-codes C++14; torch >= 2.1 needs C++17, torch 2.14 C++20. Both CMakeLists
    (as scripts/setup.sh), or the link fails (multiple definition of gloo's kDefaultTimeout)."""
    for rel in ("CMakeLists.txt", "horovod/torch/CMakeLists.txt"):
        p = src / rel
        text = p.read_text()
        if "set(CMAKE_CXX_STANDARD 20)" not in text:
            if "set(CMAKE_CXX_STANDARD 14)" not in text:
                raise KitError(f"{rel}: the C++ standard line to patch is not there")
            p.write_text(text.replace("set(CMAKE_CXX_STANDARD 14)", "set(CMAKE_CXX_STANDARD 20)"))


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
    return ",".join(ccs) or None


def build_env(cuda_home: str | None, cc_list: str | None, nccl_vars: dict[str, str], jobs: int) -> dict[str, str]:
    """The environment of the Horovod build on the GPU machine."""
    env = {"HOROVOD_WITH_PYTORCH": "1", "HOROVOD_WITH_GLOO": "1", "HOROVOD_WITHOUT_MPI": "1",
           "HOROVOD_WITHOUT_TENSORFLOW": "1", "HOROVOD_WITHOUT_MXNET": "1", "HOROVOD_CPU_OPERATIONS": "GLOO",
           "MAKEFLAGS": f"-j{jobs}"}
    if cuda_home:
        env.update(CUDA_HOME=cuda_home, HOROVOD_CUDA_HOME=cuda_home)
    if nccl_vars:
        env["HOROVOD_GPU_OPERATIONS"] = "NCCL"
        env.update(nccl_vars)
        if cc_list:
            env["HOROVOD_BUILD_CUDA_CC_LIST"] = cc_list
    return env


def install(kit: Path, target: Path, python: str = sys.executable, log=print) -> dict[str, str]:
    """On the GPU machine: the wheels into ``target``, then Horovod built there and installed into it.
    Returns the variables to export (PYTHONPATH, PATH)."""
    problems = check_manifest(kit)
    if problems:
        raise KitError("the kit does not match its manifest: " + "; ".join(problems[:3]))
    manifest = json.loads((kit / MANIFEST).read_text())
    want = manifest["python_version"]
    have = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if want != have:
        raise KitError(f"the kit's wheels are for Python {want}; this is Python {have}: rebuild it with "
                       f"scripts/gpu_kit.py build --python-version {have}")
    target.mkdir(parents=True, exist_ok=True)
    exports = {"PYTHONPATH": os.pathsep.join([str(target), str(ROOT)]),
               "PATH": os.pathsep.join([str(target / "bin"), os.environ.get("PATH", "")])}
    stamp = target / ".elastic-ring-kit"
    key = json.dumps({"files": manifest["files"], "python": python}, sort_keys=True)
    if stamp.exists() and stamp.read_text() == key:
        log("gpu_kit: already installed in this target")
        return exports
    pip = [python, "-m", "pip", "--disable-pip-version-check", "install", "-q", "--no-index", "--no-deps",
           "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(target)]
    r = subprocess.run([*pip, *map(str, sorted((kit / "wheels").glob("*.whl")))], capture_output=True, text=True)
    if r.returncode != 0:
        raise KitError(f"installing the wheels failed: {r.stderr.strip()[-400:]}")
    work = target.parent / (target.name + "-build")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    with tarfile.open(kit / "src" / SDIST) as tf:
        tf.extractall(work, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    src = work / SDIST[:-len(".tar.gz")]
    _patch_cxx20(src)
    cuda = _cuda_home()
    torch_cuda = subprocess.run([python, "-c", "import torch; print(torch.version.cuda or '')"],
                                capture_output=True, text=True).stdout.strip()
    nccl_vars: dict[str, str] = {}
    if torch_cuda:
        if cuda is None:
            raise KitError("torch is a CUDA build but no CUDA toolkit (nvcc) was found: set CUDA_HOME")
        r = subprocess.run([python, str(kit / "find_nccl.py"), "--home-dir", str(work / "nccl-home")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise KitError(r.stderr.strip())
        log(r.stderr.strip())
        nccl_vars = dict(line.split("=", 1) for line in r.stdout.split() if "=" in line)
    cc = _cc_list()
    env = dict(os.environ, **build_env(cuda, cc, nccl_vars, os.cpu_count() or 2))
    log(f"gpu_kit: building Horovod (NCCL: {'yes' if nccl_vars else 'no'}, GPU architectures: {cc or 'all'}, "
        f"log {work / 'build.log'})")
    t0 = time.time()
    with open(work / "build.log", "w") as fh:
        r = subprocess.run([python, "-m", "pip", "--disable-pip-version-check", "wheel", "--no-deps",
                            "--no-build-isolation", str(src), "-w", str(work / "dist")],
                           stdout=fh, stderr=subprocess.STDOUT, env=env)
    if r.returncode != 0:
        tail = (work / "build.log").read_text().strip().splitlines()[-15:]
        raise KitError("the Horovod build failed:\n" + "\n".join(tail))
    whl = next((work / "dist").glob("horovod-*.whl"))
    r = subprocess.run([*pip, str(whl)], capture_output=True, text=True)
    if r.returncode != 0:
        raise KitError(f"installing the built Horovod failed: {r.stderr.strip()[-400:]}")
    log(f"gpu_kit: Horovod built and installed in {time.time() - t0:.0f} s")
    stamp.write_text(key)
    return exports


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
    i.add_argument("--target", type=Path, required=True)
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
        else:
            for k, val in install(a.kit, a.target, log=lambda s: print(s, file=sys.stderr, flush=True)).items():
                print(f"{k}={val}")
    except KitError as e:
        print(f"gpu_kit: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
