"""What ``Engine.prepare`` hands back besides the module: optimizers and LR schedulers that follow the
accumulation window, dataloaders that yield this rank's batches on its device from the exact position a
``load_state`` left, and the hooks that run a prepared module's forward in the precision's context.

The per-batch cost is what a hand-written loop pays: an attribute read in ``step``/``zero_grad``, and in
the dataloader one counter and one flag per batch.
"""
from __future__ import annotations

import contextlib
import itertools
import math
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

import torch
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import DistributedSampler

from trainer.data.loaders import loader_length
from trainer.strategies.errors import ConfigurationError
from trainer.checkpoint.data_position import TrainDataPosition, loader_generators
from trainer.reproducibility.seed import restore_rng_state

if TYPE_CHECKING:  # pragma: no cover
    from trainer.strategies.precision import Precision
    from trainer.strategies.strategy import Strategy

_END = object()


def _nothing() -> None:
    pass


class AccumulationWindow:
    """Which micro-batches end an accumulation window: every ``size``-th call of :meth:`advance`, and the last
    batch of a prepared training dataloader (so a partial window at an epoch's end still steps, as in the
    Trainer). ``sync`` is the answer for the current micro-batch."""

    __slots__ = ("size", "position", "sync", "end_of_data")

    def __init__(self, size: int) -> None:
        self.size = size
        self.position = 0  # micro-batches into the current window
        self.sync = True
        self.end_of_data = False  # set by the dataloader for the batch it just yielded

    def advance(self) -> bool:
        """Count one micro-batch; True when it ends its window (its gradients are synchronised and stepped)."""
        position = self.position + 1
        if position >= self.size or self.end_of_data:
            position = 0
        self.position = position
        self.sync = position == 0
        return self.sync


class LoaderState:
    """What the prepared dataloaders tell the Engine about the batch just yielded: on a last batch evened out
    by the distributed sampler, how many ranks' batches end with a repeated sample (0 otherwise); under
    Accelerate's split, on a last batch, how many of the gathered samples are the dataset's (``remainder``, 0
    otherwise)."""

    __slots__ = ("padded_ranks", "remainder")

    def __init__(self) -> None:
        self.padded_ranks = 0
        self.remainder = 0


def dealt_remainder(loader: Any) -> int:
    """Accelerate's ``remainder`` of a loader: the dataset's length modulo the samples all processes read per
    step (0 when they divide, the loader drops its last batch, or its length is unknown)."""
    from trainer.data.batch_shard import total_batch_size

    step = total_batch_size(loader)
    if not step or getattr(loader, "drop_last", False):
        return 0
    try:
        return len(loader.dataset) % step
    except TypeError:
        return 0


def padded_ranks(loader: Any) -> int:
    """How many ranks' last batch ends with a sample a ``DistributedSampler`` repeated to give every rank
    equally many. The repeats fill the padded tail of the index list, which the sampler deals out one per
    rank to the highest ranks, so each of those ranks has exactly one, as its very last sample."""
    sampler = getattr(loader, "sampler", None)
    if not isinstance(sampler, DistributedSampler) or sampler.drop_last:
        return 0
    padding = sampler.total_size - len(sampler.dataset)
    batch_size = getattr(loader, "batch_size", None)
    if padding <= 0 or (loader.drop_last and batch_size and sampler.num_samples % batch_size):
        return 0  # nothing repeated, or the partial last batch holding the repeat is dropped
    return padding


class EngineOptimizer(Optimizer):
    """A prepared optimizer. ``step()`` runs the strategy's step (16-mixed: unscale once → step, or skip on
    inf/nan → scaler update); inside an accumulation window ``step()`` and ``zero_grad()`` do nothing.

    ``step_was_skipped`` tells whether the last step was skipped by the gradient scaler. Everything else
    (``param_groups``, ``state``, ``state_dict``...) is the wrapped ``optimizer``'s.
    """

    def __init__(self, optimizer: Optimizer, strategy: "Strategy", window: AccumulationWindow) -> None:
        # No Optimizer.__init__: this object only forwards to ``optimizer``; subclassing lets torch's LR
        # schedulers (which check isinstance) be built on it.
        self.optimizer = optimizer
        self._strategy = strategy
        self._window = window
        self.step_was_skipped = False

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @state.setter
    def state(self, value: Any) -> None:
        self.optimizer.state = value

    @property
    def param_groups(self) -> list[dict[str, Any]]:  # type: ignore[override]
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def train(self) -> None:
        """Put the wrapped optimizer in training mode, for optimizers that have one (schedule-free ones)."""
        if callable(getattr(self.optimizer, "train", None)):
            self.optimizer.train()

    def eval(self) -> None:
        """Put the wrapped optimizer in evaluation mode, for optimizers that have one (schedule-free ones)."""
        if callable(getattr(self.optimizer, "eval", None)):
            self.optimizer.eval()

    def step(self, closure: Optional[Callable[[], Any]] = None) -> None:  # type: ignore[override]
        """Step through the strategy at the end of an accumulation window; a no-op inside one."""
        if not self._window.sync:
            return
        self.step_was_skipped = not self._strategy.optimizer_step(self.optimizer, _nothing, closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients at the end of an accumulation window; a no-op inside one."""
        if self._window.sync:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group to the wrapped optimizer."""
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the wrapped optimizer's state dict."""
        self.optimizer.load_state_dict(state_dict)

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)  # Optimizer.__getstate__ would read attributes this wrapper does not have

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"EngineOptimizer({self.optimizer!r})"


