"""A run's processes coordinated through the store: lease, job spec, start gate, fan-out."""
