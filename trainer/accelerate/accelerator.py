"""``Accelerator``: the Engine with Accelerate's numbers."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Union

from trainer.accelerate.state import AcceleratorState
from trainer.engine.engine import Engine
from trainer.strategies.errors import ConfigurationError


class Accelerator(Engine):
    """The :class:`~trainer.engine.Engine` (every argument and member, Accelerate's names among them:
    ``mixed_precision``, ``cpu``, ``gradient_accumulation_steps``, ``log_with``, ``kwargs_handlers``,
    ``dataloader_config``, ``step_scheduler_with_optimizer``, ...), giving Accelerate's numbers:

    - prepared dataloaders deal whole batches of the original loader to the processes in turn (rank 0 of 2 reads
      batches 0, 2, 4, ...), or cut each batch into one piece per process with ``split_batches=True``; with
      ``even_batches`` (the default) the first samples complete the last round;
    - a prepared LR scheduler steps once per process for each optimizer step (once with ``split_batches``; at
      every call with ``step_scheduler_with_optimizer=False``);
    - ``gather`` returns its input in a one-process job, and ``gather_for_metrics`` keeps, on a loader's last
      batch, the first ``len(dataset) % samples_per_step`` gathered rows.

    The Engine's exact mid-epoch resume stays: after ``load_state`` a prepared dataloader continues at the batch
    where the saved run stood (no ``skip_first_batches`` needed).
    """

    numbers = "accelerate"

    @property
    def state(self) -> AcceleratorState:
        """Accelerate's ``AcceleratorState`` of this job (``num_processes``, ``process_index``,
        ``distributed_type``, ``mixed_precision``, ``device``; its ``repr`` is what scripts log)."""
        return AcceleratorState(self)

    def init_trackers(self, project_name: str, config: Optional[dict[str, Any]] = None,
                      init_kwargs: Optional[dict[str, Any]] = None) -> None:  # fmt: skip
        """The Engine's ``init_trackers``, with Accelerate's folder: the TensorBoard tracker writes in
        ``logging_dir/project_name`` itself (no ``version_N``; a rerun adds event files there, as on Accelerate)."""
        from trainer.engine.trackers import create_trackers

        specs = self._tracker_specs
        if isinstance(project_name, str) and project_name:
            folder = self.project_configuration.logging_dir or self.project_dir
            names = [spec for spec in specs if spec in ("tensorboard", "default")]
            made = iter(create_trackers(names, folder, project_name, versioned=False))
            self._tracker_specs = [next(made) if spec in names else spec for spec in specs]
        try:
            super().init_trackers(project_name, config, init_kwargs)
        finally:
            self._tracker_specs = specs

    def log(self, values: dict[str, Any], step: Optional[int] = None, log_kwargs: Optional[dict] = None) -> None:
        """Accelerate's ``log``: each tracker's ``log`` (dicts as one TensorBoard chart, strings as text), on the
        main process."""
        if log_kwargs:
            raise ConfigurationError(f"log(log_kwargs={log_kwargs!r}) is not supported: our trackers take values "
                                     "and step only. Leave log_kwargs out.")  # fmt: skip
        for tracker in self.trackers:
            tracker.log(values, step=step)

    def load_state(self, input_dir: Union[str, os.PathLike, None] = None, **load_model_func_kwargs: object) -> None:
        """The Engine's ``load_state``; also reads a folder Accelerate's own ``save_state`` wrote
        (:mod:`trainer.accelerate.checkpoint_folder`), so a job started on Accelerate continues here."""
        from trainer.accelerate.checkpoint_folder import is_accelerate_folder, load_accelerate_folder

        if load_model_func_kwargs:
            raise ConfigurationError(f"load_state({', '.join(load_model_func_kwargs)}=...) is not supported: models "
                                     "load with load_state_dict (strict) here. Leave the keyword arguments out.")  # fmt: skip
        if input_dir is not None and is_accelerate_folder(Path(input_dir)):
            self._require_ready("load_state()")
            return load_accelerate_folder(self, Path(input_dir))
        return super().load_state(input_dir)


class PartialState(Accelerator):
    """Accelerate's ``PartialState`` (the process topology without training): ``device``, ``num_processes``,
    ``process_index``, ``is_main_process``, ``split_between_processes``, ``main_process_first``,
    ``wait_for_everyone``, ``on_main_process``, ``print``, ... For distributed inference scripts. Each instance joins
    the job as an ``Accelerator`` does (Accelerate's instances share one state; here creating it twice is harmless)."""

    def destroy_process_group(self, group: object = None) -> None:
        """Leave the job: destroy the process group (every process must call it)."""
        self.strategy.teardown()
