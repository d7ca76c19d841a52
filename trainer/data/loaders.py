"""Dataloaders: where they come from, how many batches each stage runs, how they are split across ranks."""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Union

from torch import Tensor
from torch.utils.data import DataLoader

from trainer.strategies.errors import ConfigurationError

Number = Union[int, float]


def as_loader_list(loaders: Any) -> list[Any]:
    """Evaluation stages accept one dataloader, a list/tuple or dict of them (run one after the other, as
    ``dataloader_idx`` 0, 1, ...), or a ``CombinedLoader``: in ``sequential`` mode its loaders one after the
    other, in another mode the CombinedLoader itself as one loader (each step gets one batch of every loader,
    as in Lightning)."""
    from trainer.data.combined_loader import CombinedLoader

    if loaders is None:
        return []
    if isinstance(loaders, CombinedLoader):
        return loaders.flattened if loaders.mode == "sequential" else [loaders]
    if isinstance(loaders, Mapping):
        return list(loaders.values())
    if isinstance(loaders, (list, tuple)):
        return list(loaders)
    return [loaders]


def in_given_shape(loaders: list[Any], given: Any) -> Any:
    """The prepared ``loaders`` (from :func:`as_loader_list`) in the shape they were ``given``, as Lightning's
    ``val_dataloaders``/``test_dataloaders``/``predict_dataloaders`` give them back: one loader, a list, a dict,
    or a CombinedLoader's ``iterables``; ``None`` when there are none."""
    from trainer.data.combined_loader import CombinedLoader

    if not loaders:
        return None
    if isinstance(given, CombinedLoader):
        combined = given.with_loaders(loaders) if given.mode == "sequential" else loaders[0]
        return combined.iterables
    if isinstance(given, Mapping):
        return dict(zip(given, loaders))
    if isinstance(given, (list, tuple)):
        return list(loaders)
    return loaders[0]


def as_training_loader(loader: Any) -> Any:
    """Training data as the loop iterates it: a list/tuple holding DataLoaders, or a dict of them, becomes a
    ``CombinedLoader`` in ``max_size_cycle`` mode (Lightning's default), so each step gets one batch of each."""
    from trainer.data.combined_loader import CombinedLoader

    if isinstance(loader, Mapping):
        return CombinedLoader(loader, "max_size_cycle")
    if isinstance(loader, (list, tuple)) and any(isinstance(item, (DataLoader, CombinedLoader)) for item in loader):
        return CombinedLoader(loader, "max_size_cycle")
    return loader


def loader_from(explicit: Any, datamodule: Any, module: Any, source: str) -> Any:
    """The loader(s) passed explicitly, else ``datamodule.<source>()``, else ``module.<source>()`` (an owner whose
    ``<source>`` was set to ``None``, Lightning's way to switch a stage's data off, has none)."""
    if explicit is not None:
        return explicit
    owner = datamodule if datamodule is not None else module
    method = getattr(owner, source, None)
    return method() if method is not None else None  # ``model.val_dataloader = None`` switches it off


def source_defined(explicit: Any, datamodule: Any, module: Any, source: str) -> bool:
    """Whether :func:`loader_from` has somewhere to ask, without asking: loaders passed, or ``<source>``
    implemented by the datamodule (when there is one) or else the module."""
    if explicit is not None:
        return True
    from trainer.module.datamodule import DataModule
    from trainer.module.overrides import overrides
    from trainer.module.train_module import TrainModule

    owner, base = (datamodule, DataModule) if datamodule is not None else (module, TrainModule)
    return overrides(owner, base, source) and getattr(owner, source, None) is not None


def prepare_data(strategy: Any, module: Any, datamodule: Any) -> None:
    """The datamodule's and the module's ``prepare_data``: on local rank 0 of every node, or on global rank 0 only
    where ``prepare_data_per_node = False``; then every rank waits for them."""
    from trainer.module.overrides import overrides
    from trainer.module.train_module import TrainModule

    preparing = [datamodule] if datamodule is not None else []
    if overrides(module, TrainModule, "prepare_data"):
        preparing.append(module)
    for owner in preparing:
        if (strategy.local_rank if getattr(owner, "prepare_data_per_node", True) else strategy.global_rank) == 0:
            owner.prepare_data()
    if preparing:
        strategy.barrier("prepare_data")


def fit_train_loader(explicit: Any, datamodule: Any, module: Any) -> Any:
    """The training loader(s) for ``fit``: as :func:`loader_from`, but having none is an error."""
    loader = loader_from(explicit, datamodule, module, "train_dataloader")
    if loader is None:
        raise ConfigurationError(
            "fit() has no training data: pass train_dataloaders=..., a datamodule with train_dataloader(), "
            "or implement train_dataloader() on the module."
        )
    return loader


