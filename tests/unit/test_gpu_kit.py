"""scripts/gpu_kit.py: the kit's manifest and its checks, the build environment, the install's
refusals. No download and no build here (the kit is made by ``gpu_kit.py build`` where pip reaches
an index, and installed on the GPU machine); the parts are fakes of the right names."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, load_module


def _load():
    return load_module(ROOT / "scripts" / "gpu_kit.py")


kit_mod = _load()


def _fake_kit(tmp_path, python_version="3.12", extra=()):
    kit = tmp_path / "kit"
    (kit / "src").mkdir(parents=True)
    (kit / "wheels").mkdir()
    (kit / "src" / kit_mod.SDIST).write_bytes(b"sdist" * 100)
    for req in kit_mod.WHEELS:
        name, version = req.split("==")
        (kit / "wheels" / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").write_bytes(b"w" + name.encode())
    for name in extra:
        (kit / "wheels" / name).write_bytes(b"x")
    (kit / "find_nccl.py").write_text("# helper\n")
    m = kit_mod.make_manifest(kit, python_version)
    (kit / kit_mod.MANIFEST).write_text(json.dumps(m))
    return kit, m


def test_a_complete_kit_passes_and_its_manifest_lists_every_file(tmp_path):
    kit, m = _fake_kit(tmp_path)
    assert kit_mod.check_manifest(kit) == []
    paths = {e["path"] for e in m["files"]}
    assert f"src/{kit_mod.SDIST}" in paths and len(paths) == len(kit_mod.WHEELS) + 2
    assert m["total_bytes"] == sum(e["bytes"] for e in m["files"]) and m["python_version"] == "3.12"


def test_changed_missing_and_unlisted_files_are_found(tmp_path):
    kit, _ = _fake_kit(tmp_path)
    (kit / "src" / kit_mod.SDIST).write_bytes(b"tampered")
    whl = next((kit / "wheels").glob("pydantic-*.whl"))
    whl.unlink()
    (kit / "wheels" / "stray-1.0-py3-none-any.whl").write_bytes(b"s")
    problems = "\n".join(kit_mod.check_manifest(kit))
    assert f"src/{kit_mod.SDIST}: changed since the manifest" in problems
    assert f"{whl.relative_to(kit)}: listed in the manifest, not in the kit" in problems
    assert "stray-1.0-py3-none-any.whl: in the kit, not in the manifest" in problems


def test_required_parts_duplicates_and_size(tmp_path):
    kit, m = _fake_kit(tmp_path, extra=("pydantic-2.0.0-py3-none-any.whl",))
    assert any("two versions of pydantic" in p for p in kit_mod.check_manifest(kit))
    m2 = dict(m, files=[e for e in m["files"] if not e["path"].startswith("src/")])
    assert any("the Horovod sdist is missing" in p for p in kit_mod.check_manifest(kit, m2))
    big = dict(m, files=[*m["files"], {"path": "x", "bytes": kit_mod.KIT_BUDGET_BYTES, "sha256": ""}])
    assert any("over its 32 MiB budget" in p for p in kit_mod.check_manifest(kit, big))


def test_install_refuses_another_python_and_a_broken_kit(tmp_path):
    kit, _ = _fake_kit(tmp_path, python_version="2.7")
    with pytest.raises(kit_mod.KitError, match="for Python 2.7; this is Python 3.12"):
        kit_mod.install(kit, tmp_path / "site", machine=_machine(tmp_path))
    (kit / "find_nccl.py").write_text("changed")
    with pytest.raises(kit_mod.KitError, match="does not match its manifest"):
        kit_mod.install(kit, tmp_path / "site", machine=_machine(tmp_path))


def _machine(tmp_path, **kw):
    """The lent machine as its documentation describes it, with every risk present: CMake 4, no
    make, gcc 15, no architecture answer, libcuda.so.1 without libcuda.so, no distutils."""
    facts = dict(python="3.12.3", python_exe=str(tmp_path / "venv" / "bin" / "python3"), torch="2.11.0+cu130",
                 torch_cuda="13.0", gpus=1, cmake="4.1.2", make=False, ninja="1.13.0", gcc="15.1.0", nvcc="13.0",
                 cuda_home=str(tmp_path / "cuda"), cc_list=None, libcuda_unversioned=False,
                 libcuda=str(tmp_path / "driver" / "libcuda.so.580.95"), distutils=False,
                 distutils_src=str(tmp_path / "venv" / "setuptools" / "_distutils"), cpus=16)
    facts.update(kw)
    return kit_mod.Machine(**facts)


def test_the_plan_settles_every_risk_of_the_lent_machine_with_its_fallback(tmp_path):
    m = _machine(tmp_path)
    base = {"PYTHONPATH": "/theirs", "PATH": "/usr/bin", "LD_LIBRARY_PATH": "/driver/lib"}
    private, target = tmp_path / "links", tmp_path / "site"
    plan = kit_mod.plan_build(m, target, private, base_env=base,
                              nccl_vars={"HOROVOD_NCCL_HOME": "/k/nccl", "HOROVOD_NCCL_LINK": "SHARED"})
    env = plan.env
    assert env["CMAKE_POLICY_VERSION_MINIMUM"] == "3.5"  # CMake 4 and gloo's 2.8.12
    assert env["CMAKE_GENERATOR"] == "Ninja"  # no make
    assert env["HOROVOD_BUILD_CUDA_CC_LIST"] == "90"  # the query failed: the H200's, not a dozen
    assert env["HOROVOD_GPU_OPERATIONS"] == "NCCL" and env["HOROVOD_NCCL_HOME"] == "/k/nccl"
    assert env["HOROVOD_CUDA_HOME"] == m.cuda_home and env["MAKEFLAGS"] == "-j16"
    assert env["HOROVOD_WITHOUT_MPI"] == "1" and env["CMAKE_BUILD_PARALLEL_LEVEL"] == "16"
    # libcuda.so: a private link to libcuda.so.1's file, first on the paths, the others kept
    link = private / "lib" / "libcuda.so"
    assert plan.links[str(link)] == m.libcuda
    assert env["LD_LIBRARY_PATH"] == f"{private / 'lib'}:/driver/lib" == plan.exports["LD_LIBRARY_PATH"]
    assert env["LIBRARY_PATH"] == str(private / "lib")
    # distutils: setuptools' copy, importable by the build and by the workers; PYTHONPATH extended
    assert plan.links[str(private / "py" / "distutils")] == m.distutils_src
    assert env["PYTHONPATH"] == f"{private / 'py'}:/theirs"
    assert plan.exports["PYTHONPATH"] == f"{target}:{kit_mod.ROOT}:{private / 'py'}:/theirs"
    assert plan.exports["PATH"] == f"{target / 'bin'}:{tmp_path / 'venv' / 'bin'}:/usr/bin"
    notes = "\n".join(plan.notes)
    for what in ("CMake 4.1.2", "no make: CMake's Ninja generator", "gcc 15.1.0", "building for 90",
                 "libcuda.so missing", "no distutils"):
        assert what in notes, what
    kit_mod.make_links(plan.links)
    assert link.is_symlink() and str(link.readlink()) == m.libcuda


def test_the_plan_takes_no_fallback_where_none_is_needed(tmp_path):
    m = _machine(tmp_path, cmake="3.25.1", make=True, gcc="12.2.0", cc_list="80,90", libcuda_unversioned=True,
                 distutils=True, distutils_src=None)
    plan = kit_mod.plan_build(m, tmp_path / "site", tmp_path / "links", base_env={"PATH": "/usr/bin"},
                              nccl_vars={"HOROVOD_NCCL_HOME": "/k"})
    assert plan.notes == [] and plan.links == {}
    assert "CMAKE_GENERATOR" not in plan.env and "LD_LIBRARY_PATH" not in plan.env
    assert "PYTHONPATH" not in plan.env and "LD_LIBRARY_PATH" not in plan.exports
    assert plan.env["HOROVOD_BUILD_CUDA_CC_LIST"] == "80,90"
    assert plan.env["CMAKE_POLICY_VERSION_MINIMUM"] == "3.5"  # ignored by CMake 3, set anyway
    cpu = kit_mod.plan_build(_machine(tmp_path, torch_cuda=None, make=True), tmp_path / "s", tmp_path / "l",
                             base_env={})
    assert not any(k.startswith(("HOROVOD_GPU", "HOROVOD_BUILD_CUDA", "CUDA_HOME")) for k in cpu.env)
    assert not any("libcuda" in n for n in cpu.notes)


@pytest.mark.parametrize("facts,msg", [({"cmake": None}, "no cmake"), ({"ninja": None}, "neither make nor ninja"),
                                       ({"gcc": None}, "no gcc"), ({"cuda_home": None}, "no CUDA toolkit"),
                                       ({"distutils_src": None}, "has no distutils")])
def test_the_plan_refuses_what_no_fallback_fixes(tmp_path, facts, msg):
    with pytest.raises(kit_mod.KitError, match=msg):
        kit_mod.plan_build(_machine(tmp_path, **facts), tmp_path / "site", tmp_path / "links", base_env={})


def _sdist_tree(root):
    files = {"CMakeLists.txt": "cmake_minimum_required(VERSION 3.13 FATAL_ERROR)\nset(CMAKE_CXX_STANDARD 14)\n",
             "horovod/torch/CMakeLists.txt": "set(CMAKE_CXX_STANDARD 14)\n",
             "horovod/common/ops/cuda/CMakeLists.txt": "set(CMAKE_CUDA_STANDARD 11)\n",
             "third_party/gloo/CMakeLists.txt": "cmake_minimum_required(VERSION 2.8.12 FATAL_ERROR)\n",
             "third_party/gloo/gloo/types.h": "#pragma once\n\n#include <iostream>\n\nuint8_t x;\n",
             "third_party/eigen/bench/CMakeLists.txt": "cmake_minimum_required(VERSION 2.6.2)\n",
             "setup.py": "        if self.verbose:\n            make_args.append('VERBOSE=1')\n"}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_the_source_patches_for_cmake_4_gcc_15_and_torch(tmp_path):
    _sdist_tree(tmp_path)
    done = kit_mod.patch_source(tmp_path)
    assert len(done) == 6, done
    assert kit_mod.patch_source(tmp_path) == []  # idempotent
    for rel in ("CMakeLists.txt", "horovod/torch/CMakeLists.txt"):
        assert "set(CMAKE_CXX_STANDARD 20)" in (tmp_path / rel).read_text()
    assert "set(CMAKE_CUDA_STANDARD 17)" in (tmp_path / "horovod/common/ops/cuda/CMakeLists.txt").read_text()
    types = (tmp_path / "third_party/gloo/gloo/types.h").read_text()
    assert types.index("#include <cstdint>") < types.index("#include <iostream>")
    assert (tmp_path / "third_party/gloo/CMakeLists.txt").read_text().startswith("cmake_minimum_required(VERSION 3.5 ")
    assert "VERSION 3.13" in (tmp_path / "CMakeLists.txt").read_text()  # 3.5 or newer: untouched
    assert "2.6.2" in (tmp_path / "third_party/eigen/bench/CMakeLists.txt").read_text()  # not configured
    assert "if self.verbose and os.environ.get('CMAKE_GENERATOR') != 'Ninja':" in (tmp_path / "setup.py").read_text()
    (tmp_path / "horovod/torch/CMakeLists.txt").write_text("set(CMAKE_CXX_STANDARD 17)\n")
    with pytest.raises(kit_mod.KitError, match="the C\\+\\+ standard line to patch is not there"):
        kit_mod.patch_source(tmp_path)


def test_the_patches_apply_to_the_real_sdist(tmp_path):
    """Against the sdist itself, where a kit was built here (the lines patched are still there)."""
    import tarfile

    sdist = ROOT / ".kit" / "src" / kit_mod.SDIST
    if not sdist.exists():
        pytest.skip("no kit here (scripts/gpu_kit.py build makes one)")
    with tarfile.open(sdist) as tf:
        tf.extractall(tmp_path, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    done = "\n".join(kit_mod.patch_source(tmp_path / kit_mod.SDIST[:-len(".tar.gz")]))
    for what in ("CMakeLists.txt: C++14 -> C++20", "horovod/torch/CMakeLists.txt: C++14 -> C++20",
                 "CUDA C++11 -> C++17", "gloo/types.h: #include <cstdint>", "setup.py: no VERBOSE=1 for Ninja",
                 "third_party/gloo/CMakeLists.txt: cmake_minimum_required -> 3.5"):
        assert what in done, what


def test_a_failed_build_s_summary_has_its_error_lines_not_only_the_tail():
    log = [f"[{i}/900] Building CXX object x{i}.o" for i in range(900)]
    log[300] = "horovod/common/ops/gloo_operations.cc:42:7: error: 'uint8_t' was not declared in this scope"
    log[301] = "   42 |   uint8_t x;"
    log[600] = "CMake Error at third_party/gloo/CMakeLists.txt:1 (cmake_minimum_required):"
    log += ["ninja: build stopped: subcommand failed.", "error: subprocess-exited-with-error"]
    text = kit_mod.summarize_build_log("\n".join(log), tail=5)
    assert "301: horovod/common/ops/gloo_operations.cc:42:7: error: 'uint8_t'" in text
    assert "302:    42 |   uint8_t x;" in text  # the line after, where the message goes on
    assert "601: CMake Error at third_party/gloo" in text
    assert text.rstrip().endswith("error: subprocess-exited-with-error")
    assert "Building CXX object x100.o" not in text and "-- 4 error line(s) in 902 lines" in text
    cmake = ["CMake Warning (deprecated) at third_party/gloo/CMakeLists.txt:1 (cmake_minimum_required):",
             "  Compatibility with CMake < 3.10 will be removed from a future version of", "",
             "  error: subprocess-exited-with-error",
             "CMake Error at FindPackageHandleStandardArgs.cmake:290 (message):",
             "  Could NOT find CUDAToolkit (missing: CUDA_CUDART)"]
    assert kit_mod.first_error("\n".join(cmake)) == ("CMake Error at FindPackageHandleStandardArgs.cmake:290 "
                                                     "(message): Could NOT find CUDAToolkit (missing: CUDA_CUDART)")
    assert kit_mod.first_error("all good") == "no error line"


_FAKE_SETUP = """import os, sys
from setuptools import setup
with open(os.environ["FAKE_BUILD_RECORD"], "a") as f:
    for k in ("CMAKE_GENERATOR", "CMAKE_POLICY_VERSION_MINIMUM", "HOROVOD_WITH_PYTORCH"):
        f.write(f"{k}={os.environ.get(k, '')}\\n")
