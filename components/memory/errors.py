"""Load errors: one line each, naming the file and the field."""

from __future__ import annotations

from dataclasses import dataclass

from components.errors import InputError


@dataclass(frozen=True)
class Problem:
    file: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: {self.message}"


class PackageError(InputError):
    """A package that cannot be loaded. `problems` holds every error found, one line each."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))

    def __reduce__(self) -> tuple[type[PackageError], tuple[list[Problem]]]:
        # across processes (a Dask worker's): rebuilt from its problems, never from its message (one line a character)
        return (type(self), (self.problems,))
