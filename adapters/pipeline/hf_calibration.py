"""Calibrating a Hugging Face checkpoint decoder layer by decoder layer: SparseGPT and Wanda.

``arrayprune prune FOLDER -o OUT --method sparsegpt --calibration tokens.npz`` (or
``--method wanda``) on a Hugging Face folder (``config.json`` beside safetensors weights,
sharded or not) runs the model through :mod:`transformers` as the SparseGPT and Wanda
papers do for language models:

1. the model is built from ``config.json`` with its parameters on the ``meta`` device
   (no memory); only what runs before the first decoder layer (embeddings) is read from
   the shards, and the first layer's inputs are captured for every calibration batch
   (hidden states, and the attention mask and position embeddings as the model passes
   them), stopping each forward there;
2. for each decoder layer in turn: its weights alone are read from the shards (float32),
   the layer is pruned (:func:`arrayprune.adapters.torch.sparsegpt` on the layer, run on
   the captured inputs, sequential over its ``Linear`` layers in the order data flows;
   or Wanda's masks from the input norms of this layer's inputs), its outputs computed
   with the pruned weights become the next layer's inputs, and its pruned weights are
   set aside in a temporary folder (in their stored dtype) and freed;
3. the checkpoint's streaming writer then writes every tensor, the pruned weights from
   that folder and all others copied bit for bit.

Memory: the calibration activations of one layer's inputs and outputs (``batch x seq x
hidden``, float32), one decoder layer's weights and its Hessians, the embeddings.
``--one-pass`` computes every layer's inputs with the layers before it left dense.

No remote code is run (``trust_remote_code`` is never set): the architecture is one of
:mod:`transformers`' own classes.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from arrayprune.adapters import mapping as mp
from arrayprune.adapters.formats.safetensors_stream import TensorFiles
from arrayprune.adapters.pipeline.calibration import read_calibration
from arrayprune.adapters.pipeline.errors import optional_module
from arrayprune.adapters.pipeline.method_names import reconstructs
from arrayprune.adapters.pipeline.request import PruneSpec

__all__ = ["BATCH_ROWS", "TOKENS_KEY", "calibrate_checkpoint", "hf_folder", "read_tokens", "token_problems"]

#: The key of the token ids in the calibration file: ``[batch, seq]`` integers.
TOKENS_KEY = "input_ids"

#: Calibration sequences run at a time, unless told otherwise (``--calibration-batch``).
BATCH_ROWS = 8

_EXTRA = "transformers"


def hf_folder(src: str) -> str | None:
    """The folder of `src` (a checkpoint folder, its index or a safetensors file) if it holds a ``config.json``."""
    folder = src if os.path.isdir(src) else os.path.dirname(os.path.abspath(src))
    return folder if os.path.isfile(os.path.join(folder, "config.json")) else None


def read_tokens(path: str, vocab_size: int) -> dict[str, np.ndarray]:
    """Token ids (and an optional attention mask) from a calibration ``.npz``.

    Parameters
    ----------
    path : str
        ``input_ids`` ``[batch, seq]`` integers in ``[0, vocab_size)``; optionally
        ``attention_mask`` of the same shape (0 and 1).
    vocab_size : int
        The model's vocabulary size (``config.json``).

    Returns
    -------
    dict of str to ndarray
        ``input_ids`` (int64), and ``attention_mask`` (int64) if given.

    Raises
    ------
    ValueError
        One line naming what is wrong.
    """

    arrays = read_calibration(path)
    problems = token_problems(arrays, vocab_size)
    if problems:
        raise ValueError(problems[0])
    ids = arrays[TOKENS_KEY]
    out = {TOKENS_KEY: ids.astype(np.int64)}
    if "attention_mask" in arrays:
        out["attention_mask"] = arrays["attention_mask"].astype(np.int64)
    return out


def token_problems(arrays: Mapping[str, np.ndarray], vocab_size: int | None) -> list[str]:
    """Every problem of calibration `arrays` as token ids of a model, one line each.

    Parameters
    ----------
    arrays : mapping of str to ndarray
        The arrays of the calibration file (:func:`~arrayprune.adapters.pipeline.calibration.read_calibration`).
    vocab_size : int or None
        The model's vocabulary size (``config.json``); None: the range is not checked.

    Returns
    -------
    list of str
        Empty if the arrays are token ids (and an attention mask) the model takes.
    """
    problems = []
    if TOKENS_KEY not in arrays:  # what it holds instead is named here (a misspelt key)
        return [
            f"a Hugging Face model is calibrated on token ids: the file needs {TOKENS_KEY!r} ([batch, seq] integers), "
            f"it holds {', '.join(sorted(arrays))}"
        ]
    extra = sorted(set(arrays) - {TOKENS_KEY, "attention_mask"})
    if extra:
        problems.append(
            f"unexpected array {extra[0]!r} in the calibration file (only input_ids and attention_mask)"
            if len(extra) == 1
            else f"unexpected arrays {', '.join(map(repr, extra))} in the calibration file "
            "(only input_ids and attention_mask)"
        )
    ids = arrays[TOKENS_KEY]
    if ids.ndim != 2 or ids.dtype.kind not in "iu" or ids.shape[1] == 0:
        problems.append(f"{TOKENS_KEY!r} must be [batch, seq] integers, got {ids.dtype} of shape {list(ids.shape)}")
        return problems
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or (vocab_size is not None and high >= vocab_size):
        bound = f"[0, {vocab_size}) (the model's vocab_size)" if vocab_size is not None else "non-negative"
        problems.append(f"token ids must be in {bound}; {TOKENS_KEY!r} holds {low}..{high}")
    mask = arrays.get("attention_mask")
    if mask is not None and (mask.shape != ids.shape or not np.isin(mask, (0, 1)).all()):
        problems.append(f"'attention_mask' must be 0 and 1 of the shape of {TOKENS_KEY!r} {list(ids.shape)}")
    return problems


class _Stop(Exception):
    """Raised by the hook that captures the first layer's inputs: the rest is not run."""


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the ``meta`` device (buffers stay real)."""
    from torch import nn

    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: Any) -> None:
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=False)
        original(module, name, param)

    nn.Module.register_parameter = register  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def _skeleton(folder: str) -> tuple[Any, Any]:
    """The model of `folder`'s ``config.json`` with empty (meta) parameters, and the config."""

    transformers = optional_module("transformers", _EXTRA, "--calibration on a Hugging Face checkpoint")
    try:
        config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    except Exception as exc:  # transformers raises many kinds; shown as one line
        raise ValueError(f"config.json cannot be read by transformers: {_first_line(exc)}") from None
    names = getattr(config, "architectures", None) or []
    cls = getattr(transformers, names[0], None) if names else None
    if cls is None:
        raise ValueError(
            f"config.json names no architecture of transformers ({names[0] if names else 'architectures is empty'}); "
            "remote code is not run"
        )
    config.use_cache = False
    with _parameters_on_meta():
        try:
            model = cls(config)
        except Exception as exc:
            raise ValueError(f"cannot build {cls.__name__} from config.json: {_first_line(exc)}") from None
    return model.eval(), config


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


