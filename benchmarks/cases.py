"""The benchmark cases. Each appends rows (plain dicts) to ``ctx.records``.

Every row times arrayprune and ``torch.nn.utils.prune`` on the same data, in this
process, on alternating rounds (:func:`benchmarks.timing.compare`), together with the
physical floor: one memory pass over the same data, ``np.abs(x) > c``.

Row fields: ``case``, ``label``, ``size`` (parameters), ``shape``, ``times`` (name to
median seconds per call; names ``arrayprune``, ``torch``, ``partition``, ``floor``,
``adapter``), ``timings`` (samples), ``memory`` (name to bytes per parameter, with the
method in ``memory_method``), ``checks`` and ``note``.
"""

from __future__ import annotations

import copy
import gc
import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import arrayprune as ap

from . import data
from .memory import rss_probe, traced_peak_bytes
from .timing import Bench, Settings, compare

try:  # PyTorch is the reference; without it only the arrayprune columns are filled
    import torch
    import torch.nn.utils.prune as tprune
except ImportError:  # pragma: no cover
    torch = None
    tprune = None

#: |x| of a standard normal exceeds these with probability 1/2 and 1/5: the floor
#: pass compares against the threshold an exact selection would find.
C_HALF = np.float32(0.6745)
C_80 = np.float32(1.2816)

TRACEMALLOC = "tracemalloc peak during the call minus traced memory before (NumPy allocations)"
RSS = "fresh subprocess: peak RSS (VmHWM, reset before the call) minus VmRSS after allocating the inputs"


@dataclass
class Context:
    """What every case needs: mode, timing settings, output rows and a logger."""

    quick: bool
    settings: Settings
    log: Callable[[str], None] = print
    records: list[dict[str, Any]] = field(default_factory=list)
    adapter: Any = None
    adapter_error: str | None = None

    def add(self, row: dict[str, Any]) -> None:
        row.setdefault("memory", {})
        row.setdefault("checks", {})
        row.setdefault("note", "")
        self.records.append(row)
        t = row.get("times", {})
        parts = [f"{k}={_fmt(v)}" for k, v in t.items()]
        if "arrayprune" in t and "torch" in t:
            parts.append(f"speedup={t['torch'] / t['arrayprune']:.1f}x")
        if "arrayprune" in t and "floor" in t:
            parts.append(f"floor_x={t['arrayprune'] / t['floor']:.2f}")
        mem = ", ".join(f"{k}={v:.2f}B/p" for k, v in row["memory"].items() if isinstance(v, (int, float)))
        self.log(f"  {row['case']:<10} {row['label']:<28} " + " ".join(parts) + (f"  [{mem}]" if mem else ""))


def _fmt(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f}ms"
    return f"{seconds * 1e6:.1f}us"


def _times(timings: dict[str, Any]) -> tuple[dict[str, float], dict[str, Any]]:
    return {k: v.median for k, v in timings.items()}, {k: v.as_dict() for k, v in timings.items()}


def _probe(spec: dict[str, Any], row: dict[str, Any], name: str) -> None:
    rep = rss_probe(spec)
    row.setdefault("memory", {})
    row.setdefault("memory_detail", {})
    row["memory_detail"][name] = rep
    if "error" in rep:
        row["memory"][name] = f"error: {rep['error']}"
    else:
        row["memory"][name] = rep["bytes_per_param"]
        row.setdefault("memory_method", {})[name] = RSS + (" (upper bound)" if rep.get("upper_bound") else "")


def _traced(fn: Callable[[], Any], params: int, row: dict[str, Any], name: str) -> None:
    row.setdefault("memory", {})[name] = traced_peak_bytes(fn) / params
    row.setdefault("memory_method", {})[name] = TRACEMALLOC


def load_adapter(ctx: Context) -> None:
    """Import ``arrayprune.adapters.torch`` if it exists; remember why not otherwise."""
    try:
        ctx.adapter = importlib.import_module("arrayprune.adapters.torch")
    except Exception as exc:  # ImportError, or a half-written module
        ctx.adapter = None
        ctx.adapter_error = f"{type(exc).__name__}: {exc}"
        return
    missing = [n for n in ("l1_unstructured", "remove", "global_unstructured") if not hasattr(ctx.adapter, n)]
    if missing:
        ctx.adapter_error = f"arrayprune.adapters.torch lacks {', '.join(missing)}"
        ctx.adapter = None


