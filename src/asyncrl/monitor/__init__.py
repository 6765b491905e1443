"""Metrics sinks and progress display."""
