#!/usr/bin/env python3
"""The CUDA path of elastic-ring, measured in one command of at most 10 minutes on one GPU node,
the Horovod build of --kit included (run it through scripts/gpu_check.sh):

  scripts/gpu_check.sh [--device cuda|cpu] [--out FILE] [--python PY] [--modes "M1 M2 .."] [--kit DIR]
                       [--stages "S1 S2 .."] [--fail-at STAGE]

Its first line says what it found (the kit, Python, torch, nvcc, CMake, make/ninja, gcc, the GPU
architecture, libcuda, distutils, NCCL's header). Then, each a stage:

  0. setup: with --kit, the kit installed and Horovod built there (settled first: the fallbacks
     of scripts/gpu_kit.py's plan), then Horovod imported and its NCCL read;
  1. bare: bare start of a CUDA worker through our launcher (python -m elastic_ring.controller.hvdrun):
     imports + hvd.init() + CUDA context + a barrier; Horovod's NCCL (nccl_built), and with 2+
     GPUs a two-rank allreduce of a CUDA tensor (NCCL);
  2. throughput: ResNet-110 (CIFAR-shaped synthetic data through the real input pipeline: the
     batch gathered, augmented and normalised as in training), batch 128 on one GPU: images/s of
     `elastic-ring train`, its checkpoint write (background stall and write seconds), and the NVML
     telemetry the controller adds to the throughput events (the check FAILS when it lists no GPU);
  3. torch: the same training on the torch.distributed path (`--collective torch`: NCCL on GPUs,
     gloo on the CPU, DistributedDataParallel, no Horovod): its start-up phases (the process
     group's rendezvous included) and images/s beside the Horovod figure of stage 2; with 2+ GPUs,
     one resize 1 -> 2 -> 1 in the first relaunch mode of --modes the torch path has (overlap where
     none: inplace is Horovod's), leaving the budget's rest to stage 5;
  4. restart: a stop with checkpoint (Ctrl-C) and a restart (--resume) on the GPU: the restarted
     worker's start-up phases and launch -> first step;
  5. resize: with 2+ GPUs, one resize 1 -> 2 -> 1 with each relaunch mode (prelaunch, overlap,
     sequential, inplace; --modes picks some): each resize's time lost and its breakdown.

The report (Markdown) says which torch and Horovod it measured, each stage's seconds against the
command's budget, and, on one GPU, what one GPU cannot show. It goes to --out FILE, else to
$OUT/gpu_check.md when the variable OUT names a folder (a device tool's results folder), else to
results/gpu_check.md; it is written after every stage, so a late failure or the time limit keeps
what came before. A failed stage also leaves beside it (at most 8 files in all, the report and a
log of the output included): its run's events.jsonl, the tail of the failing command's output
and, for a failed Horovod build, build.log's error lines. Exit status: 0, 1 when a check failed
(the report says which), 2 for bad options, no GPU (one line: run it on a GPU node, or
--device cpu) or a --kit folder without a kit, 130/143 after Ctrl-C/SIGTERM (the report says in
which stage). Each stage starts only with its minimum time left of the command's 585 s.

--kit DIR: a machine without Horovod or pydantic and without a package index (the lent GPU
machine): install the kit made by `scripts/gpu_kit.py build` first (its wheels, and Horovod built
there with NCCL for that GPU's architecture: about 3 minutes on 16 cores, an estimate; kept in the
ignored build/gpu-kit/, so a rerun on the same machine skips it). The kit folder is git-ignored:
a device tool that copies only the tracked tree must be told to carry it. With the tool of this
project's workplace, one call of at most 10 minutes:

  run(command='set -o pipefail; bash scripts/gpu_check.sh --kit .kit 2>&1 | tee "$OUT/gpu_check.log"',
      carry=[".kit"], timeout_s=600)

--stages picks stages (a rerun of one that failed); --fail-at STAGE makes that stage's last
command fail on purpose, to see the failure path (tests). `--device cpu` is the dry run: the same
stages with tiny sizes on the CPU (gloo), so that the script is known to work before a GPU ever
runs it (tests/integration/test_inplace_gpu_check.py runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_kit  # noqa: E402  (beside this file; standard library only)

ROOT = Path(__file__).resolve().parents[1]
BUDGET_S = 585  # the whole command, under a device tool's 10-minute limit with a margin
STAGES = ("setup", "bare", "throughput", "torch", "restart", "resize")
MODES = ("prelaunch", "overlap", "sequential", "inplace")
TORCH_MODES = ("prelaunch", "overlap", "sequential")  # the relaunch modes --collective torch has here
MAX_FILES = 8  # what a device tool brings back from its results folder
FAIL_OPTION = "--fail-here-on-purpose"  # what --fail-at appends to a stage's last command (click: exit 2)


class StageFailed(Exception):
    """A stage that could not finish; ``run`` is its run folder and ``output`` the failing
    command's output, both kept beside the report."""

    def __init__(self, message: str, run: Path | None = None, output: str = "", build_log: Path | None = None):
        super().__init__(message)
        self.run, self.output, self.build_log = run, output, build_log


