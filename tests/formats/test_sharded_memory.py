"""Peak memory of pruning safetensors checkpoints does not grow with the model.

Each run is a child process that reads its own resident size after the imports and its
peak (``VmHWM``) after pruning. Checkpoints of 2 and 8 shards of the same size (one
Llama-style layer of 3.4M float32 parameters each), and single files of the same
tensors: the 8-layer model is 80 MB larger, its peak may not be more than a quarter of
that larger. Memory-mapped pages count in the resident size: a reader that kept them
would peak 80 MB higher.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("safetensors")
if not sys.platform.startswith("linux"):
    pytest.skip("reads /proc/self/status", allow_module_level=True)

from safetensors.numpy import save_file  # noqa: E402

HIDDEN, INTER = 512, 1536

PROBE = """
import json, sys
def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))
from arrayprune.adapters.cli import main
base = status("VmRSS:")
rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "base": base, "peak": status("VmHWM:")}))
"""


def layer(i, rng):
    p = f"model.layers.{i}."
    t = {p + f"self_attn.{n}.weight": rng.standard_normal((HIDDEN, HIDDEN), dtype=np.float32)
         for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    t[p + "mlp.gate_proj.weight"] = rng.standard_normal((INTER, HIDDEN), dtype=np.float32)
    t[p + "mlp.up_proj.weight"] = rng.standard_normal((INTER, HIDDEN), dtype=np.float32)
    t[p + "mlp.down_proj.weight"] = rng.standard_normal((HIDDEN, INTER), dtype=np.float32)
    t[p + "input_layernorm.weight"] = np.ones(HIDDEN, np.float32)
    return t


def checkpoint(folder, layers):
    """A sharded checkpoint of one layer per shard, and the same tensors in one file."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    weight_map, everything = {}, {}
    for i in range(layers):
        t = layer(i, rng)
        shard = f"model-{i + 1:05d}-of-{layers:05d}.safetensors"
        save_file(t, str(folder / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(t, shard))
        everything.update(t)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    single = folder.parent / f"model-{layers}.safetensors"
    save_file(everything, str(single), metadata={"format": "pt"})
    return folder, single, sum(v.nbytes for v in everything.values())


def peak(*args):
    proc = subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["rc"] == 0
    return out["peak"] - out["base"]


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_the_model(tmp_path):
    small, small_file, small_size = checkpoint(tmp_path / "two", 2)
    large, large_file, large_size = checkpoint(tmp_path / "eight", 8)
    growth = large_size - small_size  # 82 MB
    for options in (["--global"], []):
        sharded = [peak("prune", c, "-o", tmp_path / f"{c.name}-out{len(options)}", "--amount", "0.5", *options)
                   for c in (small, large)]
        single = [peak("prune", f, "-o", tmp_path / f"{f.stem}-out{len(options)}.safetensors", "--amount", "0.5",
                       *options) for f in (small_file, large_file)]
        for what, (a, b) in (("sharded", sharded), ("single file", single)):
            assert b - a < growth / 4, f"{what} {options}: peak grew {b - a} bytes for {growth} more bytes of model"
        assert single[1] < large_size / 2, f"single file: peak {single[1]} bytes over the imports for {large_size}"
