"""``accelerate.logging.get_logger``: a logger for several processes, writing on global rank 0 unless told
otherwise (``logger.info(msg, main_process_only=False)``)."""
from __future__ import annotations

import functools
import logging
import os
from typing import Any, Optional


def _rank_and_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class MultiProcessAdapter(logging.LoggerAdapter):
    """Prefixes each message with ``[RANK r]``; ``main_process_only=True`` (the default) logs on global rank 0 only,
    ``in_order=True`` logs on every process, one after the other (a barrier each)."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        msg, kwargs = super().process(msg, kwargs)
        kwargs.setdefault("stacklevel", 2)
        return f"[RANK {_rank_and_world()[0]}] {msg}", kwargs

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        if not self.isEnabledFor(level):
            return
        msg, kwargs = self.process(msg, kwargs)
        rank, world = _rank_and_world()
        if not in_order:
            if not main_process_only or rank == 0:
                self.logger.log(level, msg, *args, **kwargs)
            return
        import torch.distributed as dist

        for turn in range(world):
            if turn == rank:
                self.logger.log(level, msg, *args, **kwargs)
            if dist.is_available() and dist.is_initialized():
                dist.barrier()

    @functools.lru_cache(None)
    def warning_once(self, *args: Any, **kwargs: Any) -> None:
        """``warning`` the first time these arguments are given only."""
        self.warning(*args, **kwargs)


def get_logger(name: str, log_level: Optional[str] = None) -> MultiProcessAdapter:
    """The logger ``name`` for several processes; its level is ``log_level``, else ``$ACCELERATE_LOG_LEVEL``,
    else left as configured."""
    logger = logging.getLogger(name)
    log_level = log_level or os.environ.get("ACCELERATE_LOG_LEVEL")
    if log_level is not None:
        logger.setLevel(log_level.upper())
        logger.root.setLevel(log_level.upper())
    return MultiProcessAdapter(logger, {})
