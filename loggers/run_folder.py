"""Versioned run folders (``save_dir/name/version_N``) and the hyperparameter file written into them."""
from __future__ import annotations

import os
import re
from typing import Any, Callable, Mapping, Optional, Union

from trainer.loggers.logger import Logger
from trainer.strategies.checkpoint import storage
from trainer.strategies.rank import rank_zero_only

_VERSION = re.compile(r"^version_(\d+)$")


def next_version(root: Union[str, os.PathLike]) -> int:
    """One more than the highest ``version_N`` folder under ``root`` (0 when there is none); ``root`` may be an
    fsspec URL."""
    if storage.is_remote(root):
        names = [storage.name(entry) for entry in storage.listdir(root) if storage.isdir(entry)]
        found = [int(m.group(1)) for m in map(_VERSION.match, names) if m]
        return max(found) + 1 if found else 0
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return 0
    found = [int(m.group(1)) for m in map(_VERSION.match, names) if m and os.path.isdir(os.path.join(root, m.group(0)))]
    return max(found) + 1 if found else 0


def claim_version(root: Union[str, os.PathLike]) -> int:
    """Create the next free ``root/version_N`` and return ``N``. ``mkdir`` is the claim: of two runs started at
    once on the same root, one gets ``version_N`` and the other, finding it made, takes ``N + 1``. On an fsspec URL
    the folder is made without that guarantee (object stores have no exclusive create)."""
    if storage.is_remote(root):
        version = next_version(root)
        storage.makedirs(storage.join(root, f"version_{version}"))
        return version
    os.makedirs(root, exist_ok=True)
    version = next_version(root)
    while True:
        try:
            os.mkdir(os.path.join(root, f"version_{version}"))
            return version
        except FileExistsError:
            version += 1


class RunFolder:
    """Where one logger writes: ``save_dir/name/version`` with the version resolved on first use.

    The version is chosen lazily (first access of :attr:`version`/:attr:`path`), so two Trainers built one
    after the other and fitted in turn get ``version_0`` and ``version_1``; it is fixed before the logger
    is pickled, so spawned ranks use the parent's. Global rank 0 claims the version by creating its folder
    (:func:`claim_version`), so runs started at once on one root never share a folder. Ranks started
    separately (torchrun, srun) take rank 0's version when a stage starts (the Trainer broadcasts it).
    """

    def __init__(self, save_dir: Union[str, os.PathLike], name: Optional[str], version: Union[int, str, None]) -> None:
        self.save_dir = os.fspath(save_dir)
        self.name = name or ""
        self._version = version
        self._siblings: list["RunFolder"] = [self]  # folders of one run's loggers that share the version

    @property
    def root(self) -> str:
        """``save_dir/name`` (``save_dir`` when the name is empty)."""
        return storage.join(self.save_dir, self.name) if self.name else self.save_dir

    @property
    def version(self) -> Union[int, str]:
        """The version given, or the next free ``version_N`` number under :attr:`root`, claimed by creating it."""
        if self._version is None:
            rank = rank_zero_only.rank  # type: ignore[attr-defined]
            version = claim_version(self.root) if rank == 0 else next_version(self.root)
            for folder in self._siblings:
                if folder._version is None:
                    folder._version = version
        return self._version

    @property
    def path(self) -> str:
        """This run's folder: ``root/version_N`` (or ``root/<version>`` for a string version)."""
        version = self.version
        return storage.join(self.root, version if isinstance(version, str) else f"version_{version}")

    def __getstate__(self) -> dict:
        self.version  # noqa: B018 - resolve now: a spawned rank must not pick a different version
        return dict(self.__dict__)

    def create(self) -> str:
        """Make the folder (global rank 0 only) and return its path."""
        path = self.path
        if rank_zero_only.rank == 0:  # type: ignore[attr-defined]
            storage.makedirs(path)
        return path


def planned_log_dir(logger: Logger) -> Optional[str]:
    """The folder ``logger`` will write to, without creating anything (its version, when not chosen yet, is the
    next free number now); None for a logger without a run folder."""
    folder = getattr(logger, "_folder", None)
    if not isinstance(folder, RunFolder):
        return None
    if folder._version is None:
        return storage.join(folder.root, f"version_{next_version(folder.root)}")
    return folder.path


def run_folders(loggers: list[Logger]) -> list[RunFolder]:
    """The :class:`RunFolder` of each logger that has one."""
    return [logger._folder for logger in loggers if isinstance(getattr(logger, "_folder", None), RunFolder)]


def agree_versions(loggers: list[Logger], broadcast: Callable[[Any], Any]) -> None:
    """Every rank takes global rank 0's version of each logger folder (``broadcast``: rank 0's object to all)."""
    for folder in run_folders(loggers):
        folder._version = broadcast(folder.version if rank_zero_only.rank == 0 else None)  # type: ignore[attr-defined]


def share_versions(loggers: list[Logger]) -> None:
    """Loggers of one Trainer writing under the same ``save_dir/name`` without a version get the same
    ``version_N`` (the first to resolve picks it for all), instead of the second seeing the first's folder
    and taking the next number."""
    groups: dict[str, list[RunFolder]] = {}
    for logger in loggers:
        folder = getattr(logger, "_folder", None)
        if isinstance(folder, RunFolder) and folder._version is None:
            key = folder.root if storage.is_remote(folder.root) else os.path.realpath(folder.root)
            groups.setdefault(key, []).append(folder)
    for folders in groups.values():
        for folder in folders:
            folder._siblings = folders


class FolderLogger(Logger):
    """Base of the loggers that write into a :class:`RunFolder`: ``name``, ``version``, ``save_dir`` and
    ``log_dir`` come from it."""

    def __init__(self, save_dir: Union[str, os.PathLike], name: Optional[str], version: Union[int, str, None]) -> None:
        self._folder = RunFolder(save_dir, name, version)

    @property
    def name(self) -> str:
        """Experiment name (the folder under ``save_dir``)."""
        return self._folder.name

    @property
    def version(self) -> Union[int, str]:
        """Run version: the ``N`` of ``version_N``."""
        return self._folder.version

    @property
    def save_dir(self) -> str:
        """Root folder given to the logger."""
        return self._folder.save_dir

    @property
    def log_dir(self) -> str:
        """This run's folder, ``save_dir/name/version_N``."""
        return self._folder.path

    @property
    def root_dir(self) -> str:
        """The folder holding every version of this experiment, ``save_dir/name`` (``save_dir`` without a name),
        as Lightning's."""
        return storage.join(self.save_dir, self.name) if self.name else self.save_dir


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts become ``"outer/inner"`` keys; values stay as given."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_params(value, f"{name}/"))
        else:
            flat[name] = value
    return flat


def plain_value(value: Any) -> Union[bool, int, float, str, None]:
    """A value every backend accepts: numbers, strings, bools and None pass; a one-element tensor becomes a
    number; anything else (lists, dtypes, objects) its ``str``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    numel = getattr(value, "numel", None)
    if callable(numel) and numel() == 1:
        return value.item()
    return str(value)


def save_hparams_yaml(path: str, params: Mapping[str, Any]) -> None:
    """Write ``params`` as YAML (nested dicts kept, other values made plain) to ``path``; rank 0 only."""
    if rank_zero_only.rank != 0:  # type: ignore[attr-defined]
        return
    import yaml  # only when a run records hyperparameters

    def plain(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return plain_value(value)

    from trainer.loggers.log_files import write_text_atomically

    storage.makedirs(storage.parent(path) or ".")
    data = plain(dict(params))
    write_text_atomically(path, lambda fh: yaml.safe_dump(data, fh, sort_keys=False))
