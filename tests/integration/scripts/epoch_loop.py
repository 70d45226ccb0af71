"""A small plain-Horovod epoch-loop script on the worker library (``job.epochs()`` over a DataLoader with
``elastic.DistributedSampler``, SGD with momentum, a StepLR stepped after each epoch), for tests of
failures inside an epoch: each rank writes ``step pid size epoch`` to ``OUT/rank<r>.txt`` for every
step it begins, and rank 1 kills itself (SIGKILL) at the start of step ``--kill-step`` (before its
batch's forward; once rank 0 began that step too, so that rank 0 holds the step before in memory;
only once in a run: not the joiner that takes its place) when ``--kill-step`` is given. ``--step-s``: a sleep per step (pacing).

    elastic-ring train --script tests/integration/scripts/epoch_loop.py --gpus 2 --relaunch inplace \\
        --survive -- --out OUT --kill-step 3
"""

import argparse
import os
import signal
import time

import horovod.torch as hvd
import torch
import torch.nn.functional as F

import elastic_ring.worker as elastic

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--kill-step", type=int, default=0, help="rank 1 dies at the start of this step (0: never)")
p.add_argument("--step-s", type=float, default=0.0)
a = p.parse_args()

job = elastic.init()
torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
sampler = elastic.DistributedSampler(data, num_replicas=hvd.size(), rank=hvd.rank())
loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
model = torch.nn.Linear(8, 2)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9),
                               named_parameters=model.named_parameters())
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
job.register(model=model, optimizer=opt, scheduler=sched)
job.restore()
for epoch in job.epochs(1, a.epochs + 1):
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        step = job.step + 1
        with open(os.path.join(a.out, f"rank{hvd.rank()}.txt"), "a") as f:
            f.write(f"{step} {os.getpid()} {hvd.size()} {epoch}\n")
        if hvd.rank() == 1 and step == a.kill_step and not os.path.exists(os.path.join(a.out, "killed")):
            open(os.path.join(a.out, "killed"), "w").close()  # once: not its joiner, should it reach the step
            t0 = time.time()  # once rank 0 began this step too (it holds the step before in memory)
            while time.time() - t0 < 30 and not any(ln.split()[0] == str(step) for ln in
                                                     open(os.path.join(a.out, "rank0.txt")).read().splitlines()):
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(a.step_s)
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    sched.step()
