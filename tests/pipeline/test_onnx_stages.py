"""Sequential calibration level by level: each level runs its own part of the graph only.

The plan is checked on a hand-built chain (which nodes each level runs, which values it
keeps and drops); the runner against onnxruntime running the whole graph (the values of
every level equal bit for bit); sequential SparseGPT with the runner against the same
without it (every weight and mask equal) on a ``transformers`` BERT exported by
``torch.onnx.export``, whose graph has residual adds, an attention mask built once from
the input and read by every layer, and weights of one level sharing an activation.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from arrayprune.adapters import formats  # noqa: E402
from arrayprune.adapters.pipeline import onnx_stages, reconstruction  # noqa: E402
from arrayprune.adapters.pipeline.calibration import _check_inputs, _fed_inputs, _run_batches, _session  # noqa: E402
from arrayprune.adapters.pipeline.onnx_stages import LevelRunner, stage_plan  # noqa: E402
from arrayprune.adapters.pipeline.reconstruction import onnx_sparsegpt  # noqa: E402


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _chain(folder, extra_nodes=()):
    """x -> MatMul w1 -> Relu -> MatMul w2 -> Add (x @ s, a skip read again at the end) -> MatMul w3 -> y."""
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["r1"]),
        helper.make_node("MatMul", ["x", "s"], ["skip"]),
        helper.make_node("MatMul", ["r1", "w2"], ["a2"]),
        helper.make_node("Add", ["a2", "skip"], ["r2"]),
        helper.make_node("MatMul", ["r2", "w3"], ["a3"]),
        helper.make_node("Add", ["a3", "skip"], ["y"]),
        *extra_nodes,
    ]
    inits = {"w1": _rand((6, 8), 1), "s": _rand((6, 8), 2), "w2": _rand((8, 8), 3), "w3": _rand((8, 8), 4)}
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 8])],
        initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = str(folder / "chain.onnx")
    onnx.save_model(model, path)
    return formats.load(path)


def test_the_plan_runs_every_node_once_and_keeps_only_what_later_levels_read(tmp_path):
    wf = _chain(tmp_path)
    model = wf.context["model"]
    plan = stage_plan(model, [["x"], ["r1"], ["r2"]])
    assert plan is None  # an activation that is a graph input: nothing to cut, run whole
    plan = stage_plan(model, [["r1"], ["r2"]])
    assert plan is not None
    names = [[model.graph.node[i].output[0] for i in s.nodes] for s in plan]
    assert names == [["a1", "r1"], ["skip", "a2", "r2"]]
    assert [s.frontier_in for s in plan] == [(), ("r1",)]
    assert [s.sources for s in plan] == [("x",), ("x",)]
    assert [s.fetch for s in plan] == [("r1",), ("r2",)]
    assert [s.made for s in plan] == [("r1",), ()]  # skip is read by no later level's nodes: not kept
    assert [s.drop for s in plan] == [(), ("r1",)]


def test_a_graph_with_a_subgraph_or_a_random_operator_is_run_whole(tmp_path):
    branch = helper.make_graph([helper.make_node("Identity", ["y"], ["z"])], "b", [],
                               [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])
    cond = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array(True), "c"))
    with_if = helper.make_node("If", ["c"], ["out"], then_branch=branch, else_branch=branch)
    assert stage_plan(_chain(tmp_path, [cond, with_if]).context["model"], [["r1"], ["r2"]]) is None
    noise = helper.make_node("RandomNormalLike", ["y"], ["n"])
    assert stage_plan(_chain(tmp_path, [noise]).context["model"], [["r1"], ["r2"]]) is None


def _bert_export(folder):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32,
    )
    model = transformers.BertModel(config).eval()

    class Hidden(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, ids, mask):
            return self.inner(input_ids=ids, attention_mask=mask).last_hidden_state

    buffer = io.BytesIO()
    example = (torch.zeros(1, 8, dtype=torch.int64), torch.ones(1, 8, dtype=torch.int64))
    torch.onnx.export(Hidden(model), example, buffer, input_names=["ids", "mask"], output_names=["hidden"],
                      dynamic_axes={"ids": {0: "b", 1: "s"}, "mask": {0: "b", 1: "s"}}, opset_version=17,
                      dynamo=False)
    path = folder / "bert.onnx"
    path.write_bytes(buffer.getvalue())
    wf = formats.load(str(path))
    rng = np.random.default_rng(1)
    mask = np.ones((10, 8), np.int64)
    mask[::3, 6:] = 0  # padding: the mask path matters
    calibration = {"ids": rng.integers(0, 50, (10, 8)).astype(np.int64), "mask": mask}
    feeds = reconstruction.weight_feeds(wf.context["model"])
    names = [
        n for n, f in feeds.items()
        if not isinstance(f, str) and f and all(x.node is not None and x.node.op_type == "MatMul" for x in f)
        and wf.params[n].ndim == 2
    ]
    return wf, calibration, names


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize("memory", [None, 0, 20_000], ids=["in-memory", "all-on-disk", "some-on-disk"])
def test_each_level_gets_the_values_of_the_whole_graph_bit_for_bit(tmp_path, memory):
    wf, calibration, names = _bert_export(tmp_path)
    model = wf.context["model"]
    feeds = reconstruction.weight_feeds(model)
    levels = reconstruction.weight_levels(model, {n: feeds[n] for n in names})
    assert len(levels) == 8  # 2 layers x (QKV, O, FFN in, FFN out)
    wanted = [sorted({f.activation for n in level for f in feeds[n]}) for level in levels]
    fed = {n: wf.params[n].dtype for n in names}
    inputs = _fed_inputs(model, fed)
    session = _session(wf, sorted({a for w in wanted for a in w}), fed)
    casts, samples = _check_inputs(session, calibration, inputs.values())
    runner = LevelRunner.for_levels(wf, wanted, fed, memory=memory)
    assert runner is not None
    weights = {inputs[n]: np.asarray(wf.params[n]).copy() for n in names}
    rng = np.random.default_rng(2)
    spilled = 0
    for index, level in enumerate(levels):
        whole = list(_run_batches(session, calibration, casts, samples, wanted[index], 4, weights))
        staged = list(runner.run(index, calibration, casts, samples, 4, weights))
        assert runner.store is not None
        spilled = max(spilled, runner.store.spilled)
        assert len(staged) == len(whole) == 3
        for a, b in zip(whole, staged, strict=True):
            assert a.keys() == b.keys()
            for key in a:
                assert a[key].tobytes() == b[key].tobytes(), (index, key)
        for n in level:  # this level "pruned": later levels see the changed weights
            weights[inputs[n]] = (weights[inputs[n]] * (rng.random(weights[inputs[n]].shape) > 0.5)).astype(np.float32)
    store = runner.store
    assert store.batches == [{}, {}, {}] and store.held == 0  # nothing is held once the last level has run
    if memory is None:
        assert spilled == 0 and store.peak > 20_000
    else:
        assert store.peak <= memory and spilled > 0  # over the budget: on disk, the same bytes
        folder = store._folder
        assert folder is not None and folder.is_dir() and not list(folder.iterdir())
    runner.close()
    assert store._folder is None and (memory is None or not folder.exists())


def test_frontier_store_keeps_values_in_memory_up_to_its_budget_then_on_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_stages.tempfile, "tempdir", str(tmp_path))
    store = onnx_stages.FrontierStore(2, budget=100)
    a, b, c = (np.arange(n, dtype=np.float32) for n in (20, 10, 5))  # 80, 40 and 20 bytes
    store.put(0, "a", a)
    store.put(1, "b", b)  # 80 + 40 > 100: to disk
    store.put(1, "c", c)  # 80 + 20 fits
    assert store.held == 100 and store.spilled == 1
    assert store.batches[0]["a"] is a and store.batches[1]["c"] is c
    assert isinstance(store.batches[1]["b"], np.memmap) and np.array_equal(store.batches[1]["b"], b)
    (folder,) = tmp_path.iterdir()
    assert len(list(folder.iterdir())) == 1
    store.pop(1, "b")
    assert not list(folder.iterdir()) and store.spilled == 0
    store.pop(0, "a")
    store.put(1, "b", b)  # room again
    assert store.held == 60 and store.spilled == 0 and store.peak == 100
    store.put(0, "z", np.zeros(30, np.float32))  # 120 bytes alone: to disk
    store.close()
    assert not folder.exists() and store.batches == [{}, {}] and store.held == 0


@pytest.mark.parametrize("budget", [-1, 1.5, True])
def test_frontier_store_refuses_a_budget_that_is_not_a_byte_count(budget):
    with pytest.raises(ValueError, match="whole number of bytes"):
        onnx_stages.FrontierStore(1, budget)


def test_the_default_budget_is_a_quarter_of_the_memory(monkeypatch):
    monkeypatch.setenv("ARRAYPRUNE_MEMORY_LIMIT", "4G")  # what the formats take as available
    assert onnx_stages.frontier_memory() == 1 << 30
    monkeypatch.setattr(onnx_stages, "memory_limit", lambda: 2**63 - 1)  # nothing known
    assert onnx_stages.frontier_memory() == onnx_stages.FALLBACK_MEMORY


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
@pytest.mark.parametrize("options", [{"amount": 0.5}, {"n": 2, "m": 4}])
def test_sparsegpt_level_by_level_equals_whole_graph_runs(tmp_path, monkeypatch, options):
    wf, calibration, names = _bert_export(tmp_path)
    staged = onnx_sparsegpt(wf, names, calibration, batch_size=4, block_size=16, **options)
    monkeypatch.setattr(onnx_stages, "frontier_memory", lambda: 0)  # every kept value on disk
    monkeypatch.setattr(onnx_stages.tempfile, "tempdir", str(tmp_path / "spill"))
    (tmp_path / "spill").mkdir()
    written = []
    close = onnx_stages.FrontierStore.close
    monkeypatch.setattr(onnx_stages.FrontierStore, "close", lambda self: (written.append(self._written), close(self)))
    on_disk = onnx_sparsegpt(wf, names, calibration, batch_size=4, block_size=16, **options)
    assert len(written) == 1 and written[0] > 0  # values went to disk
    assert not list((tmp_path / "spill").iterdir())  # and the runner removed its folder
    monkeypatch.setattr(onnx_stages.LevelRunner, "for_levels", classmethod(lambda cls, *a: None))
    whole = onnx_sparsegpt(wf, names, calibration, batch_size=4, block_size=16, **options)
    assert list(staged) == list(whole) == list(on_disk) and set(staged) == set(names)
    for name in names:
        assert staged[name].weight.tobytes() == whole[name].weight.tobytes() == on_disk[name].weight.tobytes(), name
        assert np.array_equal(staged[name].mask, whole[name].mask)
        assert not np.array_equal(staged[name].weight, wf.params[name])


def test_weights_of_one_activation_share_one_hessian():
    rng = np.random.default_rng(3)
    feed = onnx_stages_feed("a", -1)
    targets = [reconstruction._Target(n, (feed,), 0, 1, 5, False) for n in ("q", "k")]
    other = reconstruction._Target("o", (onnx_stages_feed("b", -1),), 0, 1, 5, False)
    batches = [{"a": rng.standard_normal((3, 4, 5)).astype(np.float32), "b": rng.standard_normal((2, 5))}
               for _ in range(3)]
    got = reconstruction._hessians_of(batches, [*targets, other])
    assert got["q"] is got["k"]
    rows = np.concatenate([b["a"].reshape(-1, 5).astype(np.float64) for b in batches])
    np.testing.assert_allclose(got["q"][0], rows.T @ rows / 36, rtol=1e-12)
    rows = np.concatenate([b["b"] for b in batches])
    np.testing.assert_allclose(got["o"][0], rows.T @ rows / 6, rtol=1e-12)


def onnx_stages_feed(activation, axis):
    from arrayprune.adapters.roles.onnx_graph import Feed

    return Feed(activation, axis, 1, "MatMul B", (), None)
