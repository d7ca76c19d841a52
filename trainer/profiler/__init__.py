"""``Trainer(profiler=...)``: the profilers ("simple": time per phase; "pytorch": ``torch.profiler`` traces per
rank; or your ``Profiler`` subclass) and how one is attached to a stage by wrapping the calls the loops already
make, so that with no profiler the loops run exactly their own code."""
from trainer.profiler.profilers import Profiler, PyTorchProfiler, SimpleProfiler, build_profiler

__all__ = ["Profiler", "PyTorchProfiler", "SimpleProfiler", "build_profiler"]
