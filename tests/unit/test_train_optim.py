"""The built-in trainer's SGD (elastic_ring.train.optim): torch.optim.SGD's results without its
compile guards, so that a built-in worker never imports torch._dynamo."""

from __future__ import annotations

import subprocess
import sys

import torch

from elastic_ring.train.optim import SGD


def _train(opt_cls, steps=6, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    opt = opt_cls(model.parameters(), lr=0.1, **kw)
    g = torch.Generator().manual_seed(1)
    for i in range(steps):
        x, y = torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if i == steps // 2:  # a checkpoint round trip in the middle, as a resize does
            state = opt.state_dict()
            opt = opt_cls(model.parameters(), lr=0.1, **kw)
            opt.load_state_dict(state)
    return model, opt


def test_weights_and_state_bitwise_equal_to_torch_sgd():
    for kw in ({}, {"momentum": 0.9, "weight_decay": 5e-4}, {"momentum": 0.9, "nesterov": True}):
        ours, ours_opt = _train(SGD, **kw)
        ref, ref_opt = _train(torch.optim.SGD, **kw)
        for a, b in zip(ours.parameters(), ref.parameters()):
            assert torch.equal(a, b), kw
        sa, sb = ours_opt.state_dict(), ref_opt.state_dict()
        assert sa["param_groups"] == sb["param_groups"]
        for k in sb["state"]:
            for name, v in sb["state"][k].items():
                assert torch.equal(sa["state"][k][name], v) if torch.is_tensor(v) else sa["state"][k][name] == v


def test_no_grad_during_the_step_and_a_closure_still_works():
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = SGD([p], lr=0.5)

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert float(loss.detach()) == 5.0
    assert torch.equal(p.detach(), torch.tensor([0.0, 0.0]))  # p - 0.5 * 2p
    assert not p.grad.requires_grad


def test_a_fresh_process_training_with_it_never_imports_torch_dynamo():
    code = ("import sys, torch\n"
            "from elastic_ring.train.optim import SGD\n"
            "m = torch.nn.Linear(3, 2); o = SGD(m.parameters(), lr=0.1, momentum=0.9)\n"
            "for _ in range(2):\n"
            "    o.zero_grad(); m(torch.ones(4, 3)).sum().backward(); o.step()\n"
            "o.load_state_dict(o.state_dict())\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
