"""Evaluating a Hugging Face causal language model on token ids, layer by layer: ``arrayprune eval``.

``arrayprune eval MODEL --tokens tokens.npz [--compare DENSE]`` measures a folder
(``config.json`` beside safetensors weights, sharded or not) as a language model:

* ``loss``: the mean next-token cross-entropy (natural log) over every predicted token,
  and ``perplexity``, its exponential. Position ``t`` predicts token ``t + 1``; with an
  ``attention_mask``, a prediction counts where both positions are 1. The tokens of all
  sequences are pooled (a token-weighted mean, as one forward over every row would give).
* with ``--compare DENSE`` (the model it was pruned from): ``kl_to_dense``, the mean over
  positions of ``KL(dense || model)`` of the next-token distributions (nats), and
  ``cosine_to_dense``, the mean over positions of the cosine similarity of the last hidden
  state after the final norm (``last_hidden_state`` of the base model) to the dense one's.
  Every position with an attention mask of 1 counts, the last one included.

The model runs as :mod:`~arrayprune.adapters.pipeline.hf_calibration` runs it for
calibration, in bounded memory: built from ``config.json`` on the ``meta`` device, the
first decoder layer's inputs captured with only what runs before the layers read from the
shards, then one decoder layer's weights at a time (float32), its outputs on every batch
becoming the next layer's inputs. Last, the weights outside the decoder layers are read
again and the model's own forward runs batch by batch with each decoder layer answering
its stored output, so whatever the model does after its layers (the final norm, the
output embeddings, a logit soft-cap) is the model's own code. Memory: the activations of
every sequence at one layer (``sequences x seq x hidden``, float32; twice with
``--compare``), one decoder layer's weights, the weights outside the layers, and one
batch's logits.

No remote code is run: the architecture is one of :mod:`transformers`' own classes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from arrayprune.adapters.formats.safetensors_stream import TensorFiles
from arrayprune.adapters.formats.sharded import open_checkpoint
from arrayprune.adapters.pipeline.devices import checked_device
from arrayprune.adapters.pipeline.errors import optional_module
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
    hf_folder,
    read_tokens,
)
from arrayprune.adapters.pipeline.hooks import Hooks

__all__ = ["EvalResult", "evaluate", "write_json"]


@dataclass
class EvalResult:
    """What :func:`evaluate` measured.

    Attributes
    ----------
    model : str
        The folder evaluated.
    compare : str or None
        The dense folder it was compared with.
    sequences : int
        Token sequences run.
    tokens : int
        Next-token predictions counted in ``loss``.
    positions : int
        Positions counted in ``kl_to_dense`` and ``cosine_to_dense`` (0 without a comparison).
    loss : float
        Mean next-token cross-entropy, nats.
    perplexity : float
        ``exp(loss)``.
    kl_to_dense : float or None
        Mean over positions of ``KL(dense || model)`` of the next-token distributions, nats.
    cosine_to_dense : float or None
        Mean over positions of the cosine of the final hidden states (after the final norm).
    dense_loss : float or None
        The dense model's ``loss`` on the same tokens (with a comparison).
    dense_perplexity : float or None
        ``exp(dense_loss)``.
    """

    model: str
    compare: str | None
    sequences: int
    tokens: int
    positions: int
    loss: float
    perplexity: float
    kl_to_dense: float | None = None
    cosine_to_dense: float | None = None
    dense_loss: float | None = None
    dense_perplexity: float | None = None

    def to_json(self) -> dict[str, Any]:
        """The result as a JSON-ready dict (the keys of ``arrayprune eval --json``)."""
        return {
            "model": self.model,
            "compare": self.compare,
            "sequences": self.sequences,
            "tokens": self.tokens,
            "positions": self.positions,
            "loss": self.loss,
            "perplexity": self.perplexity,
            "kl_to_dense": self.kl_to_dense,
            "cosine_to_dense": self.cosine_to_dense,
            "dense_loss": self.dense_loss,
            "dense_perplexity": self.dense_perplexity,
        }

    def summary(self) -> str:
        """One line: perplexity and loss, and the comparison if there is one."""
        line = (
            f"{self.model}: perplexity {self.perplexity:.4f} (loss {self.loss:.4f} nats, "
            f"{self.tokens} tokens of {self.sequences} sequences)"
        )
        if self.compare is not None:
            line += (
                f"; vs {self.compare} (perplexity {self.dense_perplexity:.4f}): "
                f"kl_to_dense {self.kl_to_dense:.6g}, cosine_to_dense {self.cosine_to_dense:.6f}"
            )
        return line


#: Per-expert tensor names of a fused expert parameter: Mixtral's ``w1``/``w3``/``w2``, or
#: Qwen-MoE's (and the fused layout's) ``gate_proj``/``up_proj``/``down_proj``.
_EXPERT_PARTS = {"gate_up_proj": (("w1", "w3"), ("gate_proj", "up_proj")), "down_proj": (("w2",), ("down_proj",))}


class _CheckpointWeights(_Weights):
    """:class:`~arrayprune.adapters.pipeline.hf_calibration._Weights` that also reads what
    :mod:`transformers` 5 converts on loading: a mixture of experts stored one expert per
    tensor (``block_sparse_moe.experts.N.w1.weight``, ``mlp.experts.N.gate_proj.weight``)
    while the module holds them fused (``mlp.experts.gate_up_proj`` ``[E, 2I, H]``,
    ``mlp.experts.down_proj`` ``[E, H, I]``), and Mixtral's ``block_sparse_moe`` named ``mlp``."""

    def load(self, module: Any, prefix: str = "", skip: tuple[str, ...] = ()) -> None:
        import torch
        from torch import nn

        tensors = self.source.tensors
        for name, param in list(module.named_parameters()):
            full = f"{prefix}.{name}" if prefix else name
            if any(full.startswith(s + ".") for s in skip):
                continue
            value = self._read(full, tuple(param.shape), type(module).__name__, tensors)
            owner, leaf = _owner(module, name)
            value = torch.as_tensor(value).to(self.device, torch.float32)
            owner._parameters[leaf] = nn.Parameter(value, requires_grad=False)

    def _read(self, full: str, shape: tuple[int, ...], owner: str, tensors: Mapping[str, Any]) -> Any:
        import torch

        names = [full, full.replace(".mlp.", ".block_sparse_moe.")]
        for name in names:
            if name in tensors:
                return self._checked(name, shape, tensors)
        head, _, leaf = full.rpartition(".")
        if head.endswith(".experts") and leaf in _EXPERT_PARTS and len(shape) == 3:
            for base in dict.fromkeys([head, head.replace(".mlp.", ".block_sparse_moe.")]):
                for parts in _EXPERT_PARTS[leaf]:
                    keys = [[f"{base}.{e}.{part}.weight" for part in parts] for e in range(shape[0])]
                    if all(k in tensors for row in keys for k in row):
                        rows = [torch.cat([torch.as_tensor(self.files.load(tensors[k])) for k in row]) for row in keys]
                        value = torch.stack(rows)
                        if tuple(value.shape) != shape:
                            raise ValueError(
                                f"the experts {base}.N.{'/'.join(parts)} make {list(value.shape)}, "
                                f"the model needs {list(shape)} for {full!r}"
                            )
                        return value
        raise ValueError(f"the checkpoint has no tensor {full!r}, which {owner} needs")

    def _checked(self, name: str, shape: tuple[int, ...], tensors: Mapping[str, Any]) -> Any:
        stored = tensors[name]
        if tuple(stored.shape) != shape:
            raise ValueError(
                f"tensor {name!r} is {list(stored.shape)} in the checkpoint, the model needs {list(shape)}"
            )
        return self.files.load(stored)