class Interrupted(Exception):
    """SIGINT or SIGTERM reached the check (a time limit, Ctrl-C)."""


def _interrupt(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


# ---------------------------------------------------------------- the report
@dataclass
class Report:
    """The Markdown report, rewritten whole after every stage; the files kept beside it."""

    path: Path
    header: list[str]
    sections: list[tuple[str, list[str]]] = field(default_factory=list)
    times: list[tuple[str, float, str]] = field(default_factory=list)  # stage, seconds, result
    failures: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    status: str = "starting"
    measured: str = ""  # which torch (and Horovod) the figures are of
    reserved: int = 1  # files left for the caller's own log of the output

    def write(self) -> None:
        total = sum(t for _, t, _ in self.times)
        lines = [*self.header, self.measured, "", f"Status: **{self.status}**", "",
                 "## Time", "", "| stage | seconds | result |", "|---|---|---|",
                 *[f"| {s} | {t:.1f} | {r} |" for s, t, r in self.times],
                 f"| all stages | {total:.1f} | budget of the command: {BUDGET_S} s |", ""]
        for title, body in self.sections:
            lines += [f"## {title}", "", *body, ""]
        lines += ["## Checks", "", *([f"- FAILED: {f}" for f in self.failures] or
                                     (["All checks passed."] if self.status.startswith("finished") else
                                      ["None failed so far."])), ""]
        if self.kept:
            lines += ["## Files kept beside this report", "", *[f"- `{k}`" for k in self.kept], ""]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("\n".join(lines))
        tmp.replace(self.path)

    def text(self) -> str:
        return self.path.read_text()

    def keep(self, what: str, text: str) -> str | None:
        """Write ``text`` beside the report as ``<report stem>.<what>``; None past the file limit."""
        if 1 + len(self.kept) + self.reserved >= MAX_FILES:
            return None
        name = f"{self.path.stem}.{what}"
        (self.path.parent / name).write_text(text)
        self.kept.append(name)
        return name


# ---------------------------------------------------------------- the stages' context
@dataclass
class Check:
    """What the stages share: the device, sizes, the runs' folder, the deadline."""

    device: str
    py: str
    tmp: Path
    deadline: float
    modes: list[str]
    fail_at: str | None = None
    ngpu: int = 0
    env: dict[str, str] = field(default_factory=dict)
    kit: Path | None = None
    machine: gpu_kit.Machine | None = None
    horovod: str = ""
    current_run: Path | None = None
    figures: dict[str, float] = field(default_factory=dict)  # what a later stage compares with

    @property
    def gpu(self) -> bool:
        return self.device == "cuda"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def measured(self) -> str:
        m = self.machine
        return (f"Measured with torch {m.torch} (CUDA {m.torch_cuda or 'none'}), Python {m.python}"
                + (f", {self.horovod}" if self.horovod else "") + ".")

    def inject(self, stage: str, cmd: list[str]) -> list[str]:
        return [*cmd, FAIL_OPTION] if self.fail_at == stage else cmd

    def run(self, cmd: list[str], limit: float, what: str) -> subprocess.CompletedProcess:
        """Run ``cmd`` in its own process group, for at most ``limit`` s and what is left of the
        budget; past it, Ctrl-C then kill the group (its workers too), and fail the stage."""
        limit = max(1.0, min(limit, self.left() - 5))
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env,
                             cwd=ROOT, start_new_session=True)
        try:
            out, err = p.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            out, err = _stop(p)
            raise StageFailed(f"{what}: no end after {limit:.0f} s (the command's budget)", self.current_run,
                              f"{out}\n{err}") from None
        finally:
            if p.poll() is None:
                _stop(p)
        return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _stop(p: subprocess.Popen, grace: float = 20) -> tuple[str, str]:
    """Ctrl-C to the command's process group, up to ``grace`` s for the command to end (its
    output read meanwhile), then SIGKILL to what is left of the group; its output. The kill
    comes as soon as the command itself has ended: a child of it that outlives its Ctrl-C (one
    that ignores SIGINT) no longer holds the pipes open for the whole grace."""
    try:
        os.killpg(p.pid, signal.SIGINT)
    except ProcessLookupError:
        pass
    end = time.monotonic() + grace
    try:
        while True:
            try:
                out = p.communicate(timeout=0.2)  # ended, and its pipes closed (or it has none)
                break
            except subprocess.TimeoutExpired:
                if p.poll() is not None or time.monotonic() >= end:
                    out = None
                    break
        _kill_group(p)
        return out if out is not None else p.communicate(timeout=10)
    except subprocess.TimeoutExpired:  # a child that left the group holds the pipes: no output
        return "", ""
    except ValueError:  # communicate() already read the pipes
        _kill_group(p)
        p.wait(timeout=10)
        return "", ""


