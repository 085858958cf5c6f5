"""Plugins (docs/API.md, "Plugins"): shared libraries that register model architectures.
Before the first engine, kaon loads those named by $KAON_PLUGINS (colon-separated, as the CLI
does) and those installed Python packages register under the entry point group `kaon.plugins`
(the entry point's object: the .so path, or a function returning it)."""
import os
from importlib.metadata import entry_points

from . import _lib
from ._lib import lib

GROUP = "kaon.plugins"
_loaded = False


def load_plugin(path) -> None:
    """Loads one plugin library; loading the same one again does nothing. RuntimeError with
    kaon's one-line reason when it is refused (another plugin API, a name taken, ...)."""
    path = os.fspath(path)
    if lib.kaon_plugin_load(path.encode()) != 0:
        raise RuntimeError(f"kaon: {_lib.last_error()}")


def installed_plugin_paths():
    """The .so paths of the `kaon.plugins` entry points, sorted by entry point name."""
    paths = []
    for ep in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        obj = ep.load()
        paths.append(os.fspath(obj() if callable(obj) else obj))
    return paths


def load_plugins() -> None:
    """$KAON_PLUGINS, then the installed entry points; once per process."""
    global _loaded
    if _loaded:
        return
    for p in os.environ.get("KAON_PLUGINS", "").split(":"):
        if p:
            load_plugin(p)
    for p in installed_plugin_paths():
        load_plugin(p)
    _loaded = True