class _Model:
    """One Hugging Face folder, run layer by layer: its final layer outputs, then its head."""

    def __init__(self, folder: str, device: Any):
        self.folder = folder
        self.model, self.config = _skeleton(folder)
        self.source = open_checkpoint(folder)
        self.device = device
        from arrayprune.adapters.torch import calibration as torch_calibration

        self.prefix, self.layers = torch_calibration.layer_list(self.model, self.config)
        _buffers_to(self.model, device)
        out, inp = self.model.get_output_embeddings(), self.model.get_input_embeddings()
        self.tied = out is not None and inp is not None and out.weight is inp.weight
        named = {id(m): n for n, m in self.model.named_modules()}
        self.skip = (self.prefix, named[id(out)]) if self.tied else (self.prefix,)

    def check_tokens(self, ids: np.ndarray) -> None:
        """Refuse sequences longer than learned absolute positions hold (GPT-2's ``n_positions``)."""
        positions = getattr(self.config, "n_positions", None)
        if isinstance(positions, int) and ids.shape[1] > positions:
            raise ValueError(
                f"sequences of {ids.shape[1]} tokens are longer than the {positions} positions of {self.folder} "
                "(n_positions)"
            )

    def _load_outside(self, weights: _Weights) -> None:
        """Read every weight outside the decoder layers (and tie the output embeddings again)."""
        weights.load(self.model, skip=self.skip)
        if self.tied:  # the output embeddings are the input embeddings: skipped, then shared again
            out, inp = self.model.get_output_embeddings(), self.model.get_input_embeddings()
            out.weight = inp.weight

    def final_states(self, batches: list[dict[str, Any]], weights: _Weights, hooks: Hooks, what: str) -> list[Any]:
        """The last decoder layer's output for every batch (the layers run one at a time)."""
        import torch

        self._load_outside(weights)
        inputs = _capture(self.model, self.layers[0], batches)
        arguments = _arguments_per_layer(self.model, self.layers, batches)  # each layer's own mask
        _Weights.free(self.model)
        for index in hooks.progress(list(range(len(self.layers))), f"{what}: layers", "layer"):
            layer = self.layers[index]
            if arguments is not None:
                inputs = [(hidden, *arguments[index][b]) for b, (hidden, _, _) in enumerate(inputs)]
            weights.load(layer, f"{self.prefix}.{index}")
            replay = _replay(layer, inputs)
            outputs = [replay(torch.tensor(i)) for i in range(len(inputs))]
            inputs = [(h, args, kwargs) for h, (_, args, kwargs) in zip(outputs, inputs, strict=True)]
            _Weights.free(layer)
        return [h for h, _, _ in inputs]

    @contextlib.contextmanager
    def head(self, weights: _Weights) -> Iterator[Any]:
        """``run(batch, final)``: the model's logits and ``last_hidden_state`` on `batch`, its
        decoder layers answering with `final`, the last one's stored output."""
        self._load_outside(weights)
        answer: list[Any] = [None]
        for layer in self.layers:  # an instance attribute: the module and its attributes stay
            layer.forward = lambda *args, **kwargs: answer[0]
        grabbed: list[Any] = []
        base = self.model.base_model
        handle = base.register_forward_hook(lambda module, args, out: grabbed.append(_last_hidden(out)))

        def run(batch: dict[str, Any], final: Any) -> tuple[Any, Any]:
            answer[0], grabbed[:] = final, []
            logits = self.model(**batch, use_cache=False).logits
            return logits, grabbed[-1]

        try:
            yield run
        finally:
            handle.remove()
            for layer in self.layers:
                del layer.forward
            _Weights.free(self.model)


