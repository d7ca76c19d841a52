"""Experiment files: one YAML file holds the launch settings and the Trainer's arguments.

```yaml
num_nodes: 1            # launch settings (read by `trainer run` / `trainer slurm`)
devices: 2              # processes per node (one per GPU)
node_rank: 0
main_address: 127.0.0.1
main_port: 29500        # null: a free port on one node
max_restarts: 0
env: {OMP_NUM_THREADS: "1"}
trainer:                # Trainer(...) arguments; Trainer.from_config("cfg.yaml") builds it
  precision: bf16-mixed
  max_epochs: 10
  callbacks:
    - class_path: trainer.callbacks.EarlyStopping
      init_args: {monitor: val_loss}
model: {}               # free-form sections for the user's script (ExperimentConfig.model/.data)
data: {}
```

A launcher passes what it was given to the processes it starts through two environment variables:
``TRAINER_CONFIG`` (the file) and ``TRAINER_ARGS`` (JSON: its flags and ``--trainer.*`` arguments, which
override the file). Every Trainer created in such a process takes them as defaults (arguments written in
the script win, with a warning when they differ); ``Trainer.from_config()`` uses them too.

``yaml`` is imported only when a file is read or written, so ``import trainer`` stays cheap.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from trainer.strategies.errors import ConfigurationError
from trainer.config.accelerate_config import is_accelerate_config, translate_accelerate_config
from trainer.config.launch_env import ENV_ARGS, ENV_CONFIG, decorated_inits, decorated_parameters, resolved_arguments
from trainer.config.class_path import import_class_path
from trainer.config.value_types import describe, did_you_mean, fits

SECTIONS = ("trainer", "model", "data")
#: Launch settings that are also Trainer arguments (same meaning in both places).
SHARED_WITH_TRAINER = ("devices", "num_nodes")


@dataclasses.dataclass
class ExperimentConfig:
    """A parsed experiment file: launch settings, Trainer arguments and the user's ``model``/``data`` sections."""

    num_nodes: int = 1
    devices: int = 1
    node_rank: int = 0
    main_address: str = "127.0.0.1"
    main_port: Optional[int] = None
    max_restarts: int = 0
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    trainer: dict[str, Any] = dataclasses.field(default_factory=dict)
    model: dict[str, Any] = dataclasses.field(default_factory=dict)
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    source: Optional[str] = None
    #: The launch settings the file wrote (the others are defaults).
    given: frozenset = frozenset()

    def to_dict(self) -> dict[str, Any]:
        """The file's content, in the order it is written."""
        return {key: getattr(self, key) for key in TOP_LEVEL_KEYS}


LAUNCH_KEYS = tuple(f.name for f in dataclasses.fields(ExperimentConfig)
                    if f.name not in (*SECTIONS, "source", "given"))  # fmt: skip
TOP_LEVEL_KEYS = LAUNCH_KEYS + SECTIONS
#: Keys of a ``TrainerCLI`` config (:mod:`trainer.trainer_cli`): accepted in an experiment file, read by the CLI only.
CLI_KEYS = ("seed_everything", "ckpt_path", "verbose", "return_predictions", "optimizer", "lr_scheduler")