class EngineScheduler:
    """A prepared LR scheduler: ``step()`` runs only when its optimizer stepped, i.e. at the end of an
    accumulation window and not after a step the gradient scaler skipped. ``steps`` scheduler steps per optimizer
    step: 1 as in the Trainer, the process count under Accelerate's numbers (a schedule written for one process
    then ends on time with each process reading its own batches). ``with_optimizer=False``: every ``step()``
    steps, whatever the optimizer did."""

    def __init__(self, scheduler: Any, optimizer: Optional[EngineOptimizer], window: AccumulationWindow,
                 steps: int = 1, with_optimizer: bool = True) -> None:  # fmt: skip
        self.scheduler = scheduler
        self._optimizer = optimizer
        self._window = window
        self._steps = steps
        self._with_optimizer = with_optimizer

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Step the wrapped scheduler if its optimizer has just stepped."""
        if not self._with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self._window.sync or (self._optimizer is not None and self._optimizer.step_was_skipped):
            return
        if self._steps == 1:
            self.scheduler.step(*args, **kwargs)
            return
        scheduler = self.scheduler
        total = getattr(scheduler, "total_steps", None)  # OneCycleLR raises when stepped past its end
        for _ in range(self._steps):
            if total is None or scheduler._step_count <= total:
                scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        """The learning rates the wrapped scheduler set last."""
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        """The wrapped scheduler's state dict."""
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the wrapped scheduler's state dict."""
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.scheduler, name)

    def __repr__(self) -> str:
        return f"EngineScheduler({self.scheduler!r})"


