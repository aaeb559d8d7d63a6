"""The wheel holds every module at its import path, and an installed copy imports them all.

``adapters/`` is installed as ``arrayprune.adapters`` through ``[tool.setuptools]
package-dir``; a sub-package missing from ``packages`` silently drops out of the wheel
while the editable install keeps working. So the wheel is built from a copy of the
source and installed into a folder of its own, and every module is imported from there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# source folder -> its import path in the wheel
SOURCES = {"arrayprune": "arrayprune", "adapters": "arrayprune/adapters"}


def _source_modules() -> dict[str, str]:
    """Every .py file of the source, as {path in the wheel: module name}."""
    found = {}
    for folder, target in SOURCES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder)
            if "__pycache__" in rel.parts:
                continue
            wheel_path = f"{target}/{rel.as_posix()}"
            module = wheel_path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            found[wheel_path] = module
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the source (no build/ or egg-info left in the tree)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    for folder in SOURCES:
        shutil.copytree(ROOT / folder, src / folder, ignore=ignore)
    out = tmp / "dist"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    subprocess.run([*cmd, "-w", str(out), str(src)], check=True, capture_output=True, text=True, timeout=120)
    (found,) = out.glob("arrayprune-*.whl")
    return found


@pytest.mark.slow
def test_wheel_holds_every_module_at_its_import_path(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = {n for n in zf.namelist() if ".dist-info/" not in n}
    expected = set(_source_modules())
    assert "arrayprune/adapters/formats/__init__.py" in expected
    missing = sorted(expected - names)
    assert not missing, f"source files missing from the wheel: {missing}"
    extra = sorted(n for n in names - expected if n.endswith(".py"))
    assert not extra, f"modules in the wheel without a source file (stale build?): {extra}"
    stray = sorted(n for n in names if not n.startswith("arrayprune/"))
    assert not stray, f"files outside the arrayprune package (a top-level 'adapters' must not exist): {stray}"


@pytest.mark.slow
def test_installed_wheel_imports_every_module(wheel, tmp_path):
    target = tmp_path / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(target)]
    subprocess.run([*cmd, str(wheel)], check=True, capture_output=True, text=True, timeout=120)
    modules = sorted(set(_source_modules().values()))
    code = (
        "import importlib, json, sys\n"
        "files = {}\n"
        "for name in json.loads(sys.argv[1]):\n"
        "    files[name] = importlib.import_module(name).__file__\n"
        "print(json.dumps(files))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    # cwd outside the source tree: the checkout's folders must not be what gets imported
    result = subprocess.run(
        [sys.executable, "-c", code, json.dumps(modules)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    files = json.loads(result.stdout.strip().splitlines()[-1])
    # the venv's editable install could fill in what the wheel lacks: each module must come from the target
    elsewhere = {name: f for name, f in files.items() if not Path(f).resolve().is_relative_to(target.resolve())}
    assert not elsewhere, f"modules not imported from the installed wheel: {elsewhere}"