# ---------------------------------------------------------------------------------------------- reading
def read_yaml(path: Union[str, os.PathLike]) -> Any:
    """Parse a YAML file; a missing file or a syntax error becomes a :class:`ConfigurationError` naming the
    file, line and column."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigurationError(f"Config file '{path}' does not exist (resolved to '{path.resolve()}').") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as err:
        raise ConfigurationError(f"Config file '{path}' cannot be read: {err}.") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigurationError(
            f"Config file '{path}' is not valid YAML{where}: {problem}. Check the indentation and that every "
            "'key: value' pair has a space after the colon."
        ) from None


def load_config(config: Union[str, os.PathLike, Mapping[str, Any], None]) -> ExperimentConfig:
    """Read and validate an experiment file (or an already-parsed mapping); ``None`` gives the defaults.

    A file written by ``accelerate config`` is translated first (:mod:`trainer.config.accelerate_config`).
    """
    if config is None:
        return ExperimentConfig()
    source = "config" if isinstance(config, Mapping) else str(config)
    data = config if isinstance(config, Mapping) else read_yaml(config)
    if data is None:
        raise ConfigurationError(
            f"Config file '{source}' is empty, so it sets nothing (a Trainer would fall back to max_epochs=1000). "
            "Write the settings it should hold, e.g. 'trainer: {max_epochs: 3}', or run `trainer config` to write one."
        )
    if is_accelerate_config(data):
        data = translate_accelerate_config(data, source)
    return parse_config(data, source)


def parse_config(data: Any, source: str) -> ExperimentConfig:
    """Validate a parsed file: unknown keys and wrongly typed launch settings are errors listing what is valid."""
    if not isinstance(data, Mapping):
        raise ConfigurationError(
            f"{source}: the top level must be a mapping of settings (e.g. 'devices: 2'), not a {type(data).__name__}."
        )
    check_keys(data, TOP_LEVEL_KEYS + CLI_KEYS, source, hint="Trainer arguments go under 'trainer:'.")
    given = frozenset(key for key in LAUNCH_KEYS if data.get(key) is not None)
    config = ExperimentConfig(source=source, given=given)
    for key in given:
        setattr(config, key, check_launch_value(key, data[key], source))
    for section in SECTIONS:
        value = data.get(section)
        if value is None:
            continue
        if not isinstance(value, Mapping):
            raise ConfigurationError(f"{source}: '{section}' must be a mapping of settings, not {value!r}.")
        setattr(config, section, dict(value))
    check_keys(config.trainer, trainer_parameter_names(), f"{source}: trainer")
    check_trainer_types(config.trainer, f"{source}: trainer.")
    return config


def check_trainer_types(settings: Mapping[str, Any], where: str) -> None:
    """Each Trainer argument's value against the type hint of ``Trainer.__init__``, so a file with
    ``max_epochs: "three"`` is refused before any process starts. ``class_path`` entries are left to their class."""
    import typing

    hints = typing.get_type_hints(decorated_inits["Trainer"])
    for key, value in settings.items():
        if isinstance(value, Mapping) and "class_path" in value:
            continue
        if key in hints and not fits(hints[key], value):
            raise ConfigurationError(f"{where}{key}={value!r} must be {describe(hints[key])}.")


def check_trainer_values(settings: Mapping[str, Any], where: str) -> None:
    """The Trainer's own checks of its loop arguments and precision on ``settings`` (the others at their defaults),
    run by ``trainer run`` so that e.g. ``max_epochs: -5`` is one error line before any worker starts."""
    import inspect

    from trainer.config.arguments import validate_arguments
    from trainer.strategies.precision.plugins import precision_plugin

    parameters = inspect.signature(decorated_inits["Trainer"]).parameters
    args = {name: p.default for name, p in parameters.items() if name != "self"}
    args.update(settings)
    try:
        validate_arguments(args)
        if isinstance(args["precision"], (str, int)):
            precision_plugin(args["precision"])
        for key, value in settings.items():
            check_class_paths(value, key)
    except ConfigurationError as err:
        raise ConfigurationError(f"{where}{err}") from None


def check_class_paths(value: Any, where: str) -> None:
    """Each ``class_path`` entry in ``value`` (also in lists and nested ``init_args``) names a class that imports,
    and its ``init_args`` keys are parameters of that class with every required one given; refused with the
    closest name ("did you mean"). A path whose top-level package does not import here (a package of the user's
    found beside the script) is left to the workers."""
    if isinstance(value, list):
        for index, item in enumerate(value):
            check_class_paths(item, f"{where}[{index}]")
        return
    if not isinstance(value, Mapping) or "class_path" not in value:
        return
    check_keys(value, ("class_path", "init_args"), f"{where}: class_path entry {dict(value)!r}")
    path = value["class_path"]
    cls = _resolve_class_path(path, where)
    if cls is None:
        return
    init_args = value.get("init_args") or {}
    if not isinstance(init_args, Mapping):
        raise ConfigurationError(f"{where}: init_args of '{path}' must be a mapping, not {init_args!r}.")
    _check_init_args(cls, path, init_args, where)
    for key, item in init_args.items():
        check_class_paths(item, f"{where}.init_args.{key}")


def _resolve_class_path(path: Any, where: str) -> Any:
    import importlib
    import importlib.util

    if not isinstance(path, str) or "." not in path:
        raise ConfigurationError(f"{where}: class_path {path!r} must be 'package.module.ClassName'.")
    try:
        return import_class_path(path)
    except (ImportError, AttributeError, ValueError):
        pass
    parts = path.split(".")
    for prefix in (parts, ["trainer", *parts]) if parts[0] in ("callbacks", "loggers", "strategies") else (parts,):
        if importlib.util.find_spec(prefix[0]) is None:
            continue
        found, module = prefix[0], importlib.import_module(prefix[0])
        for part in prefix[1:]:
            if hasattr(module, part):
                module, found = getattr(module, part), f"{found}.{part}"
                continue
            try:
                module, found = importlib.import_module(f"{found}.{part}"), f"{found}.{part}"
                continue
            except ImportError:
                pass
            names = [name for name in dir(module) if not name.startswith("_")]
            raise ConfigurationError(f"{where}: class_path '{path}' cannot be imported: '{found}' has no "
                                     f"'{part}'.{did_you_mean(part, names)}")  # fmt: skip
        return module
    return None  # the user's package, importable only where the script runs


def _check_init_args(cls: Any, path: str, init_args: Mapping[str, Any], where: str) -> None:
    import inspect

    try:
        parameters = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    names = [name for name, p in parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for key in init_args:
        if key not in names:
            raise ConfigurationError(f"{where}: init_args of '{path}' has unknown key '{key}'."
                                     f"{did_you_mean(key, names)} Valid keys: {', '.join(names)}.")  # fmt: skip
    missing = [name for name in names if parameters[name].default is inspect.Parameter.empty and name not in init_args]
    if missing:
        raise ConfigurationError(f"{where}: init_args of '{path}' misses the required key(s) {', '.join(missing)}.")


def check_launch_value(key: str, value: Any, source: str) -> Any:
    """Check one launch setting's type and range; returns it normalised."""
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if key in ("num_nodes", "devices"):
        ok = is_int(value) and value >= 1
        expected = "an int >= 1"
    elif key in ("node_rank", "max_restarts"):
        ok = is_int(value) and value >= 0
        expected = "an int >= 0"
    elif key == "main_port":
        ok = is_int(value) and 0 < value < 65536
        expected = "a TCP port (1..65535) or null"
    elif key == "main_address":
        ok = isinstance(value, str) and bool(value.strip())
        expected = "a host name or IP address"
    elif key == "env":
        ok = isinstance(value, Mapping) and all(isinstance(k, str) for k in value)
        expected = "a mapping of environment variable names to values"
        if ok:
            value = {k: "" if v is None else str(v) for k, v in value.items()}
    else:  # pragma: no cover - LAUNCH_KEYS and this function are kept in step
        raise KeyError(key)
    if not ok:
        raise ConfigurationError(f"{source}: {key}={value!r} must be {expected}.")
    return value


