"""EAGLE3_DYNAMIC for sglang: EAGLE-3 speculation at small decode batches, plain decoding at large ones."""

# The one place the version is written: pyproject.toml reads it (setuptools' dynamic version).
__version__ = "0.1.0"
