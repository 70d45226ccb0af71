"""A plain, hand-written Horovod training loop: the baseline for elastic-ring's per-step cost.

    horovodrun -np 2 -H localhost:2 --gloo python launch/peer_hvd.py --steps 200 --out r.jsonl

No stop protocol, no throughput events, no checkpoints: ``hvd.init()``, broadcast the weights,
``DistributedOptimizer``, step. Rank 0 records images/s over the steps after ``--warmup``.
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402

import peer_common as pc  # noqa: E402


def main() -> None:
    ap = pc.arguments(__doc__)
    ap.add_argument("--groups", type=int, default=0,
                    help="DistributedOptimizer(groups=N): gradients allreduced in N groups (0: Horovod's default)")
    a = ap.parse_args()
    hvd.init()
    dev = pc.setup(hvd.local_rank(), hvd.local_size(), a.device)
    model, data, stream = pc.build(a, dev)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr * a.batch_size * hvd.size() / 128, momentum=0.9,
                          weight_decay=1e-4)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=hvd.Average,
                                   groups=a.groups or None)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    b, n = a.batch_size, hvd.size()
    t0 = None
    for step in range(1, a.steps + 1):
        x, y = pc.batch(data, stream, (step - 1) * b * n, hvd.rank(), b, dev)
        loss = pc.train_step(model, opt, x, y)
        if step == a.warmup:
            pc.sync(dev)
            t0 = time.time()
    pc.sync(dev)
    dt = time.time() - t0
    if hvd.rank() == 0:
        steps = a.steps - a.warmup
        pc.record(a.out, kind="steady", harness="horovod", world=n, steps=steps, seconds=dt,
                  images_per_s=steps * b * n / dt, loss=float(loss.detach()))


if __name__ == "__main__":
    main()
