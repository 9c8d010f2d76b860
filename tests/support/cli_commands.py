"""The CLI's command names, as the docs and the exit-code tests list them."""

from __future__ import annotations


def _commands(app, prefix=("cotal",)) -> list[tuple[str, ...]]:
    """Every command path of ``app`` (groups and leaves), walked through cyclopts' own table."""
    found = []
    for name in app:
        if name.startswith("-"):
            continue
        path = (*prefix, name)
        found.append(path)
        found += _commands(app[name], path)
    return found
