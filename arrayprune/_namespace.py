"""The Array API namespace of arrays, looked up once per array type."""

from __future__ import annotations

from typing import Any

import array_api_compat as apc

_BY_TYPE: dict[type, Any] = {}


def namespace(*arrays: Any) -> Any:
    """``array_api_compat.array_namespace`` of `arrays`, cached by array type.

    The namespace of an array depends only on its type for every library arrayprune
    supports, and the generic lookup costs microseconds that add up on small arrays.
    Mixed types go to the generic lookup, which raises for incompatible libraries.
    """
    kind = type(arrays[0])
    if all(type(a) is kind for a in arrays[1:]):
        xp = _BY_TYPE.get(kind)
        if xp is None:
            xp = _BY_TYPE[kind] = apc.array_namespace(arrays[0])
        return xp
    return apc.array_namespace(*arrays)


def widest_float(xp: Any, device: Any) -> Any:
    """``xp.float64`` if the library has it on `device`, else ``xp.float32``.

    Some devices lack float64 (Apple's MPS, some TPUs); the inspection API says which.
    """
    try:
        wide = xp.float64 in xp.__array_namespace_info__().dtypes(device=device).values()
    except AttributeError:  # pragma: no cover - libraries predating the inspection API
        wide = True
    return xp.float64 if wide else xp.float32