class _Weights:
    """Reads a module's parameters from the checkpoint (float32) and gives their memory back."""

    def __init__(self, source: Any, files: Any, device: Any = "cpu"):
        self.source, self.files, self.device = source, files, device

    def load(self, module: Any, prefix: str = "", skip: tuple[str, ...] = ()) -> None:
        """Read `module`'s parameters (named `prefix`.name in the checkpoint), but those under `skip`."""
        import torch
        from torch import nn

        for name, param in list(module.named_parameters()):
            full = f"{prefix}.{name}" if prefix else name
            if any(full.startswith(s + ".") for s in skip):
                continue
            stored = self.source.tensors.get(full)
            if stored is None:
                raise ValueError(f"the checkpoint has no tensor {full!r}, which {type(module).__name__} needs")
            if tuple(stored.shape) != tuple(param.shape):
                raise ValueError(
                    f"tensor {full!r} is {list(stored.shape)} in the checkpoint, the model needs {list(param.shape)}"
                )
            value = torch.as_tensor(self.files.load(stored)).to(self.device, torch.float32)
            owner, leaf = _owner(module, name)
            owner._parameters[leaf] = nn.Parameter(value, requires_grad=False)

    @staticmethod
    def free(module: Any) -> None:
        """Give the memory of `module`'s parameters back (they are on ``meta`` again)."""
        import torch
        from torch import nn

        for name, param in list(module.named_parameters()):
            owner, leaf = _owner(module, name)
            owner._parameters[leaf] = nn.Parameter(torch.empty(param.shape, device="meta"), requires_grad=False)