def _last_hidden(out: Any) -> Any:
    hidden = getattr(out, "last_hidden_state", None)
    return hidden if hidden is not None else out[0]


def _batches(tokens: Mapping[str, np.ndarray], rows: int, device: Any) -> list[dict[str, Any]]:
    import torch

    count = len(tokens[TOKENS_KEY])
    return [{k: torch.from_numpy(v[i : i + rows]).to(device) for k, v in tokens.items()} for i in range(0, count, rows)]


def _check_folder(path: Any, what: str) -> str:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"{what} {path}: no such file or folder")
    folder = hf_folder(path)
    if folder is None:
        raise ValueError(f"{what} {path}: not a Hugging Face folder (config.json beside safetensors weights)")
    return folder


def evaluate(
    model: Any,
    tokens: Any,
    *,
    compare: Any = None,
    device: str | None = None,
    batch: int | None = None,
    hooks: Hooks = Hooks(),
) -> EvalResult:
    """Next-token loss and perplexity of a Hugging Face causal LM folder, and its distance to a dense one.

    Parameters
    ----------
    model : str or os.PathLike
        A folder with ``config.json`` and safetensors weights (sharded or not), or its index.
    tokens : str or os.PathLike
        An ``.npz`` with ``input_ids`` ``[sequences, seq]`` integers in ``[0, vocab_size)``
        and optionally ``attention_mask`` (0 and 1, same shape).
    compare : str or os.PathLike, optional
        The dense model (same vocabulary): ``kl_to_dense``, ``cosine_to_dense`` and the
        dense model's own loss are measured too.
    device : str, optional
        ``cpu``, ``cuda`` or ``cuda:N``: where the layers run (one at a time). Default: the CPU.
    batch : int, optional
        Sequences run at a time (default :data:`~arrayprune.adapters.pipeline.hf_calibration.BATCH_ROWS`).
    hooks : Hooks, optional
        Told of the stages; ``progress`` wraps the loops over layers.

    Returns
    -------
    EvalResult

    Raises
    ------
    ValueError
        One line: a folder transformers cannot build, bad token ids, sequences shorter than
        two tokens, a vocabulary that differs from the dense model's, a device not here.
    """
    import torch

    optional_module("transformers", "transformers", "eval")
    folder = _check_folder(model, "MODEL")
    dense_folder = None if compare is None else _check_folder(compare, "--compare")
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    where = torch.device("cpu")
    if device is not None:
        where = torch.device(str(checked_device(device)))
    runs = [_Model(folder, where)]
    if dense_folder is not None:
        runs.append(_Model(dense_folder, where))
        vocab = [int(r.config.vocab_size) for r in runs]
        if vocab[0] != vocab[1]:
            raise ValueError(f"the model's vocabulary ({vocab[0]} tokens) is not the dense model's ({vocab[1]})")
    ids_path = os.fspath(tokens)
    try:
        read = read_tokens(ids_path, min(int(r.config.vocab_size) for r in runs))
    except ValueError as exc:
        raise ValueError(f"{ids_path}: {exc}") from None
    ids = read[TOKENS_KEY]
    if ids.shape[1] < 2:
        raise ValueError(f"{ids_path}: sequences of {ids.shape[1]} token: next-token loss needs at least 2")
    for r in runs:
        r.check_tokens(ids)
    mask = read.get("attention_mask", np.ones_like(ids))
    if not ((mask[:, :-1] == 1) & (mask[:, 1:] == 1)).any():
        raise ValueError(f"{ids_path}: the attention mask leaves no next-token prediction to count")
    rows = batch or BATCH_ROWS
    batches = _batches(read, rows, where)
    masks = [torch.from_numpy(mask[i : i + len(b[TOKENS_KEY])]).bool() for i, b in zip(
        range(0, len(ids), rows), batches, strict=True)]  # fmt: skip
    with TensorFiles() as files, torch.no_grad():
        finals = []
        for r, what in zip(runs, ("model", "dense"), strict=False):
            hooks.stage(
                f"eval: {len(ids)} sequences of {ids.shape[1]} tokens through {len(r.layers)} layers of "
                f"{type(r.model).__name__} ({r.folder}), one at a time"
            )
            finals.append(r.final_states(batches, _CheckpointWeights(r.source, files, where), hooks, what))
        sums = _Sums()
        with contextlib.ExitStack() as stack:
            heads = [stack.enter_context(r.head(_CheckpointWeights(r.source, files, where))) for r in runs]
            for i, (inputs, valid) in enumerate(zip(batches, masks, strict=True)):
                outs = [head(inputs, final[i]) for head, final in zip(heads, finals, strict=True)]
                sums.add(inputs[TOKENS_KEY], valid, outs)
    return sums.result(str(model), None if compare is None else str(compare), len(ids))


