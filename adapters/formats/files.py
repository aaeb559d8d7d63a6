"""Files on disk: regular-file checks, atomic writes, and cleanup on termination signals.

Only regular files are read (after following symlinks): a FIFO, device or socket is
refused before it is opened. :func:`atomic_write` writes through a temporary file
renamed into place (:func:`atomic_files` several files at once, renamed in order;
:func:`atomic_write_named` one whose name depends on what is written; :func:`write_out`
large data, its writeback to disk started as it goes);
:func:`resolve_inside` keeps names read from a file inside its folder;
:func:`cleanup_on_signals` turns SIGTERM and SIGHUP into an
exception so that the temporary files of an interrupted write are removed.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any

from .errors import FormatError, _describe

__all__ = [
    "read_json",
    "atomic_files",
    "atomic_write",
    "atomic_write_named",
    "write_out",
    "cache_blobs",
    "cleanup_on_signals",
    "replace_folder",
    "resolve_inside",
]

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


def read_json(path: str, limit: int, what: str, invalid: str, **loads: Any) -> Any:
    """The JSON value of the regular file `path`, at most `limit` bytes.

    Anything else is a :class:`FormatError`: a file over `limit` (named as `what`, e.g.
    ``"index"``), or one that `invalid` describes (``"not a valid index"``): not JSON,
    nested too deeply. `loads` go to :func:`json.loads` (``object_pairs_hook``).
    """
    st = _require_regular(path)
    if st.st_size > limit:
        raise FormatError(path, f"{what} of {st.st_size} bytes, larger than {limit}")
    with _open_regular(path) as f:
        data = f.read(limit + 1)
    try:
        return json.loads(data, **loads)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormatError(path, f"{invalid}: {_describe(exc)}") from None
    except RecursionError:  # the JSON parser recurses per level of nesting
        raise FormatError(path, f"{invalid}: nested too deeply") from None


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


def atomic_write(path: Any, write: Callable[[IO[bytes]], object]) -> None:
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


def atomic_write_named(folder: Any, prefix: str, write: Callable[[IO[bytes]], str]) -> str:
    """Write a file whose name is known only once it is written, atomically.

    As :func:`atomic_write`, through a temporary file ``.PREFIX.XXXXXXXX.tmp`` in
    `folder`: `write` writes the content and returns the name to give it (in `folder`,
    e.g. one made from a hash of the content, computed while writing); the file is then
    flushed to disk (``fsync``), renamed to that name with :func:`os.replace` (a file of
    that name is replaced), and the folder is synced. If `write` or any step fails, or
    SIGINT, SIGTERM or SIGHUP arrives, the temporary file is removed and nothing else is
    touched.

    Parameters
    ----------
    folder : str or os.PathLike
        Where the file goes.
    prefix : str
        The start of the temporary file's name (after its leading dot).
    write : callable
        Called with a binary file object open for writing; returns the file's name, a
        plain name in `folder` (no separator).

    Returns
    -------
    str
        The path of the file written.

    Raises
    ------
    FormatError
        If the folder does not exist or cannot be written.
    ValueError
        If `write` returns a name that is not a plain file name.
    """
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise FormatError(folder, f"folder {folder!r} does not exist")
    with cleanup_on_signals():
        try:
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{prefix}.", suffix=".tmp")
        except OSError as exc:
            raise FormatError(folder, f"cannot write in {folder!r}: {exc.strerror or _describe(exc)}") from None
        try:
            with os.fdopen(fd, "wb") as f:
                name = write(f)
                if not name or os.path.basename(name) != name or name in (".", ".."):
                    raise ValueError(f"not a plain file name: {name!r}")
                f.flush()
                os.fsync(f.fileno())
            path = os.path.join(folder, name)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    _fsync_dir(folder)
    return path


_WRITEBACK_SLICE = 64 << 20  # bytes written between two starts of writeback
_WRITEBACK_MIN = 1 << 20  # smaller data is only written (buffered)
_SYNC_FILE_RANGE_WRITE = 2
_sync_file_range_fn: list[Any] = []


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Start writing a range of a file to disk, without waiting: ``sync_file_range`` with
    ``SYNC_FILE_RANGE_WRITE`` (Linux); nothing where the C library lacks it. A hint only:
    durability comes from the ``fsync`` that follows, which then has little left to do."""
    if not _sync_file_range_fn:
        lib = ctypes.util.find_library("c") if hasattr(os, "uname") and os.uname().sysname == "Linux" else None
        fn = None
        if lib:
            try:
                fn = ctypes.CDLL(lib, use_errno=True).sync_file_range
                fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):
                fn = None
        _sync_file_range_fn.append(fn)
    fn = _sync_file_range_fn[0]
    if fn is not None:
        fn(fd, offset, length, _SYNC_FILE_RANGE_WRITE)  # a failure only means no early start


