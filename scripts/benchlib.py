"""What the benchmark scripts share: the bare start of N workers (the yardstick of every relaunch
and restart figure) and the results file with the machine's load around the measurement."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def bare_start(n: int) -> float:
    """Wall time of ``horovodrun -np N -H localhost:N --gloo python launch/bare_start.py``:
    horovodrun + ``import torch, horovod.torch`` + ``hvd.init()`` + one barrier."""
    cmd = [str(BIN / "horovodrun"), "-np", str(n), "-H", f"localhost:{n}", "--gloo",
           sys.executable, str(ROOT / "launch" / "bare_start.py")]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    return time.perf_counter() - t0


def write_results(path: Path, out: dict[str, Any], load_before: float) -> None:
    """Write ``out`` with the machine's CPU count and load before/after, and say so."""
    load_after = os.getloadavg()[0]
    out = {**out, "machine": {"cpus": os.cpu_count(), "load_before": load_before, "load_after": load_after},
           "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} "
          f"(load {load_before:.1f} -> {load_after:.1f})")


def append_result(path: Path | str, res: dict[str, Any]) -> None:
    """Append ``res`` to the JSON list in ``path`` (made if missing): the files that collect one
    summary per run (``results/ci/suite_cpu.json``, ``results/ci/suite_timeline.json``)."""
    path = Path(path)
    runs = json.loads(path.read_text()) if path.exists() else []
    path.write_text(json.dumps([*runs, res], indent=2) + "\n")


STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def cpu_counters() -> dict[str, float]:
    """The machine's CPU counters so far (/proc/stat's first line: every core, every process), in
    core-seconds, by :data:`STAT_FIELDS`."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    hz = os.sysconf("SC_CLK_TCK")
    return {k: t / hz for k, t in zip(STAT_FIELDS, ticks)}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (a rendezvous's or a store's)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spread(xs: list[float]) -> dict[str, Any]:
    """A figure over rounds: its median, min and max, and the rounds themselves."""
    import statistics

    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "rounds": xs}


def exit_on_sigterm() -> None:
    """SIGTERM (a `timeout`, the quiet wrapper's limit) exits through Python, so that every
    TrainRun still ends its run and the ranks it stopped. Call it first in a script's main()."""
    import signal

    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def train_env() -> dict[str, str]:
    """The environment of a benchmark's `elastic-ring train`: this venv's horovodrun on PATH."""
    return dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1")


class TrainRun:
    """One `elastic-ring train ARGS --run-dir RUN` in the background, the loop every fault and
    live-resize benchmark runs: wait for a step, act on it (a signal to a rank, a resize), let it
    finish, read its events. A context manager: whatever happens, the run and any rank it stopped
    are gone afterwards.

    ``keep_output``: stdout and stderr merged and returned by :meth:`finish` (else stdout is
    dropped and stderr only shown when the run fails). ``cli``: the command before ``train``
    (default: this Python's ``-m elastic_ring.cli.main``)."""

    def __init__(self, args: list[str], run: Path, keep_output: bool = False, cli: list[str] | None = None) -> None:
        self.run = Path(run)
        self.cmd = [*(cli or [sys.executable, "-m", "elastic_ring.cli.main"]), "train", *args, "--run-dir", str(run)]
        self.p = subprocess.Popen(self.cmd, cwd=ROOT, env=train_env(), text=True,
                                  stdout=subprocess.PIPE if keep_output else subprocess.DEVNULL,
                                  stderr=subprocess.STDOUT if keep_output else subprocess.PIPE)
        self._stopped: list[int] = []

    def __enter__(self) -> "TrainRun":
        return self

    def __exit__(self, *exc: Any) -> None:
        import signal

        from elastic_ring import protocol

        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        for pid in self._stopped:
            if protocol.pid_alive(pid):
                os.kill(pid, signal.SIGKILL)

    def step(self) -> int:
        from elastic_ring import protocol

        prog = protocol.read_json(protocol.control_dir(self.run) / protocol.PROGRESS_FILE)
        return int(prog["step"]) if isinstance(prog, dict) and "step" in prog else 0

    def wait_step(self, step: int, poll_s: float = 0.02) -> int:
        """Until the run has done ``step`` (its progress file); SystemExit if it ends before."""
        while (now := self.step()) < step:
            if self.p.poll() is not None:
                raise SystemExit(f"the run ended before step {step}:\n{self._tail()}")
            time.sleep(poll_s)
        return now

    def signal_rank(self, rank: int, sig: int, segment: int = 0) -> float:
        """Send ``sig`` to a worker of ``segment``; returns the time it was sent."""
        import signal

        from elastic_ring import protocol

        pid = int(protocol.read_json(protocol.pid_dir(self.run) / f"seg{segment:03d}-rank{rank}.json")["pid"])
        if sig == signal.SIGSTOP:
            self._stopped.append(pid)
        t = time.time()
        os.kill(pid, sig)
        return t

    def finish(self, what: str = "the run", timeout: float = 900) -> str:
        """Wait for the end; SystemExit unless it succeeded. Returns the kept output ("" if none)."""
        out, err = self.p.communicate(timeout=timeout)
        self._out = (out or "") + (err or "")
        if self.p.returncode != 0:
            raise SystemExit(f"{what} failed (exit {self.p.returncode}):\n{self._out[-2000:]}")
        return out or ""

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        ev = [json.loads(line) for line in (self.run / "events.jsonl").read_text().splitlines() if line.strip()]
        return [e for e in ev if kind is None or e["kind"] == kind]

    def _tail(self) -> str:
        try:
            out, err = self.p.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            return ""
        return ((out or "") + (err or ""))[-2000:]
