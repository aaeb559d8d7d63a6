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


def flags(options):
    """``prune_file`` options as the command line's flags (``global_=True`` -> ``--global``)."""
    args = []
    for name, value in options.items():
        flag = "--" + name.rstrip("_").replace("_", "-")
        if value is True:
            args.append(flag)
        elif name == "nm":
            args += [flag, f"{value[0]}:{value[1]}"]
        elif name == "verify_tol":
            args += [flag, ",".join(map(str, value))]
        elif name in ("include", "exclude"):
            args += [flag, *([value] if isinstance(value, str) else value)]
        else:
            args += [flag, str(value)]
    return args
