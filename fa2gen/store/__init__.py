"""Tuned configs at rest: the SQLite results database and the YAML files.

Both are data: every value read back is validated before it can reach a template.
"""
