"""What each tensor of a model file is: its role, and for layer weights, their axes.

A pruning tool that selects by rank and dtype alone prunes what nobody would: biases
stored as ``[1, N]``, embedding tables, optimizer moments, norm scales. Here every tensor
gets a :class:`Role`, read from the file's own structure: the ONNX graph (which input of
which operator an initializer feeds), the layout of a PyTorch training checkpoint, or
the naming conventions of Hugging Face checkpoints. Only layer weights are pruned by
default; their *output axis* (one entry per output unit: a channel) and *reduction
axis* (the axis summed over by the layer: where N:M groups run) decide the default
``dim`` of structured and N:M methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ROLES", "Role"]

#: The roles a tensor can have.
ROLES = ("weight", "bias", "embedding", "norm", "optimizer_state", "other")


@dataclass(frozen=True)
class Role:
    """The role of one tensor, and the axes of a layer weight.

    Attributes
    ----------
    kind : str
        One of :data:`ROLES`.
    output_axis : int or None
        For a weight: the axis with one entry per output unit (channel), if known.
    reduction_axis : int or None
        For a weight: the axis the layer sums over (input features, input channels),
        if known.
    why : str
        What the role was read from, for people: ``"MatMul B [K, N]"``,
        ``"name matches *LayerNorm*"``, ``"optimizer state"``, ...
    nodes : tuple of str
        The names of the graph nodes reading the tensor (ONNX: the operators at the end
        of each chain, ``"/encoder/layer.0/attention/self/query/MatMul"``), in graph
        order; empty where there is no graph or the nodes have no names. Not part of
        comparisons: two roles with the same kind, axes and why are equal.
    """

    kind: str
    output_axis: int | None = None
    reduction_axis: int | None = None
    why: str = ""
    nodes: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.kind not in ROLES:
            raise ValueError(f"unknown role {self.kind!r}; expected one of {ROLES}")
