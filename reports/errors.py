"""The one error type of the reports package."""

from __future__ import annotations


class ReportError(ValueError):
    """A report cannot be built from what the user pointed at (store, sweep name, output path)."""