def _buffers_to(model: Any, device: Any) -> None:
    """Move the buffers of `model` (rotary frequencies, position ids: real, unlike its ``meta``
    parameters) to `device`, where the layers will run."""
    for module in model.modules():
        for name, buffer in list(module._buffers.items()):
            if buffer is not None and buffer.device != device:
                module._buffers[name] = buffer.to(device)


def _owner(module: Any, name: str) -> tuple[Any, str]:
    *path, leaf = name.split(".")
    for part in path:
        module = getattr(module, part)
    return module, leaf


def _replay(layer: Any, inputs: list[tuple[Any, tuple, dict]]) -> Any:
    """A module holding `layer` as ``layer``, whose forward of ``i`` runs it on the inputs of batch ``i``."""
    from torch import nn

    class Replay(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = layer

        def forward(self, i: Any) -> Any:
            hidden, args, kwargs = inputs[int(i)]
            out = self.layer(hidden, *args, **kwargs)
            return out[0] if isinstance(out, (tuple, list)) else out

    return Replay()


def _targets_by_layer(targets: list[Any], prefix: str, count: int, layers: Any) -> list[dict[str, Any]]:
    """For each layer, its targets: module name inside the layer -> plan entry (checked)."""
    from torch import nn

    from arrayprune.adapters.torch.calibration import is_transposed_linear

    per_layer: list[dict[str, Any]] = [{} for _ in range(count)]
    for entry in targets:
        head, _, rest = entry.name.partition(prefix + ".") if prefix else ("", "", entry.name)
        index, _, inner = rest.partition(".")
        module_name, _, leaf = inner.rpartition(".")
        if head or not index.isdigit() or int(index) >= count or leaf != "weight":
            raise ValueError(
                f"{entry.name!r} is not a weight of the model's layers ({prefix}.N): calibrated layer by layer, "
                "only those are pruned (leave it with --exclude)"
            )
        module = dict(layers[int(index)].named_modules()).get(module_name)
        if not isinstance(module, nn.Linear) and not is_transposed_linear(module):
            raise ValueError(
                f"{entry.name!r} is the weight of a {type(module).__name__}: calibrated layer by layer, "
                "the Linear (and GPT-2's Conv1D) layers are pruned (leave it with --exclude)"
            )
        per_layer[int(index)][module_name] = entry
    return per_layer


def _stored(value: Any, code: str) -> np.ndarray:
    """A float32 torch tensor as the raw entries of safetensors dtype `code`."""
    import torch

    value = value.cpu()
    if code == "BF16":
        return value.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint16)
    return value.numpy().astype({"F16": np.float16, "F32": np.float32, "F64": np.float64}[code])


