"""Ray Train's own elastic training (Ray Train V2 ``TorchTrainer``, DDP over Gloo) on the same model,
data and batches as the other peers: the peer of ``elastic-ring train --backend ray`` in
``scripts/bench_ray.py``.

    RAY_TRAIN_V2_ENABLED=1 python launch/peer_raytrain.py --address ADDR --storage DIR \\
        --min-workers 1 --max-workers 2 --monitor-s 1 --ckpt-every 5 --steps 90 --out r.jsonl

``ScalingConfig(num_workers=(min, max), elastic_resize_monitor_interval_s=--monitor-s)``: Ray Train
starts with the workers the cluster can hold, grows when more become free (it tears the worker group
down and starts a new one from the newest checkpoint), and restarts on what is left after a worker or
node is lost (``FailureConfig(max_failures)``). Every worker builds the model (``peer_common``),
wraps it in DDP (``ray.train.torch.prepare_model``), resumes from ``ray.train.get_checkpoint()``
(model, optimizer, step, sample cursor) and scales the LR linearly to the world size; every
``--ckpt-every`` steps a checkpoint is reported. Rank 0 records every step (time, world size).
Needs ``ray[train]`` (the ``bench`` extra).

Where Ray Train sees capacity: its elastic policy (``ray.train.v2 ... scaling_policy/elastic.py``)
counts the workers the nodes' *total* resources hold (``ray.nodes()``, not the free ones), as
reserved for it by Ray Data's ``AutoscalingCoordinator`` actor, which re-reads the nodes only every
``TICK_INTERVAL_S`` = 20 s (``ray/data/_internal/cluster_autoscaler/default_autoscaling_coordinator.py``):
a node that joins is seen up to 20 s late, whatever the monitor interval. ``--tick-s`` (default 1 s)
sets that tick low for the measurement, as ``--monitor-s`` does the monitor: the same named, detached
actor is created here first with that interval, and Ray Train gets it (``get_if_exists``).

``--hold-file F``: while F exists, every worker waits before its next step (rank 0 records the hold):
the bench holds the loop while the node it adds starts, so that the run does not end first; the
held time is taken out of the time lost.
"""

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peer_common as pc  # noqa: E402


def train_loop(cfg: dict) -> None:
    import argparse

    import ray.train
    import ray.train.torch
    import torch

    sys.path.insert(0, cfg["launch_dir"])
    import peer_common as pc  # noqa: F811 - in the worker's process

    a = argparse.Namespace(**cfg["args"])
    ctx = ray.train.get_context()
    rank, n = ctx.get_world_rank(), ctx.get_world_size()
    dev = torch.device("cpu")
    torch.set_num_threads(a.threads)
    model, data, stream = pc.build(a, dev)
    per_worker_lr = a.lr * a.batch_size / 128
    opt = torch.optim.SGD(model.parameters(), lr=per_worker_lr * n, momentum=0.9, weight_decay=1e-4)
    step = cursor = 0
    ck = ray.train.get_checkpoint()
    if ck is not None:
        with ck.as_directory() as d:
            st = torch.load(Path(d) / "state.pt", weights_only=False)
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["optimizer"])
        step, cursor = int(st["step"]), int(st["cursor"])
        for g in opt.param_groups:
            g["lr"] = per_worker_lr * n
    model = ray.train.torch.prepare_model(model)
    out = Path(a.out) if a.out else None
    if rank == 0:
        pc.record(out, kind="start", harness="ray-train", world=n, step=step, pid=os.getpid())
    while step < a.steps:
        if a.hold_file and os.path.exists(a.hold_file):
            t_hold = time.time()
            while os.path.exists(a.hold_file):
                time.sleep(0.02)
            if rank == 0:
                pc.record(out, kind="hold", harness="ray-train", world=n, step=step, start=t_hold)
        x, y = pc.batch(data, stream, cursor, rank, a.batch_size, dev)
        pc.train_step(model, opt, x, y)
        step += 1
        cursor += a.batch_size * n
        if rank == 0:
            pc.record(out, kind="step", harness="ray-train", world=n, step=step)
        if step % a.ckpt_every == 0 or step == a.steps:
            with tempfile.TemporaryDirectory() as d:
                ckpt = None
                if rank == 0:
                    torch.save({"model": model.module.state_dict() if hasattr(model, "module") else model.state_dict(),
                                "optimizer": opt.state_dict(), "step": step, "cursor": cursor}, Path(d) / "state.pt")
                    ckpt = ray.train.Checkpoint.from_directory(d)
                ray.train.report({"step": step}, checkpoint=ckpt)


def fast_coordinator(tick_s: float) -> float:
    """Ray Data's ``AutoscalingCoordinator`` (where Ray Train's elastic policy reads the nodes),
    created first with a tick of ``tick_s`` instead of 20 s; the tick of the one in use returned
    (an older one, left detached in the cluster by an earlier run, is kept as it is)."""
    import ray
    from ray.data._internal.cluster_autoscaler import default_autoscaling_coordinator as dac

    class Coordinator(dac._AutoscalingCoordinatorActor):
        TICK_INTERVAL_S = tick_s

    actor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(Coordinator).options(
        name="AutoscalingCoordinator", namespace="AutoscalingCoordinator", get_if_exists=True,
        lifetime="detached").remote()
    return ray.get(actor.__ray_call__.remote(lambda self: self.TICK_INTERVAL_S))


def main() -> None:
    p = pc.arguments(__doc__)
    p.add_argument("--address", required=True)
    p.add_argument("--storage", required=True, help="Ray Train's storage_path (checkpoints)")
    p.add_argument("--min-workers", type=int, default=1)
    p.add_argument("--max-workers", type=int, default=2)
    p.add_argument("--monitor-s", type=float, default=1.0, help="elastic_resize_monitor_interval_s")
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per worker")
    p.add_argument("--max-failures", type=int, default=3)
    p.add_argument("--tick-s", type=float, default=1.0, help="the AutoscalingCoordinator's tick (Ray: 20 s)")
    p.add_argument("--hold-file", default=None, help="workers wait before a step while this file exists")
    a = p.parse_args()
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(address=a.address, log_to_driver=False, include_dashboard=False)
    tick = fast_coordinator(a.tick_s)
    pc.record(Path(a.out) if a.out else None, kind="config", harness="ray-train", coordinator_tick_s=tick,
              monitor_s=a.monitor_s)
    args = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"args": args, "launch_dir": str(Path(__file__).resolve().parent)},
        scaling_config=ScalingConfig(num_workers=(a.min_workers, a.max_workers),
                                     elastic_resize_monitor_interval_s=a.monitor_s),
        run_config=RunConfig(storage_path=a.storage, name="peer-raytrain",
                             failure_config=FailureConfig(max_failures=a.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=2)))
    trainer.fit()


if __name__ == "__main__":
    main()
