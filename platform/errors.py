"""The one error type of the command-line tools: bad input, reported in one line with exit 2."""

__all__ = ["UsageError", "EXIT_USAGE"]

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad input (a file, a flag, a value). The message names the input and the fix."""
