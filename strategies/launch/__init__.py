"""Launching: where a job's processes come from and what happens when one stops answering.

Cluster environments (torchrun, SLURM, local), the launchers that start ranks when nothing else did, and the
hang report that names the rank a collective waited for."""
