"""The memory planner: the bytes each rank holds for a module under each strategy or N-D layout (parameters,
gradients, optimizer state, working memory, activations), computed before anything runs; ``trainer
estimate-memory`` prints it. See :mod:`trainer.memory.planner`."""
from trainer.memory.planner import (
    STRATEGIES,
    DeviceMemory,
    MemoryEstimate,
    compare,
    estimate,
    estimate_layout,
    format_table,
    layout_report,
    layouts_for,
    recommend,
    report,
)

__all__ = ["STRATEGIES", "DeviceMemory", "MemoryEstimate", "compare", "estimate", "estimate_layout", "format_table",
           "layout_report", "layouts_for", "recommend", "report"]  # fmt: skip
