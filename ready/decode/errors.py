"""The one error type of the decoding engine for inputs a user can get wrong."""

from __future__ import annotations


class DecodeError(ValueError):
    """Bad input to the engine or the CLI (empty or too long prompt, K < 1, vocabulary
    mismatch, unknown method); the message names the input and what was expected."""
