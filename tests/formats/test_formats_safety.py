"""Safety of arrayprune.adapters.formats: atomic ONNX + external data, signals, special
files, zip bombs, missing optional packages, tensors without data."""

from __future__ import annotations

import errno
import os
import random
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import zipfile

import numpy as np
import pytest

from arrayprune.adapters import formats as fmt
from arrayprune.adapters.formats import files as fmt_files  # where the writers look up atomic_write

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

K, M = 2048, 128  # W [K, M] is external data (1 MiB); the bias [M] (512 bytes) stays inside the model


def _model(k=K, m=M):
    """x[1, k] -> MatMul(W [k, m]) -> Add(b [m]) -> y; every weight 1.0."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m])],
        initializer=[
            numpy_helper.from_array(np.ones((k, m), np.float32), "W"),
            numpy_helper.from_array(np.ones(m, np.float32), "b"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _source(folder, k=K, m=M):
    """An ONNX model with external data (onnx's own writer), loaded with formats.load."""
    folder.mkdir(exist_ok=True)
    onnx.save_model(
        _model(k, m), str(folder / "src.onnx"), save_as_external_data=True, location="src.bin", size_threshold=0
    )
    return fmt.load(folder / "src.onnx")


def _version(wf, v):
    """Every float initializer filled with the value `v`: the model's version."""
    return {name: np.full(np.shape(a), v, np.float32) for name, a in wf.params.items()}


def _whole_version(path):
    """The version of the model at `path`, after checking it is whole: the bias (inside the
    model) and W (external data) carry the same version, and onnxruntime computes with it."""
    model = onnx.load(str(path))  # with its external data
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    v = float(inits["b"][0])
    assert np.all(inits["b"] == v) and np.all(inits["W"] == v), f"mixed model: bias {v}, W {np.unique(inits['W'])[:4]}"
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    k = inits["W"].shape[0]
    y = sess.run(None, {"x": np.ones((1, k), np.float32)})[0]
    np.testing.assert_array_equal(y, np.full_like(y, v * k + v))
    return v


def _referenced(path):
    proto = onnx.load_model(str(path), load_external_data=False)
    return {e.value for t in proto.graph.initializer for e in t.external_data if e.key == "location"}


@pytest.fixture
def out_v1(tmp_path):
    """(WeightFile of the source, OUT written as version 1 with its external data)."""
    wf = _source(tmp_path / "src")
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "m.onnx"
    fmt.save(out, _version(wf, 1), like=wf)
    assert _whole_version(out) == 1
    return wf, out


# --------------------------------------------------------------------------------------
# ONNX model + external data replaced as a unit
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", ["data write", "data rename", "model write", "model rename"])
def test_onnx_failure_at_each_step_keeps_the_old_model_whole(out_v1, monkeypatch, step):
    wf, out = out_v1
    before = sorted(p.name for p in out.parent.iterdir())
    real_write, real_write_named, real_replace = fmt_files.atomic_write, fmt_files.atomic_write_named, os.replace

    def write_then_fail(f):
        f.write(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    def failing_write(path, write):
        is_model = os.fspath(path) == str(out)
        if step == ("model write" if is_model else "data write"):
            return real_write(path, write_then_fail)
        return real_write(path, write)

    def failing_write_named(folder, prefix, write):  # the data file: named after its content once written
        return real_write_named(folder, prefix, write_then_fail if step == "data write" else write)

    def failing_replace(src, dst, *args, **kwargs):
        is_model = os.fspath(dst) == str(out)
        if step == ("model rename" if is_model else "data rename"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(fmt_files, "atomic_write", failing_write)
    monkeypatch.setattr(fmt_files, "atomic_write_named", failing_write_named)
    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(fmt.FormatError, match="No space left"):
        fmt.save(out, _version(wf, 2), like=wf)
    monkeypatch.undo()
    assert _whole_version(out) == 1, "the old model, with its old weights"
    assert sorted(p.name for p in out.parent.iterdir()) == before, "nothing new left in the folder"


def test_onnx_failed_first_write_leaves_nothing(tmp_path, monkeypatch):
    wf = _source(tmp_path / "src")
    folder = tmp_path / "out"
    folder.mkdir()
    out = folder / "m.onnx"
    real_replace = os.replace

    def failing_replace(src, dst, *args, **kwargs):
        if os.fspath(dst) == str(out):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(fmt.FormatError, match="No space left"):
        fmt.save(out, _version(wf, 2), like=wf)
    assert list(folder.iterdir()) == [], "no stray m.onnx.data"


def test_onnx_interrupted_between_data_and_model_cleans_up(out_v1, monkeypatch):
    wf, out = out_v1
    before = sorted(p.name for p in out.parent.iterdir())
    real_write = fmt_files.atomic_write

    def interrupted(path, write):
        if os.fspath(path) == str(out):
            raise KeyboardInterrupt  # what SIGINT raises, and SIGTERM/SIGHUP through cleanup_on_signals
        return real_write(path, write)

    monkeypatch.setattr(fmt_files, "atomic_write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fmt.save(out, _version(wf, 2), like=wf)
    monkeypatch.undo()
    assert _whole_version(out) == 1
    assert sorted(p.name for p in out.parent.iterdir()) == before


def test_onnx_overwrite_leaves_one_data_file_and_spares_other_files(out_v1):
    wf, out = out_v1
    folder = out.parent
    # a file named like OUT's data that the old OUT does not reference, and a model of
    # someone else's in the same folder: neither may be touched
    (folder / "other.bin").write_bytes(b"belongs to another model")
    for v in (2, 3, 4):
        fmt.save(out, _version(wf, v), like=wf)
        assert _whole_version(out) == v
        names = sorted(p.name for p in folder.iterdir())
        data = [n for n in names if n.endswith(".data")]
        assert len(data) == 1 and set(data) == _referenced(out), names
        assert re.fullmatch(r"m\.onnx\.[0-9a-f]{16}\.data", data[0]), data
        assert not [n for n in names if n.endswith(".tmp")]
    assert (folder / "other.bin").read_bytes() == b"belongs to another model"


def test_onnx_data_file_not_referenced_by_the_old_output_is_never_overwritten(tmp_path):
    wf = _source(tmp_path / "src")
    folder = tmp_path / "out"
    folder.mkdir()
    foreign = folder / "m.onnx.data"
    foreign.write_bytes(b"not ours")
    fmt.save(folder / "m.onnx", _version(wf, 5), like=wf)
    assert foreign.read_bytes() == b"not ours"
    assert _whole_version(folder / "m.onnx") == 5
    (ref,) = _referenced(folder / "m.onnx")
    assert ref != "m.onnx.data" and ref.startswith("m.onnx.") and ref.endswith(".data")


def test_onnx_old_output_data_not_named_after_it_is_kept(tmp_path):
    wf = _source(tmp_path / "src")
    folder = tmp_path / "out"
    folder.mkdir()
    # OUT and another model share 'shared.bin' (written by onnx itself)
    for name in ("m.onnx", "twin.onnx"):
        onnx.save_model(_model(), str(folder / name), save_as_external_data=True, location="shared.bin")
    fmt.save(folder / "m.onnx", _version(wf, 7), like=wf)
    assert _whole_version(folder / "m.onnx") == 7
    assert _whole_version(folder / "twin.onnx") == 1, "the other model keeps its data"


def test_onnx_output_is_the_input(out_v1):
    _, out = out_v1
    wf = fmt.load(out)  # its external data is memory-mapped
    old_data = _referenced(out)
    fmt.save(out, {k: np.asarray(v) * 2 for k, v in wf.params.items()}, like=wf)
    assert _whole_version(out) == 2
    names = sorted(p.name for p in out.parent.iterdir())
    assert {n for n in names if n.endswith(".data")} == _referenced(out) != old_data, names
    assert np.all(wf.params["W"] == 1), "the input's arrays stay readable after its data is replaced"
    fmt.save(out, {k: np.asarray(v) * 3 for k, v in wf.params.items()}, like=wf)  # again, from the same input
    assert _whole_version(out) == 3
    assert len([n for n in os.listdir(out.parent) if n.endswith(".data")]) == 1


def _free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@pytest.fixture
def small_fs(tmp_path):
    """A 6 MiB tmpfs (root only); skipped where it cannot be mounted."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)],
            check=False,
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"mount failed: {exc}")
    if done.returncode != 0:
        pytest.skip(f"mount failed: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False, capture_output=True, timeout=20)


@pytest.mark.parametrize("room", ["less than the data", "the data but not the model"])
def test_onnx_on_a_really_full_filesystem(tmp_path, small_fs, room):
    wf = _source(tmp_path / "src")
    out = small_fs / "m.onnx"
    fmt.save(out, _version(wf, 1), like=wf)
    (data_file,) = small_fs.glob("m.onnx.*.data")
    data_size = data_file.stat().st_size
    pages = -(-data_size // 4096) * 4096
    keep = pages - 4096 if room == "less than the data" else pages  # tmpfs counts whole pages
    filler = small_fs / "filler"
    filler.write_bytes(b"\1" * (_free_bytes(small_fs) - keep))
    assert _free_bytes(small_fs) == keep
    before = sorted(p.name for p in small_fs.iterdir())
    with pytest.raises(fmt.FormatError, match="No space left"):
        fmt.save(out, _version(wf, 2), like=wf)
    assert _whole_version(out) == 1
    assert sorted(p.name for p in small_fs.iterdir()) == before
    filler.unlink()
    fmt.save(out, _version(wf, 2), like=wf)
    assert _whole_version(out) == 2
    assert len([p for p in small_fs.iterdir() if p.name.endswith(".data")]) == 1


KILL_POINTS = textwrap.dedent(
    """
    # A fresh interpreter (no threads: forking is safe) forks, for n = 1, 2, ..., a writer
    # of version 3 over OUT (version 2) that kills itself (SIGKILL) just before its n-th
    # file-system call among os.replace / rename / unlink / fsync, until one finishes.
    import os, signal, sys
    import numpy as np
    from arrayprune.adapters import formats as fmt

    wf = fmt.load(sys.argv[1])
    root = sys.argv[2]

    def version(v):
        return {k: np.full(np.shape(a), v, np.float32) for k, a in wf.params.items()}

    for n_call in range(1, 40):
        out = os.path.join(root, f"k{n_call}", "m.onnx")
        os.mkdir(os.path.dirname(out))
        fmt.save(out, version(1), like=wf)
        fmt.save(out, version(2), like=wf)  # OUT's data is now m.onnx.<token>.data
        pid = os.fork()
        if pid == 0:
            try:
                count = [0]

                def wrap(func):
                    def inner(*args, **kwargs):
                        count[0] += 1
                        if count[0] == n_call:
                            os.kill(os.getpid(), signal.SIGKILL)
                        return func(*args, **kwargs)

                    return inner

                for name in ("replace", "rename", "unlink", "fsync"):
                    setattr(os, name, wrap(getattr(os, name)))
                fmt.save(out, version(3), like=wf)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        print(out, int(killed), flush=True)
        if not killed:
            break
    """
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_onnx_writer_killed_at_every_step_leaves_old_or_new_whole(tmp_path):
    _source(tmp_path / "src")
    proc = subprocess.run(
        [sys.executable, "-c", KILL_POINTS, str(tmp_path / "src" / "src.onnx"), str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    runs = [line.split() for line in proc.stdout.splitlines()]
    assert runs and runs[-1][1] == "0", "the last writer finished"
    seen = [_whole_version(out) for out, _ in runs]
    assert seen[-1] == 3
    assert seen[0] == 2 and len(seen) >= 5, seen  # killed before and after the switch


WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from arrayprune.adapters import formats as fmt

    src, out = sys.argv[1], sys.argv[2]
    wf = fmt.load(src)
    print("ready", flush=True)
    v = 2
    while True:
        fmt.save(out, {k: np.full(np.shape(a), v, np.float32) for k, a in wf.params.items()}, like=wf)
        v += 1
    """
)


@pytest.mark.slow
def test_onnx_writer_killed_at_random_moments(tmp_path):
    wf = _source(tmp_path / "src", k=16384)  # 8 MiB of external data per write
    out = tmp_path / "m.onnx"
    fmt.save(out, _version(wf, 1), like=wf)
    rng = random.Random(1234)
    versions = []
    for _ in range(4):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path / "src" / "src.onnx"), str(out)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.0, 0.4))
        finally:
            proc.kill()
            proc.wait(timeout=20)
            proc.stdout.close()
        versions.append(_whole_version(out))
    assert all(v >= 1 for v in versions)


