"""Lightning Fabric's API on this framework: a Fabric script migrates by changing its imports only,
``from lightning.fabric import Fabric`` → ``from trainer.fabric import Fabric``.

:class:`Fabric` is a façade over the same :class:`~trainer.engine.Engine` core (strategies, precision, data
splitting), with Fabric's names and signatures where they differ from Accelerate's (``save(path, state)``,
``setup(model, *optimizers)``, ``all_gather``, ...). See docs/migrating_from_lightning.md.
"""
from trainer.fabric.fabric import Fabric
from trainer.reproducibility.seed import seed_everything

__all__ = ["Fabric", "seed_everything"]
