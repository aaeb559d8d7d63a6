"""The verbs and drop-in classes of the method table are plain code, kept in step with it."""

from __future__ import annotations

import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import arrayprune as ap
from arrayprune.adapters import mapping as mp
from arrayprune.method_parts import masks_alone

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "write_verbs.py"


def _writer():
    spec = importlib.util.spec_from_file_location("write_verbs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_checked_in_verbs_are_those_the_table_writes():
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_changed_docstring_makes_the_check_fail(monkeypatch):
    pytest.importorskip("torch")
    writer = _writer()
    methods, registry = writer._import_table()
    assert writer.replaced((ROOT / "adapters/mapping.py").read_text(), writer.mapping_block(methods, registry), "")
    assert writer.stale(write=False) == []
    monkeypatch.setattr(ap.L1Unstructured, "__doc__", ap.L1Unstructured.__doc__.replace("Fraction", "Share"))
    assert writer.stale(write=False) == list(writer.TARGETS)


@pytest.mark.parametrize("name", [n for n, cls in ap.METHODS.items() if masks_alone(cls)])
def test_verbs_are_written_out(name):
    for module in (ap, mp):
        source = inspect.getsource(getattr(module, name))
        assert source.startswith(f"def {name}(")


def test_no_code_is_executed_from_strings():
    for path in [*(ROOT / "arrayprune").rglob("*.py"), *(ROOT / "adapters").rglob("*.py")]:
        text = path.read_text()
        assert "exec(" not in text and "__class__ = " not in text, path
