"""Turning what users write into settings: the Trainer's argument checks and defaults, experiment YAML files
(``Trainer.from_config``, ``trainer run --config``), a launcher's settings as Trainer defaults, Accelerate
config files, and Lightning-style ``plugins``."""