def _kill_group(p: subprocess.Popen) -> None:
    """SIGKILL to what is left of the command's process group (it outlives its leader while a
    member lives)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _tail(text: str, n: int = 60) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def _events(run: Path, kind: str) -> list[dict]:
    p = run / "events.jsonl"
    if not p.exists():
        return []
    return [e for e in map(json.loads, p.read_text().splitlines()) if e["kind"] == kind]


def _sizes(c: Check) -> tuple[int, int, list[str], int]:
    depth, batch = (110, 128) if c.gpu else (8, 8)
    size = ["--depth", str(depth), "--batch-size", str(batch),
            "--set", "synthetic_size=4096" if c.gpu else "synthetic_size=64", *([] if c.gpu else ["--set", "width=4"])]
    return depth, batch, size, (300 if c.gpu else 12)


def _train_cmd(c: Check, run: Path, *args: str) -> list[str]:
    # synthetic CIFAR-shaped data through the training input pipeline: gather, augment (pad-4 crop,
    # flip), normalise, as for CIFAR-10 (configs/paper.yaml; the CPU config would turn augment off)
    cmd = [c.py, "-m", "elastic_ring.cli.main", "train", "--device", c.device, "--dataset", "synthetic",
           "--set", "augment=true", *_sizes(c)[2], "--run-dir", str(run), *args]
    return cmd if c.gpu else [*cmd, "--slots", "2"]


def _train(c: Check, stage: str, run: Path, *args: str, limit: float = 300) -> subprocess.CompletedProcess:
    c.current_run = run
    p = c.run(c.inject(stage, _train_cmd(c, run, *args)), limit, "elastic-ring train")
    if p.returncode != 0:
        raise StageFailed(f"elastic-ring train exited {p.returncode}: {_tail(p.stderr, 1)}", run,
                          f"{p.stdout}\n{p.stderr}")
    return p


# ---------------------------------------------------------------- the stages
def stage_setup(c: Check) -> tuple[list[str], str, list[str]]:
    lines, result = [], "no kit: this Python's Horovod"
    if c.fail_at == "setup":
        raise StageFailed("failed on purpose (--fail-at setup)")
    if c.kit is not None:
        target = Path(os.environ.get("KIT_TARGET") or gpu_kit.DEFAULT_TARGET)
        try:
            # the build may use all but 90 s: a late build skips stages, and a rerun finds its wheel
            done = gpu_kit.install(c.kit, target, python=c.py, machine=c.machine, build_timeout=max(30, c.left() - 90),
                                   log=lambda s: print(s, file=sys.stderr, flush=True))
        except gpu_kit.BuildFailed as e:
            raise StageFailed(str(e), build_log=e.log) from None
        except gpu_kit.KitError as e:
            raise StageFailed(f"the kit did not install: {e}") from None
        c.env.update(done.exports)
        result = f"kit: Horovod {done.built}"
        lines += [f"Kit {c.kit}: Horovod {done.built} (target `{target}`).", "",
                  *[f"- fallback: {n}" for n in done.plan.notes],
                  *[f"- patched: {p}" for p in done.patches], ""]
        code = ("import horovod, horovod.torch as h; "
                "print(horovod.__version__, 'yes' if h.nccl_built() else 'no')")
        p = c.run([c.py, "-c", code], 120, "import horovod.torch")
        if p.returncode != 0:
            raise StageFailed(f"horovod.torch does not import after the kit's install: {_tail(p.stderr, 1)}",
                              output=f"{p.stdout}\n{p.stderr}")
        c.horovod = "Horovod {} (NCCL built: {})".format(*p.stdout.split()[-2:])
    elif c.machine.horovod:
        c.horovod = f"Horovod {c.machine.horovod}"
    else:
        raise StageFailed(f"horovod.torch does not import in {c.py}: give the kit (--kit .kit)")
    lines.append(f"{c.horovod}, imported with the environment the stages use.")
    if c.gpu:
        code = "from elastic_ring.telemetry.gpu import probe; print(probe().line())"
        p = c.run([c.py, "-c", code], 60, "elastic-ring's GPU detection")
        lines += ["", f"elastic-ring's detection: {p.stdout.strip() or _tail(p.stderr, 1)}"]
    return lines, result, []


def _nccl_line(stdout: str) -> str:
    return next((ln.split("]<stdout>:")[-1].strip() for ln in stdout.splitlines() if "nccl_built=" in ln), "")


def stage_bare(c: Check) -> tuple[list[str], str, list[str]]:
    launcher = [c.py, "-m", "elastic_ring.controller.hvdrun"]  # our launcher (the controller's)
    script = "launch/bare_start.py" if c.fail_at != "bare" else "launch/no_such_script_on_purpose.py"
    bare, nccl_line, failures = [], "", []
    for _ in range(3 if c.gpu else 1):
        t0 = time.perf_counter()
        p = c.run([*launcher, "-np", "1", "-H", "localhost:1", "--gloo", c.py, script,
                   *(["--cuda", "--nccl"] if c.gpu else [])], 120, "the bare start")
        bare.append(time.perf_counter() - t0)
        if p.returncode != 0:
            raise StageFailed(f"the bare start exited {p.returncode}: {_tail(p.stderr, 1)}",
                              output=f"{p.stdout}\n{p.stderr}")
        nccl_line = _nccl_line(p.stdout)
    lines = [f"our launcher (horovodrun's) + imports + hvd.init(){' + CUDA context' if c.gpu else ''} + barrier: "
             f"median {statistics.median(bare):.2f} s of {', '.join(f'{b:.2f}' for b in bare)}", ""]
    if c.gpu:
        lines += [f"One rank, a CUDA tensor allreduced: `{nccl_line or 'no output'}`", ""]
        if "nccl_built=1" not in nccl_line:
            failures.append("Horovod has no NCCL (hvd.nccl_built() is false): GPU gradients would go through the host")
        if c.ngpu >= 2:
            p = c.run([*launcher, "-np", "2", "-H", "localhost:2", "--gloo", c.py, script, "--cuda", "--nccl"],
                      180, "the two-rank allreduce")
            two = _nccl_line(p.stdout)
            lines += ["Two ranks on two GPUs, one allreduce of a 4 MB CUDA tensor (sum checked; NCCL's set-up "
                      f"included): `{two or 'failed: ' + ' '.join(p.stderr.strip().splitlines()[-2:])}`", ""]
            if p.returncode != 0 or "ranks=2" not in two:
                failures.append("the two-rank NCCL allreduce failed")
        else:
            lines += ["Two-rank NCCL step: skipped, one GPU on this machine.", ""]
    return lines, f"median {statistics.median(bare):.2f} s", failures


def stage_throughput(c: Check) -> tuple[list[str], str, list[str]]:
    depth, batch, _, steps = _sizes(c)
    run = c.tmp / "thr"
    _train(c, "throughput", run, "--gpus", "1", "--steps", str(steps), "--checkpoint-every", str(steps // 3),
           *([] if c.gpu else ["--set", "throughput_window=4"]))
    ips, thr = _images_per_s(c, run)
    c.figures["throughput"] = ips
    ck = _events(run, "checkpoint_written")
    tel = [e.get("telemetry") or {} for e in _events(run, "throughput")]
    gpu_keys = sorted({k for t in tel for k in t if "gpu" in k.lower()})
    first = _events(run, "first_step")[0]
    gpus_listed = max((len(t.get("gpus") or []) for t in tel), default=0)
    lines = [f"ResNet-{depth}, batch {batch}, synthetic CIFAR-shaped data augmented (crop + flip) and normalised "
             f"as in training{' on the GPU' if c.gpu else ''}: **{ips:.0f} images/s** (steps after the warm-up, "
             f"{len(thr)} windows)", "",
             f"First step {first['since_launch_s']:.2f} s after the worker started; phases: "
             + ", ".join(f"{k} {v:.2f} s" for k, v in first["phases"].items()), ""]
    if ck:
        lines += [f"Checkpoints: {len(ck)}, write median {statistics.median(e['seconds'] for e in ck):.3f} s, "
                  f"stall on the training thread median {statistics.median(e['stall_s'] for e in ck):.3f} s, "
                  f"{ck[-1]['bytes'] / 1e6:.1f} MB", ""]
    lines += [f"Telemetry in throughput events: {len([t for t in tel if t])}/{len(tel)} carry it; "
              f"GPU fields: {', '.join(gpu_keys) or 'none'}", "", f"GPUs listed in the telemetry: {gpus_listed}", ""]
    failures = []
    if c.gpu and gpus_listed == 0:
        failures.append("the telemetry of the throughput events lists no GPU (NVML)")
    return lines, f"{ips:.0f} images/s", failures


def _images_per_s(c: Check, run: Path) -> tuple[float, list[dict]]:
    """Images/s of a run's throughput windows after the warm-up steps (images over their time)."""
    thr = [e for e in _events(run, "throughput") if e["step"] - e["steps"] >= (20 if c.gpu else 4)]
    if not thr:
        raise StageFailed("no throughput window after the warm-up steps", run)
    return sum(e["images_per_s"] * e["seconds"] for e in thr) / sum(e["seconds"] for e in thr), thr