if os.environ.get("FAKE_BUILD_SLEEP"):
    import time
    time.sleep(float(os.environ["FAKE_BUILD_SLEEP"]))
if os.environ.get("FAKE_BUILD_FAIL"):
    print("horovod/common/x.cc:1:1: error: failed on purpose")
    sys.exit(1)
setup(name="horovod", version="0.28.1", packages=["horovod"])
"""


def _tiny_wheel(folder):
    """A real (minimal) wheel: pip installs it."""
    import zipfile

    path = folder / "tinypkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("tinypkg/__init__.py", "VALUE = 7\n")
        z.writestr("tinypkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n")
        z.writestr("tinypkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                   "Tag: py3-none-any\n")
        z.writestr("tinypkg-1.0.dist-info/RECORD", "")
    return path


def _buildable_kit(tmp_path, monkeypatch):
    """A kit whose sdist is a tiny setuptools project named horovod (with the lines the patches
    change) that records the build's environment, and whose one wheel is real."""
    import tarfile

    monkeypatch.setattr(kit_mod, "WHEELS", ("tinypkg==1.0",))
    kit = tmp_path / "kit"
    (kit / "src").mkdir(parents=True)
    (kit / "wheels").mkdir()
    _tiny_wheel(kit / "wheels")
    src = tmp_path / "sdist" / kit_mod.SDIST[:-len(".tar.gz")]
    _sdist_tree(src)
    (src / "setup.py").write_text(_FAKE_SETUP)
    (src / "horovod").mkdir(exist_ok=True)
    (src / "horovod" / "__init__.py").write_text("__version__ = '0.28.1'\n")
    with tarfile.open(kit / "src" / kit_mod.SDIST, "w:gz") as tf:
        tf.add(src, arcname=src.name)
    (kit / "find_nccl.py").write_text("# helper\n")
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    (kit / kit_mod.MANIFEST).write_text(json.dumps(kit_mod.make_manifest(kit, version)))
    machine = _machine(tmp_path, python=f"{version}.0", python_exe=sys.executable, torch_cuda=None, make=False,
                       ninja="1.11.1", cmake="4.0.3", distutils=True)
    record = tmp_path / "build-env.txt"
    monkeypatch.setenv("FAKE_BUILD_RECORD", str(record))
    return kit, machine, record


