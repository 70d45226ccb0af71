"""The launcher's fork server asked for torch._dynamo where the run's workers import it: a script
(its torch.optim step, DistributedDataParallel) or a torch group the controller serves; never for
the built-in trainer on Horovod, whose workers never import it (elastic_ring.train.optim)."""

from __future__ import annotations

import sys

import pytest

from elastic_ring import env as envvars
from elastic_ring.controller.backends.api import BUILTIN_TARGET
from elastic_ring.controller.backends.horovodrun import SubprocessLauncher
from elastic_ring.worker import zygote


@pytest.mark.parametrize("target, extra_env, own, want", [
    (BUILTIN_TARGET, {}, [], False),  # the built-in trainer on Horovod (horovodrun, Horovod Elastic)
    ("/home/me/train.py", {}, [], True),  # a script
    (BUILTIN_TARGET, {envvars.STORE: "127.0.0.1:4242"}, [], True),  # a torch group on several hosts
    (BUILTIN_TARGET, {}, ["-m", "elastic_ring.controller.backends.local", "--nproc", "2"], True),  # torch, local
    (BUILTIN_TARGET, {}, ["--ring-by-controller"], True),  # torch, in place (local.LocalRingBackend)
    ("/home/me/train.py", {}, ["-np", "1", "--min-np", "1", "--max-np", "4"], True),  # Horovod Elastic (its spare)
])
def test_the_fork_server_imports_torch_dynamo_only_where_the_workers_would(tmp_path, monkeypatch, target,
                                                                           extra_env, own, want):
    asked = []
    monkeypatch.setattr(zygote, "ensure", lambda compile_=False: asked.append(compile_) or None)
    cmd = [sys.executable, "-c", "pass", *own, "--run-dir", str(tmp_path), "--", target, "--epochs", "1"]
    h = SubprocessLauncher(fork_server=True).start(cmd, dict(extra_env), tmp_path / "log.txt")
    h.p.wait(timeout=60)
    assert asked == [want]
    SubprocessLauncher(fork_server=False).start(cmd, {}, tmp_path / "log2.txt").p.wait()
    assert asked == [want]  # no fork server, none asked for
