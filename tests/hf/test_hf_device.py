"""``--device`` (``prune_file(device=...)``): where calibration runs the model.

On this CPU-only machine: ``--device cpu`` writes the bytes of no device at all (Hugging
Face SparseGPT and Wanda, ONNX Wanda); a device that is not here, or not spelled as one,
is one line (exit status 2) before any input is read or any output written; the
layer-by-layer runner puts the weights it loads and the model's buffers on the device it
is given. The same path on a CUDA device ran on an H100 (``benchmarks/results/``).
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from arrayprune.adapters import prune_file  # noqa: E402
from arrayprune.adapters.pipeline.devices import Device, device_problem, parse_device  # noqa: E402
from arrayprune.adapters.pipeline.errors import PruneError  # noqa: E402
from arrayprune.adapters.pipeline.hf_calibration import _buffers_to, _Weights  # noqa: E402
from cli_helpers import EXAMPLE, assert_error, run  # noqa: E402
from hf_models import VOCAB, save_sharded_llama  # noqa: E402


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama")
    folder = save_sharded_llama(root / "llama")
    tokens = root / "tokens.npz"
    np.savez(tokens, input_ids=np.random.default_rng(0).integers(0, VOCAB, (8, 12)))
    return folder, tokens


def _digest(folder):
    return {
        name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
        for name in sorted(os.listdir(folder))
        if (folder / name).is_file()
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    "options", [{"method": "sparsegpt", "amount": 0.5}, {"method": "wanda", "amount": 0.5}], ids=["sparsegpt", "wanda"]
)
def test_device_cpu_writes_the_bytes_of_no_device(llama, tmp_path, options):
    folder, tokens = llama
    prune_file(folder, tmp_path / "default", calibration=tokens, **options)
    prune_file(folder, tmp_path / "cpu", calibration=tokens, device="cpu", **options)
    assert _digest(tmp_path / "cpu") == _digest(tmp_path / "default")
    assert any(name.endswith(".safetensors") for name in _digest(tmp_path / "cpu"))


def test_device_cpu_on_onnx_writes_the_bytes_of_no_device(tmp_path):
    pytest.importorskip("onnxruntime")
    calibration = tmp_path / "calibration.npz"
    np.savez(calibration, input=np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32))
    options = {"method": "wanda", "amount": 0.5, "calibration": calibration}
    prune_file(EXAMPLE, tmp_path / "default.onnx", **options)
    prune_file(EXAMPLE, tmp_path / "cpu.onnx", device="cpu", **options)
    assert (tmp_path / "cpu.onnx").read_bytes() == (tmp_path / "default.onnx").read_bytes()


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")


@NO_CUDA
def test_a_missing_cuda_device_is_told_with_the_other_problems_before_anything_is_read(llama, tmp_path):
    folder, _ = llama
    missing_tokens = tmp_path / "not-yet.npz"  # never read: told missing, with the device
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")  # OUT exists, no --force
    before = _digest(folder)
    proc = run("prune", folder, "-o", out, "--method", "sparsegpt", "--amount", "0.5", "--calibration",
               missing_tokens, "--device", "cuda")  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == "arrayprune: error: 3 problems:", proc.stderr
    assert lines[1] == "  --device cuda: PyTorch sees no CUDA device here (torch.cuda.is_available() is False)"
    assert any("not-yet.npz" in line for line in lines[2:]) and any(str(out) in line for line in lines[2:])
    assert len(lines) == 4 and "Traceback" not in proc.stderr
    assert os.listdir(out) == ["keep.txt"] and not missing_tokens.exists() and _digest(folder) == before


@NO_CUDA
@pytest.mark.parametrize("device", ["cuda", "cuda:7", "gpu"])
def test_no_input_and_a_device_not_here_are_told_together(tmp_path, device):
    out = tmp_path / "out"
    options = {"method": "sparsegpt", "amount": 0.5, "calibration": tmp_path / "c.npz", "device": device}
    with pytest.raises(PruneError) as caught:
        prune_file(tmp_path / "no-such-model", out, **options)
    text = str(caught.value)
    assert text.startswith("2 problems:\n") and "no such file" in text and "no-such-model" in text, text
    assert text.splitlines()[2].startswith(f"--device{' ' + device if device != 'gpu' else ':'}"), text
    assert not out.exists()


def test_a_missing_cuda_provider_is_one_line_for_onnx(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("onnxruntime has its CUDA provider here")
    out = tmp_path / "out.onnx"
    calibration = tmp_path / "c.npz"
    np.savez(calibration, input=np.ones((4, 64), np.float32))
    proc = run("prune", EXAMPLE, "-o", out, "--method", "wanda", "--amount", "0.5", "--calibration",
               calibration, "--device", "cuda:1")  # fmt: skip
    line = assert_error(proc, "--device cuda:1", "no CUDA execution provider", "onnxruntime-gpu")
    with pytest.raises(PruneError) as caught:
        prune_file(EXAMPLE, out, method="wanda", amount=0.5, calibration=calibration, device="cuda:1")
    assert line == f"arrayprune: error: {caught.value}"
    assert not out.exists()


@pytest.mark.parametrize(
    ("device", "options", "fragment"),
    [
        ("gpu", {"calibration": "c.npz"}, "--device: expected cpu, cuda or cuda:N, got 'gpu'"),
        ("cpu:0", {"calibration": "c.npz"}, "expected cpu, cuda or cuda:N"),
        ("cuda:x", {"calibration": "c.npz"}, "expected cpu, cuda or cuda:N"),
        ("cpu", {}, "--device is where --calibration runs the model"),
    ],
)
def test_device_spelling_and_use_are_checked(tmp_path, device, options, fragment):
    options = {k: tmp_path / v for k, v in options.items()}
    with pytest.raises(PruneError, match=fragment.replace("(", r"\(")):
        prune_file(EXAMPLE, tmp_path / "out.onnx", method="wanda", amount=0.5, device=device, **options)
    assert not (tmp_path / "out.onnx").exists()


def test_parse_device():
    assert parse_device("cuda:3") == Device("cuda", 3) and str(parse_device(" cuda ")) == "cuda"
    assert parse_device("cpu") == Device("cpu") and device_problem(Device("cpu"), "torch") is None


def test_the_layer_runner_places_weights_and_buffers_on_its_device():
    class Source:
        tensors = {"weight": type("Stored", (), {"shape": (3, 2)})(), "bias": type("Stored", (), {"shape": (3,)})()}

    class Files:
        @staticmethod
        def load(stored):
            return np.ones(stored.shape, np.float32)

    layer = torch.nn.Linear(2, 3)
    layer.register_buffer("inv_freq", torch.ones(4))
    _Weights(Source(), Files(), torch.device("meta")).load(layer)
    _buffers_to(layer, torch.device("meta"))
    assert layer.weight.is_meta and layer.bias.is_meta and layer.inv_freq.is_meta
    _Weights(Source(), Files(), torch.device("cpu")).load(layer)
    assert not layer.weight.is_meta and float(layer.weight.sum()) == 6.0


class _Reached(Exception):
    """Stops the run at the first layer's replay."""


