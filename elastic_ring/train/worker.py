"""The Horovod training worker: one process per GPU (or CPU slot), launched by horovodrun.

Life of a worker (a *segment* of the run at one world size):

1. ``hvd.init()``; on a GPU node pin one GPU per local rank, on the CPU use
   ``cores // local_size`` torch threads.
2. Rank 0 loads the run's latest checkpoint, if any; model, optimizer state (momentum buffers) and
   counters are broadcast to every rank. If the world size changed since the checkpoint, the LR
   base is rescaled by the configured rule (Eq. 7 by default).
3. Steps ``step + 1 .. stop_at``: each step takes the next ``world * batch`` positions of the
   sample stream (``elastic_ring.data.stream``), rank r its r-th share.
4. Every ``control_every`` steps all ranks agree (an allreduce of rank 0's flag) whether the
   controller asked them to stop early (a live resize, or an interrupt). A request only sets a
   flag; the stop happens at the step boundary all ranks agree on.
5. At the stop: rank 0 writes an atomic checkpoint and a ``segment_end`` event; at the end of the
   schedule all ranks evaluate on the test set first. Then every rank exits with status 0.

Rank 0 writes events to ``RUN_DIR/worker_events.jsonl``; the controller relays them, with its
telemetry, into ``events.jsonl``. An uncaught exception in any rank is written to
``RUN_DIR/logs/error-rank<r>.json`` before the process exits, so the controller can name the rank
and the cause.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from elastic_ring.ckpt import CheckpointStore
from elastic_ring.config.api import TrainConfig, config_to_dict, load_config
from elastic_ring.data import SampleStream, load_dataset, make_batch
from elastic_ring.events import (CheckpointWritten, Evaluation, EventLog, FirstStep, SegmentEnd,
                                 Throughput)
from elastic_ring.nn import resnet
from elastic_ring.train.lr import RULES, LRState, initial_base_lr

WORKER_EVENTS = "worker_events.jsonl"
_T_IMPORTED = time.time()  # a timestamp only: start-up phases are measured from here


def stop_file(run_dir: Path, segment: int) -> Path:
    """The file whose existence asks segment ``segment``'s workers to stop at the next agreed step."""
    return run_dir / "control" / f"stop-{segment}"


def _aug_generator(seed: int, stream_pos: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 7_919 + stream_pos) % (2**63 - 1))


