"""The evaluation library: avg@k and pass@k of one policy on each configured benchmark."""
