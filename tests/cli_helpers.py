"""Running the ``arrayprune`` command in tests: a subprocess, and its one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "examples", "mlp.onnx")


def run(*args, cwd=None, stderr=subprocess.PIPE, timeout=120, env=None):
    """``python -m arrayprune ARGS``; stdout and stderr are pipes (not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "arrayprune", *map(str, args)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        timeout=timeout,
        env=env,
    )


def assert_error(proc, *fragments):
    """Exit status 2 and exactly one line ``arrayprune: error: ...`` naming `fragments`."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("arrayprune: error: "), lines[0]
    for frag in fragments:
        assert str(frag) in lines[0], (frag, lines[0])
    return lines[0]
