"""Lightning's ``pytorch_lightning.loggers.csv_logs`` after the rename (``trainer.loggers.csv_logs``): ported imports
find the CSV logger and its ``ExperimentWriter`` (``CSVLogger.experiment``) here."""
from trainer.loggers.csv_logger import CSVLogger, ExperimentWriter

__all__ = ["CSVLogger", "ExperimentWriter"]