def _rng_state() -> dict[str, Any]:
    st = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def _set_rng_state(st: dict[str, Any]) -> None:
    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    random.setstate(st["python"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


class Worker:
    def __init__(self, run_dir: Path, segment: int, stop_at: int, device: str,
                 go_file: Path | None = None, go_timeout_s: float = 900.0) -> None:
        import horovod.torch as hvd

        self.hvd = hvd
        self.run_dir = run_dir
        self.segment = segment
        self.stop_at = stop_at
        self.go_file = go_file
        self.go_timeout_s = go_timeout_s
        try:
            import psutil

            self.t_start = psutil.Process().create_time()
        except Exception:
            self.t_start = _T_IMPORTED
        self.marks: dict[str, float] = {"imports": _T_IMPORTED}
        # horovodrun tells every process its place in the environment, so a pre-launched worker
        # can build everything before hvd.init(): an initialised Horovod polls its peers in a
        # background thread, which would steal CPU from the workers still training.
        env = os.environ
        if all(k in env for k in ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE")):
            self.rank, self.size = int(env["HOROVOD_RANK"]), int(env["HOROVOD_SIZE"])
            self.local_rank, self.local_size = int(env["HOROVOD_LOCAL_RANK"]), int(env["HOROVOD_LOCAL_SIZE"])
        else:  # not under horovodrun (e.g. mpirun): ask Horovod
            hvd.init()
            self.rank, self.size = hvd.rank(), hvd.size()
            self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
        if device == "cuda":
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
            torch.backends.cudnn.benchmark = True
        else:
            self.device = torch.device("cpu")
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.local_size))
        self.cfg: TrainConfig = load_config(run_dir / "config.yaml")
        self.events = EventLog(run_dir / WORKER_EVENTS) if self.rank == 0 else None
        self.store = CheckpointStore(run_dir / "checkpoints")

    # ------------------------------------------------------------------ helpers
    def emit(self, event) -> None:
        if self.events is not None:
            self.events.write(event)

    def trace(self, step: int, indices: torch.Tensor) -> None:
        if not self.cfg.trace_samples:
            return
        path = self.run_dir / "trace" / f"seg{self.segment:03d}-rank{self.rank}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(json.dumps({"step": step, "rank": self.rank, "world": self.size,
                                "indices": indices.tolist()}) + "\n")

    def agreed_stop(self) -> bool:
        flag = 1.0 if self.rank == 0 and stop_file(self.run_dir, self.segment).exists() else 0.0
        out = self.hvd.allreduce(torch.tensor([flag]), op=self.hvd.Sum, name="stop_flag")
        return bool(out.item() > 0)

    def wait_for_go(self) -> None:
        """Pre-launched workers wait, before hvd.init(), for the controller's go file.

        Every rank polls the file itself (the run folder is on a shared filesystem, as the
        checkpoints are); the file also carries the stop step, which a live resize did not know
        when these workers started. Rank 0's value is broadcast after hvd.init() all the same.
        """
        t0 = time.time()
        while True:
            try:
                self.stop_at = int(json.loads(self.go_file.read_text())["stop_at"])
                return
            except (OSError, ValueError, KeyError):
                pass
            if time.time() - t0 > self.go_timeout_s:
                raise RuntimeError(f"no go from the controller within {self.go_timeout_s:.0f} s "
                                   f"({self.go_file} never appeared)")
            time.sleep(0.02)

    # ------------------------------------------------------------------ main
    def run(self) -> int:
        hvd, cfg = self.hvd, self.cfg
        torch.manual_seed(cfg.seed)
        model = resnet(cfg.depth, cfg.width, cfg.num_classes).to(self.device)
        base_opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                                   weight_decay=cfg.weight_decay)
        train_ds = load_dataset(cfg.dataset, True, cfg.data_dir, cfg.synthetic_size, cfg.seed,
                                download=False, cache_dir=self.run_dir / "cache")
        stream = SampleStream(len(train_ds), cfg.seed)
        self.marks["build"] = time.time()
        if self.go_file is not None:  # pre-launched: wait until the old workers have checkpointed
            self.wait_for_go()
            self.marks["wait_for_go"] = time.time()
        if not hvd.is_initialized():
            hvd.init()
        if (hvd.rank(), hvd.size()) != (self.rank, self.size):
            raise RuntimeError(f"Horovod rank {hvd.rank()}/{hvd.size()} differs from the "
                               f"environment's {self.rank}/{self.size}")
        self.marks["hvd_init"] = time.time()
        if self.go_file is not None:
            self.stop_at = int(hvd.broadcast(torch.tensor([self.stop_at]), root_rank=0,
                                             name="stop_at").item())
        # hvd.DistributedOptimizer builds a new optimizer over the same parameter groups with its
        # own (empty) state: from here on, `opt` holds the momentum buffers; load and save `opt`.
        opt = hvd.DistributedOptimizer(base_opt, named_parameters=model.named_parameters(),
                                       op=hvd.Average)

        ckpt = self.store.load_latest() if self.rank == 0 else None
        meta = None
        if self.rank == 0 and ckpt is not None:
            model.load_state_dict(ckpt["model"])
            opt.load_state_dict(ckpt["optimizer"])
            _set_rng_state(ckpt["rng"])
            meta = {k: ckpt[k] for k in ("step", "cursor", "world_size", "lr_state", "lr_last")}
        meta = hvd.broadcast_object(meta, root_rank=0, name="resume_meta")
        if meta is not None:
            hvd.broadcast_optimizer_state(opt, root_rank=0)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        self.marks["restore_broadcast"] = time.time()

        decay_steps, factor = cfg.decay_steps, cfg.decay_factor
        if meta is None:
            step, cursor = 0, 0
            base = initial_base_lr(cfg.lr, cfg.lr_reference_batch, cfg.batch_size, self.size)
            lr_state = (LRState(base, base / self.size, 0, cfg.warmup_steps) if cfg.warmup_steps
                        else LRState(base))
        else:
            step, cursor = int(meta["step"]), int(meta["cursor"])
            lr_state = LRState(**meta["lr_state"])
            if int(meta["world_size"]) != self.size:
                lr_state = lr_state.resized(RULES[cfg.lr_scaling], int(meta["world_size"]), self.size,
                                            step, cfg.resize_warmup_steps)
        resumed_world = int(meta["world_size"]) if meta else None

        model.train()
        b, world = cfg.batch_size, self.size
        window_t0, window_steps, window_loss = None, 0, 0.0
        last_loss = float("nan")
        lr = lr_state.lr_at(max(step, 1), decay_steps, factor)
        reason = "finished" if self.stop_at >= cfg.total_steps else "scheduled"
        while step < self.stop_at:
            step += 1
            lr = lr_state.lr_at(step, decay_steps, factor)
            for g in opt.param_groups:
                g["lr"] = lr
            start = cursor + self.rank * b
            idx = stream.take(start, b)
            self.trace(step, idx)
            x, y = make_batch(train_ds, idx, cfg.augment, _aug_generator(cfg.seed, start))
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            cursor += b * world
            window_loss += float(loss.detach())
            window_steps += 1
            if window_t0 is None:  # the first step of a segment: startup cost ends here
                now = time.time()
                self.marks["first_step"] = now
                phases, prev = {}, self.t_start
                for name, t in self.marks.items():
                    phases[name] = round(t - prev, 4)
                    prev = t
                self.emit(FirstStep(segment=self.segment, world_size=world, step=step,
                                    since_launch_s=now - self.t_start, lr=lr, phases=phases))
                window_t0, window_steps, window_loss = now, 0, 0.0
            elif window_steps >= cfg.throughput_window or step == self.stop_at:
                mean_loss = hvd.allreduce(torch.tensor([window_loss / window_steps]),
                                          op=hvd.Average, name="window_loss").item()
                now = time.time()
                dt = now - window_t0
                last_loss = mean_loss
                epoch, _ = stream.epoch_of(cursor)
                self.emit(Throughput(segment=self.segment, world_size=world, step=step,
                                     steps=window_steps, seconds=dt,
                                     images_per_s=window_steps * b * world / dt,
                                     steps_per_s=window_steps / dt, loss=mean_loss, lr=lr,
                                     epoch=epoch))
                window_t0, window_steps, window_loss = now, 0, 0.0
            if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.total_steps:
                t_eval = time.time()
                self.evaluate(model, step)
                if window_t0 is not None:  # keep the evaluation out of the throughput window
                    window_t0 += time.time() - t_eval
            if step < self.stop_at and step % cfg.control_every == 0 and self.agreed_stop():
                reason = "requested"
                break
        decided = time.time()

        if step >= cfg.total_steps:
            self.evaluate(model, step)
        if self.rank == 0:
            epoch, pos = stream.epoch_of(cursor)
            state = {
                "step": step, "cursor": cursor, "epoch": epoch, "epoch_position": pos,
                "world_size": world, "lr_last": lr, "lr_state": vars(lr_state).copy(),
                "model": model.state_dict(), "optimizer": opt.state_dict(),
                "rng": _rng_state(), "config": config_to_dict(cfg), "train_loss": last_loss,
                "resumed_from_world": resumed_world,
            }
            path, nbytes, secs = self.store.save(state)
            self.emit(CheckpointWritten(step=step, path=str(path.relative_to(self.run_dir)),
                                        seconds=secs, bytes=nbytes, world_size=world, lr=lr))
            self.emit(SegmentEnd(segment=self.segment, world_size=world, step=step, reason=reason,
                                 lr=lr, stop_decided_at=decided))
        hvd.allreduce(torch.tensor([0.0]), name="exit_barrier")  # leave together
        hvd.shutdown()
        return 0

    def evaluate(self, model: torch.nn.Module, step: int) -> None:
        hvd, cfg = self.hvd, self.cfg
        if getattr(self, "_test_ds", None) is None:
            self._test_ds = load_dataset(cfg.dataset, False, cfg.data_dir, cfg.synthetic_size,
                                         cfg.seed, download=False, cache_dir=self.run_dir / "cache")
        test_ds = self._test_ds
        n = len(test_ds) if cfg.max_test_samples == 0 else min(len(test_ds), cfg.max_test_samples)
        mine = torch.arange(self.rank, n, self.size)
        model.eval()
        loss_sum, correct = 0.0, 0
        with torch.no_grad():
            for i in range(0, len(mine), cfg.eval_batch_size):
                idx = mine[i:i + cfg.eval_batch_size]
                x, y = make_batch(test_ds, idx, False)
                out = model(x.to(self.device))
                y = y.to(self.device)
                loss_sum += float(F.cross_entropy(out, y, reduction="sum"))
                correct += int((out.argmax(1) == y).sum())
        tot = hvd.allreduce(torch.tensor([loss_sum, float(correct)], dtype=torch.float64),
                            op=hvd.Sum, name="eval")
        model.train()
        self.emit(Evaluation(step=step, test_loss=float(tot[0]) / n, test_accuracy=float(tot[1]) / n,
                             samples=n))


