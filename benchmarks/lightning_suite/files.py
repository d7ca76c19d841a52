"""The Lightning test files the harness measures, split into the two halves the work is organised by."""

from __future__ import annotations

#: Lightning's loop, optimisation, data and flag tests (paths under ``tests/tests_pytorch``).
LOOP_HALF: tuple[str, ...] = (
    "models/test_hooks.py",
    "trainer/optimization/test_manual_optimization.py",
    "trainer/optimization/test_optimizers.py",
    "trainer/optimization/test_multiple_optimizers.py",
    "trainer/test_dataloaders.py",
    "trainer/flags/test_fast_dev_run.py",
    "trainer/flags/test_limit_batches.py",
    "trainer/flags/test_min_max_epochs.py",
    "trainer/flags/test_val_check_interval.py",
    "trainer/flags/test_check_val_every_n_epoch.py",
    "trainer/flags/test_overfit_batches.py",
    "core/test_datamodules.py",
)

#: Lightning's logging, callback, checkpoint and tuner tests.
LOGGING_HALF: tuple[str, ...] = (
    "callbacks/test_early_stopping.py",
    "checkpointing/test_model_checkpoint.py",
    "trainer/logging_/test_train_loop_logging.py",
    "trainer/logging_/test_eval_loop_logging.py",
    "trainer/logging_/test_logger_connector.py",
    "tuner/test_lr_finder.py",
    "tuner/test_scale_batch_size.py",
    "callbacks/test_lr_monitor.py",
    "loggers/test_tensorboard.py",
    "loggers/test_csv.py",
    "callbacks/test_finetuning_callback.py",
    "loggers/test_logger.py",
)

#: Every measured file mapped to its half ("loop" or "logging").
HALVES: dict[str, str] = {**dict.fromkeys(LOOP_HALF, "loop"), **dict.fromkeys(LOGGING_HALF, "logging")}

#: The package the test files live in (and import their helpers from).
TEST_PACKAGE = "tests_pytorch"
