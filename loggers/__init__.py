"""Loggers: where metrics and hyperparameters go. Heavy backends are imported only when created."""
from loggers.logger import Logger

__all__ = ["Logger"]


def default_logger(root_dir: str) -> "Logger | None":
    """The logger ``Trainer(logger=True)`` creates under ``root_dir``."""
    return None
