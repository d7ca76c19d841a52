"""Exceptions: misuse (what was wrong and what would be valid), a failed or hung peer in a multi-process job, and a
checkpoint that cannot be used."""


class ConfigurationError(ValueError, TypeError):
    """Raised when an argument, a hook's return value or an object handed to the framework is unusable.

    It is both a ``ValueError`` and a ``TypeError`` so code that guards for the built-in a user would
    naturally expect keeps working; the message always names the argument and lists what is valid.
    """


class AutomaticOptimizationError(ConfigurationError, RuntimeError):
    """What automatic optimisation cannot do (several optimizers, a ``training_step`` taking ``optimizer_idx``):
    a ``ConfigurationError`` that is also the ``RuntimeError`` Lightning raises there, so ported ``except`` clauses
    and tests keep catching it."""


class StepSignatureError(ConfigurationError, RuntimeError):
    """A ``*_step`` whose signature does not fit the dataloaders (a required ``dataloader_idx`` with one loader): a
    ``ConfigurationError`` that is also the ``RuntimeError`` Lightning raises there."""


class RankFailedError(RuntimeError):
    """Another process of a multi-process job failed, so this one stopped too.

    The failing process's traceback is printed once (by that process, or in this message when the
    processes were spawned); this error only says why the surviving process stopped.
    """


class HangError(RuntimeError):
    """A rank of a multi-process job stopped answering (stuck, stopped, deadlocked): the message names it and
    where the job was (see :mod:`trainer.strategies.launch.hang_report`)."""


class CheckpointError(RuntimeError):
    """A checkpoint file exists but cannot be used (corrupt, truncated or unsafe)."""
