"""The memory package format M = (E, W, rho, C): a directory of data, loaded and validated here."""

from components.memory.errors import PackageError
from components.memory.package import MemoryPackage, digest, lint, load_package

__all__ = ["MemoryPackage", "PackageError", "digest", "lint", "load_package"]
