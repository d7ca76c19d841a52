"""Lightning's bar members on our progress bar: ``train_progress_bar``, ``val_progress_bar``, ``test_progress_bar``
and ``predict_progress_bar`` read as tqdm bars do (``n``, ``total``, ``desc``), so callbacks and tests written
against Lightning's TQDMProgressBar run on the rich bar."""
from __future__ import annotations

from typing import Any, Optional


class BarView:
    """One bar as Lightning's tests and callbacks read a tqdm bar: ``n`` (batches done), ``total`` (None when
    unknown), ``desc``, ``leave``, ``disable``."""

    def __init__(self, progress: Any, key: str) -> None:
        self._progress = progress
        self._key = key

    @property
    def n(self) -> int:
        """Batches done in this bar's current run."""
        return self._progress._count(self._key)

    @property
    def total(self) -> Optional[float]:
        """Batches this bar runs to (None when unknown)."""
        return self._progress._opened[self._key][1]

    @property
    def desc(self) -> str:
        """The bar's description."""
        return self._progress._opened[self._key][0]

    @property
    def leave(self) -> bool:
        """Whether the finished bar stays on screen."""
        return self._progress.leave

    @property
    def disable(self) -> bool:
        """Whether the bar is hidden."""
        return self._progress.is_disabled

    def __repr__(self) -> str:
        return f"BarView({self.desc!r}, n={self.n}, total={self.total})"



class BarViews:
    """The four bar members; the bar records what :meth:`_record_open` is told and counts through ``_count``."""

    _opened: dict[str, tuple[str, Optional[float]]]

    def _record_open(self, key: str, description: str, total: Optional[float]) -> None:
        self._opened[key] = (description, total)

    def _count(self, key: str) -> int:
        raise NotImplementedError

    def _view(self, key: str, name: str) -> BarView:
        if key not in self._opened:
            raise TypeError(f"The `{type(self).__name__}._{name}` reference has not been set yet: the bar opens when "
                            "its stage starts (and not at all while the bar is disabled).")  # fmt: skip
        return BarView(self, key)

    @property
    def train_progress_bar(self) -> BarView:
        """The training bar (of the current epoch)."""
        return self._view("train", "train_progress_bar")

    @property
    def val_progress_bar(self) -> BarView:
        """The validation bar."""
        return self._view("val", "val_progress_bar")

    @property
    def test_progress_bar(self) -> BarView:
        """The test bar."""
        return self._view("test", "test_progress_bar")

    @property
    def predict_progress_bar(self) -> BarView:
        """The prediction bar."""
        return self._view("predict", "predict_progress_bar")
