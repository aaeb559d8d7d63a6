"""Getting real savings out of a mask: packed bits, CSR, and the bytes each would take."""

from __future__ import annotations

import importlib
import math
import sys
from typing import Any

import array_api_compat as apc
import numpy as np

from ._namespace import namespace
from .amount import normalize_dim
from .patterns import is_nm_sparse

__all__ = ["pack_mask", "unpack_mask", "to_csr", "to_semi_structured", "sparse_nbytes"]

Array = Any

_BIT_WEIGHTS = (128, 64, 32, 16, 8, 4, 2, 1)


def pack_mask(mask: Array) -> Array:
    """Pack a mask into bits, eight entries per byte, most significant bit first.

    The layout is that of :func:`numpy.packbits` on the flattened mask, so packed masks
    read the same in every library.

    Parameters
    ----------
    mask : array
        Boolean or numeric mask (non-zero means kept), any shape.

    Returns
    -------
    array
        ``uint8`` array of ``ceil(mask.size / 8)`` bytes, same namespace and device.
    """
    xp = namespace(mask)
    device = apc.device(mask)
    kept = mask if xp.isdtype(mask.dtype, "bool") else mask != 0
    bits = xp.astype(xp.reshape(kept, (-1,)), xp.uint8)
    n = bits.shape[0]
    padded = -(-n // 8) * 8
    if padded != n:
        bits = xp.concat([bits, xp.zeros((padded - n,), dtype=xp.uint8, device=device)])
    weights = xp.asarray(_BIT_WEIGHTS, dtype=xp.uint8, device=device)
    return xp.sum(xp.reshape(bits, (-1, 8)) * weights, axis=1, dtype=xp.uint8)


def unpack_mask(packed: Array, shape: tuple[int, ...]) -> Array:
    """Unpack bits made by :func:`pack_mask` into a boolean mask of `shape`.

    Parameters
    ----------
    packed : array
        ``uint8`` bytes.
    shape : tuple of int
        Shape of the mask.

    Returns
    -------
    array
        Boolean mask.

    Raises
    ------
    ValueError
        If `packed` has the wrong number of bytes for `shape`.
    """
    xp = namespace(packed)
    n = math.prod(shape)
    if packed.ndim != 1 or packed.shape[0] != -(-n // 8):
        raise ValueError(
            f"{packed.shape[0] if packed.ndim == 1 else packed.shape} bytes cannot hold a mask of shape {tuple(shape)}"
        )
    weights = xp.asarray(_BIT_WEIGHTS, dtype=xp.uint8, device=apc.device(packed))
    bits = (xp.reshape(packed, (-1, 1)) & weights) != 0
    return xp.reshape(xp.reshape(bits, (-1,))[:n], tuple(shape))


def to_csr(x: Array) -> Any:
    """Compressed sparse row form of a 2-D array (zeros dropped), in its own library.

    NumPy gives a :class:`scipy.sparse.csr_array` (SciPy: the ``sparse`` extra), CuPy a
    :class:`cupyx.scipy.sparse.csr_matrix`, PyTorch a sparse CSR tensor on the same
    device. Other libraries have no sparse arrays of their own: their arrays on a CPU
    device become SciPy CSR arrays in host memory (through NumPy); on any other device
    they are refused rather than copied to the host behind the caller's back. Arrays of
    more dimensions are flattened to ``(shape[0], -1)``, the usual view of a
    convolution weight.

    Parameters
    ----------
    x : array
        Pruned weights.

    Returns
    -------
    object
        The sparse matrix.

    Raises
    ------
    ValueError
        If `x` is 0-D.
    TypeError
        If `x` is neither a NumPy, CuPy nor PyTorch array and lies on a device other
        than the CPU: move it to the CPU first.
    """
    if x.ndim == 0:
        raise ValueError("CSR needs at least one dimension")
    rows = x.shape[0] if x.ndim > 1 else 1
    if apc.is_torch_array(x):
        return x.detach().reshape(rows, -1).to_sparse_csr()
    if apc.is_cupy_array(x):
        sparse = importlib.import_module("cupyx.scipy.sparse")
        return sparse.csr_matrix(x.reshape(rows, -1))
    if not apc.is_numpy_array(x):
        device = apc.device(x)
        if "cpu" not in str(device).lower():
            raise TypeError(
                f"to_csr builds a SciPy CSR array in host memory: move the array from device {device!r} "
                "to the CPU first"
            )
    sparse = importlib.import_module("scipy.sparse")
    return sparse.csr_array(np.asarray(x).reshape(rows, -1))


def to_semi_structured(x: Array) -> Any:
    """PyTorch's 2:4 semi-structured sparse tensor for a 2-D CUDA tensor pruned 2:4.

    Raises
    ------
    TypeError
        If `x` is not a CUDA tensor or PyTorch lacks ``to_sparse_semi_structured``.
    ValueError
        If `x` is not 2-D or does not hold a 2:4 pattern along its rows.
    """
    if not (apc.is_torch_array(x) and x.device.type == "cuda"):
        raise TypeError("2:4 semi-structured tensors need a CUDA torch tensor")
    convert = getattr(sys.modules["torch"].sparse, "to_sparse_semi_structured", None)
    if convert is None:
        raise TypeError("this PyTorch has no torch.sparse.to_sparse_semi_structured")
    if x.ndim != 2 or not is_nm_sparse(x, 2, 4, dim=-1):
        raise ValueError("to_semi_structured needs a 2-D tensor with 2:4 sparsity along its rows")
    return convert(x)


def sparse_nbytes(x: Array, index_bytes: int = 4, dim: int = -1) -> dict[str, int]:
    """Bytes `x` would take in each storage form.

    Parameters
    ----------
    x : array
        Pruned weights.
    index_bytes : int, default 4
        Size of one CSR index (4 for int32, 8 for int64).
    dim : int, default -1
        The axis the 2:4 groups run along: the reduction axis of the layer (the last
        axis of a PyTorch ``Linear`` weight ``[out, in]``, the first of an ONNX
        ``MatMul`` weight ``[K, N]``).

    Returns
    -------
    dict
        ``dense``; ``csr`` (values, column indices, row pointers over the
        ``(shape[0], -1)`` view); ``bitmask`` (non-zero values plus one bit per entry);
        ``semi_structured_2_4`` (half the values plus 2 bits of metadata per kept
        value) only when `x` is 2:4 sparse along `dim`.

    Raises
    ------
    IndexError
        If `dim` is not an axis of `x`.
    """
    xp = namespace(x)
    n = math.prod(x.shape)
    itemsize = xp.finfo(x.dtype).bits // 8 if xp.isdtype(x.dtype, "real floating") else xp.iinfo(x.dtype).bits // 8
    nnz = int(xp.count_nonzero(x))
    rows = x.shape[0] if x.ndim > 1 else 1
    out = {
        "dense": n * itemsize,
        "csr": nnz * (itemsize + index_bytes) + (rows + 1) * index_bytes,
        "bitmask": nnz * itemsize + -(-n // 8),
    }
    if x.ndim >= 1:
        dim = normalize_dim(x.shape, dim)
    if x.ndim >= 1 and x.shape[dim] % 4 == 0 and n and is_nm_sparse(x, 2, 4, dim=dim):
        out["semi_structured_2_4"] = n // 2 * itemsize + n // 2 * 2 // 8
    return out
