"""The bare cost of starting workers: imports + hvd.init() + a barrier, nothing else.

Launched by horovodrun from scripts/bench_resize.py to compare against a real resize; with
``--cuda`` (scripts/gpu_check.sh) each worker also creates its CUDA context on its local GPU.
"""

import sys

import horovod.torch as hvd
import torch

hvd.init()
if "--cuda" in sys.argv[1:]:
    torch.cuda.set_device(hvd.local_rank())
    torch.zeros(1, device="cuda").sum().item()  # the CUDA context exists after this
hvd.allreduce(torch.zeros(1), name="barrier")
