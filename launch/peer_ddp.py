"""torch DistributedDataParallel under torchrun (gloo on CPUs, NCCL on GPUs): the other baseline.

    torchrun --standalone --nproc-per-node 2 launch/peer_ddp.py --steps 200 --out r.jsonl

Steady state: rank 0 records images/s over the steps after ``--warmup``. For the resize benchmark
(``--ckpt-dir``): rank 0 saves a checkpoint every ``--ckpt-every`` steps and at each step of
``--ckpt-at`` (a planned resize), and records each step's time and each checkpoint once written.
A new worker resumes from the last checkpoint (with the LR scaled to the new world size): after
torchrun's elastic agents restarted every worker on a membership change, or after the user stopped
torchrun and started it again with another ``--nproc-per-node``.
"""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import peer_common as pc  # noqa: E402


def main() -> None:
    p = pc.arguments(__doc__)
    p.add_argument("--ckpt-dir", type=Path, default=None)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--ckpt-at", default="", help="comma-separated steps also checkpointed")
    a = p.parse_args()
    ckpt_at = {int(x) for x in a.ckpt_at.split(",") if x.strip()}
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
    dev = pc.setup(local_rank, local_world, a.device)
    model, data, stream = pc.build(a, dev)
    ddp = DDP(model, device_ids=[local_rank] if a.device == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr * a.batch_size * world / 128, momentum=0.9,
                          weight_decay=1e-4)
    start, cursor = 0, 0
    ck = a.ckpt_dir / "ddp.pt" if a.ckpt_dir else None
    if ck is not None and ck.exists():
        state = torch.load(ck, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        for g in opt.param_groups:  # linear scaling of the LR to the new world size
            g["lr"] = g["lr"] * world / state["world"]
        start, cursor = state["step"], state["cursor"]
    if rank == 0:
        pc.record(a.out, kind="start", harness="ddp", world=world, step=start)
    b = a.batch_size
    t0 = None
    for step in range(start + 1, a.steps + 1):
        x, y = pc.batch(data, stream, cursor, rank, b, dev)
        cursor += b * world
        loss = pc.train_step(ddp, opt, x, y)
        if ck is not None:
            if rank == 0:
                pc.record(a.out, kind="step", harness="ddp", world=world, step=step)
                if step % a.ckpt_every == 0 or step in ckpt_at:
                    tmp = ck.with_suffix(".tmp")
                    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                                "step": step, "cursor": cursor, "world": world}, tmp)
                    os.replace(tmp, ck)
                    pc.record(a.out, kind="ckpt", harness="ddp", world=world, step=step)
        elif step == a.warmup:
            pc.sync(dev)
            t0 = time.time()
    if ck is None and rank == 0:
        pc.sync(dev)
        dt = time.time() - t0
        steps = a.steps - a.warmup
        pc.record(a.out, kind="steady", harness="ddp", world=world, steps=steps, seconds=dt,
                  images_per_s=steps * b * world / dt, loss=float(loss.detach()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
