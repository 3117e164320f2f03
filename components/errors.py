"""Bad input: one clear message naming the file and the field. The CLI prints it and exits non-zero, no traceback."""


class InputError(Exception):
    """A malformed package, plan, benchmark, score table or parameter file."""
