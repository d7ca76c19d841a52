"""``trainer plan``: the job dry in one process: the strategy's own set-up on torch's ``fake`` process group at the
full world size, one step on fake tensors per rank role (bytes, peak, collectives, step-time bounds), and every
refusal the real job would hit. Nothing here is imported by ``import trainer``; see :mod:`trainer.plan.planner`."""
