"""Lightning's ``profilers.simple`` module path: :class:`~trainer.profiler.SimpleProfiler` (defined in
:mod:`trainer.profiler.profilers`), for projects that import it from there."""
from trainer.profiler.profilers import SimpleProfiler

__all__ = ["SimpleProfiler"]
