"""Tests of the framework adapters (each skips when its framework is not installed)."""
