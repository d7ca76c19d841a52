"""``TQDMProgressBar``: Lightning's default progress bar by name, drawn here with rich (tqdm is not a dependency).

``TQDMProgressBar(refresh_rate=20)`` runs: ``refresh_rate=0`` turns the bar off, as in Lightning; any other value
gives our :class:`~trainer.callbacks.RichProgressBar`, which redraws by time rather than every N batches (its
``train_progress_bar`` and the other bars read as tqdm bars do).
"""
from __future__ import annotations

from trainer.callbacks.rich_progress import RichProgressBar
from trainer.strategies.errors import ConfigurationError


class TQDMProgressBar(RichProgressBar):
    """Lightning's ``TQDMProgressBar(refresh_rate=1, process_position=0, leave=False)`` arguments, on the rich bar.
    ``refresh_rate`` counts batches there; here ``0`` hides the bar and other values redraw every 0.1 s."""

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False) -> None:
        if isinstance(refresh_rate, bool) or not isinstance(refresh_rate, int) or refresh_rate < 0:
            raise ConfigurationError(f"TQDMProgressBar(refresh_rate={refresh_rate!r}) must be an int >= 0 "
                                     "(0 turns the bar off).")  # fmt: skip
        super().__init__(refresh_rate=refresh_rate, leave=leave)
        self.process_position = process_position