RESTART_STEPS = 100_000  # never reached: each segment is stopped by a Ctrl-C, whatever the speed


def _until_then_ctrl_c(c: Check, cmd: list[str], ready: Callable[[], bool], err_file: Path,
                       what: str) -> tuple[int, float, float]:
    """Start ``cmd``, wait until ``ready()`` (or its end), then Ctrl-C it as a user would and wait
    for its exit. Returns (exit status, seconds to the Ctrl-C, seconds from it to the exit)."""
    t0 = time.monotonic()
    with open(err_file, "w") as err_fh:  # a file, not a pipe nobody reads while it runs
        proc = subprocess.Popen(cmd, stdout=err_fh, stderr=subprocess.STDOUT, env=c.env, cwd=ROOT,
                                start_new_session=True)
        try:
            while not ready() and proc.poll() is None:
                if time.monotonic() - t0 > min(240, c.left() - 30):
                    raise StageFailed(f"{what}: not ready after {time.monotonic() - t0:.0f} s", c.current_run,
                                      err_file.read_text())
                time.sleep(0.3)
            t_sig = time.monotonic()
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            proc.wait(timeout=min(120, max(5, c.left() - 20)))
        except subprocess.TimeoutExpired:
            raise StageFailed(f"{what}: no exit {time.monotonic() - t_sig:.0f} s after its Ctrl-C", c.current_run,
                              err_file.read_text()) from None
        finally:
            if proc.poll() is None:
                _stop(proc)
    return proc.returncode, t_sig - t0, time.monotonic() - t_sig


