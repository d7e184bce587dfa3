"""Prefect flows: the run flow runs K stage flows, then evaluates the final policy (docs/design.md)."""
