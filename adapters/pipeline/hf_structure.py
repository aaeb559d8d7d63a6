"""Statistics for structured pruning of a Hugging Face checkpoint, decoder layer by decoder layer.

The runner of :mod:`~arrayprune.adapters.pipeline.hf_calibration` (the model built on
the ``meta`` device, the first layer's inputs captured, then one layer's weights read at a
time, its outputs the next layer's inputs), walking the layers for what ``--shrink``
ranks on calibration token ids:

* :func:`layer_changes`: per decoder layer, ``1 - cosine(input, output)`` of the
  residual stream, averaged over tokens (``--groups layers``); the dense model's
  activations;
* :func:`refit_changes`: the same once compensation counts, per layer the change of
  the stream after it when it is removed and refit into the layer before (the model as
  shrunk so far: layers skipped, refit weights in :attr:`LayerWalk.replaced`);
* :func:`router_statistics`: per mixture-of-experts layer, how many tokens chose each
  expert among their top ``num_experts_per_tok`` and the routing weight (router
  probability) they gave it (``--groups experts``); the dense model's activations;
* :func:`calibrated_units`: per layer, ``X^T X`` of the inputs of the layer that reads
  a group's units (``down_proj``, ``o_proj``, ...), handed to a callback that chooses
  the units and may refit that layer; its choice is applied before the layer's outputs
  are computed, so that layer ``l`` is calibrated on the model whose layers ``< l`` are
  already pruned (and compensated);
* :func:`absorb_removed_layers`: the model walked with some layers left out, each run of
  them refit into the kept layer before it: ``X^T X`` of the input of that layer's
  last projection into the residual stream (``down_proj``) and ``X^T F``, ``F`` what
  the run adds to the stream, handed to a callback that returns the new projection;
  later layers see the stream of the model as shrunk.

Memory: one layer's weights, the activations of one layer's inputs and outputs for all
calibration sequences, and one ``K x K`` float64 Hessian. The experts of a checkpoint
stored per expert are assembled into the fused parameters of ``transformers`` 5
(``experts.gate_up_proj``, ``experts.down_proj``) as the layer is read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from arrayprune.adapters.formats.safetensors_stream import TensorFiles
from arrayprune.adapters.pipeline.hf_calibration import (
    BATCH_ROWS,
    TOKENS_KEY,
    _arguments_per_layer,
    _buffers_to,
    _capture,
    _owner,
    _replay,
    _skeleton,
    _Weights,
    read_tokens,
)
from arrayprune.structured import residual_change

__all__ = [
    "LayerWalk",
    "absorb_removed_layers",
    "calibrated_units",
    "layer_changes",
    "RefitChanges",
    "refit_changes",
    "router_statistics",
]

#: Per-expert tensors of a checkpoint -> the fused parameter of transformers 5:
#: (fused name, the per-expert weights concatenated along their rows, in order).
_FUSED = {
    "gate_up_proj": (("w1", "w3"), ("gate_proj", "up_proj")),
    "down_proj": (("w2",), ("down_proj",)),
}


#: Module names of transformers' models that checkpoints store under another name:
#: (stored, in the model). Mixtral's sparse block is ``mlp`` in transformers 5.
_RENAMED = ((".block_sparse_moe.", ".mlp."),)


def _stored_names(name: str) -> list[str]:
    """`name` and the names a checkpoint may store it under."""
    return [name, *(name.replace(model, stored) for stored, model in _RENAMED if model in name)]


class LayerWalk:
    """The decoder layers of a checkpoint run one at a time on calibration token ids.

    Parameters
    ----------
    source : ShardedCheckpoint
        The checkpoint's tensors.
    folder : str
        Its folder (``config.json``).
    calibration : str
        A ``.npz`` of token ids (``input_ids``, optional ``attention_mask``).
    rows : int, optional
        Sequences run at a time (:data:`~arrayprune.adapters.pipeline.hf_calibration.BATCH_ROWS`).
    device : str, optional
        Where the layers run (``cpu`` by default).

    Attributes
    ----------
    prefix : str
        The layers' module list (``model.layers``).
    layers : nn.ModuleList
        The layers (parameters on ``meta`` but while one is :meth:`loaded`).
    inputs : list
        Per batch, the current layer's inputs ``(hidden, args, kwargs)``.
    masks : list
        Per batch, the attention mask of its tokens (``[batch, seq]``) or None.
    config : PretrainedConfig
    replaced : dict of str to str
        Weights read instead of the checkpoint's, by its name: ``.npy`` files of
        ``[out, in]`` (GPT-2's ``Conv1D`` is transposed as it is loaded), read as the
        layer is. Empty at first.
    """

    def __init__(self, source: Any, folder: str, calibration: str, rows: int | None = None, device: Any = None):
        import torch

        self._stack = contextlib.ExitStack()
        model, self.config = _skeleton(folder)
        from arrayprune.adapters.torch import calibration as torch_calibration

        tokens = read_tokens(calibration, int(self.config.vocab_size))
        self.prefix, self.layers = torch_calibration.layer_list(model, self.config)
        self.device = torch.device(device or "cpu")
        _buffers_to(model, self.device)
        rows = rows or BATCH_ROWS
        batches = [
            {k: torch.from_numpy(v[i : i + rows]).to(self.device) for k, v in tokens.items()}
            for i in range(0, len(tokens[TOKENS_KEY]), rows)
        ]
        self.masks = [b.get("attention_mask") for b in batches]
        self.files = self._stack.enter_context(TensorFiles())
        self.source = source
        self.weights = _Weights(source, self.files, self.device)
        output = model.get_output_embeddings()
        skip = {id(m): n for n, m in model.named_modules()}.get(id(output)) if output is not None else None
        with torch.no_grad():
            self.weights.load(model, skip=(self.prefix,) if skip is None else (self.prefix, skip))
            self.inputs = _capture(model, self.layers[0], batches)
            self.arguments = _arguments_per_layer(model, self.layers, batches)
        _Weights.free(model)
        self.index = 0
        self.replaced: dict[str, str] = {}

    def close(self) -> None:
        """Give the memory maps back."""
        self._stack.close()

    def __enter__(self) -> LayerWalk:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @contextlib.contextmanager
    def loaded(self, index: int) -> Iterator[Any]:
        """Layer `index` with its weights read (float32); freed on exit."""
        layer = self.layers[index]
        self._load(layer, f"{self.prefix}.{index}")
        try:
            yield layer
        finally:
            _Weights.free(layer)

    def _load(self, layer: Any, prefix: str) -> None:
        """The layer's parameters (float32), under the checkpoint's own names (:data:`_RENAMED`),
        fused experts assembled from per-expert tensors."""
        import torch
        from torch import nn

        for name, param in list(layer.named_parameters()):
            full = f"{prefix}.{name}"
            stored = next((n for n in _stored_names(full) if n in self.source.tensors), None)
            parent, _, leaf = full.rpartition(".")
            if stored is not None:
                t = self.source.tensors[stored]
                if tuple(t.shape) != tuple(param.shape):
                    raise ValueError(
                        f"tensor {stored!r} is {list(t.shape)} in the checkpoint, the model needs {list(param.shape)}"
                    )
                value = torch.as_tensor(self.files.load(t))
            elif leaf in _FUSED and parent.endswith(".experts"):
                value = self._assembled(parent, leaf, param)
            else:
                raise ValueError(f"the checkpoint has no tensor {full!r}, which {type(layer).__name__} needs")
            owner, leaf = _owner(layer, name)
            if stored in self.replaced:
                value = torch.from_numpy(np.load(self.replaced[stored]))
                value = value.T if type(owner).__name__ == "Conv1D" else value
            owner._parameters[leaf] = nn.Parameter(value.to(self.device, torch.float32), requires_grad=False)

    def _assembled(self, experts: str, leaf: str, param: Any) -> Any:
        import torch

        count = param.shape[0]
        for base in _stored_names(experts + "."):
            for names in _FUSED[leaf]:
                keys = [[f"{base}{e}.{n}.weight" for n in names] for e in range(count)]
                if all(k in self.source.tensors for row in keys for k in row):
                    rows = [sum(self.source.tensors[k].shape[0] for k in row) for row in keys]
                    shapes = {tuple(self.source.tensors[k].shape[1:]) for row in keys for k in row}
                    if set(rows) != {param.shape[1]} or shapes != {tuple(param.shape[2:])}:
                        raise ValueError(f"the experts of {experts!r} do not stack to {list(param.shape)}")
                    stacked = torch.empty(tuple(param.shape), dtype=torch.float32)  # filled in place, one at a time
                    for e, row in enumerate(keys):
                        start = 0
                        for k in row:
                            t = self.source.tensors[k]
                            stacked[e, start : start + t.shape[0]] = torch.as_tensor(self.files.load(t))
                            start += t.shape[0]
                    return stacked
        raise ValueError(f"the checkpoint has no tensor {experts + '.' + leaf!r} nor its experts one by one")

    def module(self, layer: Any, index: int, key: str) -> Any:
        """The module of `layer` (number `index`) whose weight the checkpoint names `key`."""
        inner = key.removeprefix(f"{self.prefix}.{index}.").removesuffix(".weight")
        for stored, model in _RENAMED:
            inner = ("." + inner).replace(stored, model)[1:]
        return layer.get_submodule(inner)

    def outputs(self, layer: Any) -> list[Any]:
        """The layer's outputs (hidden states) for every batch."""
        replay = _replay(layer, self.inputs)
        return [replay(i) for i in range(len(self.inputs))]

    def advance(self, outputs: Sequence[Any]) -> None:
        """The next layer's inputs: `outputs`, with that layer's own other arguments (its attention mask)."""
        self.index += 1
        if self.arguments is not None and self.index < len(self.layers):
            self.inputs = [(h, *self.arguments[self.index][b]) for b, h in enumerate(outputs)]
            return
        self.inputs = [(h, args, kwargs) for h, (_, args, kwargs) in zip(outputs, self.inputs, strict=True)]


class _Stop(Exception):
    """Raised by the last stub: nothing after the layers is run."""


def _progress(hooks: Any, n: int) -> Any:
    return range(n) if hooks is None else hooks.progress(list(range(n)), "layers", "layer")


def layer_changes(walk: LayerWalk, hooks: Any = None) -> np.ndarray:
    """Per layer, the mean over calibration tokens of ``1 - cosine(input, output)`` (float64).

    The dense model's residual stream: each layer's inputs are the outputs of the dense
    layers before it.
    """
    import torch

    out = np.zeros(len(walk.layers))
    with torch.no_grad():
        for i in _progress(hooks, len(walk.layers)):
            with walk.loaded(i) as layer:
                outputs = walk.outputs(layer)
            out[i] = _mean_change([hidden for hidden, _, _ in walk.inputs], outputs, walk.masks)
            walk.advance(outputs)
    return out


def _mean_change(before: Sequence[Any], after: Sequence[Any], masks: Sequence[Any]) -> float:
    """Mean over the counted tokens of all batches of ``1 - cosine(before, after)``, read back once."""
    total, count = 0.0, 0.0
    for a, b, mask in zip(before, after, masks, strict=True):
        s, n = residual_change(a.double(), b.double(), mask)
        total, count = total + s, count + n
    return float(total) / max(float(count), 1.0)


class RefitChanges(NamedTuple):
    """What :func:`refit_changes` finds.

    Attributes
    ----------
    scores : ndarray
        Per layer, float64; NaN for the layers skipped.
    lowest : tuple or None
        For the layer of lowest score, if it was refit: ``(p, weight name, weight)``, the
        projection of the layer ``p`` run before it as refit to absorb it (``[out, in]``,
        float64, on the walk's device).
    failed : list of int
        The layers of `probed` whose projection failed the check (not refit into).
    """

    scores: np.ndarray
    lowest: tuple[int, str, Any] | None
    failed: list[int]


def refit_changes(
    walk: LayerWalk,
    writers: Mapping[int, str],
    refit: Callable[[int, Any, Any, Any], Any],
    hooks: Any = None,
    *,
    probed: Container[int] = (),
    skip: Container[int] = (),
    start: int = 0,
    stop: int | None = None,
) -> RefitChanges:
    """Per layer, the mean over calibration tokens of ``1 - cosine`` between the stream after
    it and the stream once it is removed and refit into the layer before (float64).

    The score of :func:`layer_changes` once compensation counts: layer ``i`` is left out
    and what it adds is refit into the projection ``writers[p]`` of the layer ``p`` run
    before it (as :func:`absorb_removed_layers` does, with `refit`), and the stream that
    ``p`` then gives is compared with the one after ``i``. A layer with no layer before it,
    or whose layer before fails the check of `probed`, is compared as it is left out.

    Parameters
    ----------
    walk : LayerWalk
        The model: its checkpoint, with the weights of ``walk.replaced``.
    writers, refit, hooks, probed
        As for :func:`absorb_removed_layers`.
    skip : container of int
        Layers not run (removed already): the stream goes past them, they get no score.
    start, stop : int, optional
        Only the layers ``start <= i < stop`` are scored; those before `start` are run
        (the stream reaches `start`), those from `stop` on are not.

    Returns
    -------
    RefitChanges

    Notes
    -----
    Each layer after the first costs two more runs of the layer before it (and one
    ``X^T X`` of its projection's inputs).
    """
    import torch

    out = np.full(len(walk.layers), np.nan)
    lowest: tuple[int, str, Any] | None = None
    best = np.inf
    pending: tuple[int, list[Any], list[Any]] | None = None  # the layer run before, if it can absorb
    buffers: list[Any] = []  # the sums of `_absorbed`, reused from layer to layer
    failed: list[int] = []
    end = len(walk.layers) if stop is None else min(stop, len(walk.layers))
    with torch.no_grad():
        for i in _progress(hooks, end):
            if i in skip:
                walk.advance([hidden for hidden, _, _ in walk.inputs])
                continue
            with walk.loaded(i) as layer:
                outputs = walk.outputs(layer)
                mine = _absorber(walk, layer, i, outputs, writers, probed, failed)
            if i >= start:
                new = None
                if pending is None:
                    without = [hidden for hidden, _, _ in walk.inputs]
                else:
                    without, new = _absorbed(walk, pending, outputs, writers[pending[0]], refit, buffers)
                out[i] = _mean_change(without, outputs, walk.masks)
                if out[i] < best:  # the first of equal scores stays the lowest, as for argmin
                    best = out[i]
                    lowest = None if pending is None else (pending[0], writers[pending[0]], new)
            pending = mine
            walk.advance(outputs)
    return RefitChanges(out, lowest, failed)


def router_statistics(
    walk: LayerWalk, routers: Mapping[int, str], top_k: int, hooks: Any = None
) -> dict[int, tuple[np.ndarray, np.ndarray, int]]:
    """Per mixture-of-experts layer: (tokens choosing each expert, their routing weights summed, tokens).

    Parameters
    ----------
    walk : LayerWalk
    routers : mapping of int to str
        Layer index -> the router's weight name (``model.layers.0.block_sparse_moe.gate.weight``).
    top_k : int
        ``num_experts_per_tok``.

    Returns
    -------
    dict
        Layer index -> ``(counts, weight_sums, tokens)``: ``counts[e]`` tokens had
        expert ``e`` among their ``top_k`` by router probability, ``weight_sums[e]`` the
        sum of those probabilities (float64); padding tokens are not counted.
    """
    import torch

    stats: dict[int, tuple[np.ndarray, np.ndarray, int]] = {}
    with torch.no_grad():
        for i in _progress(hooks, len(walk.layers)):
            with walk.loaded(i) as layer:
                if i not in routers:
                    walk.advance(walk.outputs(layer))
                    continue
                router = walk.module(layer, i, routers[i])
                logits: list[Any] = []

                def grab(module: Any, args: Any, output: Any, logits: list = logits) -> None:
                    logits.append(output[0] if isinstance(output, (tuple, list)) else output)

                handle = router.register_forward_hook(grab)
                try:
                    outputs = walk.outputs(layer)
                finally:
                    handle.remove()
            experts = int(logits[0].shape[-1])
            counts, sums, tokens = np.zeros(experts, np.int64), np.zeros(experts), 0
            for batch_logits, mask in zip(logits, walk.masks, strict=True):
                probs = torch.softmax(batch_logits.double().reshape(-1, experts), dim=-1)
                if mask is not None:
                    probs = probs[mask.reshape(-1) > 0]
                value, index = torch.topk(probs, top_k, dim=-1)
                chosen, weights = index.reshape(-1).cpu().numpy(), value.reshape(-1).cpu().numpy()
                counts += np.bincount(chosen, minlength=experts)
                sums += np.bincount(chosen, weights=weights, minlength=experts)
                tokens += int(probs.shape[0])
            stats[i] = (counts, sums, tokens)
            walk.advance(outputs)
    return stats


def calibrated_units(
    walk: LayerWalk,
    consumers: Mapping[int, str],
    decide: Callable[[int, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
    hooks: Any = None,
) -> None:
    """Per layer, the Hessian of a consumer's inputs, the units chosen by `decide`, applied in turn.

    Parameters
    ----------
    walk : LayerWalk
    consumers : mapping of int to str
        Layer index -> the weight name of the layer reading the units
        (``model.layers.0.mlp.down_proj.weight``): a ``Linear`` (``[out, in]``) or
        GPT-2's ``Conv1D`` (``[in, out]``).
    decide : callable
        ``decide(index, weight, hessian) -> (kept units, new weight)``: `weight` the
        consumer's ``[out, in]`` (float64), `hessian` ``X^T X`` of its inputs over the
        calibration tokens (float64, padding left out); the new weight ``[out, in]``
        (dropped columns zero) replaces it before the layer's outputs are computed.
    """
    import torch

    with torch.no_grad():
        for i in _progress(hooks, len(walk.layers)):
            with walk.loaded(i) as layer:
                module = walk.module(layer, i, consumers[i])
                transposed = type(module).__name__ == "Conv1D"
                weight = module.weight.detach().double()
                weight = weight.T if transposed else weight
                k = weight.shape[1]
                hessian = torch.zeros((k, k), dtype=torch.float64, device=walk.device)
                current = [0]

                def grab(mod: Any, args: Any, current: list = current, hessian: Any = hessian, k: int = k) -> None:
                    x = args[0].double().reshape(-1, k)
                    mask = walk.masks[current[0]]
                    if mask is not None:
                        x = x[mask.reshape(-1) > 0]
                    hessian.add_(x.T @ x)

                handle = module.register_forward_pre_hook(grab)
                replay = _replay(layer, walk.inputs)
                try:
                    for b in range(len(walk.inputs)):
                        current[0] = b
                        replay(b)
                finally:
                    handle.remove()
                _, new = decide(i, weight.cpu().numpy(), hessian.cpu().numpy())
                value = torch.from_numpy(np.ascontiguousarray(new.T if transposed else new)).to(module.weight)
                module.weight.copy_(value)
                outputs = walk.outputs(layer)
            walk.advance(outputs)


def absorb_removed_layers(
    walk: LayerWalk,
    removed: Sequence[int],
    writers: Mapping[int, str],
    refit: Callable[[int, Any, Any, Any], Any],
    hooks: Any = None,
    *,
    probed: Container[int] = (),
) -> list[int]:
    """Walk the layers with `removed` left out, each run of them refit into the layer before it.

    Parameters
    ----------
    walk : LayerWalk
    removed : sequence of int
        The layers removed.
    writers : mapping of int to str
        For the kept layer ``p`` right before a run of removed layers, the weight name of
        its last projection into the residual stream (``model.layers.1.mlp.down_proj.weight``;
        a ``Linear`` or GPT-2's ``Conv1D``). A run with no entry (one at the start of the
        model) is left out without a refit.
    refit : callable
        ``refit(p, weight, hessian, cross) -> new weight``, float64 tensors on the walk's
        device: `weight` the projection's ``[out, in]``, `hessian` ``X^T X`` of its inputs,
        `cross` ``X^T F`` (``[in, out]``), ``F`` the change of the residual stream over the
        run, on the calibration tokens (padding left out). `hessian` is the callback's to
        overwrite.
    probed : container of int
        Layers whose projection should be the last thing before the residual add (an MLP's
        ``down_proj``). Each is checked first: a small change ``D`` of its weight must change
        the layer's output on the first batch by ``X D^T``. A layer that fails (a norm after
        the projection, as Gemma 2 has) is not refit, and its run is left out as it is.

    Returns
    -------
    list of int
        The layers of `probed` that failed, not refit.

    Notes
    -----
    Sequential: layer ``p``'s inputs come from the model already shrunk before it, the run
    is applied to ``p``'s outputs to give ``F``, and once ``p`` is refit it is run again
    with its new weight, whose outputs feed the layers after the run. Layers after the last
    removed one are not run.
    """
    import torch

    gone = set(removed)
    failed: list[int] = []
    pending: tuple[int, list[Any], list[Any]] | None = None  # p, its inputs, its outputs
    with torch.no_grad():
        for i in _progress(hooks, max(gone) + 1):
            if i in gone and pending is None:  # a run with no layer before it: left out as it is
                walk.advance([hidden for hidden, _, _ in walk.inputs])
                continue
            with walk.loaded(i) as layer:
                outputs = walk.outputs(layer)
                pending = _absorber(walk, layer, i, outputs, writers, probed, failed) or pending
            if pending is not None and i in gone and i + 1 not in gone:
                outputs, _ = _absorbed(walk, pending, outputs, writers[pending[0]], refit)
                pending = None
            walk.advance(outputs)
    return failed


def _matrix(module: Any) -> Any:
    """A projection's weight as ``[out, in]``, float64 (GPT-2's ``Conv1D`` stores ``[in, out]``)."""
    weight = module.weight.detach().double()
    return weight.T if type(module).__name__ == "Conv1D" else weight


def _absorber(
    walk: LayerWalk,
    layer: Any,
    i: int,
    outputs: list[Any],
    writers: Mapping[int, str],
    probed: Container[int],
    failed: list[int],
) -> tuple[int, list[Any], list[Any]] | None:
    """Layer `i` (loaded, run) as a layer to refit into: ``(i, its inputs, its outputs)``,
    or None if it has no writer or its writer fails the check of `probed` (noted in `failed`)."""
    if i not in writers:
        return None
    if i in probed and not _adds_as_it_is(walk, layer, walk.module(layer, i, writers[i]), outputs[0]):
        failed.append(i)
        return None
    return i, list(walk.inputs), outputs


def _adds_as_it_is(walk: LayerWalk, layer: Any, module: Any, output: Any) -> bool:
    """Whether a change ``D`` of `module`'s weight changes `layer`'s output on batch 0 by ``X D^T``."""
    import torch

    weight = module.weight
    kept = weight.detach().clone()
    generator = torch.Generator().manual_seed(0)
    change = torch.randn(tuple(weight.shape), generator=generator).to(weight) * 0.01 * weight.abs().mean()
    xs: list[Any] = []
    handle = module.register_forward_pre_hook(lambda mod, args: xs.append(args[0]))
    weight.add_(change)
    try:
        moved = _replay(layer, walk.inputs)(0)
    finally:
        handle.remove()
        weight.copy_(kept)
    step = change.T if type(module).__name__ == "Conv1D" else change  # [out, in]
    expected = xs[0].double() @ step.double().T
    return bool(torch.linalg.norm((moved - output).double() - expected) <= 0.01 * torch.linalg.norm(expected))


def _absorbed(
    walk: LayerWalk, pending: tuple, outputs: list[Any], writer: str, refit: Callable, buffers: list[Any] | None = None
) -> tuple[list[Any], Any]:
    """The stream after a run of removed layers once it is refit into the layer before, and
    the refit weight (``[out, in]``).

    That layer is run again on its inputs: once as it is, its projection's inputs ``X``
    summed into ``X^T X`` and ``X^T F`` batch by batch (none kept), then with the refit
    weight, whose outputs feed the layers after the run. `buffers`, if given, keeps the
    two sums between calls of one shape (zeroed here), sparing their allocation.
    """
    import torch

    p, inputs, start = pending
    with walk.loaded(p) as layer:
        module = walk.module(layer, p, writer)
        weight = _matrix(module)
        out, k = weight.shape
        shapes = [(k, k), (k, out)]  # X^T X, X^T F
        if buffers and [tuple(b.shape) for b in buffers] == shapes:
            sums = [b.zero_() for b in buffers]
        else:
            sums = [torch.zeros(shape, dtype=torch.float64, device=walk.device) for shape in shapes]
            if buffers is not None:
                buffers[:] = sums
        batch = [0]

        def add(mod: Any, args: Any) -> None:
            b = batch[0]
            rows = args[0].double().reshape(-1, k)
            change = (outputs[b] - start[b]).double().reshape(-1, out)
            mask = walk.masks[b]
            if mask is not None:
                counted = mask.reshape(-1) > 0
                rows, change = rows[counted], change[counted]
            sums[0].add_(rows.T @ rows)
            sums[1].add_(rows.T @ change)

        replay = _replay(layer, inputs)
        handle = module.register_forward_pre_hook(add)
        try:
            for b in range(len(inputs)):
                batch[0] = b
                replay(b)
        finally:
            handle.remove()
        new = refit(p, weight, *sums)
        sums.clear()  # the Hessian goes before the layer runs again (unless kept in `buffers`)
        module.weight.copy_(new.T if type(module).__name__ == "Conv1D" else new)
        return [replay(b) for b in range(len(inputs))], new