def check_iterable(loader: Any, argument: str) -> None:
    """Raise a clear error when something that cannot yield batches is passed as data (iterating a tensor yields
    rows and a string characters: never what was meant)."""
    from trainer.data.combined_loader import is_loader_like

    if not is_loader_like(loader):
        hint = " Wrap tensors in a TensorDataset and a DataLoader." if isinstance(loader, Tensor) else ""
        hint = hint or (" Wrap a Dataset in a DataLoader." if hasattr(loader, "__getitem__") else "")
        raise ConfigurationError(
            f"{argument} must be a torch DataLoader (or any iterable of batches, or a list/dict of DataLoaders); got "
            f"{type(loader).__name__}.{hint}"
        )


def ready_loader(loader: Any, argument: str, training: bool, sampler_kwargs: Optional[dict[str, int]],
                 use_distributed_sampler: bool, overfit: Number = 0, pin_memory: bool = False) -> Any:  # fmt: skip
    """Check ``loader`` and make it ready for this process (every loader of a ``CombinedLoader``): split across
    ranks by a distributed sampler; for training with ``overfit_batches``, read in order; on CUDA
    (``pin_memory``) in page-locked memory."""
    from trainer.data.combined_loader import CombinedLoader

    if isinstance(loader, CombinedLoader):
        return loader.with_loaders([ready_loader(child, argument, training, sampler_kwargs, use_distributed_sampler,
                                                 overfit, pin_memory) for child in loader.flattened])  # fmt: skip
    check_iterable(loader, argument)
    if overfit:
        from trainer.data.distributed import without_shuffle

        loader = without_shuffle(loader, "train" if training else "val")
    return prepare_loader(loader, sampler_kwargs, training, use_distributed_sampler, pin_memory)


def loader_length(loader: Any) -> float:
    """``len(loader)``, or ``inf`` for iterables without a length (e.g. an IterableDataset)."""
    try:
        return len(loader)
    except (TypeError, NotImplementedError):
        return math.inf


def validate_limit(name: str, limit: Optional[Number]) -> Optional[Number]:
    """``limit_*_batches``: None, an int >= 0 (batches) or a float in [0, 1] (fraction); returns it normalised.

    As in Lightning, a whole float above 1 (``1e50``, ``2.0``) counts batches: it becomes an int."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, (int, float)):
        raise ConfigurationError(f"{name}={limit!r} must be an int (number of batches) or a float in [0.0, 1.0].")
    if isinstance(limit, float) and limit > 1.0 and math.isfinite(limit) and limit.is_integer():
        return int(limit)
    if isinstance(limit, float) and not 0.0 <= limit <= 1.0:
        raise ConfigurationError(
            f"{name}={limit} is a fraction outside [0.0, 1.0] (you have passed invalid value {limit} for {name}). Use "
            "a float in [0.0, 1.0] for a fraction of the dataloader or an int for a number of batches."
        )
    if isinstance(limit, int) and limit < 0:
        raise ConfigurationError(f"{name}={limit} must be >= 0.")
    return limit


def limited_batches(loader: Any, limit: Optional[Number], name: str) -> float:
    """How many batches of ``loader`` a stage runs under ``limit_*_batches`` (``inf`` when unbounded)."""
    length = loader_length(loader)
    if limit is None or (isinstance(limit, float) and limit == 1.0):
        return length
    if isinstance(limit, int):
        return min(limit, length)
    if math.isinf(length):
        if limit == 0.0:
            return 0
        raise ConfigurationError(
            f"{name}={limit} is a fraction, but the dataloader has no length (an `IterableDataset`): `Trainer({name})` "
            f"must be `1.0` or an int (a number of batches), e.g. {name}=100."
        )
    batches = int(length * limit)
    if batches == 0 and limit > 0 and length > 0:
        raise ConfigurationError(
            f"{name}={limit} of a dataloader with {length} batches is less than one batch. "
            f"Use a larger fraction or an int, e.g. {name}=1."
        )
    return batches


def prepare_loader(loader: Any, sampler_kwargs: Optional[dict[str, int]], training: bool, enabled: bool,
                   pin_memory: bool = False) -> Any:  # fmt: skip
    """Return ``loader`` ready for this process: split across ranks when the strategy is distributed.

    With one process (``sampler_kwargs is None``) or ``use_distributed_sampler=False`` the loader is
    returned untouched, except that ``pin_memory=True`` (training on CUDA) turns on a DataLoader's
    ``pin_memory``, so batches come in page-locked memory and copy to the GPU without blocking the host.
    """
    if pin_memory and isinstance(loader, DataLoader) and not loader.pin_memory:
        loader.pin_memory = True
    if not enabled or sampler_kwargs is None or not isinstance(loader, DataLoader):
        return loader
    from trainer.data.distributed import distribute_loader

    return distribute_loader(loader, sampler_kwargs, training)
