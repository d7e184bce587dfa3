"""How a stage's jobs run: cold, one job after another (pipeline), or warm, in one process."""
