"""What the file pipeline needs of the methods that update the weights they keep.

A method of :data:`arrayprune.METHODS` that carries a solver (``SOLVE``, see
:class:`arrayprune.ReconstructionMethod`; ``--method sparsegpt``) prunes a weight *and
updates the entries it keeps* from the Hessians of calibration data
(:func:`~arrayprune.adapters.pipeline.method_names.reconstructs` says which). It runs
through a model: an ONNX graph (:data:`GRAPH_FORMATS`) or a Hugging Face folder layer by
layer; :func:`refusal` checks a request's options for it, :func:`elsewhere` says where
to turn for other inputs. The engine that runs one on an ONNX graph is
:mod:`arrayprune.adapters.pipeline.reconstruction`; the stage is
:mod:`arrayprune.adapters.pipeline.reconstruct_stage`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from arrayprune.adapters.pipeline.method_names import reconstruction_methods, reconstructs

if TYPE_CHECKING:  # the request module imports this one
    from arrayprune.adapters.pipeline.request import PruneSpec

__all__ = ["GRAPH_FORMATS", "elsewhere", "refusal"]

#: The input formats holding a graph the engine runs.
GRAPH_FORMATS = ("onnx",)


def elsewhere(method: str) -> str:
    """Where to turn, for method `method`, with an input that holds no graph (said when one is refused)."""
    call = (
        "arrayprune.adapters.torch.sparsegpt(model, batches, amount)"
        if method == "sparsegpt"
        else f"arrayprune.adapters.torch.reconstruct(model, batches, amount, method={method!r})"
    )
    return f"a Hugging Face folder runs with --calibration tokens.npz; for a PyTorch model, use {call}"


def refusal(spec: PruneSpec) -> str | None:
    """The option of `spec` that a reconstruction method refuses (or that needs one), as one line; None if all apply.

    The other options are checked as every method's are, by
    :meth:`~arrayprune.adapters.pipeline.request.PruneSpec.checked`.
    """
    method = spec.method
    if not reconstructs(method):
        names = ", ".join(reconstruction_methods())
        if spec.hessians:
            return f"--hessians gives the Hessians of {names}: use it with --method sparsegpt"
        return f"--one-pass applies to {names} only" if spec.one_pass else None
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
