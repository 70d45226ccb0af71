"""The bare cost of starting workers: imports + hvd.init() + a barrier, nothing else.

Launched by horovodrun from scripts/bench_resize.py to compare against a real resize.
"""

import horovod.torch as hvd
import torch

hvd.init()
hvd.allreduce(torch.zeros(1), name="barrier")
