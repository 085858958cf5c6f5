#!/usr/bin/env python3
"""Prints the kaon plugins installed Python packages register, as $KAON_PLUGINS wants them:
colon-separated .so paths, from the entry point group `kaon.plugins`. An entry point's object is
the path (str or os.PathLike) or a function returning it (docs/API.md, "Plugins").

    KAON_PLUGINS=$(python scripts/kaon_plugins.py) build/kaon serve MODEL
"""
import os
import sys
from importlib.metadata import entry_points

GROUP = "kaon.plugins"


def plugin_paths(group=GROUP):
    """The .so path of every entry point in group, sorted by entry point name (a stable order:
    a name clash between two plugins then always names the same one)."""
    paths = []
    for ep in sorted(entry_points(group=group), key=lambda e: e.name):
        obj = ep.load()
        path = os.fspath(obj() if callable(obj) else obj)
        if ":" in path:
            raise ValueError(f"kaon plugin {ep.name}: path {path!r} has a ':' ($KAON_PLUGINS separates with it)")
        paths.append(path)
    return paths


if __name__ == "__main__":
    try:
        print(":".join(plugin_paths()))
    except Exception as e:  # an entry point that does not load: one line, status 2, as kaon does
        print(f"kaon_plugins: error: {e}", file=sys.stderr)
        sys.exit(2)
