"""The local launcher as torchrun's agent for a script of torchrun's contract
(``elastic_ring.controller.backends.local``, ``--torchrun``): what the backend starts and tells the
workers, and how one segment ends (a stop asked, a failure, all done), with real child processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import types

from elastic_ring import protocol
from elastic_ring.controller.backends import LaunchOptions, Relaunch, make_launch
from elastic_ring.controller.backends import local, local_launcher
from elastic_ring.controller.backends.api import SegmentLaunch
from elastic_ring.events.api import EventLog, Restart, read_events
from elastic_ring.worker import torchrun

TORCHRUN_SCRIPT = "import torch.distributed as dist\ndist.init_process_group('gloo')\n"


def _spec(tmp_path, script):
    return types.SimpleNamespace(run_dir=tmp_path, script=str(script) if script else None, script_args=("--x",),
                                 extra_env={}, device="cpu", slots=2, hosts=None, hostfile=None, cwd="")


def test_the_backend_starts_a_torchrun_script_with_torchrun_s_environment(tmp_path):
    (tmp_path / "tr.py").write_text(TORCHRUN_SCRIPT)
    started = []

    class Launcher:
        def start(self, cmd, env, log_path):
            started.append((cmd, env))
            return types.SimpleNamespace(pid=1, poll=lambda: None, kill=lambda: None)

    spec = _spec(tmp_path, tmp_path / "tr.py")
    backend, resize = make_launch(LaunchOptions(relaunch="sequential", collective="torch", stop_grace=7.5,
                                                max_restarts=4), spec, launcher=Launcher())
    assert isinstance(backend, local.LocalBackend) and backend.torchrun and resize == Relaunch("sequential")
    backend.start(SegmentLaunch(2, 0, 10, "me"), tmp_path / "0.log")
    EventLog(tmp_path / "events.jsonl").write(Restart(attempt=1, cause="x", rank=1, returncode=137, segment=0,
                                                      world_size=2, from_step=0, failed_at_step=0, steps_redone=0,
                                                      new_world_size=2, gave_up=False))
    backend.start(SegmentLaunch(1, 1, 10, "me"), tmp_path / "1.log")
    (cmd0, env0), (cmd1, env1) = started
    own = cmd0[cmd0.index("--nproc"):cmd0.index("--")]
    assert own == ["--nproc", "2", "--torchrun", "--run-dir", str(tmp_path), "--segment", "0", "--stop-grace", "7.5"]
    assert cmd1[cmd1.index("--segment") + 1] == "1" and cmd1[-2:] == [str(tmp_path / "tr.py"), "--x"]
    assert env0[torchrun.FORM_ENV] == "torchrun" and env0["TORCHELASTIC_MAX_RESTARTS"] == "4"
    assert env0["TORCHELASTIC_RUN_ID"] == tmp_path.name
    assert (env0["TORCHELASTIC_RESTART_COUNT"], env1["TORCHELASTIC_RESTART_COUNT"]) == ("0", "1")  # failures
    plain, _ = make_launch(LaunchOptions(relaunch="overlap", collective="torch"), _spec(tmp_path, None))
    assert not plain.torchrun and "--torchrun" not in local.launcher_command(plain.spec, SegmentLaunch(1, 0, 5, "me"))


def _procs(*codes: str) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", c]) for c in codes]


SLEEP = "import time; time.sleep(60)"
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"


def test_a_stop_asked_ends_every_worker_sigterm_then_sigkill_after_the_grace(tmp_path):
    procs = [*_procs(SLEEP), subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True)]
    assert procs[1].stdout.readline() == "up\n"  # the stubborn one ignores SIGTERM from now on
    protocol.stop_file(tmp_path, 3).parent.mkdir(parents=True, exist_ok=True)
    protocol.stop_file(tmp_path, 3).touch()
    t0 = time.time()
    assert local_launcher.supervise_torchrun(procs, tmp_path, 3, grace_s=1.0, poll_s=0.01) == 0
    took = time.time() - t0
    assert procs[0].returncode == -15 and procs[1].returncode == -9  # SIGTERM; SIGKILL after the grace
    assert 0.9 <= took < 10
    (end,) = read_events(tmp_path / protocol.WORKER_EVENTS, "segment_end")
    assert (end.segment, end.world_size, end.reason, end.step) == (3, 2, "requested", 0)
    assert end.stop_decided_at <= t0 + 0.5


def test_a_failed_worker_stops_the_others_and_its_status_is_the_segment_s(tmp_path, capfd):
    procs = _procs(SLEEP, "import sys, time; time.sleep(0.3); sys.exit(3)")
    assert local_launcher.supervise_torchrun(procs, tmp_path, 0, grace_s=5.0, poll_s=0.01) == 3
    assert procs[0].returncode == -15  # ended by SIGTERM, within the grace
    assert "elastic-ring local launcher: rank 1 exited with status 3" in capfd.readouterr().err
    assert not (tmp_path / protocol.WORKER_EVENTS).exists()  # no end: the controller restarts the segment


def test_all_workers_done_end_the_segment_finished(tmp_path):
    procs = _procs("pass", "import time; time.sleep(0.2)")
    assert local_launcher.supervise_torchrun(procs, tmp_path, 2, grace_s=5.0, poll_s=0.01) == 0
    assert [e.reason for e in read_events(tmp_path / protocol.WORKER_EVENTS, "segment_end")] == ["finished"]


def test_the_launcher_gives_each_worker_torchrun_s_names_and_a_free_port(tmp_path):
    code = ("import json, os; open(os.path.join(%r, 'env-' + os.environ['RANK']), 'w').write(json.dumps({k: "
            "os.environ.get(k) for k in ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'GROUP_RANK', "
            "'GROUP_WORLD_SIZE', 'ROLE_RANK', 'ROLE_WORLD_SIZE', 'ROLE_NAME', 'MASTER_ADDR', 'MASTER_PORT', "
            "'TORCHELASTIC_USE_AGENT_STORE', %r)}))" % (str(tmp_path), protocol.STORE_FD_ENV))
    p = subprocess.run([sys.executable, "-m", "elastic_ring.controller.backends.local", "--nproc", "2", "--torchrun",
                        "--run-dir", str(tmp_path), "--segment", "0", "--stop-grace", "1", "--",
                        sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    envs = [json.loads((tmp_path / f"env-{r}").read_text()) for r in range(2)]
    for r, e in enumerate(envs):
        assert e == {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                     "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_RANK": str(r), "ROLE_WORLD_SIZE": "2",
                     "ROLE_NAME": "default", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": envs[0]["MASTER_PORT"],
                     "TORCHELASTIC_USE_AGENT_STORE": "False", protocol.STORE_FD_ENV: None}  # no socket handed over
    assert [e.reason for e in read_events(tmp_path / protocol.WORKER_EVENTS, "segment_end")] == ["finished"]
    bad = subprocess.run([sys.executable, "-m", "elastic_ring.controller.backends.local", "--nproc", "2", "--torchrun",
                          "--", "true"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "usage:" in bad.stderr