def stage_restart(c: Check) -> tuple[list[str], str, list[str]]:
    run = c.tmp / "restart"
    c.current_run = run
    cmd = _train_cmd(c, run, "--gpus", "1", "--steps", str(RESTART_STEPS), "--set", "throughput_window=5")
    first_err = c.tmp / "restart-first.log"
    rc, t_first, t_stop = _until_then_ctrl_c(c, cmd, lambda: bool(_events(run, "throughput")), first_err,
                                             "the first segment")
    seg_end = [e for e in _events(run, "segment_end") if e["segment"] == 0]
    if rc not in (0, 130) or not (run / "run.json").exists():
        out = first_err.read_text()
        raise StageFailed(f"the first segment exited {rc}: {_tail(out, 1)}", run, out)
    resume = c.inject("restart", [c.py, "-m", "elastic_ring.cli.main", "train", "--resume", str(run),
                                  *([] if c.gpu else ["--slots", "2"])])
    resume_err = c.tmp / "restart-resume.log"
    # the restarted worker's first step is the figure: the resume is stopped too once it is there
    rc, t_resume, t_stop2 = _until_then_ctrl_c(c, resume, lambda: len(_events(run, "first_step")) >= 2,
                                               resume_err, "the resume")
    firsts = _events(run, "first_step")
    if rc not in (0, 130) or len(firsts) < 2:
        out = resume_err.read_text()
        raise StageFailed(f"the resume exited {rc}: {_tail(out, 1)}", run, out)
    lines = [f"Ctrl-C stopped at step {seg_end[0]['step'] if seg_end else '?'}; the restarted worker's first step "
             f"{firsts[1]['since_launch_s']:.2f} s after it started; phases: "
             + ", ".join(f"{k} {v:.2f} s" for k, v in firsts[1]["phases"].items()), "",
             f"Wall time: Ctrl-C {t_first:.1f} s after the start, the controller out {t_stop:.1f} s later; "
             f"the resume's first step {t_resume:.1f} s after its start (then stopped the same way, "
             f"{t_stop2:.1f} s)"]
    return lines, f"first step {firsts[1]['since_launch_s']:.2f} s after the restart", []


