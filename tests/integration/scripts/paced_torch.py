"""The paced script (``paced.py``: a tiny model whose steps take at least --step-s seconds, a sleep)
on ``torch.distributed``: the gradients averaged by ``job.parallel`` (DistributedDataParallel), for
``--collective torch`` runs."""

import argparse
import time

import torch

import elastic_ring.worker as elastic

p = argparse.ArgumentParser()
p.add_argument("--step-s", type=float, default=0.05)
a = p.parse_args()

job = elastic.init()
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.01 * job.size, momentum=0.9)
net, opt = job.parallel(model, opt)
data = job.sampler(256, batch_size=8, seed=0)
x, y = torch.randn(256, 8), torch.randint(0, 2, (256,))
job.register(model=model, optimizer=opt)
job.restore()
for _ in job.steps():
    t0 = time.perf_counter()
    idx = data.next_batch()
    loss = torch.nn.functional.cross_entropy(net(x[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    job.record(loss, samples=len(idx))
    time.sleep(max(0.0, a.step_s - (time.perf_counter() - t0)))