class _Sums:
    """Running float64 sums over batches: losses, KL, cosines and their counts."""

    def __init__(self) -> None:
        self.loss = [0.0, 0.0]
        self.tokens = 0
        self.kl = 0.0
        self.cos = 0.0
        self.positions = 0

    def add(self, ids: Any, valid: Any, outs: Sequence[tuple[Any, Any]]) -> None:
        import torch

        valid = valid.to(ids.device)
        counted = valid[:, :-1] & valid[:, 1:]
        targets = ids[:, 1:][counted]
        logps = []
        for k, (logits, _) in enumerate(outs):
            logp = torch.log_softmax(logits.double(), dim=-1)
            logps.append(logp)
            picked = logp[:, :-1][counted].gather(1, targets[:, None])
            self.loss[k] -= float(picked.sum())
        self.tokens += int(counted.sum())
        if len(outs) == 2:
            p, q = logps[1][valid], logps[0][valid]  # the dense model's distribution first
            self.kl += float((p.exp() * (p - q)).sum())
            a, b = outs[0][1].double()[valid], outs[1][1].double()[valid]
            if a.shape != b.shape:
                raise ValueError(
                    f"the final hidden states are {a.shape[-1]} wide, the dense model's {b.shape[-1]}: no cosine"
                )
            self.cos += float(torch.nn.functional.cosine_similarity(a, b, dim=-1).sum())
            self.positions += int(valid.sum())

    def result(self, model: str, compare: str | None, sequences: int) -> EvalResult:
        loss = self.loss[0] / self.tokens
        out = EvalResult(model, compare, sequences, self.tokens, self.positions, loss, math.exp(loss))
        if compare is not None:
            out.kl_to_dense = self.kl / self.positions
            out.cosine_to_dense = self.cos / self.positions
            out.dense_loss = self.loss[1] / self.tokens
            out.dense_perplexity = math.exp(out.dense_loss)
        return out


def write_json(result: EvalResult, path: Any) -> None:
    """Write `result` as JSON to `path` (a temporary file renamed into place)."""
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(result.to_json(), f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
