"""Files on disk: regular-file checks, atomic writes, and cleanup on termination signals.

Only regular files are read (after following symlinks): a FIFO, device or socket is
refused before it is opened. :func:`atomic_write` writes through a temporary file
renamed into place (:func:`atomic_files` several files at once, renamed in order);
:func:`resolve_inside` keeps names read from a file inside its folder;
:func:`cleanup_on_signals` turns SIGTERM and SIGHUP into an
exception so that the temporary files of an interrupted write are removed.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

from .errors import FormatError, _describe

_FILE_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_regular(mode: int) -> str | None:
    """Why a file of this ``st_mode`` is not read, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a directory"
    kind = next((name for test, name in _FILE_KINDS if test(mode)), "a special file")
    return f"not a regular file ({kind})"


def _require_regular(path: str) -> os.stat_result:
    """Stat `path` (following symlinks); refuse anything but an existing regular file."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise FormatError(path, exc.strerror or _describe(exc)) from None
    problem = _not_regular(st.st_mode)
    if problem:
        raise FormatError(path, problem)
    return st


def _open_regular(path: str) -> IO[bytes]:
    """Open a regular file for reading without ever blocking on a FIFO or device."""
    _require_regular(path)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise FormatError(path, exc.strerror or _describe(exc)) from None
    problem = _not_regular(os.fstat(fd).st_mode)  # replaced between stat and open
    if problem:
        os.close(fd)
        raise FormatError(path, problem)
    return os.fdopen(fd, "rb")


def _fsync_dir(folder: str) -> None:
    """Make renames in `folder` durable (where the platform allows it)."""
    if not hasattr(os, "O_DIRECTORY"):
        return
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_TERM_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


class _Terminated(BaseException):
    """A termination signal turned into an exception (a BaseException, like
    KeyboardInterrupt, so that ``except Exception`` lets it through to the cleanups)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_signals_state: dict[str, Any] = {"active": False, "received": None}


def _on_termination(signum: int, frame: Any) -> None:
    if _signals_state["received"] is not None:
        return  # a second signal while the first one's cleanups run: they finish first
    _signals_state["received"] = signum
    raise _Terminated(signum)


