"""The renamed Lightning test package (built by benchmarks/lightning_suite; edits here are overwritten)."""
