"""What a run is pinned to: input fingerprints, stage prompt plans, refusals when they change."""