@contextlib.contextmanager
def cleanup_on_signals() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into an exception inside the block, then exit.

    While the block runs, these signals raise an exception in the main thread, so that
    ``finally`` clauses and cleanups (such as the removal of the temporary files of
    :func:`atomic_write`) run; the exception is then turned into
    ``SystemExit(128 + signum)`` (143 for SIGTERM, 129 for SIGHUP), the status a shell
    reports for a process killed by the signal. A second signal during the cleanups is
    ignored. The previous handlers are restored when the block ends.

    Only signals whose action is the default (termination) are taken over: signals that
    are ignored or already handled by the program are left alone. Outside the main
    thread (where Python cannot set handlers), and inside another such block, it does
    nothing. :func:`~arrayprune.adapters.formats.save` and :func:`atomic_write` use it
    themselves; a command-line program wraps its whole run in it::

        with formats.cleanup_on_signals():
            return run(args)

    Yields
    ------
    None

    Raises
    ------
    SystemExit
        With status 128 + the signal number, when one of the signals arrived.
    """
    if _signals_state["active"] or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}
    for signum in _TERM_SIGNALS:
        try:
            if signal.getsignal(signum) is signal.SIG_DFL:
                previous[signum] = signal.signal(signum, _on_termination)
        except (ValueError, OSError):  # pragma: no cover - a platform without it
            pass
    _signals_state["active"] = True

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _signals_state["active"] = False

    try:
        try:
            yield
        finally:
            restore()
    except _Terminated as exc:
        restore()  # again: the signal may have come while restoring
        _signals_state["received"] = None
        raise SystemExit(128 + exc.signum) from None


def atomic_write(path: Any, write: Callable[[IO[bytes]], None]) -> None:
    """Write a file through a temporary file in its folder, renamed into place at the end.

    The temporary file is ``.NAME.XXXXXXXX.tmp`` in the destination's folder; it is
    flushed to disk (``fsync``) before :func:`os.replace` renames it into place, and the
    folder is synced after. If `write` or any step fails, or SIGINT, SIGTERM or SIGHUP
    arrives (see :func:`cleanup_on_signals`), the temporary file is removed and the
    destination is left as it was.

    Parameters
    ----------
    path : str or os.PathLike
        The destination.
    write : callable
        Called with a binary file object open for writing; what it writes becomes the
        file. If it raises, the destination is left as it was.

    Raises
    ------
    FormatError
        If the folder does not exist or cannot be written.
    """
    with atomic_files([path]) as (f,):
        write(f)


@contextlib.contextmanager
def atomic_files(paths: Sequence[Any]) -> Iterator[list[IO[bytes]]]:
    """Write several files at once, each through a temporary file renamed into place.

    Every destination gets a temporary file ``.NAME.XXXXXXXX.tmp`` in its folder, open
    for writing (and seeking: data may be written at any offset). When the block ends
    normally, every file is flushed to disk (``fsync``) and only then renamed into place,
    in the order of `paths` (so the last one, an index say, appears last), and the
    folders are synced. If the block raises, or SIGINT, SIGTERM or SIGHUP arrives (see
    :func:`cleanup_on_signals`), every temporary file is removed and no destination is
    touched. :func:`atomic_write` is this with one file.

    Parameters
    ----------
    paths : sequence of str or os.PathLike
        The destinations, all distinct.

    Yields
    ------
    list of file objects
        Binary files open for writing, one per destination, in the order of `paths`.

    Raises
    ------
    FormatError
        If a folder does not exist or cannot be written.
    """
    paths = [os.fspath(p) for p in paths]
    folders = [os.path.dirname(os.path.abspath(p)) for p in paths]
    for path, folder in zip(paths, folders, strict=True):
        if not os.path.isdir(folder):
            raise FormatError(path, f"folder {folder!r} does not exist")
    with cleanup_on_signals():
        temps: list[str] = []
        handles: list[IO[bytes]] = []
        try:
            for path, folder in zip(paths, folders, strict=True):
                try:
                    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
                except OSError as exc:
                    raise FormatError(path, f"cannot write in {folder!r}: {exc.strerror or _describe(exc)}") from None
                temps.append(tmp)
                handles.append(os.fdopen(fd, "wb"))
            yield list(handles)
            for f in handles:
                f.flush()
                os.fsync(f.fileno())
                f.close()
            umask = os.umask(0)
            os.umask(umask)
            for i, (tmp, path) in enumerate(zip(temps, paths, strict=True)):
                os.chmod(tmp, 0o666 & ~umask)
                os.replace(tmp, path)
                temps[i] = ""  # in place: no longer ours to remove
        except BaseException:
            for f in handles:
                with contextlib.suppress(OSError):
                    f.close()
            for tmp in temps:
                if tmp:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
            raise
    for folder in dict.fromkeys(folders):
        _fsync_dir(folder)


def cache_blobs(folder: str) -> str | None:
    """The ``blobs/`` folder of the Hugging Face cache repository `folder` is a snapshot of.

    ``huggingface_hub`` downloads a repository into
    ``models--ORG--NAME/snapshots/REVISION/``, whose files are symlinks to
    ``../../blobs/SHA256``. For such a `folder` (after following symlinks: a parent
    named ``snapshots`` inside a folder named ``models--*``), this is the real path of
    that repository's ``blobs`` folder, else None.

    Parameters
    ----------
    folder : str
        A folder.

    Returns
    -------
    str or None
    """
    snapshots = os.path.dirname(os.path.realpath(folder))
    repo = os.path.dirname(snapshots)
    if os.path.basename(snapshots) != "snapshots" or not os.path.basename(repo).startswith("models--"):
        return None
    return os.path.join(repo, "blobs")


def resolve_inside(folder: str, name: str, *, blobs: str | None = None) -> tuple[str | None, str | None]:
    """Where a file named relative to `folder` is, if it stays inside and is regular.

    Parameters
    ----------
    folder : str
        The folder the name is relative to.
    name : str
        A relative path, as a model's index or graph gives it.
    blobs : str, optional
        A second folder that symlinks may lead into: a file of `folder` that is a
        symlink into it is accepted (:func:`cache_blobs` of a Hugging Face snapshot).

    Returns
    -------
    tuple
        ``(real_path, None)`` for a regular file inside `folder` (after following
        symlinks), else ``(None, problem)``, where `problem` is one of ``"empty"``,
        ``"absolute"``, ``"outside"`` (``..``), ``"symlink"`` (a link leading out,
        other than into `blobs`),
        ``"missing"``, or the reason :func:`_not_regular` gives.
    """
    if not name:
        return None, "empty"
    if os.path.isabs(name) or name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return None, "absolute"
    parts = re.split(r"[\\/]+", name)
    if ".." in parts:
        return None, "outside"
    base = os.path.realpath(folder)
    real = os.path.realpath(os.path.join(base, *parts))
    inside = os.path.commonpath([base, real]) == base
    if not inside and blobs is not None:
        inside = os.path.dirname(real) == os.path.realpath(blobs)  # a blob of the same cache repository
    if not inside:
        return None, "symlink"
    try:
        mode = os.stat(real).st_mode
    except OSError:
        return None, "missing"
    return (None, problem) if (problem := _not_regular(mode)) else (real, None)
