"""Fine-tuning schedules: ``BaseFinetuning`` (freeze layers before training, unfreeze them as epochs go, each
unfrozen part a new optimizer parameter group) and ``BackboneFinetuning`` (a module's ``backbone``), as Lightning
offers them.

The parameter groups added during the fit are saved in checkpoints by parameter name, and re-created on resume
before the optimizer state is loaded into them.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Optional, Union

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim import Optimizer

from trainer.callbacks.callback import Callback
from trainer.strategies.errors import ConfigurationError
from trainer.strategies.rank import rank_zero_info, rank_zero_warn

Modules = Union[nn.Module, Iterable[Any]]


def multiplicative(epoch: int) -> float:
    """The default ``lambda_func`` of :class:`BackboneFinetuning`: the backbone's rate doubles every epoch (as in
    Lightning)."""
    return 2.0


class BaseFinetuning(Callback):
    """Subclass and implement :meth:`freeze_before_training` (called at setup) and :meth:`finetune_function`
    (called at the start of every training epoch, once per optimizer); use the static helpers (``freeze``,
    ``make_trainable``, ``unfreeze_and_add_param_group``) inside them."""

    def __init__(self) -> None:
        self._groups: dict[int, list[dict[str, Any]]] = {}  # optimizer index → its groups, parameters by name
        self._trainer: Any = None
        self._restoring = False  # load_state_dict got saved groups: on_fit_start re-creates them

    # ------------------------------------------------------------------ what subclasses implement
    def freeze_before_training(self, pl_module: Any) -> None:
        """Freeze what should not train at first."""
        raise NotImplementedError(f"{type(self).__name__} must implement freeze_before_training(pl_module).")

    def finetune_function(self, pl_module: Any, epoch: int, optimizer: Optimizer) -> None:
        """Unfreeze (and add to ``optimizer``) what trains from ``epoch`` on."""
        raise NotImplementedError(f"{type(self).__name__} must implement finetune_function(pl_module, epoch, optimizer).")

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def flatten_modules(modules: Modules) -> list[nn.Module]:
        """The leaf modules (and modules with parameters of their own) of a module or nested iterable of them."""
        if isinstance(modules, nn.ModuleDict):
            modules = modules.values()
        if isinstance(modules, Iterable) and not isinstance(modules, nn.Module):
            found: list[nn.Module] = []
            for module in modules:
                found.extend(BaseFinetuning.flatten_modules(module))
            return found
        return [m for m in modules.modules() if not list(m.children()) or m._parameters]

    @staticmethod
    def filter_params(modules: Modules, train_bn: bool = True, requires_grad: bool = True) -> Iterator[nn.Parameter]:
        """The parameters of ``modules`` whose ``requires_grad`` is ``requires_grad`` (BatchNorm's skipped unless
        ``train_bn``)."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and not train_bn:
                continue
            for param in module.parameters(recurse=False):
                if param.requires_grad == requires_grad:
                    yield param

    @staticmethod
    def make_trainable(modules: Modules) -> None:
        """Let every parameter of ``modules`` train (and BatchNorm layers track statistics again)."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm):
                module.track_running_stats = True
            for param in module.parameters(recurse=False):
                param.requires_grad = True

    @staticmethod
    def freeze_module(module: nn.Module) -> None:
        """Freeze one module's own parameters (a BatchNorm also stops tracking statistics)."""
        if isinstance(module, _BatchNorm):
            module.track_running_stats = False
        for param in module.parameters(recurse=False):
            param.requires_grad = False

    @staticmethod
    def freeze(modules: Modules, train_bn: bool = True) -> None:
        """Freeze ``modules``; their BatchNorm layers keep training when ``train_bn``."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and train_bn:
                BaseFinetuning.make_trainable(module)
            else:
                BaseFinetuning.freeze_module(module)

    @staticmethod
    def filter_on_optimizer(optimizer: Optimizer, params: Iterable[nn.Parameter]) -> list[nn.Parameter]:
        """``params`` that are in none of ``optimizer``'s groups yet (the others skipped, with a warning)."""
        present = {id(p) for group in optimizer.param_groups for p in group["params"]}
        params = list(params)
        fresh = [p for p in params if id(p) not in present]
        if len(fresh) != len(params):
            rank_zero_warn(
                f"The provided params to be frozen already exist within another group of this optimizer: "
                f"{len(params) - len(fresh)} of the parameters to unfreeze are skipped. Did you init your optimizer "
                "in `configure_optimizers` from the trainable ones only: "
                f"{type(optimizer).__name__}(filter(lambda p: p.requires_grad, self.parameters()), ...)?"
            )
        return fresh

    @staticmethod
    def unfreeze_and_add_param_group(modules: Modules, optimizer: Optimizer, lr: Optional[float] = None,
                                     initial_denom_lr: float = 10.0, train_bn: bool = True) -> None:  # fmt: skip
        """Unfreeze ``modules`` and add their parameters to ``optimizer`` as a new group, at ``lr`` (default: the
        first group's rate divided by ``initial_denom_lr``)."""
        BaseFinetuning.make_trainable(modules)
        group_lr = optimizer.param_groups[0]["lr"] / initial_denom_lr if lr is None else float(lr)
        params = BaseFinetuning.filter_on_optimizer(optimizer, BaseFinetuning.filter_params(modules, train_bn, True))
        if params:
            optimizer.add_param_group({"params": params, "lr": group_lr})

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._trainer = trainer
        self.freeze_before_training(pl_module)
        if trainer.strategy.strategy_name == "deepspeed":  # Lightning's type and words
            raise NotImplementedError(f"The Finetuning callback does not support running with the DeepSpeed strategy "
                                      f"({type(self).__name__}): DeepSpeed builds its optimizer once, so parameter "
                                      "groups cannot be added during the fit. Choose a different strategy or disable "
                                      "the callback.")  # fmt: skip

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        for index, optimizer in enumerate(trainer.optimizers):
            before = len(optimizer.param_groups)
            self.finetune_function(pl_module, trainer.current_epoch, optimizer)
            self._remember_groups(pl_module, index, optimizer, before)

    def _remember_groups(self, pl_module: Any, index: int, optimizer: Optimizer, before: int) -> None:
        """As Lightning keeps them: every group at the first epoch, then only the groups added since, each with
        the hyperparameters it had when it was added (the optimizer's own state holds the current ones)."""
        known = self._groups.get(index)
        if known is not None and before == len(optimizer.param_groups):
            return
        added = optimizer.param_groups if known is None else optimizer.param_groups[before:]
        names = {param: name for name, param in pl_module.named_parameters()}
        groups = [{**{k: v for k, v in group.items() if k != "params"}, "params": [names[p] for p in group["params"]]}
                  for group in added]  # fmt: skip
        self._groups.setdefault(index, []).extend(groups)

    def state_dict(self) -> dict[str, Any]:
        """The optimizers' parameter groups (parameters by name), so a resumed fit has the groups it had."""
        return {"internal_optimizer_metadata": self._groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the saved parameter groups; :meth:`on_fit_start` re-creates them (on resume the optimizers are
        built after this call and their saved state is loaded after ``on_fit_start``, as in Lightning)."""
        self._groups = {int(k): v for k, v in state_dict.get("internal_optimizer_metadata", {}).items()}
        self._restoring = bool(self._groups)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """On resume: give the optimizers back the parameter groups the saved optimizer state has."""
        if not self._restoring:
            return
        self._restoring = False
        params = dict(trainer.module.named_parameters())
        for index, optimizer in enumerate(trainer.optimizers):
            saved = self._groups.get(index)
            if saved is None or len(saved) == len(optimizer.param_groups):
                continue
            for group in saved[len(optimizer.param_groups):]:
                self.make_trainable_params([params[name] for name in group["params"]])
                optimizer.add_param_group({**group, "params": [params[name] for name in group["params"]]})

    @staticmethod
    def make_trainable_params(params: list[nn.Parameter]) -> None:
        """Let ``params`` train (a resumed fit's unfrozen groups)."""
        for param in params:
            param.requires_grad = True


class BackboneFinetuning(BaseFinetuning):
    """Train with the module's ``backbone`` frozen until ``unfreeze_backbone_at_epoch``, then add it to the
    optimizer at ``backbone_initial_lr`` (default: ``backbone_initial_ratio_lr`` times the current rate) and raise its
    rate by ``lambda_func(epoch + 1)`` each epoch, never above the rest's (``should_align``)."""

    def __init__(
        self,
        unfreeze_backbone_at_epoch: int = 10,
        lambda_func: Callable[[int], float] = multiplicative,
        backbone_initial_ratio_lr: float = 10e-2,
        backbone_initial_lr: Optional[float] = None,
        should_align: bool = True,
        initial_denom_lr: float = 10.0,
        train_bn: bool = True,
        verbose: bool = False,
        rounding: int = 12,
    ) -> None:
        super().__init__()
        self.unfreeze_backbone_at_epoch = unfreeze_backbone_at_epoch
        self.lambda_func = lambda_func
        self.backbone_initial_ratio_lr = backbone_initial_ratio_lr
        self.backbone_initial_lr = backbone_initial_lr
        self.should_align = should_align
        self.initial_denom_lr = initial_denom_lr
        self.train_bn = train_bn
        self.verbose = verbose
        self.rounding = rounding
        self.previous_backbone_lr: Optional[float] = None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "previous_backbone_lr": self.previous_backbone_lr}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.previous_backbone_lr = state_dict.get("previous_backbone_lr")
        super().load_state_dict(state_dict)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if not isinstance(getattr(pl_module, "backbone", None), nn.Module):
            raise ConfigurationError("BackboneFinetuning needs the module's layers to fine-tune in a `self.backbone` "
                                     "nn.Module attribute; set one, or subclass BaseFinetuning.")  # fmt: skip
        super().setup(trainer, pl_module, stage)

    def freeze_before_training(self, pl_module: Any) -> None:
        # As in Lightning, the backbone's BatchNorm layers stay trainable whatever ``train_bn`` says: it only decides
        # whether their parameters join the backbone's group when it is unfrozen.
        self.freeze(pl_module.backbone)

    def finetune_function(self, pl_module: Any, epoch: int, optimizer: Optimizer) -> None:
        current_lr = optimizer.param_groups[0]["lr"]
        if epoch == self.unfreeze_backbone_at_epoch:
            backbone_lr = (self.backbone_initial_lr if self.backbone_initial_lr is not None
                           else current_lr * self.backbone_initial_ratio_lr)  # fmt: skip
            self.unfreeze_and_add_param_group(pl_module.backbone, optimizer, backbone_lr,
                                              initial_denom_lr=self.initial_denom_lr, train_bn=self.train_bn)  # fmt: skip
        elif epoch > self.unfreeze_backbone_at_epoch and self.previous_backbone_lr is not None:
            backbone_lr = self.lambda_func(epoch + 1) * self.previous_backbone_lr
            if self.should_align and backbone_lr > current_lr:
                backbone_lr = current_lr
            optimizer.param_groups[-1]["lr"] = backbone_lr
        else:
            return
        self.previous_backbone_lr = backbone_lr
        if self.verbose:
            rank_zero_info("Current lr: %s, Backbone lr: %s", round(current_lr, self.rounding),
                           round(backbone_lr, self.rounding))  # fmt: skip
