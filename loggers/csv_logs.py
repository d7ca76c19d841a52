"""Lightning's ``pytorch_lightning.loggers.csv_logs`` after the rename (``trainer.loggers.csv_logs``): ported imports
find the CSV logger here."""
from trainer.loggers.csv_logger import CSVLogger

__all__ = ["CSVLogger"]