def write_out(f: IO[bytes], data: Any) -> None:
    """Write `data` to the file `f`, starting its way to disk as it goes.

    Data of 1 MiB or more is written in slices of 64 MiB straight from its memory, and
    after each slice the kernel is asked to start writing it to disk (Linux:
    ``sync_file_range``) rather than let dirty pages pile up until the final ``fsync``
    (where the writer may also be throttled): the ``fsync`` that :func:`atomic_write`
    and :func:`atomic_write_named` end with then finds most of the file on disk already.
    Smaller data is only written.

    Parameters
    ----------
    f : binary file object
        Open for writing, at the position where `data` goes (a real file: ``fileno``).
    data : bytes-like
        Anything that exports a buffer (``bytes``, ``memoryview``, a C-contiguous
        ``ndarray``).
    """
    view = memoryview(data)
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    if len(view) < _WRITEBACK_MIN:
        f.write(view)
        return
    f.flush()
    start = f.tell()
    fd = f.fileno()
    for i in range(0, len(view), _WRITEBACK_SLICE):
        piece = view[i : i + _WRITEBACK_SLICE]
        f.write(piece)
        f.flush()
        _start_writeback(fd, start + i, len(piece))


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
    ``../../blobs/SHA256`` (``../../../blobs/SHA256`` in a sub-folder such as ``onnx/``).
    For such a `folder` (after following symlinks: the snapshot itself or a folder inside
    it, under ``snapshots`` inside a folder named ``models--*``), this is the real path of
    that repository's ``blobs`` folder, else None.

    Parameters
    ----------
    folder : str
        A folder.

    Returns
    -------
    str or None
    """
    here = os.path.realpath(folder)
    while True:
        snapshots = os.path.dirname(here)
        repo = os.path.dirname(snapshots)
        if os.path.basename(snapshots) == "snapshots" and os.path.basename(repo).startswith("models--"):
            return os.path.join(repo, "blobs")
        if snapshots == here or repo == snapshots:  # the root: no snapshot above
            return None
        here = snapshots


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


# --------------------------------------------------------------------------------------
# Folders switched as a whole
# --------------------------------------------------------------------------------------

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_renameat2_fn: list[Any] = []


def _renameat2(src: str, dst: str, flags: int) -> bool:
    """``renameat2(src, dst, flags)`` (Linux); False where the C library, kernel or
    filesystem lacks it, an OSError for any other failure."""
    if not _renameat2_fn:
        lib = ctypes.util.find_library("c") if hasattr(os, "uname") and os.uname().sysname == "Linux" else None
        fn = None
        if lib:
            try:
                fn = ctypes.CDLL(lib, use_errno=True).renameat2
                fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):
                fn = None
        _renameat2_fn.append(fn)
    fn = _renameat2_fn[0]
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), dst)


def _step(name: str) -> None:
    """Called after each step of :func:`replace_folder` and of the writers that use it
    (a point where a kill must leave the destination whole); tests replace it."""


_STALE = re.compile(r"^\.(?P<base>.+)\.(?P<pid>\d+)\.[A-Za-z0-9_]+\.tmp(?P<old>\.old)?$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process
    return True


def _clean_stale(parent: str, base: str, dst: str) -> None:
    """Remove the temporary folders of runs into `dst` that were killed (their process is
    gone); a folder set aside by a run killed between its two renames goes back to `dst`."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    stale = [(n, m) for n in names if (m := _STALE.match(n)) and m["base"] == base and not _alive(int(m["pid"]))]
    for name, m in sorted(stale, key=lambda nm: nm[1]["old"] is None):  # the set-aside folders first
        path = os.path.join(parent, name)
        if m["old"] and not os.path.lexists(dst):
            with contextlib.suppress(OSError):
                os.rename(path, dst)
                continue
        shutil.rmtree(path, ignore_errors=True)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copy2(src, dst, follow_symlinks=False)


