"""``trainer plan``: the job as it will run, dry, in one process: the module on ``meta``, the strategy's own set-up
under torch's ``fake`` process group at the full world size, one step on fake tensors per rank role; bytes, peak,
collectives and step-time bounds against a hardware profile, and every refusal the real job would hit.
Nothing here is imported by ``import trainer``; see :mod:`trainer.plan.planner`."""
