"""Agent evaluation framework for benchmarking AI agents."""

__version__ = "0.1.0"
