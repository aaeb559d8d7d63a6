"""The order-preserving key space of the selection: integers whose order is the wanted one.

Keys are integers made from the bit patterns of the values, so that integer order is
the wanted order, exact and total. They are defined here once, and read by every
storage of keys (:mod:`.host` on NumPy arrays and CPU tensors, :mod:`.radix` and
:mod:`.lazy` on chunks of files and Dask arrays, :mod:`.portable` on JAX arrays):

* **by magnitude**: a float's bits with the sign bit cleared (:data:`MAGNITUDE`) order
  like ``|x|``, with every NaN above +inf. Floats of several widths share the key space
  of the widest (:func:`magnitude_keys`, :func:`key_bits`); eligibility takes one more
  bit (``key + 1`` on eligible entries, 0 elsewhere).
* **by value** (:func:`value_keys`): a float's bits with the sign bit set, or all bits
  flipped for negatives, order like ``x``; a NaN of either sign keeps its sign bit set
  and so ranks above +inf. Integers flip their sign bit; unsigned integers and booleans
  are their own keys.
* **on JAX and accelerators** (:class:`BitKeys`): the same keys as signed integers of
  the float's width, for JAX, CuPy and tensors off the CPU (JAX and GPU float
  comparisons flush subnormals to zero; integers compare exactly). Subnormals rank by
  value on every library and device.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import array_api_compat as apc
import numpy as np

__all__ = [
    "UINT_FOR_SIZE",
    "INT_FOR_SIZE",
    "MAGNITUDE",
    "INF_BITS",
    "BFLOAT16_INF_BITS",
    "FLOAT_BITS",
    "value_keys",
    "key_bits",
    "magnitude_keys",
    "BitKeys",
    "JaxBitKeys",
    "on_accelerator",
]

Array = Any

#: Unsigned and signed NumPy integers by item size.
UINT_FOR_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
INT_FOR_SIZE = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}
#: Every bit but the sign, by item size: ``bits & MAGNITUDE`` keys a float by magnitude.
MAGNITUDE = {n: t((1 << (8 * n - 1)) - 1) for n, t in UINT_FOR_SIZE.items()}
#: Bits of +inf: IEEE half, single and double by width, and bfloat16 (a float16's width).
INF_BITS = {2: 0x7C00, 4: 0x7F80_0000, 8: 0x7FF0_0000_0000_0000}
BFLOAT16_INF_BITS = 0x7F80


def value_keys(bits: np.ndarray, kind: str, inf: int = 0, out: np.ndarray | None = None) -> np.ndarray:
    """Keys ordering like the values whose bit patterns are `bits` (unsigned integers).

    Parameters
    ----------
    bits : ndarray
        Bit patterns as unsigned integers of the values' width.
    kind : {'f', 'i', 'u'}
        How the bits encode values: IEEE float, two's complement, unsigned (or boolean).
    inf : int
        For floats, the bits of +inf (:data:`INF_BITS`, :data:`BFLOAT16_INF_BITS`).
    out : ndarray, optional
        Where to write the keys (of the dtype of `bits`).

    Returns
    -------
    ndarray
        The keys, of the dtype of `bits`; a NaN of either sign ranks above +inf.
    """
    utype = bits.dtype.type
    sign = utype(1 << (8 * bits.itemsize - 1))
    if kind != "f":
        return np.bitwise_xor(bits, sign if kind == "i" else 0, out=out)
    # Flip every bit of negatives, only the sign bit of the rest. An arithmetic shift
    # spreads the sign bit over the word: no branch, and no masked ufunc (ten times
    # slower). Three passes in place, as the copy a partition needs anyway.
    signed = bits.view(INT_FOR_SIZE[bits.itemsize])
    key = np.right_shift(signed, 8 * bits.itemsize - 1, out=None if out is None else out.view(signed.dtype))
    key = key.view(bits.dtype)
    key |= sign
    key ^= bits
    # A negative NaN was flipped below -inf, where no other key lands: flip it back,
    # so that every NaN ranks above +inf. A reduction tells whether there is one.
    lowest = MAGNITUDE[bits.itemsize] - utype(inf)
    if key.size and key.min() < lowest:
        nan = key < lowest
        key[nan] = ~key[nan]
    return key


#: NumPy dtype names of the floats keys are made from, and bfloat16 (held as uint16).
FLOAT_BITS = {"float16": 16, "bfloat16": 16, "float32": 32, "float64": 64}


def key_bits(dtype_names: Iterable[str], *, shifted: bool = False) -> int:
    """Width of the magnitude keys of :func:`magnitude_keys` for arrays of these dtypes.

    Parameters
    ----------
    dtype_names : iterable of str
        ``'float16'``, ``'bfloat16'``, ``'float32'`` or ``'float64'``.
    shifted : bool
        Whether keys carry eligibility (one more bit).

    Returns
    -------
    int
        31 (63 if any is float64; 15 if all are one 16-bit dtype), plus one if `shifted`.
    """
    names = set(dtype_names)
    unknown = names - set(FLOAT_BITS)
    if unknown:
        raise TypeError(f"magnitude keys need floating-point arrays, got {sorted(unknown)}")
    if len(names) == 1 and FLOAT_BITS[next(iter(names))] == 16:
        width = 16
    else:
        width = 64 if "float64" in names else 32
    return width - 1 + int(shifted)


def magnitude_keys(
    raw: np.ndarray, dtype_name: str, bits: int, eligible: np.ndarray | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """Unsigned keys ordered like ``|x|`` (NaN above +inf), in a space shared by dtypes.

    Parameters
    ----------
    raw : ndarray
        Values of `dtype_name`, or their bit patterns as unsigned integers of the same
        width (the only way to hold bfloat16 in NumPy).
    dtype_name : str
        What `raw` holds: ``'float16'``, ``'bfloat16'``, ``'float32'``, ``'float64'``.
    bits : int
        The key width from :func:`key_bits` for all arrays ranked together: a 16-bit
        float is widened exactly to the float32 (or float64) key when others are wider.
    eligible : ndarray of bool, optional
        Entries that may be dropped. Keys then become ``key + 1`` on eligible entries
        and 0 elsewhere (`bits` must have been chosen with ``shifted=True``).
    out : ndarray, optional
        A flat buffer of the keys' dtype and ``raw.size`` entries, reused across calls
        (no new memory to fault in per chunk). It receives the keys, and is returned,
        where they have the width of `raw`; wider keys are a new array.

    Returns
    -------
    ndarray
        A flat array of uint16, uint32 or uint64 keys (`out`, or a new one).
    """
    raw = raw.reshape(-1)
    width = FLOAT_BITS[dtype_name]
    value_bits = bits - int(eligible is not None)
    target = 16 if value_bits <= 15 else (32 if value_bits <= 31 else 64)
    utype = {16: np.uint16, 32: np.uint32, 64: np.uint64}[target]
    if raw.dtype.kind == "f":
        raw = raw.view({16: np.uint16, 32: np.uint32, 64: np.uint64}[width])
    if width == target:
        keys = np.bitwise_and(raw, utype((1 << (target - 1)) - 1), out=out)
    elif dtype_name == "bfloat16" and target == 32:
        # bfloat16 is the upper half of a float32: widening is a shift.
        keys = (raw.astype(np.uint32) << np.uint32(16)) & np.uint32(0x7FFF_FFFF)
    else:
        value = raw.view({16: np.float16, 32: np.float32, 64: np.float64}[width])
        if dtype_name == "bfloat16":
            value = (raw.astype(np.uint32) << np.uint32(16)).view(np.float32)
        wide = np.abs(value.astype({32: np.float32, 64: np.float64}[target]))
        keys = wide.view(utype)
    if eligible is not None:
        keys += utype(1)
        keys *= eligible.reshape(-1)
    return keys


def on_accelerator(x: Array) -> bool:
    """Whether `x` is a CuPy array or a PyTorch tensor off the CPU (CUDA, meta, ...).

    Neither library is imported: ``array_api_compat`` tells them by type name.
    """
    if apc.is_cupy_array(x):
        return True
    return apc.is_torch_array(x) and x.device.type != "cpu"


class BitKeys:
    """Signed-integer keys made from the bit patterns of floats of one dtype.

    JAX on CPU flushes subnormal floats to zero when it compares or sorts them, and so
    do GPU kernels (CuPy's, and those compiled with flush-to-zero): a ranking by ``|x|``
    in floats ties every subnormal with zero where NumPy (and the host path) tells them
    apart. Integers of the float's width compare exactly:

    * by magnitude, the bits with the sign bit cleared order like ``|x|``, with every
      NaN above +inf; the keys are non-negative, so -1 stays free for ineligible entries;
    * by value, non-negative floats keep their bits and negative ones flip all bits but
      the sign, so that keys order like the values (-0 just below +0); NaN of either
      sign gets its magnitude key, above +inf.

    The standard has no bit cast: JAX reinterprets with ``jax.lax.bitcast_convert_type``
    (reached through ``sys.modules``, never imported), CuPy arrays and tensors with
    their own ``view(dtype)``.
    """

    _INT_NAMES = {16: "int16", 32: "int32", 64: "int64"}

    def __init__(self, xp: Any, dtype: Any, *, jax: bool = False):
        self.xp = xp
        self._lax_bitcast = sys.modules["jax"].lax.bitcast_convert_type if jax else None
        self.float_dtype = dtype
        width = xp.finfo(dtype).bits
        self.dtype = getattr(xp, self._INT_NAMES[width])
        self.low_bits = (1 << (width - 1)) - 1  # every bit but the sign

    @classmethod
    def of(cls, xp: Any, x: Array, dtype: Any) -> BitKeys | None:
        """Keys for floats of `dtype` if `x` is a JAX array, a CuPy array or a tensor off
        the CPU and `dtype` is floating, else None (compare the floats themselves)."""
        if not xp.isdtype(dtype, "real floating"):
            return None
        if apc.is_jax_array(x):
            return cls(xp, dtype, jax=True)
        if on_accelerator(x):
            return cls(xp, dtype)
        return None

    def bitcast(self, x: Array, dtype: Any) -> Array:
        """`x` reinterpreted as `dtype`, of the same width."""
        if self._lax_bitcast is not None:
            return self._lax_bitcast(x, dtype)
        return x.view(dtype)

    def magnitude(self, x: Array) -> Array:
        """Keys ordering like ``|x|``, NaN above +inf."""
        return self.bitcast(x, self.dtype) & self.low_bits

    def value(self, x: Array) -> Array:
        """Keys ordering like `x`, NaN above +inf."""
        xp = self.xp
        bits = self.bitcast(x, self.dtype)
        keys = xp.where(bits < 0, bits ^ self.low_bits, bits)
        return xp.where(xp.isnan(x), bits & self.low_bits, keys)

    def decode(self, keys: Array) -> Array:
        """The floats whose `value` keys are `keys` (NaN comes back positive)."""
        xp = self.xp
        return self.bitcast(xp.where(keys < 0, keys ^ self.low_bits, keys), self.float_dtype)


#: The former name of :class:`BitKeys`, when it served JAX alone.
JaxBitKeys = BitKeys
