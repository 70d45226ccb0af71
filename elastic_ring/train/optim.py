"""The built-in trainer's SGD: torch's own arithmetic, without the guards torch puts around every
optimizer method for ``torch.compile``.

Those guards (``torch._disable_dynamo`` on ``add_param_group``, ``zero_grad``, ``state_dict`` and
``load_state_dict``; ``step``'s wrapper, which marks graph breaks) import ``torch._dynamo`` at their
first call: about 2 s of CPU in every worker process, as much as importing the rest of torch, spent
before the first step of every launch and relaunch. The built-in trainer never compiles, so the
guards guard nothing here; this class calls the guarded functions themselves (``__wrapped__``).
A script of the user's keeps ``torch.optim`` as it is (it may compile), and the worker library warms
the import for it instead (:func:`elastic_ring.worker.ring.warm_imports`).

``tests/unit/test_train_optim.py`` holds the weights and the optimizer state bitwise equal to
``torch.optim.SGD``'s and checks that ``torch._dynamo`` stays unimported.
"""

from __future__ import annotations

from typing import Any

import torch

_Optimizer = torch.optim.Optimizer


def _unguarded(fn: Any) -> Any:
    """The function a torch guard wraps (the guard itself where torch has none)."""
    return getattr(fn, "__wrapped__", fn)


class SGD(torch.optim.SGD):
    """``torch.optim.SGD`` (same arguments, state and results) minus the compile guards."""

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _unguarded(_Optimizer.add_param_group)(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _unguarded(_Optimizer.zero_grad)(self, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return _unguarded(_Optimizer.state_dict)(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        _unguarded(_Optimizer.load_state_dict)(self, state_dict)

    def step(self, closure=None):  # type: ignore[override]
        # step's guard runs the update with grad enabled only for a differentiable optimizer
        with torch.set_grad_enabled(bool(self.defaults["differentiable"])):
            return _unguarded(torch.optim.SGD.step)(self, closure)
