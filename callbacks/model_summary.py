"""``ModelSummary``: a table of the module's layers, parameter counts and sizes, printed when fit starts."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.nn.parameter import is_lazy

from trainer.callbacks.callback import Callback
from trainer.callbacks.memory_stats import MB


@dataclass
class LayerRow:
    """One row of the summary: a submodule and its parameters (its own and its children's)."""

    name: str
    kind: str
    params: int
    trainable: int
    size_bytes: int


@dataclass
class Summary:
    """Layer rows and totals; ``size_mb`` counts parameters and buffers (shared tensors once)."""

    rows: list[LayerRow]
    total: int
    trainable: int
    size_mb: float
    has_lazy: bool

    @property
    def non_trainable(self) -> int:
        """Parameters that do not require grad."""
        return self.total - self.trainable


def _count(params: list[nn.Parameter]) -> tuple[int, int, int]:
    total = trainable = size = 0
    for p in params:
        if is_lazy(p):
            continue
        n = p.numel()
        total += n
        size += n * p.element_size()
        if p.requires_grad:
            trainable += n
    return total, trainable, size


def summarize(module: nn.Module, max_depth: int = 1) -> Summary:
    """Rows for submodules down to ``max_depth`` levels (0: totals only), and totals for the whole module."""
    rows = []
    if max_depth > 0:
        for name, sub in module.named_modules():
            if not name or name.count(".") + 1 > max_depth:
                continue
            total, trainable, size = _count(list(sub.parameters()))
            rows.append(LayerRow(name, type(sub).__name__, total, trainable, size))
    params = list(module.parameters())  # parameters() yields a shared parameter once
    total, trainable, size = _count(params)
    size += sum(b.numel() * b.element_size() for b in module.buffers() if not is_lazy(b))
    return Summary(rows, total, trainable, size / MB, any(is_lazy(p) for p in params))


def format_count(n: float) -> str:
    """``950``, ``12.3 K``, ``4.5 M``, ``1.2 B``."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return str(int(n))


def format_size(n_bytes: float) -> str:
    """``512 B``, ``1.5 KB``, ``12.3 MB``, ``1.2 GB``."""
    for unit, scale in (("GB", 1024**3), ("MB", 1024**2), ("KB", 1024)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{int(n_bytes)} B"


class ModelSummary(Callback):
    """Print a rich table of the module (name, type, params, trainable, size) and totals at the start of fit.

    ``max_depth`` levels of submodules are listed (``-1``: all). Added by default
    (``Trainer(enable_model_summary=True)``). Printed on global rank 0 only.
    """

    def __init__(self, max_depth: int = 1, console: Any = None) -> None:
        self.max_depth = max_depth
        self.console = console

    def on_fit_start(self, trainer: Any, module: Any) -> None:
        if not trainer.is_global_zero:
            return
        from rich.console import Console

        console = self.console if self.console is not None else Console()
        depth = 10**6 if self.max_depth == -1 else self.max_depth
        for renderable in render(summarize(module, depth), type(module).__name__):
            console.print(renderable)


def render(summary: Summary, title: str) -> list[Any]:
    """The rich table of layers and the totals grid."""
    from rich.table import Table

    items: list[Any] = []
    if summary.rows:
        table = Table(title=f"{title} summary", title_justify="left", header_style="bold")
        for column, justify in (("", "right"), ("Name", "left"), ("Type", "left"), ("Params", "right"),
                                ("Trainable", "right"), ("Size", "right")):  # fmt: skip
            table.add_column(column, justify=justify)
        for i, row in enumerate(summary.rows):
            table.add_row(str(i), row.name, row.kind, format_count(row.params), format_count(row.trainable),
                          format_size(row.size_bytes))  # fmt: skip
        items.append(table)
    totals = Table.grid(padding=(0, 2))
    totals.add_column(justify="right")
    totals.add_column()
    lazy = " (+ lazy parameters not yet initialised)" if summary.has_lazy else ""
    for value, label in ((summary.trainable, "Trainable params"), (summary.non_trainable, "Non-trainable params"),
                         (summary.total, "Total params")):  # fmt: skip
        totals.add_row(format_count(value), label + (lazy if label == "Total params" else ""))
    totals.add_row(f"{summary.size_mb:.2f}", "Estimated model size (MB)")
    items.append(totals)
    return items