def calibrate_checkpoint(
    storage: Any,
    targets: list[Any],
    spec: PruneSpec,
    hooks: Any,
    workdir: str,
    method_for: Callable[[Any, Any, Mapping, Any], tuple[Any, Any]],
    *,
    recorded: dict[str, np.ndarray] | None = None,
) -> dict[str, Callable[[], np.ndarray]]:
    """Prune the targets of a Hugging Face checkpoint layer by layer; their pruned entries, set aside.

    Parameters
    ----------
    storage : StreamedCheckpoint
        The checkpoint (its ``source`` reads the shards; its folder holds ``config.json``).
    targets : list of PlanEntry
        The weights to prune: ``Linear`` weights of the model's layers.
    spec : PruneSpec
        The checked request: ``method`` ``"sparsegpt"`` (``amount`` or ``nm``, ``one_pass``)
        or a method ranking by Wanda's scores; ``calibration`` (token ids),
        ``calibration_batch``.
    hooks : Hooks
        Told of the stages; ``progress`` wraps the loop over layers.
    workdir : str
        A temporary folder for the pruned weights (removed by the caller).
    method_for : callable
        ``method_for(entry, spec, norms, value)``: the pipeline's mask method of an entry
        and the importance scores it ranks `value` by (Wanda's).
    recorded : dict, optional
        Prune nothing: every target's input norms (float64, of the dense model's
        activations) go into it, by name, and nothing is set aside (a method ranking
        by Wanda's scores).

    Returns
    -------
    dict of str to callable
        Weight name -> a function returning its pruned entries (raw, flat, its stored dtype).

    Raises
    ------
    ValueError
        Bad token ids, a model transformers cannot build, a target outside the layers.
    """
    import torch

    import arrayprune.adapters.torch as prune
    from arrayprune.adapters.torch import calibration as torch_calibration
    from arrayprune.adapters.torch import reconstruction

    folder = hf_folder(storage.src)
    if folder is None:
        raise ValueError("--calibration on a safetensors checkpoint runs it with transformers: config.json is missing")
    model, config = _skeleton(folder)
    tokens = read_tokens(spec.calibration, int(config.vocab_size))
    prefix, layers = torch_calibration.layer_list(model, config)
    per_layer = _targets_by_layer(targets, prefix, len(layers), layers)
    rows = spec.calibration_batch or BATCH_ROWS
    device = torch.device(spec.device or "cpu")
    _buffers_to(model, device)
    batches = [
        {k: torch.from_numpy(v[i : i + rows]).to(device) for k, v in tokens.items()}
        for i in range(0, len(tokens[TOKENS_KEY]), rows)
    ]
    reconstructing = reconstructs(spec.method) and recorded is None
    out: dict[str, Callable[[], np.ndarray]] = {}
    with TensorFiles() as files, torch.no_grad():
        weights = _Weights(storage.source, files, device)
        output = model.get_output_embeddings()
        skip = {id(m): n for n, m in model.named_modules()}.get(id(output)) if output is not None else None
        hooks.stage(f"{spec.method}: reading what runs before {prefix}.0")
        weights.load(model, skip=(prefix,) if skip is None else (prefix, skip))
        inputs = _capture(model, layers[0], batches)
        arguments = _arguments_per_layer(model, layers, batches)  # each layer's own mask (sliding windows)
        _Weights.free(model)  # what ran before the layers: only one decoder layer is resident from here on
        how = "each on the dense layers' outputs" if spec.one_pass else "each on the pruned layers' outputs"
        hooks.stage(
            f"{spec.method}: {len(tokens[TOKENS_KEY])} calibration sequences through {len(layers)} layers of "
            f"{type(model).__name__}, one at a time, {how}"
        )
        for index in hooks.progress(list(range(len(layers))), "layers", "layer"):
            layer = layers[index]
            if arguments is not None:
                inputs = [(hidden, *arguments[index][b]) for b, (hidden, _, _) in enumerate(inputs)]
            weights.load(layer, f"{prefix}.{index}")
            chosen = per_layer[index]
            replay = _replay(layer, inputs)
            steps = [torch.tensor(i) for i in range(len(inputs))]
            dense = [replay(i) for i in steps] if spec.one_pass else None
            pruned: list[Any] = []  # the outputs of the pruned layer, as its sequential calibration ends
            if chosen:
                names = [f"layer.{m}" for m in chosen]
                if reconstructing:
                    kwargs = _amounts(spec, chosen)
                    try:
                        reconstruction.reconstruct(
                            replay, steps, modules=names, sequential=not spec.one_pass, method=spec.method,
                            outputs=None if spec.one_pass else pruned, **kwargs,
                        )  # fmt: skip
                    except ValueError as exc:  # named by the checkpoint's names, not the replay's
                        raise ValueError(str(exc).replace("'layer.", f"'{prefix}.{index}.")) from None
                    for module_name in chosen:
                        prune.remove(layer.get_submodule(module_name), "weight")
                else:
                    norms = torch_calibration.input_norms(replay, steps, modules=names)
                    for module_name, entry in chosen.items():
                        module = layer.get_submodule(module_name)
                        vector = norms[f"layer.{module_name}.weight"].to("cpu", torch.float64).numpy()
                        if recorded is not None:
                            recorded[entry.name] = vector
                            continue
                        _mask_in_place(module, entry, spec, vector, method_for)
                for module_name, entry in chosen.items() if recorded is None else ():
                    path = os.path.join(workdir, f"{len(out)}.npy")
                    np.save(path, _stored(layer.get_submodule(module_name).weight.detach(), entry.value.code))
                    out[entry.name] = _reader(path)
            outputs = dense if dense is not None else pruned or [replay(i) for i in steps]
            inputs = [(h, args, kwargs) for h, (_, args, kwargs) in zip(outputs, inputs, strict=True)]
            _Weights.free(layer)
    return out


