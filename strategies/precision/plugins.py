"""Where the four plugins lived before each got its own file; kept so ``trainer.strategies.precision.plugins``
imports keep working. Import from :mod:`trainer.strategies.precision` instead."""
from trainer.strategies.precision import (  # noqa: F401
    VALID_PRECISIONS,
    DoublePrecision,
    HalfPrecision,
    MixedPrecision,
    Precision,
    canonical_precision,
    precision_plugin,
)