def test_install_builds_with_the_plan_once_and_a_rerun_skips_the_build(tmp_path, monkeypatch):
    kit, machine, record = _buildable_kit(tmp_path, monkeypatch)
    target = tmp_path / "build" / "site"
    said = []
    done = kit_mod.install(kit, target, python=sys.executable, log=said.append, machine=machine)
    assert done.built.startswith("built in ") and len(done.patches) == 5
    seen = record.read_text()
    assert "CMAKE_GENERATOR=Ninja" in seen and "CMAKE_POLICY_VERSION_MINIMUM=3.5" in seen
    assert "HOROVOD_WITH_PYTORCH=1" in seen
    assert (target / "tinypkg" / "__init__.py").exists() and (target / "horovod" / "__init__.py").exists()
    assert any("no make: CMake's Ninja generator" in s for s in said)
    built_sdist = target.parent / "site-build" / kit_mod.SDIST[:-len(".tar.gz")]
    assert "CMAKE_CUDA_STANDARD 17" in (built_sdist / "horovod/common/ops/cuda/CMakeLists.txt").read_text()
    again = kit_mod.install(kit, target, python=sys.executable, log=said.append, machine=machine)
    assert again.built == "already installed" and record.read_text() == seen  # no second build
    (target / ".elastic-ring-kit").unlink()  # the install lost, the wheel kept: no build either
    third = kit_mod.install(kit, target, python=sys.executable, log=said.append, machine=machine)
    assert third.built == "wheel from an earlier build" and record.read_text() == seen
    p = subprocess.run([sys.executable, "-c", "import tinypkg, horovod; print(tinypkg.VALUE, horovod.__version__)"],
                       capture_output=True, text=True, env={**done.exports, "PATH": done.exports["PATH"]})
    assert p.stdout.split() == ["7", "0.28.1"], p.stderr