# --------------------------------------------------------------------------------------
# termination signals
# --------------------------------------------------------------------------------------

SLOW_WRITER = textwrap.dedent(
    """
    import sys, time
    from arrayprune.adapters import formats as fmt

    dst, mode = sys.argv[1], sys.argv[2]

    def slow(f):
        f.write(b"new" * 100000)
        f.flush()
        print("writing", flush=True)
        for _ in range(3000):
            f.write(b"x" * 4096)
            time.sleep(0.01)

    if mode == "context":
        with fmt.cleanup_on_signals():
            fmt.atomic_write(dst, slow)
    else:
        fmt.atomic_write(dst, slow)
    print("finished", flush=True)
    """
)


@pytest.mark.parametrize("mode", ["atomic_write", "context"])
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGHUP"])
def test_termination_signal_during_a_write_cleans_up(tmp_path, signame, mode):
    signum = getattr(signal, signame, None)
    if signum is None:
        pytest.skip(f"no {signame} here")
    if signal.getsignal(signum) is signal.SIG_IGN:
        pytest.skip(f"{signame} is ignored here (nohup): the writer inherits that and is not stopped by it")
    dst = tmp_path / "out.bin"
    dst.write_bytes(b"old content")
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_WRITER, str(dst), mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "writing"
        assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, (proc.returncode, err)
    assert "finished" not in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"], "the temporary file is removed"
    assert dst.read_bytes() == b"old content"


