"""What a fit that trains nothing says, instead of ending like a successful one.

The rule (docs/troubleshooting.md): ``fit()`` warns when

- it starts on a Trainer whose loop is already done (a second ``fit()`` after ``max_epochs``/``max_steps`` was
  reached): it continues from where the first one ended, as in Lightning, so it trains nothing; or
- it ends normally with no optimizer step over a loss (an empty training dataloader, a ``training_step`` that
  returns ``None`` every time, manual optimisation that never steps). A window whose every ``training_step``
  returned ``None`` still takes an (empty) optimizer step, as in Lightning; those steps do not count here.
  ``limit_train_batches=0`` asks for exactly that, so it is quiet.

Both are read once per fit from the progress counters: nothing is added to the per-step path.
"""
from __future__ import annotations

from typing import Any

from trainer.strategies.rank import rank_zero_warn


def warn_if_already_done(trainer: Any) -> bool:
    """At the start of a fit that did not restore a checkpoint: say that a finished loop trains nothing."""
    progress = trainer.fit_loop.progress
    if progress.global_step == 0 and progress.epoch == 0 or not trainer.fit_loop.done:
        return False
    limits = f"max_epochs={trainer.max_epochs}, max_steps={trainer.max_steps}"
    rank_zero_warn(
        f"This Trainer already trained to epoch {progress.epoch}, global step {progress.global_step} ({limits}), so "
        "this fit() continues from there and trains nothing (it still runs on_fit_start/on_fit_end). To train "
        "further, build a Trainer with a higher max_epochs/max_steps (and fit(ckpt_path='last') to continue); to "
        "train from scratch, build a new Trainer."
    )
    return True


def warn_if_no_step(trainer: Any, steps_before: int, batches_before: int) -> None:
    """At the normal end of a fit: warn when it took no optimizer step over a loss although training was asked for
    (the empty steps of windows whose ``training_step`` returned ``None`` do not count)."""
    progress = trainer.fit_loop.progress
    empty_steps = getattr(trainer._optimization, "empty_steps", 0)  # this fit's; manual optimisation has none
    if progress.global_step - empty_steps != steps_before or trainer.limit_train_batches == 0:
        return
    batches = progress.total_batches - batches_before
    if batches == 0:
        reason = ("the training dataloader gave no batches (an empty dataset, or fewer samples than one batch with "
                  "drop_last=True, or fewer than the number of processes)")  # fmt: skip
    elif not trainer.module.automatic_optimization:
        reason = f"training_step ran {batches} time(s) but never called optimizer.step() (manual optimisation)"
    else:
        guard = trainer._faults.guard
        skipped = guard.skipped if guard is not None else 0
        reason = (f"training_step returned None (no loss) for all {batches} batch(es): did it forget `return loss`?"
                  if not skipped else
                  f"every loss was NaN/inf and skipped ({skipped} micro-batch(es), on_nonfinite_loss='skip')")  # fmt: skip
    rank_zero_warn(f"fit() ended without a single optimizer step: {reason}. The weights did not change.")