def _carry_over(old: str, new: str) -> None:
    """Give folder `new` every entry of `old` that it does not have (hard links, else copies)."""
    for name in sorted(os.listdir(old)):
        src, dst = os.path.join(old, name), os.path.join(new, name)
        if os.path.lexists(dst):
            continue
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        elif os.path.isdir(src):
            shutil.copytree(src, dst, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(src, dst)


def _exchange(new: str, dst: str) -> None:
    """Put folder `new` at `dst` and the old `dst` at `new`: one step where the system has
    ``RENAME_EXCHANGE``, else the old one renamed aside, the new one into place, and the
    old one to `new` (a kill between the first two leaves ``NEW.old``, which the next run
    puts back)."""
    if _renameat2(new, dst, _RENAME_EXCHANGE):
        return
    aside = new + ".old"
    os.rename(dst, aside)
    _step("aside")
    try:
        os.rename(new, dst)
    except BaseException:
        os.rename(aside, dst)
        raise
    os.rename(aside, new)


def _rename_new(tmp: str, dst: str) -> None:
    """Rename folder `tmp` to `dst`, which must not exist (not even as an empty folder)."""
    try:
        done = _renameat2(tmp, dst, _RENAME_NOREPLACE)
    except FileExistsError:
        done, exists = False, True
    else:
        exists = not done and os.path.lexists(dst)
    if exists:
        raise FormatError(dst, "was created by another process while this one wrote it; left as it is")
    if not done:
        os.rename(tmp, dst)


@contextlib.contextmanager
def replace_folder(dst: Any, *, replace: bool = True) -> Iterator[str]:
    """Write folder `dst` as a whole: fill a hidden sibling, then switch it in one step.

    The block receives a new empty folder ``.NAME.PID.XXXXXXXX.tmp`` beside `dst` and
    fills it. When the block ends normally, the entries of an existing `dst` that the new
    folder lacks are carried over (hard links where the filesystem allows, else copies),
    everything is synced, and the new folder takes the place of `dst` in one step
    (``renameat2(RENAME_EXCHANGE)`` on Linux; elsewhere the old one is renamed aside
    first), then the old folder is removed. A new `dst` is renamed into place only if no
    folder appeared there meanwhile. So at every instant `dst` is the old folder or the
    new one, whole, and two runs writing `dst` at once leave one of the two whole.

    If the block raises, or SIGINT, SIGTERM or SIGHUP arrives (see
    :func:`cleanup_on_signals`), the new folder is removed and `dst` is left as it was
    (or absent). A run killed by SIGKILL may leave its hidden folder: the next run into
    `dst` removes it.

    Parameters
    ----------
    dst : str or os.PathLike
        The destination folder (its parent must exist).
    replace : bool, default True
        Whether an existing `dst` may be replaced. False (an output written without
        ``--force``): a folder at `dst`, there already or appearing while this one is
        written (a second run that passed the same check), is left as it is and this
        write fails.

    Yields
    ------
    str
        The folder to fill.

    Raises
    ------
    FormatError
        If the parent cannot be written, `dst` is not a folder, or a folder is at `dst`
        that may not be replaced (not `replace`, or it appeared while this one was written).
    """
    dst = os.path.abspath(os.fspath(dst))
    if os.path.islink(dst):
        dst = os.path.realpath(dst)  # the folder it leads to is replaced; the link stays
    parent, base = os.path.dirname(dst), os.path.basename(dst)
    _clean_stale(parent, base, dst)
    existed = os.path.isdir(dst)  # else: a folder that appears meanwhile is not replaced
    if existed and not replace:
        raise FormatError(dst, "was created by another process while this one wrote it; left as it is")
    with cleanup_on_signals():
        try:
            tmp = tempfile.mkdtemp(dir=parent, prefix=f".{base}.{os.getpid()}.", suffix=".tmp")
        except OSError as exc:
            raise FormatError(dst, f"cannot write in {parent!r}: {exc.strerror or _describe(exc)}") from None
        try:
            yield tmp
            if existed:
                _carry_over(dst, tmp)
                mode = stat.S_IMODE(os.stat(dst).st_mode)
            else:
                umask = os.umask(0)
                os.umask(umask)
                mode = 0o777 & ~umask
            os.chmod(tmp, mode)
            _fsync_dir(tmp)
            _step("complete")
            if existed:
                _exchange(tmp, dst)
            else:
                _rename_new(tmp, dst)
            _fsync_dir(parent)
            _step("switched")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # the new folder on failure, else the old one
    _step("removed")