class EngineDataLoader:
    """A prepared dataloader: this rank's share of the data (split as the Trainer splits it), each batch moved
    to the device and converted for the precision. Every ``iter()`` is one epoch; the sampler's ``set_epoch``
    is called for it (so a shuffled loader reshuffles), and after ``Engine.load_state`` the next epoch resumes
    at the batch where the saved run stood, without loading the batches before it.

    A training loader (``prepare``'s default) also tells the accumulation window when it yields its last batch.
    ``epoch`` counts finished passes; ``batch_in_epoch`` the batches yielded in the current one.
    """

    def __init__(self, loader: Any, strategy: "Strategy", window: Optional[AccumulationWindow],
                 state: Optional[LoaderState] = None, accelerate_numbers: bool = False,
                 sample_seeds: bool = True) -> None:  # fmt: skip
        self.loader = loader
        self._strategy = strategy
        self._window = window
        self._state = state if state is not None else LoaderState()
        self._padded_ranks = 0 if accelerate_numbers else padded_ranks(loader)
        self._remainder = dealt_remainder(loader) if accelerate_numbers else 0
        # A shuffled loader split across processes: its generator's state comes from rank 0 each epoch, so every
        # process draws the same order even without a common seed (as Accelerate synchronizes it).
        sampler = getattr(getattr(loader, "batch_sampler", None), "sampler", None)
        shared = getattr(sampler, "generator", None) if accelerate_numbers and strategy.world_size > 1 else None
        self._shared_generator = shared if isinstance(shared, torch.Generator) else None
        self.epoch = 0
        self.batch_in_epoch = 0
        self._position = TrainDataPosition(sample_seeds)
        self._resume: Optional[dict[str, Any]] = None

    @property
    def training(self) -> bool:
        """True for a training loader (it ends accumulation windows and is saved by ``save_state``)."""
        return self._window is not None

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def resuming(self) -> bool:
        """True when ``load_state`` positioned this loader and its next pass continues mid-epoch."""
        return self._resume is not None and bool(self._resume["batch_in_epoch"])

    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` epoch ``epoch`` (the sampler's shuffle order follows it)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        return self._pass()

    def _pass(self, skip: int = 0) -> Iterator[Any]:
        """One epoch; ``skip``: entered that many batches in (``skip_first_batches``), nothing read for them."""
        resume, self._resume = self._resume, None
        if resume is not None and resume["epoch"] == self.epoch and resume["batch_in_epoch"] >= loader_length(self.loader):
            # Saved at the epoch's last batch, before the loop left it: finish that epoch's index draws (no batch is
            # loaded) and start the next one, as the uninterrupted run's next pass does.
            for _ in self._position.iterator(self.loader, self.epoch, resume["batch_in_epoch"], resume["position"]):
                pass
            restore_rng_state(resume["rng"])
            self.epoch += 1
            resume = None
        if resume is not None and resume["epoch"] == self.epoch and not resume["batch_in_epoch"]:
            # Saved between epochs: the loader's generators continue where the finished epochs left them (a
            # shuffled sampler's generator has drawn their orders), not where prepare() seeded them.
            for generator, state in zip(loader_generators(self.loader), resume.get("generators", ())):
                generator.set_state(state)
        if self._shared_generator is not None:
            self._shared_generator.set_state(self._strategy.broadcast(self._shared_generator.get_state(), 0))
        if resume is not None and resume["epoch"] == self.epoch and resume["batch_in_epoch"]:
            skip = resume["batch_in_epoch"]
            iterator = self._position.iterator(self.loader, self.epoch, skip, resume["position"])
            restore_rng_state(resume["rng"])  # positioning replayed the sampler's draws; continue the saved stream
        else:
            iterator = self._position.iterator(self.loader, self.epoch, skip)
        self.batch_in_epoch = skip
        return self._batches(iterator, skip)

    def _batches(self, iterator: Iterator[Any], index: int) -> Iterator[Any]:
        to_device = self._strategy.batch_to_device
        window = self._window
        total = loader_length(self.loader)
        padded, remainder, state = self._padded_ranks, self._remainder, self._state
        if not math.isinf(total):
            for batch in iterator:
                index += 1
                self.batch_in_epoch = index
                if window is not None:
                    window.end_of_data = index >= total
                if padded:
                    state.padded_ranks = padded if index >= total else 0
                if remainder:
                    state.remainder = remainder if index >= total else 0
                yield to_device(batch)
            state.padded_ranks = state.remainder = 0
        else:  # no length: look one batch ahead to know which is the last
            batch = next(iterator, _END)
            while batch is not _END:
                following = next(iterator, _END)
                index += 1
                self.batch_in_epoch = index
                if window is not None:
                    window.end_of_data = following is _END
                yield to_device(batch)
                batch = following
        if window is not None:
            window.end_of_data = False
        self.epoch += 1
        self.batch_in_epoch = 0

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands: epoch, batches yielded in it, and the random state its order came from."""
        position = self._position.state_dict(consumed=self.batch_in_epoch)
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch, "position": position,
                "generators": [generator.get_state() for generator in loader_generators(self.loader)]}

    def load_state_dict(self, state: dict[str, Any], rng: dict[str, Any]) -> None:
        """Continue at ``state`` on the next ``iter()``; ``rng`` is put back once the position is reached."""
        self.epoch = state["epoch"]
        self.batch_in_epoch = state["batch_in_epoch"]
        self._position.adopt(state.get("position"))  # the saved run's per-sample seeds
        self._resume = {**state, "rng": rng}

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)  # dataset, batch_size, sampler, ...

    def __repr__(self) -> str:
        return f"EngineDataLoader({self.loader!r}, epoch={self.epoch}, batch_in_epoch={self.batch_in_epoch})"


class _Skipped:
    """A dataloader whose passes start ``skip`` batches in: a prepared one is entered at that batch (its sampler
    positioned, nothing read for the skipped batches); any other iterable reads and drops them."""

    def __init__(self, loader: Any, skip: int) -> None:
        self.loader = loader
        self.skip = skip

    def __iter__(self) -> Iterator[Any]:
        if isinstance(self.loader, EngineDataLoader):
            return self.loader._pass(self.skip)
        return itertools.islice(iter(self.loader), self.skip, None)

    def __len__(self) -> int:
        return max(0, len(self.loader) - self.skip)

    def __getattr__(self, name: str) -> Any:
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)


def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
    """``dataloader`` starting ``num_batches`` batches in. A prepared dataloader that ``load_state`` has just
    positioned already continues at the saved batch, so it is returned as it is (skipping again would lose
    batches)."""
    if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 0:
        raise ConfigurationError(f"skip_first_batches(num_batches={num_batches!r}) must be an int >= 0.")
    if num_batches == 0 or getattr(dataloader, "resuming", False):
        return dataloader
    return _Skipped(dataloader, num_batches)


class AutocastForward:
    """Forward hooks on a prepared module: its forward runs in the precision's forward context (autocast), and
    its output goes through ``precision.convert_output`` (float16/bfloat16 → float32), so a loss computed on
    it afterwards equals the one a ``training_step`` computes inside autocast. Installed only for precisions
    that have a forward context."""

    def __init__(self, precision: "Precision") -> None:
        self.precision = precision
        self._open: list[Any] = []  # entered contexts, innermost last (a module may run inside itself)

    @staticmethod
    def needed(precision: "Precision") -> bool:
        """True when the precision changes how a forward computes."""
        return not isinstance(precision.forward_context(), contextlib.nullcontext)

    def attach(self, module: nn.Module) -> list[Any]:
        """Install the hooks on ``module``; returns their handles (``handle.remove()`` takes them off)."""
        return [module.register_forward_pre_hook(self._enter),
                module.register_forward_hook(self._exit, always_call=True)]  # fmt: skip

    def _enter(self, module: nn.Module, args: Any) -> None:
        context = self.precision.forward_context()
        context.__enter__()
        self._open.append(context)

    def _exit(self, module: nn.Module, args: Any, output: Any) -> Any:
        self._open.pop().__exit__(None, None, None)
        return self.precision.convert_output(output)
