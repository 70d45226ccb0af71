"""scripts/gpu_kit.py: the kit's manifest and its checks, the build environment, the install's
refusals. No download and no build here (the kit is made by ``gpu_kit.py build`` where pip reaches
an index, and installed on the GPU machine); the parts are fakes of the right names."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def _load():
    spec = importlib.util.spec_from_file_location("gpu_kit", ROOT / "scripts" / "gpu_kit.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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
    with pytest.raises(kit_mod.KitError, match="for Python 2.7; this is Python"):
        kit_mod.install(kit, tmp_path / "site")
    (kit / "find_nccl.py").write_text("changed")
    with pytest.raises(kit_mod.KitError, match="does not match its manifest"):
        kit_mod.install(kit, tmp_path / "site")


def test_build_env_nccl_for_the_machines_architecture_only():
    env = kit_mod.build_env("/usr/local/cuda", "90", {"HOROVOD_NCCL_HOME": "/k/nccl", "HOROVOD_NCCL_LINK": "SHARED"}, 16)
    assert env["HOROVOD_GPU_OPERATIONS"] == "NCCL" and env["HOROVOD_BUILD_CUDA_CC_LIST"] == "90"
    assert env["HOROVOD_NCCL_HOME"] == "/k/nccl" and env["MAKEFLAGS"] == "-j16"
    assert env["HOROVOD_CUDA_HOME"] == "/usr/local/cuda" and env["HOROVOD_WITHOUT_MPI"] == "1"
    cpu = kit_mod.build_env(None, None, {}, 2)
    assert "HOROVOD_GPU_OPERATIONS" not in cpu and "CUDA_HOME" not in cpu


def test_cxx20_patch_of_both_cmakelists(tmp_path):
    for rel in ("CMakeLists.txt", "horovod/torch/CMakeLists.txt"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x\nset(CMAKE_CXX_STANDARD 14)\n")
    kit_mod._patch_cxx20(tmp_path)
    kit_mod._patch_cxx20(tmp_path)  # idempotent
    for rel in ("CMakeLists.txt", "horovod/torch/CMakeLists.txt"):
        assert "set(CMAKE_CXX_STANDARD 20)" in (tmp_path / rel).read_text()


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
    spec = importlib.util.spec_from_file_location("find_nccl", ROOT / "scripts" / "find_nccl.py")
    fn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fn)
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
