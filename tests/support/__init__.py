"""Helpers shared by tests of more than one folder (no fixtures, no tests)."""
