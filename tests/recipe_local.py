"""Import a recipe's ``local/*.py`` script as a module (the scripts are not a package)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def load(path: Path):
    """The module of ``path``, registered in sys.modules under its stem (so that its classes
    pickle for the scripts' --jobs workers); loaded once."""
    name = path.stem
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
