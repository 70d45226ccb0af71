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
"""

import os
import sys
import tempfile
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
    a = p.parse_args()
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
    import ray
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(address=a.address, log_to_driver=False, include_dashboard=False)
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