def _write_error(run_dir: Path, exc: BaseException) -> None:
    rank = os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "unknown"))
    path = run_dir / "logs" / f"error-rank{rank}.json"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "rank": int(rank) if str(rank).isdigit() else None,
            "type": type(exc).__name__, "message": str(exc).splitlines()[0] if str(exc) else "",
            "traceback": traceback.format_exc(), "time": time.time()}))
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="elastic-ring Horovod worker (launched by horovodrun)")
    p.add_argument("--run-dir", required=True, type=Path)
    p.add_argument("--segment", required=True, type=int)
    p.add_argument("--stop-at", required=True, type=int)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--go-file", type=Path, default=None,
                   help="pre-launched: build everything, then wait for this file before resuming")
    a = p.parse_args(argv)
    try:
        rc = Worker(a.run_dir, a.segment, a.stop_at, a.device, a.go_file).run()
        # Everything is on disk (checkpoint fsynced, events written): skip the interpreter's slow
        # teardown of torch and Horovod, which only delays the relaunch.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    except BaseException as e:  # noqa: BLE001 - every failure must reach the controller
        if isinstance(e, SystemExit) and not e.code:
            raise
        _write_error(a.run_dir, e)
        traceback.print_exc()
        return 1


if __name__ == "__main__":
    sys.exit(main())
