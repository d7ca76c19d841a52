"""Callbacks: plug-ins the Trainer calls at fixed points of the loop."""
from callbacks.callback import Callback
from callbacks.early_stopping import EarlyStopping
from callbacks.model_checkpoint import ModelCheckpoint

__all__ = ["Callback", "EarlyStopping", "ModelCheckpoint"]