def test_cleanup_on_signals_restores_handlers_and_respects_the_programs_own():
    if not hasattr(signal, "SIGHUP"):
        pytest.skip("no SIGHUP here")

    def own(signum, frame):
        pass

    old_term, old_hup = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, own)
        with fmt.cleanup_on_signals():
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, own)
            assert signal.getsignal(signal.SIGHUP) is own, "a handler of the program is left alone"
            with fmt.cleanup_on_signals():  # nested: nothing changes
                pass
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGHUP) is own
        with pytest.raises(SystemExit) as info, fmt.cleanup_on_signals():
            signal.raise_signal(signal.SIGTERM)
            time.sleep(5)
        assert info.value.code == 128 + signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

        def in_thread():
            with fmt.cleanup_on_signals():  # not the main thread: a no-op, no error
                pass

        t = threading.Thread(target=in_thread)
        t.start()
        t.join()
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGHUP, old_hup)


# --------------------------------------------------------------------------------------
# FIFOs, devices, sockets
# --------------------------------------------------------------------------------------

FIFO_READER = textwrap.dedent(
    """
    import os, sys
    from arrayprune.adapters import formats as fmt

    for path, form in [(p, None) for p in sys.argv[1:]] + [(sys.argv[1], "npz"), (sys.argv[1], "onnx"),
                                                          (sys.argv[1], "safetensors"), (sys.argv[1], "torch")]:
        try:
            (fmt.detect_format if form is None else (lambda p: fmt.load(p, form)))(path)
            fmt.load(path)
            print("READ", path, form)
        except fmt.FormatError as exc:
            print(exc)
    """
)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_fifo_and_special_files_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    link = tmp_path / "link.npz"
    link.symlink_to(fifo)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", FIFO_READER, str(fifo), str(link)],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("reading a FIFO blocked")
    lines = proc.stdout.splitlines()
    assert len(lines) == 6 and proc.returncode == 0, (proc.stdout, proc.stderr)
    for line in lines:
        assert "not a regular file (a FIFO)" in line, line
    # a character device and a socket: refused with the same message
    with pytest.raises(fmt.FormatError, match="not a regular file \\(a character device\\)"):
        fmt.load(os.devnull)
    sock_path = tmp_path / "s.sock"
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(sock_path))
        for call in (fmt.detect_format, fmt.load):
            with pytest.raises(fmt.FormatError, match="not a regular file \\(a socket\\)"):
                call(sock_path)
    finally:
        sock.close()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_onnx_external_data_that_is_a_fifo_is_refused(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    onnx.save_model(_model(), str(folder / "m.onnx"), save_as_external_data=True, location="w.bin")
    (folder / "w.bin").unlink()
    os.mkfifo(folder / "w.bin")
    with pytest.raises(fmt.FormatError, match="'w.bin' not a regular file \\(a FIFO\\)"):
        fmt.load(folder / "m.onnx")


# --------------------------------------------------------------------------------------
# .npz bombs
# --------------------------------------------------------------------------------------


def _zeros_npz(path, nbytes, level, shape=None):
    """An .npz with one float32 member of `nbytes` zeros, deflated at `level`, streamed
    (the test never holds the array)."""
    with (
        zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=level, allowZip64=True) as zf,
        zf.open("w.npy", "w", force_zip64=True) as member,
    ):
        header = {"descr": "<f4", "fortran_order": False, "shape": shape or (nbytes // 4,)}
        np.lib.format.write_array_header_1_0(member, header)
        chunk = bytes(16 * 2**20)
        left = nbytes
        while left:
            member.write(chunk[: min(left, len(chunk))])
            left -= min(left, len(chunk))
    return path


@pytest.fixture(scope="module")
def bomb(tmp_path_factory):
    """12 MB that inflate to 2.5 GiB (deflate level 1: 229:1)."""
    return _zeros_npz(tmp_path_factory.mktemp("bomb") / "bomb.npz", 5 * 2**29, level=1)


LIMITED = textwrap.dedent(
    """
    import resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (3 * 2**29, 3 * 2**29))  # 1.5 GiB of address space
    import numpy as np
    from arrayprune.adapters import formats as fmt

    start = time.perf_counter()
    try:
        wf = fmt.load(sys.argv[1])
        print("LOADED", float(np.asarray(wf.params["w"], np.float64).sum()))
    except fmt.FormatError as exc:
        print("REFUSED", exc)
    print(time.perf_counter() - start)
    # peak resident memory of this process image (ru_maxrss would count the forking parent's)
    with open("/proc/self/status") as f:
        print(next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:")))
    """
)


def _run_limited(path, **env):
    proc = subprocess.run(
        [sys.executable, "-c", LIMITED, str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stderr
    result, seconds, peak = proc.stdout.splitlines()
    return result, float(seconds), int(peak)


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS and /proc are Linux's")
@pytest.mark.slow
def test_npz_bomb_beyond_memory_is_refused_quickly(bomb):
    assert bomb.stat().st_size < 16 * 2**20
    result, seconds, peak = _run_limited(bomb)
    assert result.startswith("REFUSED"), result
    assert "array 'w' inflates to 2.5 GiB, more than the" in result and "memory available" in result, result
    assert seconds < 2 and peak < 400 * 2**20, (seconds, peak)


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS and /proc are Linux's")
@pytest.mark.slow
def test_npz_legitimate_large_member_loads_under_the_same_limits(tmp_path):
    w = np.random.default_rng(0).standard_normal(12_500_000).astype(np.float32)  # 50 MB, barely compressible
    path = tmp_path / "big.npz"
    np.savez_compressed(path, w=w)
    assert path.stat().st_size > 40 * 2**20
    result, _, _ = _run_limited(path)
    assert result.startswith("LOADED"), result
    assert float(result.split()[1]) == pytest.approx(float(w.astype(np.float64).sum()), rel=1e-12)


@pytest.mark.slow
def test_npz_implausibly_compressed_member_is_refused(tmp_path, monkeypatch):
    path = _zeros_npz(tmp_path / "z.npz", 300 * 2**20, level=6)  # 1029:1
    monkeypatch.setattr(fmt, "MEMORY_LIMIT", 2**40)  # memory is not the reason
    start = time.perf_counter()
    with pytest.raises(fmt.FormatError, match="implausibly compressed .*1029:1.*zip bomb"):
        fmt.load(path)
    assert time.perf_counter() - start < 1


def test_npz_header_that_does_not_match_the_member_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "lie.npz"
    with zipfile.ZipFile(path, "w") as zf, zf.open("w.npy", "w") as member:
        np.lib.format.write_array_header_1_0(member, {"descr": "<f4", "fortran_order": False, "shape": (2**28,)})
        member.write(bytes(40))
    with pytest.raises(fmt.FormatError, match="header declares shape \\(268435456,\\).* holds 40"):
        fmt.load(path)


def test_memory_limit_settings(monkeypatch):
    monkeypatch.delenv("ARRAYPRUNE_MEMORY_LIMIT", raising=False)
    derived = fmt.memory_limit()
    assert 0 < derived < 2**63 - 1
    for text, value in [("512M", 512 * 2**20), ("8G", 8 * 2**30), ("1.5GiB", 3 * 2**29), ("1000", 1000)]:
        monkeypatch.setenv("ARRAYPRUNE_MEMORY_LIMIT", text)
        assert fmt.memory_limit() == value
    monkeypatch.setattr(fmt, "MEMORY_LIMIT", 12345)
    assert fmt.memory_limit() == 12345


def test_settings_assigned_on_the_package_are_the_ones_the_npz_checks_read(tmp_path, monkeypatch):
    monkeypatch.delenv("ARRAYPRUNE_MEMORY_LIMIT", raising=False)
    monkeypatch.delenv("ARRAYPRUNE_NPZ_MAX_RATIO", raising=False)
    path = tmp_path / "zeros.npz"
    np.savez_compressed(path, w=np.zeros(2**21, np.float32))  # 8 MiB deflated about 1000:1
    monkeypatch.setattr(fmt, "NPZ_RATIO_MIN_SIZE", 2**20)
    with pytest.raises(fmt.FormatError, match="1000:1"):
        fmt.load(path)
    monkeypatch.setattr(fmt, "NPZ_MAX_RATIO", 0)  # the check off: the file loads
    assert fmt.load(path).params["w"].shape == (2**21,)
    monkeypatch.setattr(fmt, "MEMORY_LIMIT", 4321)
    assert fmt.memory_limit() == 4321
    with pytest.raises(fmt.FormatError, match="4.2 KiB"):
        fmt.load(path)
    monkeypatch.undo()
    assert (fmt.MEMORY_LIMIT, fmt.NPZ_MAX_RATIO, fmt.NPZ_RATIO_MIN_SIZE) == (None, 1000, 256 * 2**20)
    assert fmt.load(path).params["w"].shape == (2**21,)


def test_npz_arrays_together_beyond_the_limit_are_refused(tmp_path, monkeypatch):
    path = tmp_path / "two.npz"
    np.savez(path, a=np.zeros(1000, np.float32), b=np.zeros(1000, np.float32))
    monkeypatch.setenv("ARRAYPRUNE_MEMORY_LIMIT", "6000")
    with pytest.raises(fmt.FormatError, match="the arrays inflate to"):
        fmt.load(path)
    monkeypatch.setenv("ARRAYPRUNE_MEMORY_LIMIT", "9000")
    assert fmt.load(path).params["b"].shape == (1000,)


# --------------------------------------------------------------------------------------
# missing optional packages
# --------------------------------------------------------------------------------------


def _files(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.numpy import save_file
    from safetensors.torch import save_file as save_torch_file

    arrays = {"w": np.ones((4, 4), np.float32)}
    save_file(arrays, str(tmp_path / "a.safetensors"))
    save_torch_file({"w": torch.ones(2, dtype=torch.bfloat16)}, str(tmp_path / "bf16.safetensors"))
    torch.save({"w": torch.ones(2)}, tmp_path / "a.pt")
    onnx.save_model(_model(8, 4), str(tmp_path / "a.onnx"))
    return fmt.load(tmp_path / "a.onnx")


@pytest.mark.parametrize(
    "missing, action",
    [
        ("onnx", "load a.onnx"),
        ("onnx", "save b.onnx"),
        ("safetensors", "load a.safetensors"),
        ("safetensors", "save b.safetensors"),
        ("safetensors", "save-torch b.safetensors"),
        ("torch", "load a.pt"),
        ("torch", "save b.pt"),
        ("torch", "load bf16.safetensors"),
    ],
)
def test_missing_optional_package_names_the_extra(tmp_path, monkeypatch, missing, action):
    torch = pytest.importorskip("torch")
    like = _files(tmp_path)
    verb, name = action.split()
    if verb == "save-torch":
        params = {"w": torch.ones(2)}
    else:
        params = like.params if name.endswith(".onnx") else {"w": np.ones(2, np.float32)}
    monkeypatch.setitem(sys.modules, missing, None)  # 'import missing' raises ImportError
    with pytest.raises(fmt.FormatError) as info:
        if verb == "load":
            fmt.load(tmp_path / name)
        else:
            fmt.save(tmp_path / name, params, like=like)
    assert f'pip install "arrayprune[{missing}]"' in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


# --------------------------------------------------------------------------------------
# tensors without data
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["o.npz", "o.safetensors", "o.pt", "o.onnx"])
def test_meta_tensors_are_refused_naming_the_tensor(tmp_path, name):
    torch = pytest.importorskip("torch")
    like = None
    params = {"x": {"w": torch.empty(3, 3, device="meta")}}
    if name.endswith(".onnx"):
        like = fmt.load(_zeros_onnx(tmp_path))
        params = {"W": torch.empty(8, 4, device="meta")}
    with pytest.raises(fmt.FormatError, match="tensor '(x/w|W)' is on the meta device: it has no data"):
        fmt.save(tmp_path / name, params, like=like)
    assert not (tmp_path / name).exists()
    with pytest.raises(ValueError, match="meta device"):
        fmt.to_numpy(torch.empty(2, device="meta"))


def _zeros_onnx(tmp_path):
    path = tmp_path / "src.onnx"
    onnx.save_model(_model(8, 4), str(path))
    return path


def test_save_refuses_a_tree_that_contains_itself(tmp_path):
    loop = {"w": np.ones((2, 2), np.float32)}
    loop["self"] = loop
    for name in ("a.npz", "a.pt", "a.safetensors"):
        with pytest.raises(fmt.FormatError, match="contains itself"):
            fmt.save(tmp_path / name, loop)
    assert list(tmp_path.iterdir()) == []
