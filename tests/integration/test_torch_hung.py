"""The stall watchdog still sees a hung training thread on ``torch.distributed`` now that the stop
vote is launched by a thread of its own (issue 50, :class:`elastic_ring.worker.collective.VoteThread`):
the heartbeat is the training thread's note, so a rank whose training thread sleeps is named while
its vote thread lives on, and the run restarts from the checkpoint and ends by itself.

(The rank hangs after its optimizer step, so that its peer goes on to the next step's backward,
where DDP's allreduce waits for it: a hang before the step's backward leaves both ranks at the
same heartbeat, where DDP waits, and the watchdog then allows a collective's longer wait.)"""

from __future__ import annotations

from elastic_ring.events import read_events
from tests.conftest import run_cli

HUNG = """
import time, torch
import elastic_ring.worker as elastic
job = elastic.init()
torch.manual_seed(0)
model = torch.nn.Linear(2, 1)
net, opt = job.parallel(model, torch.optim.SGD(model.parameters(), lr=0.1))
job.register(model=model, optimizer=opt)
job.restore()
for step in job.steps():
    loss = net(torch.ones(4, 2)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if step == 9 and job.rank == 1 and job.segment == 0:
        time.sleep(3600)  # code after the step that never returns: the process sleeps (state S)
    job.record(loss, samples=4)
"""


def test_a_torch_rank_hung_while_its_vote_thread_lives_is_named_by_its_heartbeat(tmp_path):
    script = tmp_path / "hung.py"
    script.write_text(HUNG)
    run = tmp_path / "hung"
    p = run_cli("train", "--script", str(script), "--steps", "14", "--gpus", "2", "--slots", "2",
                "--collective", "torch", "--checkpoint-every", "4", "--stall-timeout", "2",
                "--run-dir", str(run), timeout=300)
    assert p.returncode == 0, p.stderr
    (st,) = read_events(run / "events.jsonl", kind="stalled")
    assert st["ranks"] == [1] and st["why"] == "oldest heartbeat", st
    (r,) = read_events(run / "events.jsonl", kind="restart")
    assert r["rank"] == 1 and r["from_step"] == 8 and not r["gave_up"], r
    assert read_events(run / "events.jsonl", kind="finished")[0]["step"] == 14
