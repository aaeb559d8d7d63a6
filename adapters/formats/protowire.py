"""Protobuf messages written in pieces: a message around one of its fields, records of buffers.

A serialized protobuf message is a sequence of fields, each a key (field number and wire
type, as a varint) and a value; a length-delimited value (wire type 2: bytes, strings,
embedded messages) is a varint byte count followed by the bytes. A message can therefore
be written as its fields numbered below one field, that field's records, and its fields
numbered above it, without ever being held whole in one buffer: the ONNX writer uses this
to write tensor data straight from arrays. The protobuf runtimes write known fields in
field-number order (the encoding guide asks serializers to), so a message written in
pieces that way has the bytes of the message serialized whole.

Parsers accept fields in any order and merge a singular embedded message that appears
twice (its repeated fields concatenated, in order), which is the way out for a message
with fields that its schema does not know (:func:`has_unknown_fields`): only a whole copy
keeps those, followed by a second record of the embedded message.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Buffers", "field_header", "has_unknown_fields", "nbytes", "split", "varint", "without"]

#: Pieces of a serialized message, to be written one after the other: ``bytes``, or 1-D
#: ``memoryview`` objects of format ``"B"`` (so that ``len`` of each is its byte count).
Buffers = Sequence[Any]

_LENGTH_DELIMITED = 2


def varint(n: int) -> bytes:
    """`n` (a non-negative integer) as a protobuf base-128 varint.

    Parameters
    ----------
    n : int
        The value.

    Returns
    -------
    bytes
        Seven bits per byte, least significant group first, the high bit set on every
        byte but the last.

    Raises
    ------
    ValueError
        If `n` is negative.
    """
    if n < 0:
        raise ValueError(f"a varint length cannot be negative, got {n}")
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field_header(number: int, length: int) -> bytes:
    """The key and length of a length-delimited field: what precedes its `length` bytes.

    Parameters
    ----------
    number : int
        The field number.
    length : int
        The byte count of the value.

    Returns
    -------
    bytes
    """
    return varint(number << 3 | _LENGTH_DELIMITED) + varint(length)


def nbytes(buffers: Buffers) -> int:
    """The byte count of `buffers` written one after the other."""
    return sum(len(b) for b in buffers)


def _is_repeated(field: Any) -> bool:
    flag = getattr(field, "is_repeated", None)  # protobuf >= 5.28; `label` before
    return bool(flag) if flag is not None else field.label == field.LABEL_REPEATED


def _copy_fields(message: Any, keep: Callable[[int], bool]) -> Any:
    """A new message of `message`'s type with copies of its set fields whose number `keep` accepts."""
    out = type(message)()
    for field, value in message.ListFields():
        if not keep(field.number):
            continue
        if _is_repeated(field):
            getattr(out, field.name).extend(value)
        elif field.message_type is not None:
            getattr(out, field.name).CopyFrom(value)
        else:
            setattr(out, field.name, value)
    return out


def split(message: Any, number: int) -> tuple[Any, Any]:
    """Copies of the fields of `message` numbered below `number`, and of those above it.

    The field `number` itself is in neither, and is never copied. Serialized one after
    the other with that field's records between them, the two parts have the bytes of
    `message` serialized whole (when it has no unknown fields: see
    :func:`has_unknown_fields`).

    Parameters
    ----------
    message : google.protobuf.message.Message
        The message (left as it is).
    number : int
        The field left out.

    Returns
    -------
    tuple of two messages
        Of `message`'s type: ``(below, above)``.
    """
    return _copy_fields(message, lambda n: n < number), _copy_fields(message, lambda n: n > number)


def without(message: Any, number: int) -> Any:
    """A copy of `message` without its field `number`.

    That field is not copied, unless `message` holds unknown fields (see
    :func:`has_unknown_fields`), which only a whole copy keeps: then the message is
    copied whole and the field cleared.

    Parameters
    ----------
    message : google.protobuf.message.Message
        The message (left as it is).
    number : int
        The field left out.

    Returns
    -------
    message
        Of `message`'s type.
    """
    if has_unknown_fields(message):
        out = type(message)()
        out.CopyFrom(message)
        out.ClearField(message.DESCRIPTOR.fields_by_number[number].name)
        return out
    return _copy_fields(message, lambda n: n != number)


def has_unknown_fields(message: Any) -> bool:
    """Whether `message` itself (not its sub-messages) holds fields its schema does not know.

    Such fields are kept by a whole copy of the message, not by :func:`split`. Where the
    protobuf runtime cannot tell, the answer is True.
    """
    try:
        from google.protobuf.unknown_fields import UnknownFieldSet
    except ImportError:  # protobuf < 4.23: the method, since removed
        try:
            return len(message.UnknownFields()) > 0
        except Exception:  # noqa: BLE001 - no way to tell: assume there are some
            return True
    return len(UnknownFieldSet(message)) > 0