def check_keys(data: Mapping[str, Any], valid: Any, where: str, hint: str = "") -> None:
    """Raise when ``data`` has a key outside ``valid``, naming the closest valid key and listing all."""
    valid = list(valid)
    for key in data:
        if key not in valid:
            guess = did_you_mean(key, valid)
            raise ConfigurationError(
                f"{where}: unknown key '{key}'.{guess} Valid keys: {', '.join(valid)}.{' ' + hint if hint else ''}"
            )


def trainer_parameter_names() -> tuple[str, ...]:
    """The names ``Trainer(...)`` accepts, read from its signature (recorded by :func:`with_launch_defaults`, which
    decorates ``Trainer.__init__``; importing the ``trainer`` package defines the Trainer before any of this runs)."""
    return decorated_parameters["Trainer"]


# ---------------------------------------------------------------------------------------------- command line
def parse_value(text: str) -> Any:
    """A command-line value as YAML would read it: ``3`` → 3, ``[0,1]`` → list, ``null`` → None, else the text."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def parse_trainer_args(tokens: list[str]) -> dict[str, Any]:
    """``["--trainer.max_epochs", "3", "--trainer.precision=bf16-mixed"]`` → ``{"max_epochs": 3, ...}``."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name, eq, value = token[len("--trainer."):].partition("=")
        if not eq:
            if i + 1 >= len(tokens):
                raise ConfigurationError(f"{token} needs a value, e.g. {token}=VALUE.")
            value = tokens[i + 1]
            i += 1
        out[name.replace("-", "_")] = parse_value(value)
        i += 1
    check_keys(out, trainer_parameter_names(), "--trainer.*")
    check_trainer_types(out, "--trainer.")
    return out


def split_trainer_args(argv: list[str], value_options: set[str], stop_at_positional: bool) -> tuple[list[str], list[str]]:
    """Pull ``--trainer.KEY VALUE``/``--trainer.KEY=VALUE`` out of a command's arguments.

    Scanning stops at ``--`` and, with ``stop_at_positional``, at the first positional argument (the script,
    whose own arguments follow it); ``value_options`` are the command's options that take a value.
    """
    rest: list[str] = []
    tokens: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--" or (stop_at_positional and not token.startswith("-")):
            rest.extend(argv[i:])
            break
        if token.startswith("--trainer."):
            tokens.append(token)
            if "=" not in token and i + 1 < len(argv):
                tokens.append(argv[i + 1])
                i += 1
        else:
            rest.append(token)
            if token in value_options and i + 1 < len(argv):
                rest.append(argv[i + 1])
                i += 1
        i += 1
    return rest, tokens


