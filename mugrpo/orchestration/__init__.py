"""A run's bookkeeping (run.json, job specs, stage commits, status) and its resume checks."""
