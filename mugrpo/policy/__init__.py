"""The policy model: loading, LoRA adapters, per-token log-probs and truncated sampling."""
