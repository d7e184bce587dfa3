"""From rewards to a training signal: a worker's verifier pool and the advantage estimators."""
