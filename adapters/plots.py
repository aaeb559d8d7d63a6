"""Pictures: a scan's curves, a file's per-tensor sparsity (matplotlib, the ``plot`` extra).

* :func:`plot_scan`: one curve per weight, the output error (log scale) against the
  sparsity, each weight named after the graph node reading it, in the model's order;
  the fragile weights (:func:`fragile_curves`) drawn bold; with many weights, a heat map
  (weights by sparsities, the colour the error's logarithm) instead.
* :func:`plot_sparsity`: one bar per tensor, its sparsity, coloured by whether it is 2:4
  sparse along its reduction axis (what ``arrayprune report`` says), or nearly empty
  (a warning, not a pattern).

What each picture draws comes from a plain function (:func:`scan_picture`,
:func:`sparsity_bars`), so that it can be checked without looking.

Figures are drawn with matplotlib's Agg canvas (no display, no global backend state) and
written as PNG atomically. matplotlib is an optional dependency:
``pip install "arrayprune[plot]"``.
"""

from __future__ import annotations

import io
import math
import statistics
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from arrayprune.adapters import formats as fmt
from arrayprune.adapters.pipeline.prune_result import NEARLY_EMPTY
from arrayprune.adapters.plan import nodes_text

__all__ = [
    "FRAGILE_FACTOR",
    "HEATMAP_FROM",
    "MISSING",
    "Bar",
    "ScanPicture",
    "fragile_curves",
    "percent_text",
    "plot_scan",
    "plot_sparsity",
    "require_matplotlib",
    "scan_picture",
    "sparsity_bars",
]

#: Scans of this many weights or more are drawn as a heat map.
HEATMAP_FROM = 13
#: A weight is fragile when its mean output error is this many times the median of the others'.
FRAGILE_FACTOR = 10.0
#: Bar colours: 2:4 sparse, not 2:4, nearly empty (a warning), the mean of all shown.
NM_COLOR, OTHER_COLOR, EMPTY_COLOR, MEAN_COLOR = "#2a9d8f", "#8d99ae", "#d62828", "#264653"
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


def percent_text(fraction: float) -> str:
    """``fraction`` as a percentage for a label, never rounded to 0% or 100% when it is not.

    >>> percent_text(0.5), percent_text(0.9999), percent_text(0.99999999), percent_text(1.0)
    ('50.0%', '99.99%', '>99.9999%', '100.0%')
    """
    p = 100 * float(fraction)
    for digits in range(1, 5):
        text = f"{p:.{digits}f}"
        if not ((float(text) == 100 and p < 100) or (float(text) == 0 and p > 0)):
            return text + "%"
    return ">99.9999%" if p > 50 else "<0.0001%"


def fragile_curves(curves: Sequence[Any], factor: float = FRAGILE_FACTOR) -> list[int]:
    """Indices of the fragile curves: mean output error (:attr:`Curve.fragility`) at least
    `factor` times the median of the other curves', and above zero.

    None is fragile when the weights are alike, whatever their values; a lone weight
    has no others to be compared with.

    Parameters
    ----------
    curves : sequence of Curve
    factor : float, default :data:`FRAGILE_FACTOR`

    Returns
    -------
    list of int
        Ascending.
    """
    values = [c.fragility for c in curves]
    out = []
    for i, v in enumerate(values):
        others = values[:i] + values[i + 1 :]
        if others and v > 0 and v >= factor * statistics.median(others):
            out.append(i)
    return out


@dataclass(frozen=True)
class ScanPicture:
    """What :func:`plot_scan` draws.

    Attributes
    ----------
    labels : list of str
        One per weight, in the model's order (the scan's): the graph node reading it
        (``"+1 more"`` when several do), or its name without a graph.
    fragile : list of int
        Indices of the weights drawn bold (:func:`fragile_curves`).
    heat_map : bool
        Whether the weights are drawn as a heat map (:data:`HEATMAP_FROM` or more).
    legend : str
        The words that say what bold means.
    """

    labels: list[str]
    fragile: list[int]
    heat_map: bool
    legend: str


def scan_picture(result: Any) -> ScanPicture:
    """What :func:`plot_scan` draws for `result`: labels, order, the fragile weights."""
    curves = list(result.curves)
    labels = [nodes_text(c.nodes, 1) if c.nodes else c.name for c in curves]
    fragile = fragile_curves(curves)
    legend = f"bold: fragile, mean output error >= {FRAGILE_FACTOR:g}x the median of the others" + (
        "" if fragile else " (none)"
    )
    return ScanPicture(labels, fragile, len(curves) >= HEATMAP_FROM, legend)


