"""The ``Engine``: Accelerate-style building blocks for a hand-written loop (``prepare``, ``backward``,
``accumulate``, ``autocast``, gathers, ``save_state``/``load_state``, trackers), driving the same strategies
as the Trainer. See docs/engine.md."""
from trainer.engine.engine import Engine

__all__ = ["Engine"]
