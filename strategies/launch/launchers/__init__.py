"""Launchers: how the processes of a ``ddp``/``ddp_spawn`` job come to exist when nothing else started them.

Each exposes ``launch(fn, *args)`` (run a stage on this process's rank and return global rank 0's
result) and ``runs_in_caller`` (whether the stage runs in the calling process).
"""
from trainer.strategies.launch.launchers.spawn import SpawnLauncher
from trainer.strategies.launch.launchers.subprocess_script import SubprocessScriptLauncher

__all__ = ["SpawnLauncher", "SubprocessScriptLauncher"]
