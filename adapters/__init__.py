"""Framework adapters for arrayprune.

This folder is installed as :mod:`arrayprune.adapters`. Each adapter is a module or a
sub-package named after the convention it serves: ``torch`` (the drop-in for PyTorch
modules), ``mapping`` (mappings of arrays, on ``state_dict`` and ``trees``),
``formats`` (one module per file format), ``pipeline`` (the file pipeline behind the
command, :func:`prune_file` from Python) and ``cli`` (the command line). Every
sub-package needs its own entry in pyproject.toml. Importing this package under any
other name is refused: an unrelated PyPI package is called ``adapters``, and a silent
mix-up would be worse than an error.
"""

if __name__ != "arrayprune.adapters":
    raise ImportError(
        f"the arrayprune adapters must be imported as 'arrayprune.adapters', not {__name__!r}; "
        "install arrayprune (pip install -e .) instead of putting its source folder on sys.path"
    )

__all__ = ["prune_file"]


def __getattr__(name: str) -> object:
    """:func:`prune_file`, imported when first used (importing the adapters imports no format)."""
    if name == "prune_file":
        from arrayprune.adapters.pipeline import prune_file

        return prune_file
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