# --------------------------------------------------------------------------------------
# 1. single arrays
# --------------------------------------------------------------------------------------


def case_l1(ctx: Context) -> None:
    """L1 unstructured mask, amount 0.5, flat float32 arrays, boolean default mask.

    arrayprune vs torch (topk) vs the np.partition peer vs the floor. Sizes 2^10..2^26
    for the selection-vs-partition comparison; PyTorch from 2^16 (and, in quick mode,
    only up to 2^22: its topk takes seconds above).
    """
    if ctx.quick:
        exps = [10, 12, 14, 16, 18, 20, 22, 24]
        torch_exps = {16, 18, 20, 22}
        probe_exp = None  # no memory subprocesses in quick mode
    else:
        exps = list(range(10, 27))
        torch_exps = {16, 18, 20, 22, 24, 26}
        probe_exp = 24
    for e in exps:
        n = 1 << e
        k = round(0.5 * n)
        x = data.vector(n)
        m = np.ones(n, dtype=bool)
        benches: dict[str, Any] = {
            "arrayprune": lambda x=x, m=m: ap.L1Unstructured(0.5).compute_mask(x, m),
            # the k-th-smallest primitive alone, held to np.partition
            "selection": lambda x=x, k=k: ap.smallest_magnitude_keep([x], k)[0],
            "partition": lambda x=x, k=k: np.abs(x) > np.partition(np.abs(x), k - 1)[k - 1],
            "floor": lambda x=x: np.abs(x) > C_HALF,
        }
        if torch is not None and e in torch_exps:
            t = torch.from_numpy(x)
            tm = torch.ones_like(t)
            benches["torch"] = lambda t=t, tm=tm: tprune.L1Unstructured(0.5).compute_mask(t, tm)
        times, samples = _times(compare(benches, ctx.settings))
        row = {"case": "l1", "label": f"2^{e}", "exp": e, "size": n, "shape": [n], "times": times, "timings": samples}
        mask = ap.L1Unstructured(0.5).compute_mask(x, m)
        row["checks"] = {"pruned": int(n - np.count_nonzero(mask)), "expected": k}
        if "torch" in benches:
            tmask = tprune.L1Unstructured(0.5).compute_mask(t, tm).numpy() != 0
            row["checks"]["entries_differing_from_torch"] = int(np.count_nonzero(tmask != mask))
            del tmask
        del mask
        if e >= 16:
            _traced(benches["arrayprune"], n, row, "arrayprune")
            _traced(benches["partition"], n, row, "partition")
        if e == probe_exp and torch is not None:
            _probe({"op": "l1", "lib": "torch", "n": n}, row, "torch")
            _probe({"op": "l1", "lib": "arrayprune", "n": n}, row, "arrayprune_rss")
        ctx.add(row)
        del benches, x, m
        gc.collect()


def _structured_shapes(quick: bool) -> list[tuple[str, tuple[int, ...]]]:
    if quick:
        return [("conv", (64, 64, 3, 3)), ("conv", (512, 512, 3, 3)), ("linear", (1024, 1024)), ("linear", (4096, 4096))]
    return [
        ("conv", (64, 64, 3, 3)),
        ("conv", (128, 128, 3, 3)),
        ("conv", (256, 256, 3, 3)),
        ("conv", (512, 512, 3, 3)),
        ("conv", (1024, 1024, 3, 3)),
        ("linear", (1024, 1024)),
        ("linear", (4096, 1024)),
        ("linear", (4096, 4096)),
    ]


