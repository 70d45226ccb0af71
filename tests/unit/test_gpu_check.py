"""scripts/gpu_check.sh and scripts/gpu_check.py without a GPU: one-line refusals (no GPU, bad
options, a kit folder without a kit), where the report goes, and the stage runner with fake
stages: the report rewritten after every stage, a failed stage's run events and output kept beside
it within the files a device tool brings back, the budget, the runs' folder removed. The full CPU
dry run, and a real late failure, are tests/integration/test_inplace_gpu_check.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

from pathlib import Path

import pytest

from tests.conftest import ROOT, ended, load_module, wait_for

SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _load():
    return load_module(ROOT / "scripts" / "gpu_check.py")


gc = _load()


def _run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "--python", sys.executable, *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env=env)


def test_without_a_gpu_it_fails_fast_with_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    p = _run()
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().count("\n") == 0 and "no CUDA GPU" in p.stderr and "--device cpu" in p.stderr
    assert f"torch {torch.__version__}" in p.stderr  # which torch it asked


@pytest.mark.parametrize("args,msg", [(["--device", "tpu"], "invalid choice: 'tpu'"),
                                      (["--frobnicate"], "unrecognized arguments: --frobnicate"),
                                      (["--modes", "warp"], "unknown relaunch mode 'warp'"),
                                      (["--stages", "bare nap"], "unknown stage 'nap'")])
def test_bad_options_exit_2_with_one_line(args, msg):
    p = _run(*args)
    assert p.returncode == 2 and msg in p.stderr and p.stderr.strip().count("\n") == 0 and p.stdout == ""


def test_help_describes_every_step():
    p = _run("--help")
    assert p.returncode == 0
    for what in ("bare start", "ResNet-110", "NVML", "--resume", "inplace", "--device cpu", "--kit",
                 "two-rank allreduce", "augmented", "FAILS when it lists no GPU", "$OUT/gpu_check.md",
                 'carry=[".kit"]', "timeout_s=600", "at most 8 files", "what one GPU cannot show"):
        assert what in p.stdout, what


def test_a_kit_folder_without_a_kit_is_refused_in_one_line_that_says_to_carry_it(tmp_path):
    p = _run("--device", "cpu", "--kit", str(tmp_path))
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().count("\n") == 0 and "holds no MANIFEST.json" in p.stderr
    assert 'carry=[".kit"]' in p.stderr


def test_the_report_goes_to_out_or_the_results_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gc._report_path("cuda", None) == (tmp_path / "gpu_check.md", 1)  # one file left for the log
    assert gc._report_path("cpu", None) == (tmp_path / "gpu_check_cpu.md", 1)
    assert gc._report_path("cuda", str(tmp_path / "r.md")) == (tmp_path / "r.md", 0)
    monkeypatch.setenv("OUT", str(tmp_path / "missing"))
    assert gc._report_path("cuda", None) == (ROOT / "results" / "gpu_check.md", 0)
    monkeypatch.delenv("OUT")
    assert gc._report_path("cpu", None) == (ROOT / "results" / "gpu_check_cpu.md", 0)


@pytest.fixture
def ctrl_c_as_in_main():
    """SIGINT handled in this process as ``gpu_check.main`` handles it, so that the commands a
    test runs start with SIGINT's default action, as the check's own do: a test run started in
    the background by a shell without job control (a CI job) inherits SIGINT ignored, and so
    would its commands (each then ended only by the SIGKILL 20 s after its Ctrl-C)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def _check(tmp_path, left=500.0, fail_at=None):
    (tmp_path / "runs").mkdir(exist_ok=True)
    return gc.Check("cpu", sys.executable, tmp_path / "runs", time.monotonic() + left, ["inplace"], fail_at,
                    env=dict(os.environ))


def _stage(name, fn, essential=False, need=1):
    return gc.Stage(name, f"Stage {name}", need, essential, fn)


def test_the_report_is_written_after_every_stage_and_a_late_failure_keeps_its_evidence(tmp_path):
    out = tmp_path / "out"
    report = gc.Report(out / "gpu_check.md", ["# GPU check", ""], reserved=1)
    c = _check(tmp_path)
    seen_during_b = []

    def a(c):
        return ["a's figure: 42 images/s"], "42 images/s", []

    def b(c):
        seen_during_b.append(report.text())  # what a kill at this moment would leave
        run = c.tmp / "b-run"
        run.mkdir()
        (run / "events.jsonl").write_text(json.dumps({"kind": "first_step", "step": 1}) + "\n")
        raise gc.StageFailed("the resume exited 2: No such option", run,
                             "\n".join(f"line {i}" for i in range(500)) + "\nError: No such option")

    def d(c):
        return ["d ran after b failed"], "ok", ["d's check failed"]

    gc.run_stages(c, report, [_stage("a", a), _stage("b", b), _stage("d", d)])
    assert "a's figure: 42 images/s" in seen_during_b[0] and "running 2/3: b" in seen_during_b[0]
    text = report.text()
    assert "a's figure" in text and "**FAILED**: the resume exited 2" in text and "d ran after b failed" in text
    assert "- FAILED: b: the resume exited 2" in text and "- FAILED: d's check failed" in text
    assert "| a |" in text and "| b |" in text and "FAILED |" in text
    files = sorted(p.name for p in out.iterdir())
    assert files == ["gpu_check.b.events.jsonl", "gpu_check.b.output_tail.txt", "gpu_check.md"]
    assert json.loads((out / "gpu_check.b.events.jsonl").read_text())["kind"] == "first_step"
    tail = (out / "gpu_check.b.output_tail.txt").read_text()
    assert tail.rstrip().endswith("Error: No such option") and "line 100\n" not in tail  # a tail, not all
    assert "`gpu_check.b.events.jsonl`" in text