def plot_scan(result: Any, path: Any, *, title: str | None = None) -> None:
    """Draw a sensitivity scan into a PNG file.

    Parameters
    ----------
    result : ScanResult
        From :func:`arrayprune.adapters.pipeline.scan.scan_onnx` or
        :func:`~arrayprune.adapters.pipeline.scan.scan_arrays`.
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
    picture = scan_picture(result)
    title = title or f"{result.model or 'model'}: {result.method}, each weight pruned alone"
    errors = [e for c in curves for e in c.errors if e > 0]
    floor = min(errors) / 10 if errors else 1e-12
    if picture.heat_map:
        _heat_map(result, curves, picture, path, title, floor)
        return
    fig = _figure(9.0, 5.2)
    ax = fig.add_subplot()
    bold = set(picture.fragile)
    colors = _colors(len(curves))
    xs = [100 * s for s in result.sparsities]
    for i, c in enumerate(curves):
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
            label=f"{_short(picture.labels[i])} {tuple(c.shape)}" + (" (fragile)" if i in bold else ""),
            zorder=3 if strong else 2,
        )
    ax.set_yscale("log")
    ax.set_xlabel("sparsity of the weight (%), the others dense")
    ax.set_ylabel("output error (relative squared error)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.35)
    legend_title = "in the model's order\n" + textwrap.fill(picture.legend, 34)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title=legend_title, title_fontsize=8)
    _save(fig, path)


def _colors(n: int) -> list[Any]:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _heat_map(result: Any, curves: list[Any], picture: ScanPicture, path: Any, title: str, floor: float) -> None:
    import numpy as np

    values = np.log10(np.maximum(np.array([c.errors for c in curves], dtype=np.float64), floor))
    height = min(2.0 + 0.18 * len(curves), 60.0)
    fig = _figure(9.0, height)
    ax = fig.add_subplot()
    image = ax.imshow(values, aspect="auto", cmap="magma", interpolation="nearest")
    ax.set_xticks(range(len(result.sparsities)), [f"{100 * s:g}%" for s in result.sparsities], fontsize=8)
    ax.set_yticks(range(len(curves)), [_short(t, 48) for t in picture.labels], fontsize=6 if len(curves) > 40 else 8)
    for i in picture.fragile:
        ax.get_yticklabels()[i].set_fontweight("bold")
        ax.get_yticklabels()[i].set_color("#b00000")
    ax.set_xlabel("sparsity of the weight, the others dense")
    legend = picture.legend.replace("bold", "bold red")
    ax.set_title(f"{title}\n(weights in the model's order; {legend})", fontsize=10)
    bar = fig.colorbar(image, ax=ax, shrink=min(1.0, 8.0 / height) if height > 8 else 1.0)
    bar.set_label("log10 output error (relative squared error)")
    _save(fig, path)


@dataclass(frozen=True)
class Bar:
    """One bar of :func:`plot_sparsity`.

    Attributes
    ----------
    label : str
        The tensor's name.
    sparsity : float
        Its fraction of zeros.
    text : str
        The percentage written by the bar (:func:`percent_text`).
    kind : str
        ``"nearly empty"`` (:data:`~arrayprune.adapters.pipeline.NEARLY_EMPTY` or more
        zero: a warning, whatever its pattern), ``"2:4"`` (2:4 sparse along its
        reduction axis) or ``"other"``.
    color : str
        The bar's colour, by its kind.
    """

    label: str
    sparsity: float
    text: str
    kind: str
    color: str


def sparsity_bars(rows: Sequence[Mapping[str, Any]]) -> list[Bar]:
    """What :func:`plot_sparsity` draws for report rows, top to bottom (see there).

    Raises
    ------
    ValueError
        If no tensor is left to draw.
    """
    shown = [r for r in rows if r.get("prunable") and r.get("tied_to") is None]
    if not shown:
        shown = [r for r in rows if r.get("zeros") and r.get("tied_to") is None]
    if not shown:
        raise ValueError("no prunable tensor and no tensor with zeros: nothing to draw")
    bars = []
    for r in shown:
        sparsity = float(r["sparsity"])
        if sparsity >= NEARLY_EMPTY:
            kind, color = "nearly empty", EMPTY_COLOR
        elif r.get("nm_2_4"):
            kind, color = "2:4", NM_COLOR
        else:
            kind, color = "other", OTHER_COLOR
        bars.append(Bar(str(r["name"]), sparsity, percent_text(sparsity), kind, color))
    return bars


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
    bars = sparsity_bars(rows)
    shown = [r for r in rows if r.get("prunable") and r.get("tied_to") is None]
    if not shown:
        shown = [r for r in rows if r.get("zeros") and r.get("tied_to") is None]
    height = min(1.8 + 0.22 * len(bars), 80.0)
    fig = _figure(9.0, height)
    ax = fig.add_subplot()
    ys = list(range(len(bars)))[::-1]
    pct = [100 * b.sparsity for b in bars]
    ax.barh(ys, pct, color=[b.color for b in bars], height=0.72)
    ax.set_yticks(ys, [_short(b.label, 48) for b in bars], fontsize=7 if len(bars) > 30 else 8)
    for y, p, b in zip(ys, pct, bars, strict=True):
        inside = p > 88  # no room after the bar: the text ends inside it, in white
        ax.text(p - 1 if inside else p + 1, y, b.text, va="center", ha="right" if inside else "left", fontsize=7,
                color="white" if inside else "black", fontweight="bold" if inside else "normal")  # fmt: skip
    ax.set_xlim(0, 100)
    ax.set_xlabel("sparsity (%)")
    total = sum(int(r["zeros"]) for r in shown), sum(int(r["size"]) for r in shown)
    overall = total[0] / total[1] if total[1] else 0.0
    if not math.isnan(overall):
        ax.axvline(100 * overall, color=MEAN_COLOR, linestyle=":", linewidth=1.5)
    from matplotlib.patches import Patch

    handles = [
        Patch(color=NM_COLOR, label="2:4 sparse (reduction axis)"),
        Patch(color=OTHER_COLOR, label="not 2:4"),
        Patch(color=EMPTY_COLOR, label=f"nearly empty ({percent_text(NEARLY_EMPTY)}+ zero):\npasses almost nothing on"),
        Patch(color=MEAN_COLOR, label=f"all shown: {percent_text(overall)}"),
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.set_title(title or "sparsity per tensor", fontsize=10)
    _save(fig, path)