def case_structured(ctx: Context) -> None:
    """Ln structured (n=2, dim 0, amount 0.5) with a float32 default mask on both sides."""
    shapes = _structured_shapes(ctx.quick)
    largest = max(shapes, key=lambda s: np.prod(s[1]))
    for kind, shape in shapes:
        x = data.tensor(shape)
        mf = np.ones(shape, dtype=np.float32)
        benches: dict[str, Any] = {
            "arrayprune": lambda x=x, mf=mf: ap.LnStructured(0.5, n=2, dim=0).compute_mask(x, mf),
            "floor": lambda x=x: np.abs(x) > C_HALF,
        }
        if torch is not None:
            t = torch.from_numpy(x)
            tm = torch.ones_like(t)
            benches["torch"] = lambda t=t, tm=tm: tprune.LnStructured(0.5, n=2, dim=0).compute_mask(t, tm)
            # PyTorch with one intra-op thread: on a shared 2-core machine its default
            # 2 threads can wait on each other for a whole time slice; the target is
            # judged against the faster of the two configurations.
            threads = torch.get_num_threads()
            benches["torch_1thread"] = Bench(
                run=benches["torch"],
                enter=lambda: torch.set_num_threads(1),
                exit=lambda threads=threads: torch.set_num_threads(threads),
            )
        # Diagnostics: the channel norms alone, where most of the time goes.
        others = tuple(range(1, x.ndim))
        benches["arrayprune_norms"] = lambda x=x: ap.channel_norms(x, 2, 0)
        if torch is not None:
            benches["torch_norms"] = lambda t=t, others=others: torch.linalg.vector_norm(t, 2, dim=others)
        times, samples = _times(compare(benches, ctx.settings))
        label = f"{kind} {'x'.join(map(str, shape))}"
        row = {
            "case": "structured",
            "label": label,
            "size": x.size,
            "shape": list(shape),
            "times": times,
            "timings": samples,
        }
        if torch is not None:
            a = ap.LnStructured(0.5, n=2, dim=0).compute_mask(x, mf)
            b = tprune.LnStructured(0.5, n=2, dim=0).compute_mask(t, tm).numpy()
            row["checks"] = {"mask_dtype": str(a.dtype), "entries_differing_from_torch": int(np.count_nonzero(a != b))}
        _traced(benches["arrayprune"], x.size, row, "arrayprune")
        if (kind, shape) == largest and torch is not None and not ctx.quick:
            _probe({"op": "structured", "lib": "torch", "shape": list(shape)}, row, "torch")
        ctx.add(row)
        del benches, x, mf
        gc.collect()


def case_random(ctx: Context) -> None:
    """Random unstructured, amount 0.5: counts only (the two libraries' RNGs differ)."""
    exps = [16, 20] if ctx.quick else [16, 20, 24]
    for e in exps:
        n = 1 << e
        x = data.vector(n)
        m = np.ones(n, dtype=bool)
        benches: dict[str, Any] = {
            "arrayprune": lambda x=x, m=m: ap.RandomUnstructured(0.5, seed=0).compute_mask(x, m),
            "floor": lambda x=x: np.abs(x) > C_HALF,
        }
        if torch is not None:
            t = torch.from_numpy(x)
            tm = torch.ones_like(t)
            benches["torch"] = lambda t=t, tm=tm: tprune.RandomUnstructured(0.5).compute_mask(t, tm)
        times, samples = _times(compare(benches, ctx.settings))
        row = {"case": "random", "label": f"2^{e}", "size": n, "shape": [n], "times": times, "timings": samples}
        row["checks"] = {
            "expected": round(0.5 * n),
            "pruned_arrayprune": int(n - np.count_nonzero(benches["arrayprune"]())),
        }
        if torch is not None:
            row["checks"]["pruned_torch"] = int(n - torch.count_nonzero(benches["torch"]()).item())
        row["note"] = "random numbers differ between libraries; only the counts are compared"
        _traced(benches["arrayprune"], n, row, "arrayprune")
        ctx.add(row)
        del benches, x, m
        gc.collect()


