"""Pictures: a scan's curves, a file's per-tensor sparsity (matplotlib, the ``plot`` extra).

* :func:`plot_scan`: one curve per weight, the output error (log scale) against the
  sparsity, the most fragile weights drawn bold and named first in the legend; with many
  weights, a heat map (weights by sparsities, the colour the error's logarithm) instead.
* :func:`plot_sparsity`: one bar per tensor, its sparsity, coloured by whether it is 2:4
  sparse along its reduction axis (what ``arrayprune report`` says).

Figures are drawn with matplotlib's Agg canvas (no display, no global backend state) and
written as PNG atomically. matplotlib is an optional dependency:
``pip install "arrayprune[plot]"``.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

from arrayprune.adapters import formats as fmt

__all__ = ["HEATMAP_FROM", "MISSING", "plot_scan", "plot_sparsity", "require_matplotlib"]

#: Scans of this many weights or more are drawn as a heat map.
HEATMAP_FROM = 13
#: Weights drawn bold (the most fragile) in a line plot.
BOLD = 3
#: The message when matplotlib is missing.
MISSING = 'drawing needs the \'matplotlib\' package: pip install "arrayprune[plot]"'


def require_matplotlib() -> Any:
    """Import matplotlib, or an ``ImportError`` naming the extra that installs it."""
    try:
        import matplotlib
        from matplotlib.figure import Figure  # noqa: F401
    except ImportError:
        raise ImportError(MISSING) from None
    return matplotlib


def _figure(width: float, height: float) -> Any:
    require_matplotlib()
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _save(fig: Any, path: Any) -> None:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    data = buffer.getvalue()
    fmt.atomic_write(path, lambda f: f.write(data))


def _short(name: str, most: int = 40) -> str:
    return name if len(name) <= most else "..." + name[-(most - 3) :]


def plot_scan(result: Any, path: Any, *, title: str | None = None) -> None:
    """Draw a sensitivity scan into a PNG file.

    Parameters
    ----------
    result : ScanResult
        From :func:`arrayprune.adapters.scan.scan_onnx` or :func:`~arrayprune.adapters.scan.scan_arrays`.
    path : str or os.PathLike
        The PNG to write (atomically). A line plot is 900 x 520 pixels; a heat map is
        900 pixels wide and grows with the number of weights.
    title : str, optional
        The title (default: the model, method and what the values are).

    Raises
    ------
    ImportError
        If matplotlib is missing (the message names the extra).
    """
    curves = list(result.curves)
    title = title or f"{result.model or 'model'}: {result.method}, each weight pruned alone"
    errors = [e for c in curves for e in c.errors if e > 0]
    floor = min(errors) / 10 if errors else 1e-12
    if len(curves) >= HEATMAP_FROM:
        _heat_map(result, curves, path, title, floor)
        return
    fig = _figure(9.0, 5.2)
    ax = fig.add_subplot()
    ranked = sorted(range(len(curves)), key=lambda i: -curves[i].fragility)
    bold = set(ranked[:BOLD]) if len(curves) > BOLD else set()
    colors = _colors(len(curves))
    xs = [100 * s for s in result.sparsities]
    for rank, i in enumerate(ranked):
        c = curves[i]
        ys = [max(e, floor) for e in c.errors]
        strong = i in bold or not bold
        ax.plot(
            xs,
            ys,
            marker="o" if strong else ".",
            linewidth=2.6 if i in bold else 1.2,
            linestyle="-" if strong else "--",
            alpha=1.0 if strong else 0.75,
            color=colors[i],
            label=f"{_short(c.name)} {tuple(c.shape)}" + (" (fragile)" if i in bold and rank < BOLD else ""),
            zorder=3 if strong else 2,
        )
    ax.set_yscale("log")
    ax.set_xlabel("sparsity of the weight (%), the others dense")
    ax.set_ylabel("output error (relative squared error)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.35)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title="most fragile first", title_fontsize=8)
    _save(fig, path)


def _colors(n: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _heat_map(result: Any, curves: list[Any], path: Any, title: str, floor: float) -> None:
    import numpy as np

    values = np.log10(np.maximum(np.array([c.errors for c in curves], dtype=np.float64), floor))
    height = min(2.0 + 0.18 * len(curves), 60.0)
    fig = _figure(9.0, height)
    ax = fig.add_subplot()
    image = ax.imshow(values, aspect="auto", cmap="magma", interpolation="nearest")
    ax.set_xticks(range(len(result.sparsities)), [f"{100 * s:g}%" for s in result.sparsities], fontsize=8)
    ax.set_yticks(range(len(curves)), [_short(c.name, 48) for c in curves], fontsize=6 if len(curves) > 40 else 8)
    fragile = sorted(range(len(curves)), key=lambda i: -curves[i].fragility)[:BOLD]
    for i in fragile:
        ax.get_yticklabels()[i].set_fontweight("bold")
        ax.get_yticklabels()[i].set_color("#b00000")
    ax.set_xlabel("sparsity of the weight, the others dense")
    ax.set_title(title + f"\n(bold red: the {len(fragile)} most fragile)", fontsize=10)
    bar = fig.colorbar(image, ax=ax, shrink=min(1.0, 8.0 / height) if height > 8 else 1.0)
    bar.set_label("log10 output error (relative squared error)")
    _save(fig, path)


def plot_sparsity(rows: Sequence[Mapping[str, Any]], path: Any, *, title: str = "") -> None:
    """Draw each tensor's sparsity as a bar, coloured by its 2:4 status, into a PNG file.

    Parameters
    ----------
    rows : sequence of mapping
        ``arrayprune report``'s rows (:func:`arrayprune.adapters.summary.report_rows`):
        ``name``, ``sparsity``, ``nm_2_4``, ``prunable``, ``tied_to``. Prunable tensors
        are drawn, or every floating tensor with zeros when none is prunable.
    path : str or os.PathLike
        The PNG to write (atomically): 900 pixels wide, 180 + 22 per tensor high.
    title : str, optional

    Raises
    ------
    ImportError
        If matplotlib is missing (the message names the extra).
    ValueError
        If no tensor is left to draw.
    """
    shown = [r for r in rows if r.get("prunable") and r.get("tied_to") is None]
    if not shown:
        shown = [r for r in rows if r.get("zeros") and r.get("tied_to") is None]
    if not shown:
        raise ValueError("no prunable tensor and no tensor with zeros: nothing to draw")
    height = min(1.8 + 0.22 * len(shown), 80.0)
    fig = _figure(9.0, height)
    ax = fig.add_subplot()
    ys = list(range(len(shown)))[::-1]
    colors = ["#2a9d8f" if r.get("nm_2_4") else "#8d99ae" for r in shown]
    pct = [100 * float(r["sparsity"]) for r in shown]
    ax.barh(ys, pct, color=colors, height=0.72)
    ax.set_yticks(ys, [_short(str(r["name"]), 48) for r in shown], fontsize=7 if len(shown) > 30 else 8)
    for y, p in zip(ys, pct, strict=True):
        ax.text(min(p + 1, 92), y, f"{p:.1f}%", va="center", fontsize=7)
    ax.set_xlim(0, 100)
    ax.set_xlabel("sparsity (%)")
    total = sum(int(r["zeros"]) for r in shown), sum(int(r["size"]) for r in shown)
    overall = 100 * total[0] / total[1] if total[1] else 0.0
    if not math.isnan(overall):
        ax.axvline(overall, color="#e76f51", linestyle=":", linewidth=1.5)
    from matplotlib.patches import Patch

    handles = [
        Patch(color="#2a9d8f", label="2:4 sparse (reduction axis)"),
        Patch(color="#8d99ae", label="not 2:4"),
        Patch(color="#e76f51", label=f"all shown: {overall:.1f}%"),
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.set_title(title or "sparsity per tensor", fontsize=10)
    _save(fig, path)
