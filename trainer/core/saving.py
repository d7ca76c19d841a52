"""Lightning's ``pytorch_lightning.core.saving`` YAML helpers after the rename (``trainer.core.saving``): read and
write the ``hparams.yaml`` the loggers keep next to a run."""
from __future__ import annotations

import os
import warnings
from argparse import Namespace
from typing import Any, Union

from trainer.loggers.run_folder import save_hparams_yaml


def load_hparams_from_yaml(config_yaml: Union[str, os.PathLike], use_omegaconf: bool = True) -> dict[str, Any]:
    """The hyperparameters in a YAML file (``{}`` with a warning when it does not exist, as in Lightning).
    ``use_omegaconf`` is accepted for Lightning's signature; the file is read as plain YAML."""
    import yaml

    if not os.path.isfile(config_yaml):
        warnings.warn(f"Missing Tags: {config_yaml}.", stacklevel=2)
        return {}
    with open(config_yaml, encoding="utf-8") as fh:
        return yaml.safe_load(fh) or {}


def save_hparams_to_yaml(config_yaml: Union[str, os.PathLike], hparams: Union[dict, Namespace],
                         use_omegaconf: bool = True) -> None:  # fmt: skip
    """Write ``hparams`` (a dict or an argparse ``Namespace``) as YAML; values that are not plain become strings."""
    save_hparams_yaml(str(config_yaml), vars(hparams) if isinstance(hparams, Namespace) else hparams)


__all__ = ["load_hparams_from_yaml", "save_hparams_to_yaml"]