def _ap_chain(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    c = ap.PruningContainer()
    for method in (ap.L1Unstructured(0.3), ap.LnStructured(0.2, n=2, dim=0), ap.L1Unstructured(0.3)):
        c.add_pruning_method(method)
        mask = c.compute_mask(x, mask)
    return mask


def _torch_chain(t: Any, mask: Any) -> Any:
    # PyTorch's container writes into the default mask it is given (``mask.to(dtype)``
    # returns the same tensor); a pruned module hands it a clone, and so does this.
    mask = mask.clone()
    c = tprune.PruningContainer()
    c._tensor_name = None  # methods built outside a module have no tensor name
    for method in (tprune.L1Unstructured(0.3), tprune.LnStructured(0.2, n=2, dim=0), tprune.L1Unstructured(0.3)):
        method._tensor_name = None
        c.add_pruning_method(method)
        mask = c.compute_mask(t, mask)
    return mask


def case_chain(ctx: Context) -> None:
    """Iterative pruning in a PruningContainer: L1 0.3 -> Ln structured 0.2 dim 0 -> L1 0.3.

    Float32 masks on both sides (what a pruned module holds); the time is the whole chain.
    """
    shapes = (
        [("conv", (256, 256, 3, 3)), ("linear", (1024, 1024))]
        if ctx.quick
        else [
            ("conv", (512, 512, 3, 3)),
            ("linear", (4096, 4096)),
        ]
    )
    for kind, shape in shapes:
        x = data.tensor(shape)
        mf = np.ones(shape, dtype=np.float32)
        benches: dict[str, Any] = {
            "arrayprune": lambda x=x, mf=mf: _ap_chain(x, mf),
            "floor": lambda x=x: np.abs(x) > C_HALF,
        }
        if torch is not None:
            t = torch.from_numpy(x)
            tm = torch.ones_like(t)
            benches["torch"] = lambda t=t, tm=tm: _torch_chain(t, tm)
        times, samples = _times(compare(benches, ctx.settings))
        label = f"{kind} {'x'.join(map(str, shape))}"
        row = {
            "case": "chain",
            "label": label,
            "size": x.size,
            "shape": list(shape),
            "times": times,
            "timings": samples,
        }
        a = _ap_chain(x, mf)
        row["checks"] = {"kept_arrayprune": int(np.count_nonzero(a)), "default_mask_untouched": bool(mf.all())}
        if torch is not None:
            b = _torch_chain(t, tm).numpy()
            row["checks"]["kept_torch"] = int(np.count_nonzero(b))
            row["checks"]["entries_differing_from_torch"] = int(np.count_nonzero(a != b))
            row["checks"]["default_mask_untouched"] &= bool(tm.all())
        _traced(benches["arrayprune"], x.size, row, "arrayprune")
        ctx.add(row)
        del benches, x, mf
        gc.collect()


# --------------------------------------------------------------------------------------
# 2. global pruning
# --------------------------------------------------------------------------------------


def case_global(ctx: Context) -> None:
    """Global L1 pruning, amount 0.8, over 50 float32 arrays (~100M parameters; quick ~10M).

    arrayprune on the NumPy arrays vs torch.nn.utils.prune.global_unstructured over 50
    Linear-like modules holding the same memory (fresh modules per run; torch's time
    includes its re-parametrisation, weight = weight_orig * weight_mask, one pass).
    arrayprune, the floor and the adapter (if present) alternate first; then PyTorch runs
    once here (its masks serve the agreement check) and once in its memory subprocess:
    its ~5 GB of temporaries would disturb every allocation timed after it.
    """
    total = 10_000_000 if ctx.quick else 100_000_000
    shapes = data.global_shapes(total)
    arrays = data.global_arrays(shapes)
    params = sum(a.size for a in arrays)
    label = f"{len(arrays)} arrays, {params / 1e6:.0f}M"
    benches: dict[str, Any] = {
        "arrayprune": lambda arrays=arrays: ap.global_unstructured(arrays, ap.L1Unstructured, amount=0.8),
        "floor": lambda arrays=arrays: [np.abs(a) > C_80 for a in arrays],
    }
    adapter = ctx.adapter if torch is not None else None
    if adapter is not None:
        method = getattr(adapter, "L1Unstructured", ap.L1Unstructured)
        benches["adapter"] = (
            lambda arrays=arrays: [(m, "weight") for m in data.holders(arrays)],
            lambda pairs: adapter.global_unstructured(pairs, method, amount=0.8),
        )
    ctx.log(f"  global: {label}")
    times, samples = _times(compare(benches, ctx.settings))
    masks = ap.global_unstructured(arrays, ap.L1Unstructured, amount=0.8)
    row = {
        "case": "global",
        "label": label,
        "size": params,
        "shape": [list(s) for s in shapes],
        "times": {k: times[k] for k in ("arrayprune", "floor")},
        "timings": {k: samples[k] for k in ("arrayprune", "floor")},
    }
    row["checks"] = {
        "pruned": int(params - sum(int(np.count_nonzero(mk)) for mk in masks)),
        "expected": round(0.8 * params),
    }
    arow = None
    if adapter is not None:
        arow = {
            "case": "global",
            "label": label + " (adapter)",
            "size": params,
            "times": {"arrayprune": times["adapter"], "floor": times["floor"]},
            "timings": {"adapter": samples["adapter"], "floor": samples["floor"]},
            "note": "arrayprune.adapters.torch.global_unstructured over the same modules; PyTorch time from the row above",
        }
        pairs = [(m, "weight") for m in data.holders(arrays)]
        adapter.global_unstructured(pairs, method, amount=0.8)
        arow["checks"] = {
            "entries_differing_from_core": int(
                sum(
                    int(np.count_nonzero((m.weight_mask.numpy() != 0) != mk))
                    for (m, _), mk in zip(pairs, masks, strict=True)
                )
            )
        }
        del pairs
    gc.collect()
    _traced(benches["arrayprune"], params, row, "arrayprune")
    _probe({"op": "global", "lib": "arrayprune", "total": total}, row, "arrayprune_rss")
    if adapter is not None:
        _probe({"op": "global", "lib": "adapter", "total": total}, arow, "arrayprune")
    if torch is not None:
        ctx.log("  global: PyTorch, once here and once in its memory subprocess")
        pairs = [(m, "weight") for m in data.holders(arrays)]
        gc.collect()
        t0 = time.perf_counter()
        tprune.global_unstructured(pairs, tprune.L1Unstructured, amount=0.8)
        t_torch = [time.perf_counter() - t0]
        row["checks"]["entries_differing_from_torch"] = int(
            sum(
                int(np.count_nonzero((m.weight_mask.numpy() != 0) != mk))
                for (m, _), mk in zip(pairs, masks, strict=True)
            )
        )
        del pairs
        gc.collect()
        _probe({"op": "global", "lib": "torch", "total": total}, row, "torch")
        rep = row["memory_detail"]["torch"]
        if "time_s" in rep:
            t_torch.append(rep["time_s"])
        row["times"]["torch"] = sum(t_torch) / len(t_torch)
        row["timings"]["torch"] = {
            "median_s": row["times"]["torch"],
            "min_s": min(t_torch),
            "number": 1,
            "samples_s": t_torch,
        }
        row["note"] = (
            f"PyTorch timed once in this process and once in its memory subprocess ({', '.join(f'{t:.1f} s' for t in t_torch)}); "
            "the table shows their mean"
        )
        if arow is not None:
            arow["times"]["torch"] = row["times"]["torch"]
    del masks
    ctx.add(row)
    if arow is not None:
        ctx.add(arow)
    else:
        ctx.add(
            {
                "case": "global",
                "label": label + " (adapter)",
                "size": params,
                "times": {},
                "note": f"skipped: adapter not available ({ctx.adapter_error})",
                "skipped": True,
            }
        )
    del arrays, benches
    gc.collect()


# --------------------------------------------------------------------------------------
# 3. the PyTorch adapter on models
# --------------------------------------------------------------------------------------


def _prune_pass(lib: Any, targets: list[tuple[Any, str]]) -> None:
    for module, name in targets:
        lib.l1_unstructured(module, name, amount=0.5)
        lib.remove(module, name)


def case_adapter(ctx: Context) -> None:
    """l1_unstructured(amount=0.5) + remove over a model, adapter vs torch.nn.utils.prune.

    ResNet-18 (every conv/linear weight, 21 tensors, 11.7M parameters) and a small MLP of
    10 Linear(64, 64) (weights and biases: 20 tensors). Each run prunes a fresh deep copy
    of the same model (the copy is made outside the timed region).
    """
    if torch is None or ctx.adapter is None:
        for label in ("ResNet-18", "small MLP 10x Linear(64,64)"):
            ctx.add(
                {
                    "case": "adapter",
                    "label": label,
                    "times": {},
                    "skipped": True,
                    "note": f"skipped: adapter not available ({ctx.adapter_error})",
                }
            )
        ctx.log(f"  adapter: skipped: adapter not available ({ctx.adapter_error})")
        return
    adapter = ctx.adapter
    for label, model, with_bias in (
        ("ResNet-18", data.resnet18(), False),
        ("small MLP 10x Linear(64,64)", data.small_model(), True),
    ):
        targets = data.prunable_modules(model, with_bias)
        params = sum(getattr(m, n).numel() for m, n in targets)

        def fresh(model=model, with_bias=with_bias):
            return data.prunable_modules(copy.deepcopy(model), with_bias)

        # Diagnostic "core": arrayprune's own masks (boolean) for the same tensors, as
        # NumPy arrays; what is left of the adapter's time is its module-level work.
        weights = [getattr(m, n).detach().numpy().copy() for m, n in targets]
        ones = [np.ones(w.shape, dtype=bool) for w in weights]

        def core(weights=weights, ones=ones):
            for w, o in zip(weights, ones, strict=True):
                ap.L1Unstructured(0.5).compute_mask(w, o)

        benches = {
            "arrayprune": (fresh, lambda tg: _prune_pass(adapter, tg)),
            "torch": (fresh, lambda tg: _prune_pass(tprune, tg)),
            "core": core,
        }
        times, samples = _times(compare(benches, ctx.settings))
        row = {
            "case": "adapter",
            "label": label,
            "size": params,
            "tensors": len(targets),
            "times": times,
            "timings": samples,
        }
        row["per_tensor_us"] = {k: v / len(targets) * 1e6 for k, v in times.items()}
        a, b = fresh(), fresh()
        _prune_pass(adapter, a)
        _prune_pass(tprune, b)
        row["checks"] = {
            "entries_differing_from_torch": int(
                sum(int((getattr(ma, n) != getattr(mb, n)).sum()) for (ma, n), (mb, _) in zip(a, b, strict=True))
            ),
            "adapter_left_no_reparametrisation": all(
                not hasattr(ma, n + "_orig") and not hasattr(ma, n + "_mask") for ma, n in a
            ),
        }
        ctx.add(row)
        ctx.log("    per pruned tensor: " + ", ".join(f"{k}={v:.1f}us" for k, v in row["per_tensor_us"].items()))
        del a, b, model, benches, weights, ones
        gc.collect()


# --------------------------------------------------------------------------------------
# 4. N:M and block masks
# --------------------------------------------------------------------------------------


def case_nm(ctx: Context) -> None:
    """2:4 (N:M) and block masks at 2^24, once arrayprune has NMStructured / BlockUnstructured.

    PyTorch has no such methods; the row compares with the floor only.
    """
    n = 1 << 24
    specs = [
        ("2:4 N:M (dim -1)", "NMStructured", lambda cls: cls(n=2, m=4)),
        ("block 4x4, L1, amount 0.5", "BlockUnstructured", lambda cls: cls(0.5, block_shape=(4, 4))),
    ]
    x = None
    for label, attr, make in specs:
        cls = getattr(ap, attr, None)
        if cls is None:
            ctx.add(
                {
                    "case": "nm",
                    "label": label,
                    "size": n,
                    "times": {},
                    "skipped": True,
                    "note": "skipped: not implemented",
                }
            )
            ctx.log(f"  nm: {label}: skipped: not implemented")
            continue
        if x is None:
            x = data.tensor((4096, 4096))  # 2^24 entries
            m = np.ones(x.shape, dtype=bool)
        try:
            method = make(cls)
            method.compute_mask(x, m)
        except Exception as exc:  # constructor signature not the one guessed here
            ctx.add(
                {
                    "case": "nm",
                    "label": label,
                    "size": n,
                    "times": {},
                    "skipped": True,
                    "note": f"skipped: {attr} API not recognised ({type(exc).__name__}: {exc})",
                }
            )
            continue
        benches = {
            "arrayprune": lambda method=method, x=x, m=m: method.compute_mask(x, m),
            "floor": lambda x=x: np.abs(x) > C_HALF,
        }
        times, samples = _times(compare(benches, ctx.settings, repeats={"arrayprune": 3} if ctx.quick else None))
        row = {"case": "nm", "label": label, "size": n, "shape": list(x.shape), "times": times, "timings": samples}
        _traced(benches["arrayprune"], n, row, "arrayprune")
        ctx.add(row)


CASES: dict[str, Callable[[Context], None]] = {
    "l1": case_l1,
    "structured": case_structured,
    "random": case_random,
    "chain": case_chain,
    "global": case_global,
    "adapter": case_adapter,
    "nm": case_nm,
}
