"""Framework adapters for arrayprune.

This folder is installed as :mod:`arrayprune.adapters`. Each adapter lives in a module
named after the convention it serves (``arrayprune.adapters.torch`` for PyTorch modules);
``arrayprune.adapters.formats`` is a sub-package with one module per file format.
Importing this package under any other name is refused: an unrelated PyPI package is
called ``adapters``, and a silent mix-up would be worse than an error.
"""

if __name__ != "arrayprune.adapters":
    raise ImportError(
        f"the arrayprune adapters must be imported as 'arrayprune.adapters', not {__name__!r}; "
        "install arrayprune (pip install -e .) instead of putting its source folder on sys.path"
    )

__all__: list[str] = []
