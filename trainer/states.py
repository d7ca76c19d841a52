"""What the Trainer is doing, as Lightning's ``trainer.state`` reports it: ``.fn`` (the entry point called),
``.stage`` (what runs right now) and ``.status``.

The values are Lightning's strings, and each member equals its string case-insensitively
(``trainer.state.fn == "fit"``), so callbacks written for Lightning compare the same. Also importable as
``trainer.trainer.states`` (Lightning's ``lightning.pytorch.trainer.states`` under the rename).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Optional


class _StrEnum(str, Enum):
    """A string enum whose members equal their value in any case (Lightning's ``LightningEnum``)."""

    @classmethod
    def from_str(cls, value: str) -> "_StrEnum":
        """The member whose value or name is ``value`` (any case); ``ValueError`` listing the valid ones."""
        for member in cls:
            if value.lower() in (member.value.lower(), member.name.lower()):
                return member
        raise ValueError(f"{value!r} is not a {cls.__name__}; use one of {[m.value for m in cls]}.")

    def __eq__(self, other: Any) -> bool:
        other = other.value if isinstance(other, Enum) else other
        return isinstance(other, str) and self.value.lower() == other.lower()

    def __hash__(self) -> int:
        return hash(self.value.lower())

    def __str__(self) -> str:
        return self.value


class TrainerStatus(_StrEnum):
    """Whether the last entry point is running, finished, or was interrupted (by an exception or Ctrl-C)."""

    INITIALIZING = "initializing"
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"

    @property
    def stopped(self) -> bool:
        """Finished or interrupted."""
        return self in (TrainerStatus.FINISHED, TrainerStatus.INTERRUPTED)


class TrainerFn(_StrEnum):
    """The entry point: ``fit``, ``validate``, ``test`` or ``predict``."""

    FITTING = "fit"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


class RunningStage(_StrEnum):
    """What runs now: fit runs ``sanity_check``, ``train`` and ``validate``; the others their own stage."""

    TRAINING = "train"
    SANITY_CHECKING = "sanity_check"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"

    @property
    def evaluating(self) -> bool:
        """Validation, test or the sanity check."""
        return self in (RunningStage.VALIDATING, RunningStage.TESTING, RunningStage.SANITY_CHECKING)

    @property
    def dataloader_prefix(self) -> Optional[str]:
        """``"val"``, ``"test"``, ``"predict"`` or ``"train"``: the ``<prefix>_dataloader`` this stage reads."""
        if self in (RunningStage.VALIDATING, RunningStage.SANITY_CHECKING):
            return "val"
        return self.value


@dataclass
class TrainerState:
    """``trainer.state``: a snapshot of the status, the entry point and the running stage."""

    status: TrainerStatus = TrainerStatus.INITIALIZING
    fn: Optional[TrainerFn] = None
    stage: Optional[RunningStage] = None

    @property
    def finished(self) -> bool:
        """The last entry point returned normally."""
        return self.status == TrainerStatus.FINISHED

    @property
    def stopped(self) -> bool:
        """The last entry point returned or raised."""
        return self.status.stopped


__all__ = ["RunningStage", "TrainerFn", "TrainerState", "TrainerStatus"]
