"""The reconstruction methods of the file pipeline and the options they take.

A reconstruction method prunes a weight *and updates the entries it keeps* from
calibration data (``arrayprune prune --method sparsegpt``). :data:`RECONSTRUCTIONS` says
which methods these are and what each needs; :func:`refusal` checks a request's options
for them. The engine that runs each on an ONNX graph is in
:data:`arrayprune.adapters.pipeline.reconstruction.ONNX_ENGINES`; the stage is
:mod:`arrayprune.adapters.pipeline.reconstruct_stage`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import arrayprune

__all__ = ["OWN_OPTIONS", "RECONSTRUCTIONS", "Reconstruction", "refusal"]


@dataclass(frozen=True)
class Reconstruction:
    """A method that prunes the weights of a model's graph and updates those it keeps.

    Attributes
    ----------
    formats : tuple of str
        The input formats holding a graph the engine runs.
    elsewhere : str
        Where to turn for other inputs (said when one is refused).
    by_amount, by_pattern : str
        The mask methods of :data:`arrayprune.METHODS` standing in for it (plan, checks,
        global ranking) with an ``--amount`` and with ``--nm N:M``.
    """

    formats: tuple[str, ...]
    elsewhere: str
    by_amount: str = "l1_unstructured"
    by_pattern: str = "nm_structured"

    #: The method's constructor parameters as the command line spells them (``method_flags``).
    flags = MappingProxyType({"amount": "--amount", "n": "--nm", "m": "--nm"})

    def stand_in(self, spec: Any) -> str:
        """The mask method that plans, checks and ranks for `spec`."""
        return self.by_pattern if spec.nm is not None else self.by_amount


class _Rows(Mapping[str, Reconstruction]):
    """The reconstructions of :data:`arrayprune.RECONSTRUCTIONS` as the pipeline sees them,
    read at every use (a reconstruction registered while the program runs is in)."""

    def __getitem__(self, name: str) -> Reconstruction:
        if not isinstance(name, str) or name not in arrayprune.RECONSTRUCTIONS:
            raise KeyError(name)
        return Reconstruction(
            formats=("onnx",),
            elsewhere=(
                "a Hugging Face folder runs with --calibration tokens.npz; for a PyTorch model, use "
                + (
                    "arrayprune.adapters.torch.sparsegpt(model, batches, amount)"
                    if name == "sparsegpt"
                    else f"arrayprune.adapters.torch.reconstruct(model, batches, amount, method={name!r})"
                )
            ),
        )

    def __iter__(self) -> Iterator[str]:
        return iter(list(arrayprune.RECONSTRUCTIONS))

    def __len__(self) -> int:
        return len(arrayprune.RECONSTRUCTIONS)


#: The reconstruction methods of the pipeline: ``--method`` name -> what it needs; one
#: row for each solver of :data:`arrayprune.RECONSTRUCTIONS`.
RECONSTRUCTIONS: Mapping[str, Reconstruction] = _Rows()

#: The options only reconstruction methods take (restored after the stand-in's checks).
OWN_OPTIONS = ("method", "one_pass", "hessians")


def refusal(spec: Any) -> str | None:
    """The option of `spec` that a reconstruction method refuses (or that needs one), as one line; None if all apply.

    The other options are checked as those of the stand-in mask method
    (:meth:`Reconstruction.stand_in`) by :meth:`~arrayprune.adapters.pipeline.request.PruneSpec.checked`.
    """
    method = spec.method
    if method not in RECONSTRUCTIONS:
        if spec.hessians:
            return f"--hessians gives the Hessians of {', '.join(RECONSTRUCTIONS)}: use it with --method sparsegpt"
        return f"--one-pass applies to {', '.join(RECONSTRUCTIONS)} only" if spec.one_pass else None
    if spec.hessians and (spec.calibration or spec.one_pass):
        return f"--hessians gives every Hessian: no {'--calibration' if spec.calibration else '--one-pass'} with it"
    if spec.amount is not None and spec.nm is not None:
        return f"--method {method} takes --amount A or --nm N:M, not both"
    if spec.amount is None and spec.nm is None and not spec.dry_run:
        return f"--method {method} needs --amount A or --nm N:M"
    if spec.global_ and spec.nm is not None:
        return f"--global ranks entries for an --amount; with --nm N:M every weight of {method} gets the pattern"
    if spec.input_norms:
        return f"--input-norms makes Wanda's scores; {method} takes its Hessians from --calibration"
    if not spec.calibration and not spec.hessians:
        return (
            f"--method {method} needs --calibration calib.npz: samples of the model's inputs "
            "(graph input name -> array, samples along axis 0; token ids for a Hugging Face folder), "
            "or --hessians hessians.npz for safetensors"
        )
    if spec.keep_masks:
        return (
            f"--keep-masks does not apply to {method}: it updates the weights it keeps, "
            "so name_orig would not be the original"
        )
    if spec.seed is not None:
        return f"--seed does not apply to {method}, which is deterministic (--verify runs on the --calibration samples)"
    if spec.dim is not None:
        return f"--dim does not apply to {method}: it prunes each weight along its reduction axis"
    for flag, value in (("--n", spec.n), ("--block", spec.block)):
        if value is not None:
            return f"{flag} does not apply to {method}"
    return None
