"""Validate, dispatch and launch. Imports nothing from the tuner."""

from .api import attention
from .problem import Problem, make_problem

__all__ = ["Problem", "attention", "make_problem"]
