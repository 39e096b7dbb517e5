"""Graders for agent evaluation."""

from .base import AbstractGrader
from .registry import get_grader

__all__ = ["AbstractGrader", "get_grader"]
