"""``TrainerCLI``: a script's command line from its module and datamodule classes, as Lightning's ``LightningCLI``.

```python
# train.py
from trainer import TrainerCLI
TrainerCLI(MyModel, MyData)
```
```
python train.py fit --config config.yaml --trainer.max_epochs=10 --model.lr=0.01
python train.py test --config config.yaml --ckpt_path=best
python train.py fit --print_config > config.yaml      # every setting with its default
```

The config is the experiment file of :mod:`trainer.config.yaml_config` (its ``trainer:``/``model:``/``data:`` sections and
launch settings; ``trainer run --config`` reads the same file) plus the CLI's own keys: ``seed_everything``, the
subcommand's arguments (``ckpt_path``, ``verbose``, ``return_predictions``), and ``optimizer``/``lr_scheduler``
(``class_path`` entries that replace ``configure_optimizers``). Later ``--config`` files and arguments override
earlier ones, in command-line order. Values are read as YAML (``3``, ``0.1``, ``[0, 1]``, ``null``) and checked
against the parameter's type hint; unknown keys are errors naming the closest valid key. ``fit`` saves the full
config as ``config.yaml`` in the run's log folder (``save_config_kwargs={"overwrite": True}`` to replace one).

Built on :mod:`trainer.config.yaml_config` rather than jsonargparse: one file format for the CLI, ``Trainer.from_config``
and ``trainer run``, and no dependency; jsonargparse-only features (``parser.link_arguments``, ``--*.help``, append
syntax ``+=``) are not offered.
"""
from __future__ import annotations

import copy
import difflib
import inspect
import os
import random
import sys
import typing
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from trainer.callbacks.callback import Callback
from trainer.strategies.errors import ConfigurationError
from trainer.config.value_types import fits as _matches, hint_name as _hint_name

SUBCOMMANDS = ("fit", "validate", "test", "predict")
_DATA_ARGUMENTS = {"model", "train_dataloaders", "val_dataloaders", "dataloaders", "datamodule"}
_SECTIONS = ("trainer", "model", "data")
_OPTIMIZER_KEYS = ("optimizer", "lr_scheduler")


class CLIError(ConfigurationError):
    """A command line or config the CLI cannot use; printed as ``error: ...`` with exit status 2."""


# ---------------------------------------------------------------------------------------------- signatures
def _init_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """``cls.__init__``'s named parameters (``self``, ``*args`` and ``**kwargs`` left out)."""
    signature = inspect.signature(cls.__init__)
    return {name: p for name, p in signature.parameters.items()
            if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}  # fmt: skip


def _takes_any_keyword(cls: type) -> bool:
    return any(p.kind is p.VAR_KEYWORD for p in inspect.signature(cls.__init__).parameters.values())


def _hints(cls: type) -> dict[str, Any]:
    try:  # unwrapped: a decorated __init__ (the Trainer's) resolves its hints in its own module
        return typing.get_type_hints(inspect.unwrap(cls.__init__))
    except Exception:  # noqa: BLE001 - unresolvable forward references: no type checks
        return {}


def _plain(value: Any, where: str) -> Any:
    """A default as YAML can write it."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v, where) for k, v in value.items()}
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise CLIError(f"{where}: the default {value!r} cannot be written to a config file; give it a plain default.")


def _defaults(cls: type, where: str, skip: frozenset = frozenset()) -> dict[str, Any]:
    out = {}
    for name, parameter in _init_parameters(cls).items():
        if name in skip:
            continue
        default = parameter.default
        if default is inspect.Parameter.empty:
            out[name] = None  # required: must be set in a config or on the command line
        else:
            try:
                out[name] = _plain(default, f"{where}.{name}")
            except CLIError:
                continue  # not configurable from a file: keeps the code's default
    return out


def _import_class(path: str, where: str, default_package: Optional[str] = None) -> type:
    from trainer.config.class_path import import_class_path

    module_name, _, name = str(path).rpartition(".")
    candidates = [str(path)] if module_name else []
    if default_package is not None:
        candidates.append(f"{default_package}.{name}")
    for candidate in candidates:
        try:
            return import_class_path(candidate)
        except (ImportError, AttributeError, ValueError):
            continue
    raise CLIError(f"{where}: class_path '{path}' cannot be imported. Use 'package.module.ClassName'.")


# ---------------------------------------------------------------------------------------------- the config
def _set_dotted(config: dict[str, Any], dotted: str, value: Any, subclass_sections: set[str]) -> None:
    """``config["model"]["lr"] = value`` for ``model.lr`` (into ``init_args`` for a ``class_path`` section)."""
    parts = dotted.split(".")
    section = parts[0]
    if section in subclass_sections and len(parts) == 1 and isinstance(value, str):
        config[section] = {"class_path": value, "init_args": {}}
        return
    target = config
    if section in subclass_sections and len(parts) > 1 and parts[1] not in ("class_path", "init_args"):
        node = config.setdefault(section, {})
        if not isinstance(node, dict) or "class_path" not in node:
            raise CLIError(f"--{dotted}: give --{section}=package.Class (or a config with {section}.class_path) first.")
        parts = [section, "init_args", *parts[1:]]
    for part in parts[:-1]:
        node = target.get(part)
        if not isinstance(node, dict):
            node = {} if node is None else node
            if not isinstance(node, dict):
                raise CLIError(f"--{dotted}: '{part}' holds {node!r}, not a mapping of settings.")
            target[part] = node
        target = node
    target[parts[-1]] = value


def _merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Nested update: mappings merge key by key, anything else replaces (a new ``class_path`` replaces its section)."""
    for key, value in update.items():
        current = base.get(key)
        if isinstance(value, Mapping) and isinstance(current, dict) and not (
            "class_path" in value and current.get("class_path") != value.get("class_path")
        ):
            _merge(current, value)
        else:
            base[key] = copy.deepcopy(dict(value)) if isinstance(value, Mapping) else copy.deepcopy(value)
    return base


