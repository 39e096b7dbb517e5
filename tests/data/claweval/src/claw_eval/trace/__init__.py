"""Trace I/O utilities."""

from .reader import load_trace, read_events
from .writer import TraceWriter

__all__ = ["TraceWriter", "load_trace", "read_events"]
