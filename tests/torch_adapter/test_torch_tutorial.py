"""Tutorial-style end-to-end test: train a small CNN, prune it globally, compare libraries.

A small convolutional network is trained for a few hundred steps on scikit-learn's bundled
handwritten digits (8x8 images, no download). Copies of the trained model are then
pruned globally, 30% / 50% / 70% / 90% of the convolution and linear weights by L1
magnitude, once with ``torch.nn.utils.prune`` and once with
``arrayprune.adapters.torch``: the masks and the test accuracies must be identical.
Run with ``-s`` to see the table.
"""

from __future__ import annotations

import copy
import time

import pytest
import torch
import torch.nn as nn
import torch.nn.utils.prune as tprune

import arrayprune.adapters.torch as prune

sklearn_datasets = pytest.importorskip("sklearn.datasets")

AMOUNTS = (0.3, 0.5, 0.7, 0.9)


def digits(seed: int = 0):
    data = sklearn_datasets.load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    x, y = x[order], y[order]
    n_train = 1400
    return (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])


def small_cnn() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(16 * 4 * 4, 64),
        nn.ReLU(),
        nn.Linear(64, 10),
    )


def prunable(model: nn.Sequential) -> list[tuple[nn.Module, str]]:
    return [(m, "weight") for m in model if isinstance(m, (nn.Conv2d, nn.Linear))]


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).float().mean())


@pytest.fixture(scope="module")
def one_thread():
    """Small tensors train fastest on one thread (and are deterministic on it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained(one_thread):
    torch.manual_seed(0)
    (x_train, y_train), test = digits()
    model = small_cnn()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(1)
    for _ in range(150):
        batch = torch.randint(0, len(y_train), (128,), generator=g)
        optimizer.zero_grad()
        loss_fn(model(x_train[batch]), y_train[batch]).backward()
        optimizer.step()
    model.eval()
    return model, test


def test_global_pruning_tutorial(trained):
    model, (x_test, y_test) = trained
    base = accuracy(model, x_test, y_test)
    assert base > 0.9

    rows = []
    for amount in AMOUNTS:
        ours, ref = copy.deepcopy(model), copy.deepcopy(model)
        start = time.perf_counter()
        prune.global_unstructured(prunable(ours), pruning_method=prune.L1Unstructured, amount=amount)
        t_ours = time.perf_counter() - start
        start = time.perf_counter()
        tprune.global_unstructured(prunable(ref), pruning_method=tprune.L1Unstructured, amount=amount)
        t_ref = time.perf_counter() - start

        total = sum(m.weight_orig.numel() for m, _ in prunable(ours))
        zeros = sum(int((m.weight_mask == 0).sum()) for m, _ in prunable(ours))
        assert zeros == round(amount * total)
        for (a, _), (b, _) in zip(prunable(ours), prunable(ref), strict=True):
            assert a.weight_mask.dtype == b.weight_mask.dtype == torch.float32
            assert torch.equal(a.weight_mask, b.weight_mask)
            assert torch.equal(a.weight, b.weight)
        acc_ours, acc_ref = accuracy(ours, x_test, y_test), accuracy(ref, x_test, y_test)
        assert acc_ours == acc_ref

        # make it permanent: same parameters, no reparametrization left
        for module, name in prunable(ours):
            prune.remove(module, name)
        assert not prune.is_pruned(ours)
        assert accuracy(ours, x_test, y_test) == acc_ours
        rows.append((amount, zeros / total, acc_ref, acc_ours, t_ref, t_ours))

    print()
    print(f"unpruned test accuracy: {base:.4f}")
    print(
        f"{'amount':>7} {'sparsity':>9} {'torch acc':>10} {'arrayprune acc':>15} {'torch ms':>9} {'arrayprune ms':>14}"
    )
    for amount, sparsity, acc_ref, acc_ours, t_ref, t_ours in rows:
        print(
            f"{amount:>7.0%} {sparsity:>9.3f} {acc_ref:>10.4f} {acc_ours:>15.4f}"
            f" {1e3 * t_ref:>9.2f} {1e3 * t_ours:>14.2f}"
        )
    # moderate pruning costs little accuracy
    assert rows[0][3] > base - 0.05


def test_iterative_pruning_with_fine_tuning(trained):
    """Prune, fine-tune, prune again: both libraries stay in lockstep."""
    model, (x_test, y_test) = trained
    (x_train, y_train), _ = digits()
    results = []
    for lib in (tprune, prune):
        net = copy.deepcopy(model)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(3)
        for amount in (0.5, 0.5):
            lib.global_unstructured(prunable(net), pruning_method=lib.L1Unstructured, amount=amount)
            lib.ln_structured(net[0], "weight", amount=2, n=2, dim=0)
            for _ in range(20):
                batch = torch.randint(0, len(y_train), (64,), generator=g)
                optimizer.zero_grad()
                nn.functional.cross_entropy(net(x_train[batch]), y_train[batch]).backward()
                optimizer.step()
        results.append((net, accuracy(net, x_test, y_test)))
    (ref, acc_ref), (ours, acc_ours) = results
    assert acc_ours == acc_ref
    for (a, _), (b, _) in zip(prunable(ours), prunable(ref), strict=True):
        assert torch.equal(a.weight_mask, b.weight_mask)
        assert torch.equal(a.weight_orig, b.weight_orig)
    assert acc_ours > 0.5
