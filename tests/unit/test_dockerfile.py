"""The Dockerfile and .dockerignore, read (no Docker engine here): the properties a GPU image needs.

- the set-up (torch, Horovod) runs before the source is copied, from files copied one by one, and
  every file scripts/setup.sh uses is among them: a code change rebuilds neither torch nor Horovod;
- NCCL packages, where named, are pinned and installed with --allow-change-held-packages (the CUDA
  images hold libnccl2);
- Horovod is built with NCCL for a named list of GPU architectures;
- a local .venv, run folders and .git stay out of the build context.
"""

from __future__ import annotations

import re
import shlex

from tests.conftest import ROOT


def _instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)  # line continuations
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            op, _, rest = line.partition(" ")
            out.append((op.upper(), rest.strip()))
    return out


def test_dependencies_are_installed_before_the_source_is_copied():
    ins = _instructions()
    copy_all = next(i for i, (op, rest) in enumerate(ins) if op == "COPY" and rest.split()[0] == ".")
    setup_runs = [i for i, (op, rest) in enumerate(ins) if op == "RUN" and "scripts/setup.sh" in rest]
    assert setup_runs and setup_runs[0] < copy_all, "set-up must run before COPY . (layer cache)"
    early = set()
    for op, rest in ins[:setup_runs[0]]:
        if op == "COPY":
            *srcs, _dest = rest.split()
            for s in srcs:
                assert (ROOT / s).exists(), f"COPY {s}: no such file"
                early.add(s)
    # every repository file that setup.sh reads is copied before it runs
    used = set(re.findall(r"scripts/[\w.]+\.(?:py|sh)|pyproject\.toml", (ROOT / "scripts/setup.sh").read_text()))
    assert used <= early, f"setup.sh reads {sorted(used - early)}, not copied before it runs"


def test_nccl_is_pinned_and_held_packages_allowed():
    ins = _instructions()
    env = " ".join(rest for op, rest in ins if op in ("ENV", "ARG"))
    assert "HOROVOD_GPU_OPERATIONS=NCCL" in env
    m = re.search(r"HOROVOD_BUILD_CUDA_CC_LIST=(\S+)", env)
    assert m, "HOROVOD_BUILD_CUDA_CC_LIST unset: every architecture would be compiled"
    arg = re.search(r"CUDA_CC_LIST=([\d,]+)", env)
    assert arg and all(x.isdigit() for x in arg.group(1).split(","))
    for op, rest in ins:
        if op != "RUN":
            continue
        for cmd in rest.split("&&"):
            words = shlex.split(cmd.replace(";", " "))
            if "install" in words and ("apt-get" in words or "apt" in words):
                nccl = [w for w in words if w.startswith("libnccl")]
                assert all("=" in w for w in nccl), f"unpinned NCCL package in: {cmd.strip()}"
                if nccl or "$NCCL_APT" in cmd:
                    assert "--allow-change-held-packages" in words, cmd.strip()


def test_dockerignore_keeps_local_state_out():
    lines = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")}
    for needed in (".venv", ".git", "runs", "**/__pycache__"):
        assert needed in lines, f".dockerignore lacks {needed}"
    # and nothing the image needs is ignored
    for kept in ("elastic_ring", "scripts", "configs", "pyproject.toml", "launch"):
        assert kept not in lines
