"""Callbacks: plug-ins the Trainer calls at fixed points of the loop."""
from callbacks.callback import Callback

__all__ = ["Callback"]