def _amounts(spec: PruneSpec, chosen: Mapping[str, Any]) -> dict[str, Any]:
    """The pattern or amount arguments of :func:`~arrayprune.adapters.torch.reconstruction.sparsegpt`
    for the modules `chosen` of one layer (named ``layer.<module>`` there): N:M, one amount,
    or each weight's own under an allocation (``spec.amount`` maps weight names to amounts)."""
    if spec.nm is not None:
        return {"n": spec.nm[0], "m": spec.nm[1]}
    if isinstance(spec.amount, Mapping):
        return {"amount": {f"layer.{module}": spec.amount[entry.name] for module, entry in chosen.items()}}
    return {"amount": spec.amount}


def _mask_in_place(module: Any, entry: Any, spec: PruneSpec, norms: np.ndarray, method_for: Callable) -> None:
    """Prune `module.weight` with the pipeline's Wanda-scored method of `entry`."""
    import torch

    weight = module.weight.detach().cpu().numpy()
    method, scores = method_for(entry, spec, {entry.name: norms}, weight)
    folded = mp.remove(mp.prune({"t": weight}, "t", method, scores), "t")["t"]
    module.weight.copy_(torch.from_numpy(np.asarray(folded)))


def _reader(path: str) -> Callable[[], np.ndarray]:
    return lambda: np.load(path, mmap_mode="r").reshape(-1)


def _capture(model: Any, first: Any, batches: list[dict[str, Any]]) -> list[tuple[Any, tuple, dict]]:
    """The first layer's inputs for every batch: (hidden states, other arguments, keywords)."""
    captured: list[tuple[Any, tuple, dict]] = []

    def grab(module: Any, args: tuple, kwargs: dict) -> None:
        if args:
            hidden, rest = args[0], tuple(args[1:])
        else:
            kwargs = dict(kwargs)
            hidden, rest = kwargs.pop("hidden_states"), ()
        captured.append((hidden, rest, dict(kwargs)))
        raise _Stop

    handle = first.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        for batch in batches:
            try:
                model(**batch, use_cache=False)
            except _Stop:
                continue
            raise ValueError(f"{type(model).__name__} never called its first layer")
    finally:
        handle.remove()
    return captured


def _arguments_per_layer(model: Any, layers: Any, batches: list[dict[str, Any]]) -> list[list[tuple]] | None:
    """Per layer and batch, the arguments other than the hidden states the model passes it.

    Models whose layers differ in kind (sliding-window and full attention, ``layer_types``)
    pass each layer its own attention mask. The layers are replaced by stubs that record
    their arguments and hand the hidden states on; None where the model cannot run so.
    """
    from torch import nn

    class Stub(nn.Module):
        """Stands in for a decoder layer: records its other arguments, hands the hidden states on."""

        def __init__(self, layer: Any, index: int, last: bool):
            super().__init__()
            self.index, self.last = index, last
            for name, value in vars(layer).items():  # what the model reads of its layers (attention_type, ...)
                if not name.startswith("_") and name != "training" and isinstance(value, (str, int, bool)):
                    setattr(self, name, value)

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            hidden = args[0] if args else kwargs.pop("hidden_states")
            seen.setdefault(self.index, []).append((tuple(args[1:]), dict(kwargs)))
            if self.last:
                raise _Stop
            return hidden

    seen: dict[int, list] = {}
    originals = list(layers)
    try:
        for i, layer in enumerate(originals):
            layers._modules[str(i)] = Stub(layer, i, i == len(originals) - 1)
        for batch in batches:
            try:
                model(**batch, use_cache=False)
            except _Stop:
                continue
            return None
    except Exception:  # a model that reads more of its layers than the stubs hold: the first layer's arguments
        return None
    finally:
        for i, layer in enumerate(originals):
            layers._modules[str(i)] = layer
    if sorted(seen) != list(range(len(originals))) or any(len(v) != len(batches) for v in seen.values()):
        return None
    return [seen[i] for i in range(len(originals))]


@contextlib.contextmanager
def workdir_beside(dst: str) -> Iterator[str]:
    """A temporary folder next to `dst` (same disk), removed on exit."""
    parent = os.path.dirname(os.path.abspath(dst))
    with tempfile.TemporaryDirectory(prefix=".arrayprune-layers-", dir=parent) as path:
        yield path
