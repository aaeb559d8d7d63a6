"""arrayprune: neural-network weight pruning on any Array API library.

The semantics of :mod:`torch.nn.utils.prune` at array level, on NumPy, CuPy, PyTorch,
JAX and any other library that follows the Python Array API standard, on the array's
own device. Masks are computed here; adapters in :mod:`arrayprune.adapters` bring them
to PyTorch modules and to dictionaries of weights.
"""

from . import functional as _functional
from .allocation import allocate_from_curves, outlier_ratio, owl_allocation
from .amount import (
    compute_nparams_toprune,
    validate_pruning_amount,
    validate_pruning_amount_init,
    validate_pruning_dim,
    validate_structured_pruning,
)
from .functional import *  # noqa: F403 (one verb per method of the table)
from .functional import mask_for
from .global_pruning import global_unstructured, lamp_scores
from .groups import ChannelGroup
from .methods import (
    AmountPruningMethod,
    BasePruningMethod,
    CustomFromMask,
    Identity,
    L1Unstructured,
    LnStructured,
    PruningContainer,
    RandomStructured,
    RandomUnstructured,
    StructuredPruningMethod,
    UnstructuredPruningMethod,
    combine_masks,
)
from .norms import channel_norms
from .patterns import BlockUnstructured, NMStructured, is_nm_sparse
from .reconstruction import HessianAccumulator, ReconstructionMethod, SparseGPT, sparsegpt, unfold_patches
from .registry import METHODS
from .schedules import (
    ConstantSparsity,
    PolynomialDecay,
    prune_to_schedule,
    prune_to_sparsity,
)
from .selection import kth_smallest, smallest_magnitude_keep
from .sparse import pack_mask, sparse_nbytes, to_csr, to_semi_structured, unpack_mask
from .structured_methods import ActivationStructured, ObsStructured, UnitPruningMethod
from .wanda import Wanda, wanda_scores

__version__ = "0.1.0"

# Importing the submodule ``arrayprune.wanda`` made it an attribute of the package: the
# name is the functional verb's.
wanda = _functional.wanda

__all__ = [
    "METHODS",
    "BasePruningMethod",
    "AmountPruningMethod",
    "UnstructuredPruningMethod",
    "StructuredPruningMethod",
    "PruningContainer",
    "combine_masks",
    "mask_for",
    # Every method of the table is exported twice, its class and its functional verb; a
    # method with a solver (SparseGPT) once: its verb is the solver, `sparsegpt`; the
    # calibrated structured methods (a unit refit) once: they run through a model.
    "Identity",
    "RandomUnstructured",
    "L1Unstructured",
    "RandomStructured",
    "LnStructured",
    "CustomFromMask",
    "NMStructured",
    "BlockUnstructured",
    "Wanda",
    "SparseGPT",
    "ReconstructionMethod",
    "UnitPruningMethod",
    "ActivationStructured",
    "ObsStructured",
    *(name for name in _functional.__all__ if name != "mask_for"),
    "global_unstructured",
    "allocate_from_curves",
    "owl_allocation",
    "outlier_ratio",
    "lamp_scores",
    "ChannelGroup",
    "wanda_scores",
    "sparsegpt",
    "HessianAccumulator",
    "unfold_patches",
    "is_nm_sparse",
    "ConstantSparsity",
    "PolynomialDecay",
    "prune_to_sparsity",
    "prune_to_schedule",
    "pack_mask",
    "unpack_mask",
    "to_csr",
    "to_semi_structured",
    "sparse_nbytes",
    "channel_norms",
    "kth_smallest",
    "smallest_magnitude_keep",
    "validate_pruning_amount_init",
    "validate_pruning_amount",
    "compute_nparams_toprune",
    "validate_structured_pruning",
    "validate_pruning_dim",
    "__version__",
]
