"""Where a fit is: the counters saved in checkpoints under ``loops`` and restored on resume."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class Progress:
    """Loop counters, saved in checkpoints so a resumed fit continues exactly where the saved one was.

    ``batch_in_epoch``: micro-batches finished in ``epoch`` (the resume position). ``val_pending``: the
    last finished batch is due a validation that has not finished yet. ``epoch_finished``: the epoch's
    batches, its epoch-interval schedulers and its ``on_train_epoch_end`` up to the module's are done (only the
    monitoring callbacks', e.g. checkpointing, remain). ``plateau_pending``: the last step's step-interval
    ``ReduceLROnPlateau`` schedulers have not stepped yet (they step after the batch's validation, as in Lightning);
    ``plateau_metrics``: the values they monitor, kept when a validation ends before they step, so a fit resumed
    from a checkpoint saved there steps them as the saved run did.
    """

    epoch: int = 0
    global_step: int = 0
    batch_in_epoch: int = 0
    batches_that_stepped: int = 0
    total_batches: int = 0
    skipped_steps: int = 0
    epoch_finished: bool = False
    val_pending: bool = False
    plateau_pending: bool = False
    plateau_metrics: dict[str, float] = field(default_factory=dict)

    def state_dict(self) -> dict[str, Any]:
        """Plain values only."""
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore counters; unknown keys from newer formats are ignored."""
        names = {f.name for f in fields(self)}
        for key, value in state.items():
            if key in names:
                setattr(self, key, value)
