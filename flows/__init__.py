"""Prefect flows: the run flow runs K stage flows, then evaluates the final policy (design.md)."""
