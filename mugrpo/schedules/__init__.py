"""The schedules of a run: stage sizes (stages) and the learning rate (lr)."""