# ---------------------------------------------------------------------------------------------- writing
def dump_config(config: ExperimentConfig) -> str:
    """The file text for ``config`` (launch settings first, then the sections that are not empty)."""
    import yaml

    data = config.to_dict()
    for section in ("env", *SECTIONS):
        if not data[section]:
            data.pop(section)
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


# ---------------------------------------------------------------------------------------------- Trainer side
def launch_environment(config_path: Optional[Union[str, os.PathLike]], trainer_args: Mapping[str, Any]) -> dict[str, str]:
    """The variables a launcher exports so the Trainers it starts see its file and flags."""
    env = {ENV_ARGS: json.dumps(dict(trainer_args))}
    if config_path is not None:
        env[ENV_CONFIG] = str(Path(config_path).resolve())
    return env


def environment_args() -> dict[str, Any]:
    """``TRAINER_ARGS`` as a dict (empty when not launched by ``trainer run``/``trainer slurm``)."""
    text = os.environ.get(ENV_ARGS)
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigurationError(f"{ENV_ARGS}={text!r} is not valid JSON ({err}); it is set by `trainer run`.") from None
    if not isinstance(value, dict):
        raise ConfigurationError(f"{ENV_ARGS} must hold a JSON object of Trainer arguments, not {text!r}.")
    return value


def trainer_settings(config: Union[str, os.PathLike, Mapping[str, Any], ExperimentConfig, None]) -> dict[str, Any]:
    """Trainer arguments from a file (its ``trainer:`` section plus its ``devices``/``num_nodes``) and, on top,
    the launcher's ``TRAINER_ARGS``. ``class_path`` entries are still plain dicts here."""
    parsed = config if isinstance(config, ExperimentConfig) else load_config(config)
    settings = {key: getattr(parsed, key) for key in SHARED_WITH_TRAINER if key in parsed.given}
    for key in SHARED_WITH_TRAINER:
        if key in settings and key in parsed.trainer and parsed.trainer[key] != settings[key]:
            raise ConfigurationError(
                f"{parsed.source}: {key}={settings[key]!r} (launch) and trainer.{key}={parsed.trainer[key]!r} disagree; "
                f"set {key} once, at the top level."
            )
    settings.update(parsed.trainer)
    overrides = environment_args()
    check_keys(overrides, trainer_parameter_names(), ENV_ARGS)
    settings.update(overrides)
    return settings


def instantiate(value: Any) -> Any:
    """Build objects written as ``{"class_path": "pkg.Class", "init_args": {...}}`` (also inside lists)."""
    if isinstance(value, list):
        return [instantiate(v) for v in value]
    if not isinstance(value, Mapping) or "class_path" not in value:
        return value
    check_keys(value, ("class_path", "init_args"), f"class_path entry {dict(value)!r}")
    path = value["class_path"]
    try:
        cls = import_class_path(path)
    except (ImportError, AttributeError, ValueError) as err:
        raise ConfigurationError(f"class_path '{path}' cannot be imported ({err}). Use 'package.module.ClassName'.") from None
    init_args = value.get("init_args") or {}
    if not isinstance(init_args, Mapping):
        raise ConfigurationError(f"init_args of '{path}' must be a mapping, not {init_args!r}.")
    try:
        return cls(**{k: instantiate(v) for k, v in init_args.items()})
    except TypeError as err:
        raise ConfigurationError(f"class_path '{path}' could not be built with init_args {dict(init_args)}: {err}.") from None


def build_from_config(cls: type, config: Any, defaults: dict[str, Any]) -> Any:
    """``Trainer.from_config``: ``defaults`` < the file (``None``: the launcher's) < the launcher's flags."""
    if config is None:
        config = os.environ.get(ENV_CONFIG)
    kwargs = dict(defaults)
    check_keys(kwargs, trainer_parameter_names(), "Trainer.from_config(**defaults)")
    kwargs.update({k: instantiate(v) for k, v in trainer_settings(config).items()})
    with resolved_arguments():
        if config is None or isinstance(config, (Mapping, ExperimentConfig)):
            return cls(**kwargs)
        try:
            return cls(**kwargs)
        except ConfigurationError as err:  # name the file the settings came from
            raise ConfigurationError(f"Trainer.from_config('{config}'): {err}") from None
