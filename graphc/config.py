"""Every environment variable graphc reads, in one place.

- GRAPHC_LOG: comma-separated topics to log to stderr; `recompiles` logs why a compiled
  callable traced again (a field-level diff of its guards).
- GRAPHC_DUMP: a directory; the IR of every compiled graph is written there after tracing
  (and after every pass, once passes exist), one file per stage.
- GRAPHC_RECOMPILE_LIMIT: how many times one compiled callable may trace (default 8).
- GRAPHC_CACHE_DIR: where compiled object code is cached on disk (default
  `$XDG_CACHE_HOME/graphc`, else `~/.cache/graphc`).

Read at use, not at import, so tests can set them with monkeypatch.
"""

from __future__ import annotations

import os


def log_topics() -> set[str]:
    return {t.strip() for t in os.environ.get("GRAPHC_LOG", "").split(",") if t.strip()}


def dump_dir() -> str | None:
    return os.environ.get("GRAPHC_DUMP") or None


def recompile_limit() -> int:
    return int(os.environ.get("GRAPHC_RECOMPILE_LIMIT", "8"))


def cache_dir() -> str:
    """The on-disk cache root: GRAPHC_CACHE_DIR, else the user cache directory + `graphc`."""
    explicit = os.environ.get("GRAPHC_CACHE_DIR")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(base), "graphc")