def test_a_failed_essential_stage_stops_the_rest_and_a_build_failure_keeps_its_error_lines(tmp_path):
    report = gc.Report(tmp_path / "out" / "r.md", ["# t", ""])
    log = tmp_path / "build.log"
    log.write_text("\n".join([f"[{i}/500] Building" for i in range(500)] +
                             ["gloo/types.h:66:11: error: 'uint8_t' does not name a type"] +
                             [f"[{i}/500] more" for i in range(40)] + ["ninja: build stopped"]))
    ran = []

    def setup(c):
        raise gc.StageFailed("the Horovod build failed", build_log=log)

    gc.run_stages(_check(tmp_path), report, [_stage("setup", setup, essential=True),
                                             _stage("bare", lambda c: ran.append(1))])
    assert ran == []
    text = report.text()
    assert "Not run: the setup stage failed." in text
    errors = (tmp_path / "out" / "r.setup.build_errors.txt").read_text()
    assert "error: 'uint8_t' does not name a type" in errors and "ninja: build stopped" in errors


def test_no_more_files_than_a_device_tool_brings_back(tmp_path):
    report = gc.Report(tmp_path / "out" / "gpu_check.md", ["# t", ""], reserved=1)

    def failing(c):
        run = c.tmp / f"run{len(report.failures)}"
        run.mkdir()
        (run / "events.jsonl").write_text("{}\n")
        raise gc.StageFailed("no", run, "output")

    gc.run_stages(_check(tmp_path), report, [_stage(n, failing) for n in "abcdef"])
    files = list((tmp_path / "out").iterdir())
    assert len(files) + 1 <= gc.MAX_FILES  # and the caller's log beside them
    assert "Not kept: the limit of files brought back" in report.text()


def test_a_stage_without_time_left_is_not_started(tmp_path):
    report = gc.Report(tmp_path / "r.md", ["# t", ""])
    gc.run_stages(_check(tmp_path, left=30), report, [_stage("a", lambda c: (["x"], "ok", []), need=20),
                                                      _stage("b", lambda c: (["y"], "ok", []), need=60)])
    text = report.text()
    assert "x" in text and "Not run: only" in text and "left of the command's 585 s" in text


def test_an_interrupt_writes_the_report_and_keeps_the_current_run(tmp_path):
    report = gc.Report(tmp_path / "out" / "r.md", ["# t", ""])

    def slow(c):
        c.current_run = c.tmp / "run"
        c.current_run.mkdir()
        (c.current_run / "events.jsonl").write_text('{"kind": "throughput"}\n')
        raise gc.Interrupted("SIGTERM")

    with pytest.raises(gc.Interrupted):
        gc.run_stages(_check(tmp_path), report, [_stage("a", lambda c: (["done a"], "ok", [])), _stage("b", slow)])
    text = report.text()
    assert "done a" in text and "interrupted in b" in text and "**Interrupted** by SIGTERM" in text
    assert (tmp_path / "out" / "r.b.events.jsonl").exists()


def test_a_command_past_its_time_is_stopped_with_its_children(tmp_path, ctrl_c_as_in_main):
    c = _check(tmp_path)
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
           "print('started', flush=True); time.sleep(60)"
    t0 = time.monotonic()
    with pytest.raises(gc.StageFailed, match="no end after 2 s") as e:
        c.run([sys.executable, "-c", code], 2, "the sleeper")
    assert time.monotonic() - t0 < 30 and "started" in e.value.output


def test_a_child_that_ignores_ctrl_c_is_killed_once_the_command_has_ended(tmp_path, ctrl_c_as_in_main):
    """The command ends at its Ctrl-C, a child of it does not (it ignores SIGINT): the rest of
    its group is killed then, not after the 20 s grace, and the command's output is kept."""
    c = _check(tmp_path)
    pid_file = tmp_path / "child.pid"
    child = (f"import os, signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
             f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)")
    code = (f"import os, subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {child!r}]); "
            f"[time.sleep(0.05) for _ in range(600) if not os.path.exists({str(pid_file)!r})]; "
            "print('started', flush=True); time.sleep(60)")
    t0 = time.monotonic()
    with pytest.raises(gc.StageFailed, match="no end after 2 s") as e:
        c.run([sys.executable, "-c", code], 2, "the sleeper")
    took = time.monotonic() - t0
    assert "started" in e.value.output and took < 15, took  # (the grace alone is 20 s)
    pid = int(pid_file.read_text())
    wait_for(lambda: ended(pid), 5, f"the end of the child {pid} that ignored Ctrl-C", poll=0.05)


