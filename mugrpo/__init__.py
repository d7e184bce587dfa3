"""mugrpo: staged, high-staleness RL with verifiable rewards (Mu-GRPO) for LLMs."""

__version__ = "0.1.0"
