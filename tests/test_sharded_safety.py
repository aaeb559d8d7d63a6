"""Sharded checkpoints and safetensors headers against hostile or unusual layouts.

Headers that claim more than the format allows, indexes nested too deeply, Hugging Face
cache snapshots (symlinks into ``blobs/``), and the atomic switch of an output folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_sharded import cli, llama_tensors, one_line_error, write_checkpoint

from arrayprune.adapters.formats import FormatError, sharded
from arrayprune.adapters.formats.safetensors import HEADER_MAX_BYTES, read_header

pytest.importorskip("safetensors")

LIMITED = """
import resource, sys
limit = int(sys.argv[1]) << 20
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from arrayprune.adapters.cli import main
sys.exit(main(sys.argv[2:]))
"""


def run_limited(mib, *args):
    """The command in a subprocess whose address space is limited to `mib` MiB."""
    return subprocess.run(
        [sys.executable, "-c", LIMITED, str(mib), *map(str, args)], capture_output=True, text=True, timeout=120
    )


def sparse_header_file(path, claimed=2 << 30):
    """A sparse file whose header length field says `claimed` bytes (the file is larger)."""
    with open(path, "wb") as f:
        f.write(claimed.to_bytes(8, "little"))
        f.write(b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}')
        f.truncate(claimed + (1 << 30))
    return path


# --------------------------------------------------------------------------------------
# Header bound
# --------------------------------------------------------------------------------------


def test_header_larger_than_the_format_allows_is_refused_before_reading(tmp_path):
    big = sparse_header_file(tmp_path / "big.safetensors")
    src = write_checkpoint(tmp_path / "in", llama_tensors(layers=1), 2)
    shard = src / "model-00002-of-00002.safetensors"
    os.unlink(shard)
    sparse_header_file(shard)
    want = f"safetensors header of {2 << 30} bytes, larger than the format's limit of 100000000"
    assert HEADER_MAX_BYTES == 100_000_000
    with pytest.raises(FormatError, match="larger than the format's limit"):
        read_header(str(big))
    for args in (
        ["report", big],
        ["prune", big, "-o", tmp_path / "o.safetensors", "--amount", "0.5"],
        ["prune", big, "-o", tmp_path / "o.npz", "--amount", "0.5"],  # the in-memory reader
        ["prune", big, "--dry-run", "--amount", "0.5"],
        ["report", src],
        ["prune", src, "-o", tmp_path / "out", "--amount", "0.5"],
    ):
        proc = run_limited(1000, *args)  # reading the claimed header would need 2 GiB
        lines = proc.stderr.splitlines()
        assert proc.returncode == 2 and len(lines) == 1, (args, proc.stderr[-2000:])
        assert lines[0].startswith("arrayprune: error: ") and want in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.safetensors", "in"]


def test_header_at_the_limit_is_read(tmp_path):
    """A header of exactly the limit is not refused for its size (here: padded JSON)."""
    body = b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    path = tmp_path / "padded.safetensors"
    with open(path, "wb") as f:
        f.write(HEADER_MAX_BYTES.to_bytes(8, "little"))
        f.write(body + b" " * (HEADER_MAX_BYTES - len(body)))
        f.write(b"\x00\x00\x80\x3f")
    header = read_header(str(path))
    assert header.names == ["w"] and header.entries["w"] == ("F32", (1,), 8 + HEADER_MAX_BYTES, 12 + HEADER_MAX_BYTES)


# --------------------------------------------------------------------------------------
# Deeply nested index
# --------------------------------------------------------------------------------------


def test_deeply_nested_index_is_one_line(tmp_path, capsys):
    src = write_checkpoint(tmp_path / "in", llama_tensors(layers=1), 2)
    depth = 5000
    (src / "model.safetensors.index.json").write_text('{"weight_map": ' * depth + "{}" + "}" * depth)
    for args in (["prune", src, "-o", tmp_path / "out", "--amount", "0.5"], ["report", src],
                 ["prune", src, "--dry-run", "--amount", "0.5"]):
        assert cli(*args) == 2
        one_line_error(capsys, "model.safetensors.index.json: not a valid index: nested too deeply")
    assert not (tmp_path / "out").exists()
    with pytest.raises(FormatError, match="nested too deeply"):
        sharded.open_checkpoint(src)
    index = {"metadata": {"total_size": 1}, "weight_map": json.loads((src / "config.json").read_text())}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    assert cli("report", src) == 2  # a shallow index is read as before
    one_line_error(capsys, "weight_map")