def test_a_failed_build_names_its_first_error_and_keeps_the_log(tmp_path, monkeypatch):
    kit, machine, _ = _buildable_kit(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_BUILD_FAIL", "1")
    with pytest.raises(kit_mod.BuildFailed, match="x.cc:1:1: error: failed on purpose") as e:
        kit_mod.install(kit, tmp_path / "site", python=sys.executable, log=lambda s: None, machine=machine)
    assert "error: failed on purpose" in kit_mod.summarize_build_log(e.value.log.read_text())
    assert not (tmp_path / "site" / ".elastic-ring-kit").exists()


def test_a_build_past_its_time_is_stopped_and_a_rerun_continues_it(tmp_path, monkeypatch):
    kit, machine, _ = _buildable_kit(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_BUILD_SLEEP", "60")
    t0 = time.monotonic()
    with pytest.raises(kit_mod.BuildFailed, match="did not end in 3 s"):
        kit_mod.install(kit, tmp_path / "site", python=sys.executable, log=lambda s: None, machine=machine,
                        build_timeout=3)
    assert time.monotonic() - t0 < 30
    assert (tmp_path / "site-build" / "KEY").exists()  # the stopped build's folder stays
    monkeypatch.delenv("FAKE_BUILD_SLEEP")
    said = []
    done = kit_mod.install(kit, tmp_path / "site", python=sys.executable, log=said.append, machine=machine)
    assert done.built.startswith("built in ") and any("continuing the unfinished build" in s for s in said)
    assert done.patches == []  # the same source, patched once


def test_probe_reads_this_machine(tmp_path):
    import platform

    m = kit_mod.probe(sys.executable)
    assert m.python == platform.python_version() and m.python_exe == sys.executable
    try:
        import torch
    except ImportError:
        torch = None
    assert m.torch == (torch.__version__ if torch else None)
    assert m.make == (shutil.which("make") is not None) and m.cpus >= 1
    assert m.cmake is None or m.cmake[0].isdigit()
    line = m.line()
    assert f"python {m.python}" in line and "cmake" in line and "gcc" in line and "distutils" in line


def test_the_kit_built_here_installs_with_target_into_its_python(tmp_path):
    """The kit of this checkout (scripts/gpu_kit.py build), where one was built: its wheels are for
    the Python it names, complete, and install with --target into a Python of that version (found
    as pythonX.Y on PATH, or GPU_KIT_TEST_PYTHON), where pydantic then imports."""
    import os

    kit = ROOT / ".kit"
    if not (kit / kit_mod.MANIFEST).exists():
        pytest.skip("no kit here (scripts/gpu_kit.py build makes one)")
    assert kit_mod.check_manifest(kit) == []
    want = json.loads((kit / kit_mod.MANIFEST).read_text())["python_version"]
    tag = "cp" + want.replace(".", "")
    binary = [p.name for p in (kit / "wheels").glob("*.whl") if "-py3-none-any" not in p.name]
    assert binary and all(f"-{tag}-" in n for n in binary), binary
    py = None
    for cand in (os.environ.get("GPU_KIT_TEST_PYTHON"), shutil.which(f"python{want}")):
        if cand and subprocess.run([cand, "-c", f"import sys; assert '%d.%d' % sys.version_info[:2] == '{want}'"],
                                   capture_output=True).returncode == 0:
            py = cand
            break
    if py is None:
        pytest.skip(f"no Python {want} here to install the kit into")
    r = subprocess.run([py, "-m", "pip", "--disable-pip-version-check", "install", "-q", "--no-index", "--no-deps",
                        "--no-compile", "--target", str(tmp_path / "site"), *map(str, (kit / "wheels").glob("*.whl"))],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([py, "-c", "import pydantic, cffi; print(pydantic.VERSION)"], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(tmp_path / "site")))
    assert r.returncode == 0 and r.stdout.strip() == next(w for w in kit_mod.WHEELS if w.startswith("pydantic=="))[10:]


def test_the_wheel_list_matches_what_setup_installs():
    """The kit's pins are the versions this project's venv holds (pydantic and its parts)."""
    from importlib.metadata import version

    for req in kit_mod.WHEELS:
        name, want = req.split("==")
        assert version(name) == want, f"{name}: the venv has {version(name)}, the kit pins {want}"


def test_verify_cli_one_line_per_problem(tmp_path):
    kit, _ = _fake_kit(tmp_path)
    ok = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_kit.py"), "verify", "--kit", str(kit)],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and "matches its manifest" in ok.stdout
    (kit / kit_mod.MANIFEST).unlink()
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_kit.py"), "verify", "--kit", str(kit)],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "MANIFEST.json is missing" in bad.stderr


def test_find_nccl_says_what_is_missing(tmp_path, monkeypatch):
    fn = load_module(ROOT / "scripts" / "find_nccl.py")
    wheel = tmp_path / "nvidia" / "nccl"
    (wheel / "lib").mkdir(parents=True)
    (wheel / "lib" / "libnccl.so.2").write_bytes(b"")
    monkeypatch.setattr(fn, "wheel_dir", lambda: wheel)
    monkeypatch.setattr(fn, "SYSTEM_INCLUDES", [])
    found, what = fn.find(tmp_path / "home", {})
    assert found is None and "no nccl.h was found" in what  # a wheel with the library alone
    (wheel / "include").mkdir()
    (wheel / "include" / "nccl.h").write_text("#define NCCL_MAJOR 2\n")
    found, what = fn.find(tmp_path / "home", {})
    assert found == {"HOROVOD_NCCL_HOME": str(tmp_path / "home"), "HOROVOD_NCCL_LINK": "SHARED"}
    assert (tmp_path / "home" / "lib" / "libnccl.so").resolve() == (wheel / "lib" / "libnccl.so.2").resolve()
    assert (tmp_path / "home" / "include" / "nccl.h").exists()
    given, _ = fn.find(tmp_path / "home", {"HOROVOD_NCCL_HOME": "/opt/nccl"})
    assert given == {"HOROVOD_NCCL_HOME": "/opt/nccl", "HOROVOD_NCCL_LINK": "SHARED"}
    monkeypatch.setattr(fn, "wheel_dir", lambda: None)
    monkeypatch.setattr(fn, "SYSTEM_LIBS", [])
    none, what = fn.find(tmp_path / "home", {})
    assert none is None and "nccl.h and libnccl.so missing" in what