RESIZE_HEAD = ["| relaunch mode | resize | stop (s) | checkpoint (s) | relaunch to 1st step (s) | time lost (s) |",
               "|---|---|---|---|---|---|"]


def _resize_rows(c: Check, stage: str, mode: str, *extra: str) -> list[str]:
    """One run resized 1 -> 2 -> 1 in relaunch ``mode``: a table row per resize."""
    rs = 100 if c.gpu else 4
    run = c.tmp / f"{stage}-{mode}"
    _train(c, stage, run, "--gpus", "1", "--schedule", f"{rs}:2,{2 * rs}:1", "--steps", str(3 * rs),
           "--relaunch", mode, "--set", "throughput_window=4", *extra)
    return [f"| {mode} | {o['from_workers']} -> {o['to_workers']} | {o['stop_latency_s']:.2f} | "
            f"{o['checkpoint_s']:.3f} | {o['relaunch_to_first_step_s']:.2f} | {o['total_lost_s']:.2f} |"
            for o in _events(run, "resize_overhead")]


def stage_resize(c: Check) -> tuple[list[str], str, list[str]]:
    if c.gpu and c.ngpu < 2:
        return ["Skipped: one GPU (a resize 1 -> 2 needs two)."], "skipped: one GPU", []
    rows = list(RESIZE_HEAD)
    for mode in c.modes:
        rows += _resize_rows(c, "resize", mode)
    return rows, f"{len(rows) - 2} resizes", []


