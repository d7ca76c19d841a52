"""The loops: fit (epochs), training epoch (batches), optimisation step, evaluation and prediction."""
