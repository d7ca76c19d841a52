"""What ends or hands over a run safely: stop signals (SIGTERM/SIGINT and the agreed stop across ranks),
non-finite losses, SLURM's requeue on SIGUSR1, and the fault monitor that checks them at step boundaries.
Hang reports live with the collectives, in ``trainer.strategies.launch.hang_report``."""