def stage_torch(c: Check) -> tuple[list[str], str, list[str]]:
    """The torch.distributed path: the throughput stage's run (its periodic checkpoints too) with
    ``--collective torch`` (the run itself checks that this torch has NCCL), and with 2+ GPUs a resize."""
    depth, batch, _, steps = _sizes(c)
    backend = "NCCL" if c.gpu else "gloo"
    run = c.tmp / "torch"
    _train(c, "torch", run, "--collective", "torch", "--gpus", "1", "--steps", str(steps),
           "--checkpoint-every", str(steps // 3), *([] if c.gpu else ["--set", "throughput_window=4"]))
    ips, thr = _images_per_s(c, run)
    first = _events(run, "first_step")[0]
    hvd = c.figures.get("throughput")
    beside = f" ({ips / hvd:.2f}x the Horovod path's {hvd:.0f} images/s of stage 2)" if hvd else ""
    lines = [f"`elastic-ring train --collective torch` ({backend}, DistributedDataParallel), ResNet-{depth}, "
             f"batch {batch}, one worker, the throughput stage's data: **{ips:.0f} images/s**{beside}; "
             f"{len(thr)} windows after the warm-up", "",
             f"First step {first['since_launch_s']:.2f} s after the worker started; phases (hvd_init: the "
             "process group's rendezvous): " + ", ".join(f"{k} {v:.2f} s" for k, v in first["phases"].items()), ""]
    result = f"{ips:.0f} images/s"
    if c.gpu and c.ngpu < 2:
        return [*lines, "Resize: skipped, one GPU (NCCL puts no two ranks on one GPU)."], result, []
    if not c.gpu:
        return [*lines, "Resize: on GPUs only (the resize stage runs the CPU's)."], result, []
    mode = next((m for m in c.modes if m in TORCH_MODES), "overlap")  # one: the resize stage needs the rest
    rows = [*RESIZE_HEAD, *_resize_rows(c, "torch", mode, "--collective", "torch")]
    return [*lines, f"Resizes on the torch path ({backend}):", "", *rows], f"{result}, {len(rows) - 2} resizes", []


@dataclass(frozen=True)
class Stage:
    name: str
    title: str
    need_s: float  # not started with less than this left of the budget
    essential: bool  # the later stages cannot run without it
    fn: Callable[[Check], tuple[list[str], str, list[str]]]  # the section's lines, the result, checks failed


STAGE_LIST = (
    Stage("setup", "Horovod", 20, True, stage_setup),
    Stage("bare", "Bare start of one worker", 20, True, stage_bare),
    Stage("throughput", "Steady state, one worker", 40, False, stage_throughput),
    Stage("torch", "The torch.distributed path", 40, False, stage_torch),
    Stage("restart", "Stop with checkpoint, restart on the device", 60, False, stage_restart),
    Stage("resize", "Resize per relaunch mode", 60, False, stage_resize),
)


def _keep_failure(report: Report, stage: str, e: StageFailed) -> list[str]:
    """A failed stage's evidence beside the report: its run's events, the failing output's tail,
    a failed build's error lines. Returns the report's lines naming them."""
    kept = []
    if e.build_log is not None and e.build_log.exists():
        kept.append(report.keep(f"{stage}.build_errors.txt",
                                gpu_kit.summarize_build_log(e.build_log.read_text(errors="replace"))))
    if e.run is not None and (e.run / "events.jsonl").exists():
        kept.append(report.keep(f"{stage}.events.jsonl", (e.run / "events.jsonl").read_text()))
    output = e.output
    if e.run is not None and not output.strip():  # the controller's own log, where the output was not caught
        logs = sorted((e.run / "logs").glob("*"), key=lambda p: p.stat().st_mtime) if (e.run / "logs").is_dir() else []
        output = "\n".join(f"== {p.name}\n{_tail(p.read_text(errors='replace'), 40)}" for p in logs[-2:])
    if output.strip():
        kept.append(report.keep(f"{stage}.output_tail.txt", _tail(output, 200) + "\n"))
    return [f"Kept: `{k}`" if k else "Not kept: the limit of files brought back" for k in kept]


def run_stages(c: Check, report: Report, stages: list[Stage]) -> None:
    """Each stage in turn, the report rewritten after each; a failed essential stage ends the
    check, any other failure is recorded and the next stage runs."""
    stop = ""
    for i, st in enumerate(stages):
        if stop or c.left() < st.need_s:
            why = stop or f"only {max(0, c.left()):.0f} s left of the command's {BUDGET_S} s"
            report.sections.append((st.title, [f"Not run: {why}."]))
            report.times.append((st.name, 0.0, "not run"))
            report.write()
            continue
        report.status = f"running {i + 1}/{len(stages)}: {st.name}"
        report.write()
        print(f"gpu_check: {i + 1}/{len(stages)} {st.name} ({c.left():.0f} s left)", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        c.current_run = None
        try:
            lines, result, failed = st.fn(c)
            report.failures += failed
            report.sections.append((st.title, lines))
        except StageFailed as e:
            result = "FAILED"
            report.failures.append(f"{st.name}: {e}")
            report.sections.append((st.title, [f"**FAILED**: {e}", "", *_keep_failure(report, st.name, e)]))
            if st.essential:
                stop = f"the {st.name} stage failed"
        except Interrupted as e:
            report.times.append((st.name, time.monotonic() - t0, f"interrupted ({e})"))
            report.failures.append(f"{st.name}: interrupted by {e}")
            report.sections.append((st.title, [f"**Interrupted** by {e}.",
                                               *_keep_failure(report, st.name, StageFailed("", c.current_run))]))
            report.status = f"interrupted in {st.name}"
            report.write()
            raise
        report.times.append((st.name, time.monotonic() - t0, result))
        if c.horovod:
            report.measured = c.measured()
        report.write()


# ---------------------------------------------------------------- the command
def _refuse(message: str) -> int:
    print(f"gpu_check: {message}", file=sys.stderr)
    return 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        print(f"gpu_check: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


def _report_path(device: str, out: str | None) -> tuple[Path, int]:
    """The report's file, and how many files to leave for the caller's own log beside it."""
    name = "gpu_check.md" if device == "cuda" else "gpu_check_cpu.md"
    if out:
        return Path(out), 0
    if os.environ.get("OUT") and Path(os.environ["OUT"]).is_dir():
        return Path(os.environ["OUT"]) / name, 1
    return ROOT / "results" / name, 0


ONE_GPU = ("With one GPU this check cannot show: a gradient allreduce between workers (at one worker there is no "
           "peer: the one-rank allreduce below is NCCL's set-up and a copy), nor a resize between GPUs (1 -> 2 "
           "needs a second GPU: the relaunch modes' time lost on GPUs is not measured).")


def header_lines(machine: gpu_kit.Machine, device: str, found: str, smi: str, args: str) -> list[str]:
    """The report's head: what ran where, what was found, and what one GPU cannot show."""
    gpu = device == "cuda"
    lines = [f"# GPU check ({f'CUDA, {machine.gpus} GPU(s)' if gpu else 'CPU dry run: tiny sizes'})", "",
             f"{time.strftime('%Y-%m-%d %H:%M')}, `scripts/gpu_check.sh {args}`", "", f"Found: {found}", ""]
    if gpu:
        lines += [f"GPU: {smi}", ""]
    if gpu and machine.gpus == 1:
        lines += [ONE_GPU, ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    t_start = time.monotonic()
    p = _Parser(prog="scripts/gpu_check.sh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--out", default=None, help="the report's file")
    p.add_argument("--python", default=None,
                   help="the Python of the check and its workers (scripts/gpu_check.sh runs this file with it)")
    p.add_argument("--modes", default=" ".join(MODES), help="relaunch modes of the resize stage")
    p.add_argument("--kit", type=Path, default=None, help="install this kit first (scripts/gpu_kit.py)")
    p.add_argument("--stages", default=" ".join(STAGES), help="the stages to run, in order")
    p.add_argument("--fail-at", choices=STAGES, default=None, help="make this stage fail on purpose")
    a = p.parse_args(argv)
    modes, stages = a.modes.split(), a.stages.split()
    for m in modes:
        if m not in MODES:
            p.error(f"unknown relaunch mode '{m}' in --modes ({' '.join(MODES)})")
    for s in stages:
        if s not in STAGES:
            p.error(f"unknown stage '{s}' in --stages ({' '.join(STAGES)})")
    if a.kit is not None and not (a.kit / gpu_kit.MANIFEST).is_file():
        return _refuse(f"--kit {a.kit} holds no {gpu_kit.MANIFEST}: make it with scripts/gpu_kit.py build, and "
                       "carry that ignored folder to the GPU machine (carry=[\".kit\"])")
    a.python = sys.executable  # gpu_check.sh chose it (--python, else .venv's, else python3)
    machine = gpu_kit.probe(a.python)
    if a.device == "cuda" and machine.gpus < 1:
        return _refuse(f"no CUDA GPU visible to torch {machine.torch or '(missing)'} in {machine.python_exe} "
                       "(torch.cuda.is_available() is False); run it on a GPU node, or --device cpu for the dry run")
    kit_line = "no kit"
    if a.kit is not None:
        problems = gpu_kit.check_manifest(a.kit)
        size = json.loads((a.kit / gpu_kit.MANIFEST).read_text()).get("total_bytes", 0) / 2**20
        kit_line = f"kit {a.kit} ({size:.1f} MiB, {'matches its manifest' if not problems else problems[0]})"
    found = f"{kit_line} | {machine.line()}"
    print(f"gpu_check: found: {found}", file=sys.stderr, flush=True)
    path, reserved = _report_path(a.device, a.out)
    gpu = a.device == "cuda"
    smi = ""
    if gpu:
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            pass
        smi = smi or "nvidia-smi did not answer"
    header = header_lines(machine, a.device, found, smi, " ".join(sys.argv[1:] if argv is None else argv))
    report = Report(path, header, reserved=reserved)
    tmp = Path(tempfile.mkdtemp(prefix="gpu-check-", dir=os.environ.get("TMPDIR") or None))
    env = dict(os.environ, PYTHONUNBUFFERED="1", GPU_CHECK_TMP=str(tmp))
    env["PATH"] = os.pathsep.join([str(Path(a.python).parent), env.get("PATH", "")])
    c = Check(a.device, a.python, tmp, t_start + BUDGET_S, modes, a.fail_at, machine.gpus, env, a.kit, machine)
    report.measured = c.measured()
    old = {s: signal.signal(s, _interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    status = 1
    try:
        run_stages(c, report, [st for name in stages for st in STAGE_LIST if st.name == name])
        report.status = "finished" + (f": {len(report.failures)} check(s) failed" if report.failures else "")
        report.write()
        status = 1 if report.failures else 0
    except Interrupted as e:
        status = 130 if str(e) == "SIGINT" else 143
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        shutil.rmtree(tmp, ignore_errors=True)
    print(report.text())
    print(f"gpu_check: written {path}" + (f" and {', '.join(report.kept)} beside it" if report.kept else ""),
          file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
