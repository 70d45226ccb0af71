"""A minimal Horovod Elastic training script: Horovod's own way to resize in place.

    horovodrun -np 1 --min-np 1 --max-np 2 --host-discovery-script ./discover.sh \\
        --network-interface lo --gloo python launch/peer_elastic.py --steps 300 --out r.jsonl

The state that survives a reset (model, optimizer, step, sample cursor) is a ``TorchState``;
``commit()`` after every step is where a pending change of hosts is raised; the reset callback
scales the LR linearly to the new world size. Rank 0 records every step (time, world size).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import horovod.torch as hvd  # noqa: E402
import torch  # noqa: E402

import peer_common as pc  # noqa: E402


def main() -> None:
    a = pc.arguments(__doc__).parse_args()
    hvd.init()
    dev = pc.setup(hvd.local_rank(), hvd.local_size(), a.device)
    model, data, stream = pc.build(a, dev)
    per_worker_lr = a.lr * a.batch_size / 128
    opt = torch.optim.SGD(model.parameters(), lr=per_worker_lr * hvd.size(), momentum=0.9,
                          weight_decay=1e-4)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=hvd.Average)
    state = hvd.elastic.TorchState(model, opt, step=0, cursor=0)

    def on_reset() -> None:
        for g in opt.param_groups:
            g["lr"] = per_worker_lr * hvd.size()

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state) -> None:
        b = a.batch_size
        if hvd.rank() == 0:
            pc.record(a.out, kind="start", harness="horovod-elastic", world=hvd.size(), step=state.step)
        while state.step < a.steps:
            n = hvd.size()
            x, y = pc.batch(data, stream, state.cursor, hvd.rank(), b, dev)
            pc.train_step(model, opt, x, y)
            state.step += 1
            state.cursor += b * n
            if hvd.rank() == 0:
                pc.record(a.out, kind="step", harness="horovod-elastic", world=n, step=state.step)
            state.commit()

    train(state)


if __name__ == "__main__":
    main()
