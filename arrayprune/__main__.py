"""``python -m arrayprune``: the ``arrayprune`` command line.

The command lives in :mod:`arrayprune.adapters.cli`; it is imported only here, when the
package is run as a program, so that ``import arrayprune`` never loads it.
"""

from __future__ import annotations

__all__: list[str] = []

if __name__ == "__main__":
    from arrayprune.adapters.cli import main

    raise SystemExit(main())
