"""The Array API namespace of arrays, looked up once per array type."""

from __future__ import annotations

from typing import Any

import array_api_compat as apc

_BY_TYPE: dict[type, Any] = {}
#: Array types whose shapes may hold unknown (NaN) lengths: Dask's.
_LAZY_SHAPES: set[type] = set()


def namespace(*arrays: Any) -> Any:
    """``array_api_compat.array_namespace`` of `arrays`, cached by array type.

    The namespace of an array depends only on its type for every library arrayprune
    supports, and the generic lookup costs microseconds that add up on small arrays.
    Mixed types go to the generic lookup, which raises for incompatible libraries.

    Raises
    ------
    ValueError
        If a Dask array has chunks of unknown size (see :func:`check_known_shape`).
    """
    kind = type(arrays[0])
    if all(type(a) is kind for a in arrays[1:]):
        xp = _BY_TYPE.get(kind)
        if xp is None:
            xp = _BY_TYPE[kind] = apc.array_namespace(arrays[0])
            if apc.is_dask_array(arrays[0]):
                _LAZY_SHAPES.add(kind)
        if kind in _LAZY_SHAPES:
            for a in arrays:
                check_known_shape(a)
        return xp
    xp = apc.array_namespace(*arrays)
    for a in arrays:
        check_known_shape(a)
    return xp


def check_known_shape(x: Any) -> None:
    """Raise unless every length of the shape of `x` is known.

    A Dask array made by boolean indexing (``x[x > 0]``) has NaN lengths until
    ``compute_chunk_sizes()`` has run; nothing can be counted or ranked before that.

    Raises
    ------
    ValueError
        If a length of ``x.shape`` is NaN or None.
    """
    shape = getattr(x, "shape", ())
    if any(n is None or n != n for n in shape):
        raise ValueError(
            f"cannot prune an array of shape {tuple(shape)}: unknown chunk sizes; "
            "call `.compute_chunk_sizes()` on the Dask array first"
        )


def widest_float(xp: Any, device: Any) -> Any:
    """``xp.float64`` if the library has it on `device`, else ``xp.float32``.

    Some devices lack float64 (Apple's MPS, some TPUs); the inspection API says which.
    """
    try:
        wide = xp.float64 in xp.__array_namespace_info__().dtypes(device=device).values()
    except AttributeError:  # pragma: no cover - libraries predating the inspection API
        wide = True
    return xp.float64 if wide else xp.float32