def test_the_layer_by_layer_run_places_everything_on_the_device_it_is_given(llama, tmp_path, monkeypatch):
    """The run itself, not only its helpers: with ``device="meta"`` let through (the model's
    skeleton is on ``meta`` before its weights are read), the tokens and what runs before
    the layers are loaded on ``meta``, then freed, and the first layer's weights are loaded
    on ``meta``; with ``"cpu"``, on the CPU. Where placement is dropped, the weights load on
    the CPU and the first assertion fails."""
    from arrayprune.adapters.pipeline import hf_calibration, request
    from arrayprune.adapters.pipeline import runner as pipeline

    folder, tokens = llama
    monkeypatch.setattr(pipeline, "_device", lambda spec, src: (None, []))  # "meta" is no --device spelling
    monkeypatch.setattr(request.PruneSpec, "_check_device", lambda self: None)
    seen: dict = {}

    def spy_capture(model, first, batches):  # transformers' masks cannot run on meta: inputs stand in
        seen["model"] = model
        seen["tokens"] = {v.device.type for b in batches for v in b.values()}
        seen["before"] = {p.device.type for p in model.get_input_embeddings().parameters()}
        return [(torch.zeros(1), (), {}) for _ in batches]

    def spy_replay(layer, inputs):
        seen["layer"] = {p.device.type for p in layer.parameters()}
        seen["before, at the layer"] = {p.device.type for p in seen.pop("model").get_input_embeddings().parameters()}
        raise _Reached

    monkeypatch.setattr(hf_calibration, "_capture", spy_capture)
    monkeypatch.setattr(hf_calibration, "_replay", spy_replay)
    for device in ("meta", "cpu"):
        with pytest.raises(_Reached):
            prune_file(folder, tmp_path / device, method="sparsegpt", amount=0.5, calibration=tokens, device=device)
        assert seen == {"tokens": {device}, "before": {device}, "layer": {device}, "before, at the layer": {"meta"}}