class SaveConfigCallback(Callback):
    """Writes the CLI's config as ``config.yaml`` into the run's log folder when a stage starts (global rank 0), so
    the run can be repeated with ``--config``; an existing file is an error unless ``overwrite=True``."""

    def __init__(self, config: dict[str, Any], config_filename: str = "config.yaml", overwrite: bool = False) -> None:
        self.config = config
        self.config_filename = config_filename
        self.overwrite = overwrite
        self.already_saved = False

    def setup(self, trainer: Any, module: Any, stage: str) -> None:
        if self.already_saved:
            return
        path = Path(trainer.log_dir) / self.config_filename
        exists = trainer.strategy.broadcast(path.exists() if trainer.is_global_zero else False)
        if exists and not self.overwrite:
            raise RuntimeError(
                f"{path} exists already and would be overwritten. Pass save_config_kwargs={{'overwrite': True}} to "
                "TrainerCLI, or log into a new folder."
            )
        if trainer.is_global_zero:
            import yaml

            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(yaml.safe_dump(self.config, sort_keys=False, default_flow_style=False))
        self.already_saved = True


class TrainerCLI:
    """A command line for ``model_class`` and ``datamodule_class`` with ``fit``/``validate``/``test``/``predict``
    subcommands (see the module docstring). After it runs: ``cli.config`` (the subcommand's settings),
    ``cli.model``, ``cli.datamodule``, ``cli.trainer``, ``cli.subcommand``.

    Args:
        model_class / datamodule_class: the classes whose ``__init__`` arguments are ``model.*``/``data.*``;
            with ``subclass_mode_model``/``subclass_mode_data`` (or when not given) the config names the class
            (``model: {class_path: pkg.MyModel, init_args: {...}}`` or ``--model=pkg.MyModel``).
        save_config_callback: the callback class that saves the config (None: no file).
        save_config_kwargs: its options (``config_filename``, ``overwrite``).
        trainer_class / trainer_defaults: the Trainer to build and defaults for its arguments (under the config).
        seed_everything_default: ``True`` (a random seed, written into the saved config), an int, or False.
        args: the arguments to parse instead of ``sys.argv[1:]`` (a list, or a config dict).
        run: False: no subcommand; build the objects and let the script call ``cli.trainer.fit(cli.model)``.
        auto_configure_optimizers: accept ``optimizer``/``lr_scheduler`` sections.
    """

    def __init__(
        self,
        model_class: Optional[type] = None,
        datamodule_class: Optional[type] = None,
        save_config_callback: Optional[type] = SaveConfigCallback,
        save_config_kwargs: Optional[dict[str, Any]] = None,
        trainer_class: Optional[type] = None,
        trainer_defaults: Optional[dict[str, Any]] = None,
        seed_everything_default: Union[bool, int] = True,
        subclass_mode_model: bool = False,
        subclass_mode_data: bool = False,
        args: Union[None, list[str], dict[str, Any]] = None,
        run: bool = True,
        auto_configure_optimizers: bool = True,
    ) -> None:
        from trainer.trainer import Trainer

        self.model_class = model_class
        self.datamodule_class = datamodule_class
        self.save_config_callback = save_config_callback
        self.save_config_kwargs = dict(save_config_kwargs or {})
        self.trainer_class = trainer_class or Trainer
        self.trainer_defaults = dict(trainer_defaults or {})
        self.seed_everything_default = seed_everything_default
        self.auto_configure_optimizers = auto_configure_optimizers
        self.subclass_sections = {section for section, cls, subclass in
                                  (("model", model_class, subclass_mode_model), ("data", datamodule_class, subclass_mode_data))
                                  if subclass or (cls is None and section == "model")}  # fmt: skip
        self.prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "train.py"
        self.model: Any = None
        self.datamodule: Any = None
        self.trainer: Any = None
        try:
            self.subcommand, self.config, print_config = self._parse(args, run)
            if print_config:
                self._print_config()
                raise SystemExit(0)
            self._instantiate()
        except ConfigurationError as err:
            print(f"{self.prog}: error: {err}", file=sys.stderr)
            raise SystemExit(2) from None
        if run:
            self._run_subcommand()

    # ------------------------------------------------------------------ parsing
    def _subcommand_defaults(self, subcommand: Optional[str]) -> dict[str, Any]:
        if subcommand is None:
            return {}
        method = getattr(self.trainer_class, subcommand)
        return {name: _plain(p.default, name) for name, p in inspect.signature(method).parameters.items()
                if name != "self" and name not in _DATA_ARGUMENTS and p.default is not inspect.Parameter.empty}  # fmt: skip

    def _default_config(self, subcommand: Optional[str]) -> dict[str, Any]:
        trainer = _defaults(self.trainer_class, "trainer")
        for key, value in self.trainer_defaults.items():
            try:
                trainer[key] = _plain(value, f"trainer_defaults[{key!r}]")
            except CLIError:
                trainer.pop(key, None)  # an object given in code: applied when the Trainer is built, not printed
        config: dict[str, Any] = {"seed_everything": self.seed_everything_default, "trainer": trainer}
        for section, cls in (("model", self.model_class), ("data", self.datamodule_class)):
            if section in self.subclass_sections:
                config[section] = None
            elif cls is not None:
                config[section] = _defaults(cls, section)
        config.update(self._subcommand_defaults(subcommand))
        return config

    def _parse(self, args: Union[None, list[str], dict[str, Any]], run: bool) -> tuple[Optional[str], dict, bool]:
        if isinstance(args, Mapping):  # a config dict instead of a command line
            subcommand = args.get("subcommand") if run else None
            tokens: list[str] = []
            given = {k: v for k, v in args.items() if k != "subcommand"}
            if run:
                if subcommand not in SUBCOMMANDS:
                    raise CLIError(f"args must name a 'subcommand' ({', '.join(SUBCOMMANDS)}).")
                given = given.get(subcommand, given)
        else:
            tokens = list(sys.argv[1:] if args is None else args)
            given = {}
            subcommand = None
            if run:
                if not tokens or tokens[0] in ("-h", "--help"):
                    self._print_help(None)
                    raise SystemExit(0)
                subcommand = tokens.pop(0)
                if subcommand not in SUBCOMMANDS:
                    close = difflib.get_close_matches(subcommand, SUBCOMMANDS, n=1)
                    raise CLIError(f"'{subcommand}' is not a subcommand.{' Did you mean ' + repr(close[0]) + '?' if close else ''} "
                                   f"Choose from {', '.join(SUBCOMMANDS)}.")  # fmt: skip
        config = self._default_config(subcommand)
        self._explicit: set[tuple[str, str]] = {("trainer", key) for key in self.trainer_defaults}
        if given:
            self._apply_file(config, dict(given), "args")
        print_config = False
        i = 0
        while i < len(tokens):
            token = tokens[i]
            if token in ("-h", "--help"):
                self._print_help(subcommand)
                raise SystemExit(0)
            if token == "--print_config" or token.startswith("--print_config="):
                print_config = True
                i += 1
                continue
            if not token.startswith("--"):
                raise CLIError(f"unexpected argument '{token}'. Options look like --trainer.max_epochs=3.")
            name, eq, value = token[2:].partition("=")
            if not eq:
                if i + 1 >= len(tokens):
                    raise CLIError(f"{token} needs a value, e.g. {token}=VALUE.")
                value = tokens[i + 1]
                i += 1
            i += 1
            if name == "config":
                from trainer.config.yaml_config import read_yaml

                data = read_yaml(value)
                if data is None:
                    continue
                if not isinstance(data, Mapping):
                    raise CLIError(f"{value}: the top level must be a mapping of settings.")
                self._apply_file(config, dict(data), value)
            else:
                self._apply_argument(config, name.replace("-", "_"), value)
        self._check(config)
        return subcommand, config, print_config

    def _valid_top_level(self, config: dict[str, Any]) -> list[str]:
        from trainer.config.yaml_config import LAUNCH_KEYS

        return [*config, *(k for k in _SECTIONS if k not in config), *_OPTIMIZER_KEYS, *LAUNCH_KEYS]

    def _apply_file(self, config: dict[str, Any], data: dict[str, Any], source: str) -> None:
        from trainer.config.yaml_config import LAUNCH_KEYS, SHARED_WITH_TRAINER, check_keys, check_launch_value

        check_keys(data, self._valid_top_level(config), source, hint="Trainer arguments go under 'trainer:'.")
        for key in list(data):
            if key in LAUNCH_KEYS:  # a launch setting of an experiment file: devices/num_nodes are Trainer arguments
                value = check_launch_value(key, data.pop(key), source)
                if key in SHARED_WITH_TRAINER:
                    data.setdefault("trainer", {})
                    data["trainer"] = {key: value, **(data["trainer"] or {})}
        for section in _SECTIONS:
            if isinstance(data.get(section), Mapping):
                for key in data[section]:
                    self._explicit.add((section, key))
        _merge(config, data)

    def _apply_argument(self, config: dict[str, Any], name: str, text: str) -> None:
        from trainer.config.yaml_config import check_keys, parse_value

        top = name.split(".")[0]
        check_keys({top: None}, self._valid_top_level(config), f"--{name}")
        value = parse_value(text)
        if top in _OPTIMIZER_KEYS and "." not in name and isinstance(value, str):
            config[top] = {"class_path": value, "init_args": {}}
            return
        if top in _OPTIMIZER_KEYS and "." in name and not name.split(".")[1] in ("class_path", "init_args"):
            name = f"{top}.init_args.{name.split('.', 1)[1]}"
        _set_dotted(config, name, value, self.subclass_sections)
        if top in _SECTIONS and "." in name:
            self._explicit.add((top, name.split(".")[1]))

    def _check(self, config: dict[str, Any]) -> None:
        """Unknown keys and values that do not fit the parameters' type hints are errors."""
        from trainer.config.yaml_config import check_keys

        for section, cls in (("trainer", self.trainer_class), ("model", self.model_class), ("data", self.datamodule_class)):
            settings = config.get(section)
            if section in self.subclass_sections:
                if settings is None:
                    if section == "model":
                        raise CLIError("no model: give --model=package.MyModel or a config with model.class_path.")
                    continue
                if not isinstance(settings, Mapping) or "class_path" not in settings:
                    raise CLIError(f"{section} must be {{class_path: package.Class, init_args: {{...}}}}.")
                check_keys(settings, ("class_path", "init_args"), section)
                cls = _import_class(settings["class_path"], section)
                settings = settings.get("init_args") or {}
            if cls is None or settings is None:
                continue
            if not isinstance(settings, Mapping):
                raise CLIError(f"'{section}' must be a mapping of settings, not {settings!r}.")
            if not _takes_any_keyword(cls):
                check_keys(settings, _init_parameters(cls), section)
            hints = _hints(cls)
            for key, value in settings.items():
                if isinstance(value, Mapping) and "class_path" in value:
                    continue
                if key in hints and not _matches(hints[key], value):
                    raise CLIError(f"{section}.{key}={value!r} does not fit its type {_hint_name(hints[key])}.")
            required = [name for name, p in _init_parameters(cls).items()
                        if p.default is inspect.Parameter.empty and settings.get(name) is None]  # fmt: skip
            if required:
                raise CLIError(f"{section}: {', '.join(required)} must be set (in a config or as --{section}.{required[0]}=...).")

    # ------------------------------------------------------------------ building and running
    def _instantiate(self) -> None:
        from trainer.reproducibility.seed import seed_everything
        from trainer.config.yaml_config import instantiate

        config = self.config
        seed = config.get("seed_everything")
        if seed is True:
            seed = random.randint(0, 2**32 - 1)
            config["seed_everything"] = seed  # the saved config repeats this run
        if seed is not False and seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, int):
                raise CLIError(f"seed_everything={seed!r} must be true, false or an int.")
            seed_everything(seed)
        self.datamodule = self._build("data", self.datamodule_class)
        self.model = self._build("model", self.model_class)
        self._configure_optimizers()
        trainer_kwargs = {key: instantiate(value) for key, value in (config.get("trainer") or {}).items()
                          if ("trainer", key) in self._explicit}  # fmt: skip
        for key, value in self.trainer_defaults.items():
            trainer_kwargs.setdefault(key, value)
        callbacks = trainer_kwargs.get("callbacks")
        callbacks = [] if callbacks is None else (list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks])
        if self.save_config_callback is not None and self.subcommand is not None:
            callbacks.append(self.save_config_callback(self._printable(), **self.save_config_kwargs))
        if callbacks:
            trainer_kwargs["callbacks"] = callbacks
        self.trainer = self.trainer_class(**trainer_kwargs)

    def _build(self, section: str, cls: Optional[type]) -> Any:
        from trainer.config.yaml_config import instantiate

        settings = self.config.get(section)
        if section in self.subclass_sections:
            if settings is None:
                return None
            cls = _import_class(settings["class_path"], section)
            settings = settings.get("init_args") or {}
        if cls is None:
            return None
        kwargs = {key: instantiate(value) for key, value in (settings or {}).items()}
        try:
            return cls(**kwargs)
        except TypeError as err:
            raise CLIError(f"{section}: {cls.__name__}({', '.join(kwargs)}) failed: {err}") from None

    def _configure_optimizers(self) -> None:
        spec = self.config.get("optimizer")
        if spec is None:
            if self.config.get("lr_scheduler") is not None:
                raise CLIError("lr_scheduler needs an optimizer section (--optimizer=Adam).")
            return
        if not self.auto_configure_optimizers:
            raise CLIError("optimizer: this CLI was built with auto_configure_optimizers=False.")
        import torch

        model = self.model
        optimizer_class = _import_class(spec["class_path"], "optimizer", "torch.optim")
        optimizer_args = dict(spec.get("init_args") or {})
        scheduler_spec = self.config.get("lr_scheduler")

        def configure_optimizers() -> Any:
            optimizer = optimizer_class(model.parameters(), **optimizer_args)
            if scheduler_spec is None:
                return optimizer
            scheduler_class = _import_class(scheduler_spec["class_path"], "lr_scheduler", "torch.optim.lr_scheduler")
            scheduler_args = dict(scheduler_spec.get("init_args") or {})
            monitor = scheduler_args.pop("monitor", None)
            scheduler = scheduler_class(optimizer, **scheduler_args)
            if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                if monitor is None:
                    raise CLIError("lr_scheduler: ReduceLROnPlateau needs init_args.monitor (e.g. val_loss).")
                return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": monitor}}
            return {"optimizer": optimizer, "lr_scheduler": scheduler}

        model.configure_optimizers = configure_optimizers  # instance attribute: the Trainer calls it

    def _run_subcommand(self) -> None:
        subcommand = self.subcommand
        before = getattr(self, f"before_{subcommand}", None)
        if callable(before):
            before()
        kwargs = {key: self.config[key] for key in self._subcommand_defaults(subcommand)}
        getattr(self.trainer, subcommand)(self.model, datamodule=self.datamodule, **kwargs)
        after = getattr(self, f"after_{subcommand}", None)
        if callable(after):
            after()

    # ------------------------------------------------------------------ output
    def _printable(self) -> dict[str, Any]:
        config = copy.deepcopy(self.config)
        for key in _OPTIMIZER_KEYS:
            if config.get(key) is None:
                config.pop(key, None)
        return config

    def _print_config(self) -> None:
        import yaml

        sys.stdout.write(yaml.safe_dump(self._printable(), sort_keys=False, default_flow_style=False))

    def _print_help(self, subcommand: Optional[str]) -> None:
        if subcommand is None:
            print(f"usage: {self.prog} {{{','.join(SUBCOMMANDS)}}} [--config FILE] [--print_config] [--KEY=VALUE ...]\n\n"
                  f"Subcommands: {', '.join(SUBCOMMANDS)}. `{self.prog} fit --help` lists every option.")  # fmt: skip
            return
        config = self._default_config(subcommand)
        lines = [f"usage: {self.prog} {subcommand} [--config FILE] [--print_config] [--KEY=VALUE ...]", "",
                 "  --config FILE         a YAML config (repeatable; later ones override)",
                 "  --print_config        print the resulting config and exit", ""]  # fmt: skip
        for key, value in config.items():
            if isinstance(value, dict):
                lines.extend(f"  --{key}.{name}={inner!r}" for name, inner in value.items())
            else:
                lines.append(f"  --{key}={value!r}")
        print("\n".join(lines))
