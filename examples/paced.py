"""A job whose speed is set by a clock, for trying a scheduler where the machine's load must not
decide the result (scripts/cluster_check_sim.py runs a dozen of them side by side on 2 cores).

Each step is a real Horovod step of a tiny model (allreduce of its gradients), then a sleep so that
the step lasts ``--serial-s + --step-s / W`` seconds at W workers: a fixed global batch shared by
the workers (steps/s rises with W, nearly linearly while the serial part is small), the time of
the work set by the sleep instead of the cores. A step whose real work already took longer is not
slowed further, so a job starved of CPU shows up as slower than its pace.

    elastic-ring submit examples/paced.py --steps 200 --dir cluster -- --step-s 0.4
"""

import argparse
import time

import horovod.torch as hvd
import torch

import elastic_ring.worker as elastic


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--step-s", type=float, default=0.4, help="seconds of a step at 1 worker, shared by the workers")
    p.add_argument("--serial-s", type=float, default=0.0, help="seconds of a step not shared (any worker count)")
    a = p.parse_args()
    if a.step_s < 0 or a.serial_s < 0:
        p.error("--step-s and --serial-s must be >= 0")

    job = elastic.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * job.size),
                                   named_parameters=model.named_parameters())
    data = job.sampler(256, batch_size=8, seed=0)
    x, y = torch.randn(256, 8), torch.randint(0, 2, (256,))
    job.register(model=model, optimizer=opt)
    job.restore()
    for _ in job.steps():
        t0 = time.perf_counter()
        idx = data.next_batch()
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        job.record(loss, samples=len(idx))
        time.sleep(max(0.0, a.serial_s + a.step_s / job.size - (time.perf_counter() - t0)))


if __name__ == "__main__":
    main()
