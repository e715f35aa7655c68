"""Benchmarking: shapes, competing implementations, timing and reports."""
