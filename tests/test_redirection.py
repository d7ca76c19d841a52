"""ForwardRedirection: a step method run through a wrapper's forward (how DDP/FSDP see ``training_step``)."""
from __future__ import annotations

import gc
import weakref

import torch
from torch import nn

from trainer.strategies.data_parallel.redirection import ForwardRedirection


class Wrapper(nn.Module):
    """Stands in for DDP: does something around the wrapped module's forward and records it."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module
        self.calls: list[str] = []

    def forward(self, *args):
        self.calls.append("before")
        out = self.module(*args)
        self.calls.append("after")
        return out


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(3, 1)

    def forward(self, x):
        return self.layer(x)

    def training_step(self, x):
        return self(x).sum() * 2  # calls the real forward inside the step


def test_the_step_runs_inside_the_wrappers_forward_and_the_real_forward_is_back():
    net = Net()
    wrapper = Wrapper(net)
    x = torch.randn(4, 3)
    out = ForwardRedirection(wrapper, net, "training_step")(x)
    assert torch.equal(out, net.layer(x).sum() * 2)
    assert wrapper.calls == ["before", "after"]
    assert "forward" not in net.__dict__  # the class's forward again


def test_a_dropped_redirection_frees_the_wrapper_without_a_garbage_collection():
    """A wrapper kept alive in a reference cycle holds a DDP reducer's process group until some collection,
    possibly at interpreter exit, where destroying a gloo group aborts the process."""
    gc.disable()
    try:
        net = Net()
        wrapper = Wrapper(net)
        redirect = ForwardRedirection(wrapper, net, "training_step")
        redirect(torch.randn(2, 3))
        alive = weakref.ref(wrapper)
        del wrapper, redirect
        assert alive() is None
    finally:
        gc.enable()