def test_the_runs_folder_is_removed_however_the_check_ends(tmp_path, monkeypatch):
    """The runs live in one gpu-check-* folder under TMPDIR, removed when the check ends (here a
    stage failing on purpose)."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.setattr(gc.gpu_kit, "probe", lambda py: gc.gpu_kit.Machine(python="3.11.7", python_exe=py,
                                                                           torch="2.14.1"))
    status = gc.main(["--device", "cpu", "--stages", "setup", "--fail-at", "setup", "--out", str(tmp_path / "r.md")])
    assert status == 1 and list(tmpdir.iterdir()) == []
    text = (tmp_path / "r.md").read_text()
    assert "**FAILED**: failed on purpose" in text and "Found: no kit | python" in text
    assert "Measured with torch 2.14.1 (CUDA none), Python 3.11.7." in text


def test_the_report_says_which_torch_it_measured_and_what_one_gpu_cannot_show(tmp_path):
    m = gc.gpu_kit.Machine(python="3.12.3", python_exe="python3", torch="2.11.0+cu130", torch_cuda="13.0", gpus=1)
    head = "\n".join(gc.header_lines(m, "cuda", "kit .kit | python 3.12.3", "NVIDIA H200, 580.95, 143771 MiB",
                                     "--kit .kit"))
    assert "# GPU check (CUDA, 1 GPU(s))" in head and "GPU: NVIDIA H200" in head
    assert "no peer" in head and "nor a resize between GPUs" in head
    c = _check(tmp_path)
    c.machine, c.horovod = m, "Horovod 0.28.1 (NCCL built: yes)"
    assert c.measured() == ("Measured with torch 2.11.0+cu130 (CUDA 13.0), Python 3.12.3, "
                            "Horovod 0.28.1 (NCCL built: yes).")
    two = gc.gpu_kit.Machine(python="3.12.3", python_exe="python3", torch="2.11.0+cu130", gpus=2)
    assert "cannot show" not in "\n".join(gc.header_lines(two, "cuda", "", "", ""))
    assert "cannot show" not in "\n".join(gc.header_lines(m, "cpu", "", "", ""))


def test_the_torch_stage_on_two_gpus_runs_nccl_beside_horovod_and_one_torch_resize(tmp_path):
    (tmp_path / "runs").mkdir()
    c = gc.Check("cuda", sys.executable, tmp_path / "runs", time.monotonic() + 500, ["inplace", "sequential"],
                 ngpu=2, env=dict(os.environ))
    c.figures["throughput"] = 1000.0  # the Horovod path's figure of the throughput stage
    cmds = []

    def fake_run(cmd, limit, what):  # the controller's events of a run, as a GPU run writes them
        cmds.append(cmd)
        run = Path(cmd[cmd.index("--run-dir") + 1])
        run.mkdir(parents=True)
        evs = [{"kind": "first_step", "since_launch_s": 6.5, "phases": {"imports": 2.0, "hvd_init": 1.5}}]
        evs += [{"kind": "throughput", "step": s, "steps": 20, "images_per_s": 1100.0, "seconds": 2.0}
                for s in range(40, 301, 20)]
        if "--schedule" in cmd:
            evs += [{"kind": "resize_overhead", "from_workers": a, "to_workers": b, "stop_latency_s": 0.1,
                     "checkpoint_s": 0.2, "relaunch_to_first_step_s": 3.0, "total_lost_s": 3.5}
                    for a, b in ((1, 2), (2, 1))]
        (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    c.run = fake_run
    lines, result, failed = gc.stage_torch(c)
    text = "\n".join(lines)
    assert failed == [] and result == "1100 images/s, 2 resizes"
    assert "(NCCL, DistributedDataParallel), ResNet-110" in text and "1.10x the Horovod path's 1000" in text
    assert all(cmd[cmd.index("--collective") + 1] == "torch" and "cuda" in cmd for cmd in cmds)
    assert len(cmds) == 2 and cmds[1][cmds[1].index("--relaunch") + 1] == "sequential"  # inplace is Horovod's
    assert "| sequential | 1 -> 2 |" in text and "| sequential | 2 -> 1 |" in text
    shutil.rmtree(c.tmp / "torch")
    c.ngpu, cmds[:] = 1, []
    lines, _, _ = gc.stage_torch(c)
    assert len(cmds) == 1 and "Resize: skipped, one GPU" in "\n".join(lines)
