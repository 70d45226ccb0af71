"""What the stop vote costs per step, paired in one Horovod job (less noise than separate runs).

    horovodrun -np 2 -H localhost:2 --gloo python launch/vote_cost.py --steps 90 --out r.jsonl

The same training step (``launch/peer_common.py``) runs in blocks of ``--block`` steps that cycle
through three ways of agreeing on a stop between steps: ``none`` (no agreement: the plain loop),
``blocking`` (an allreduce of rank 0's flag after every step, waited for at once: elastic-ring
before this change) and ``async`` (the allreduce started after a step and read after the next:
elastic-ring now). Rank 0 records each block's seconds per step, and first the latency of a
blocking vote on its own (50 in a row, three times).
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402

import peer_common as pc  # noqa: E402


def main() -> None:
    p = pc.arguments(__doc__)
    p.add_argument("--block", type=int, default=10)
    a = p.parse_args()
    hvd.init()
    dev = pc.setup(hvd.local_rank(), hvd.local_size(), a.device)
    model, data, stream = pc.build(a, dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    b, n = a.batch_size, hvd.size()
    modes = ("none", "blocking", "async")
    step, vote = 0, None
    for _ in range(3):  # the latency of one blocking vote alone (no training step around it)
        t0 = time.time()
        for _ in range(50):
            hvd.allreduce(torch.tensor([0.0]), op=hvd.Sum, name="stop_flag")
        if hvd.rank() == 0:
            pc.record(a.out, kind="vote_latency", world=n, seconds=(time.time() - t0) / 50)
    for _ in range(a.warmup):
        step += 1
        pc.train_step(model, opt, *pc.batch(data, stream, step * b * n, hvd.rank(), b, dev))
    while step < a.steps:
        mode = modes[(step // a.block) % 3]
        pc.sync(dev)
        t0 = time.time()
        for _ in range(a.block):
            step += 1
            pc.train_step(model, opt, *pc.batch(data, stream, step * b * n, hvd.rank(), b, dev))
            flag = torch.tensor([0.0])
            if mode == "blocking":
                hvd.allreduce(flag, op=hvd.Sum, name="stop_flag")
            elif mode == "async":
                if vote is not None:
                    hvd.synchronize(vote)
                vote = hvd.allreduce_async(flag, op=hvd.Sum, name="stop_flag")
        if vote is not None:
            hvd.synchronize(vote)
            vote = None
        pc.sync(dev)
        if hvd.rank() == 0:
            pc.record(a.out, kind="vote", mode=mode, world=n, steps=a.block,
                      step_s=(time.time() - t0) / a.block)


if __name__ == "__main__":
    main()
