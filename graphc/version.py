"""graphc's version, in a module of its own so that the backends' caches can key on it
without importing the `graphc` package (which loads the front end and the jit)."""

__version__ = "0.1.0"
