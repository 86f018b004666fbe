"""Two-hot projection, the distributional loss and the value metrics against plain references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from reproduction.recap.value.loss import average_ranks, batch_metrics, set_metrics, spearman, two_hot, value_loss


def test_two_hot_between_bins_splits_mass_linearly():
    probs, b, lo, up = two_hot(torch.tensor([-0.9, -0.4], dtype=torch.float64), num_bins=5, v_min=-1.0, v_max=0.0)
    # dz = 0.25: -0.9 -> b = 0.4 (bins 0/1 get 0.6/0.4); -0.4 -> b = 2.4 (bins 2/3 get 0.6/0.4)
    expected = np.array([[0.6, 0.4, 0, 0, 0], [0, 0, 0.6, 0.4, 0]])
    np.testing.assert_allclose(probs.numpy(), expected, atol=1e-12)
    assert lo.tolist() == [0, 2] and up.tolist() == [1, 3]
    np.testing.assert_allclose(b.numpy(), [0.4, 2.4], atol=1e-12)


def test_two_hot_on_a_bin_edge_puts_all_mass_on_that_bin():
    probs, _, lo, up = two_hot(torch.tensor([-0.5, -1.0, 0.0, -0.75]), num_bins=5, v_min=-1.0, v_max=0.0)
    assert lo.tolist() == up.tolist() == [2, 0, 4, 1]
    assert probs.numpy().tolist() == np.eye(5)[[2, 0, 4, 1]].tolist()


def test_two_hot_clamps_outside_the_support():
    probs, _, lo, up = two_hot(torch.tensor([-1.7, 0.3, -25.0]), num_bins=201, v_min=-1.0, v_max=0.0)
    assert lo.tolist() == up.tolist() == [0, 200, 0]
    assert probs[0, 0] == 1.0 and probs[1, 200] == 1.0 and float(probs.sum()) == 3.0


def test_two_hot_201_bins_each_row_sums_to_one_and_reproduces_the_target():
    y = torch.linspace(-1.0, 0.0, 997, dtype=torch.float64)
    probs, _, _, _ = two_hot(y, num_bins=201, v_min=-1.0, v_max=0.0)
    atoms = torch.linspace(-1.0, 0.0, 201, dtype=torch.float64)
    np.testing.assert_allclose(probs.sum(1).numpy(), 1.0, atol=1e-12)
    np.testing.assert_allclose((probs @ atoms).numpy(), y.numpy(), atol=1e-12)  # two-hot mean == target


def _reference_loss(logits: np.ndarray, targets: np.ndarray, v_min: float, v_max: float) -> float:
    """RECAP.md 2.3 written out per sample with Python floats."""
    k = logits.shape[1]
    dz = (v_max - v_min) / (k - 1)
    total = 0.0
    for row, t in zip(logits, targets):
        y = min(max(float(t), v_min), v_max)
        b = (y - v_min) / dz
        lo, up = min(max(math.floor(b), 0), k - 1), min(max(math.ceil(b), 0), k - 1)
        target = [0.0] * k
        if lo == up:
            target[lo] = 1.0
        else:
            target[lo], target[up] = up - b, b - lo
        m = max(row)
        logz = m + math.log(sum(math.exp(v - m) for v in row))
        total += -sum(target[i] * (row[i] - logz) for i in range(k))
    return total / len(targets)


def test_loss_equals_plain_reference():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(9, 201, generator=gen, dtype=torch.float64) * 3
    targets = torch.tensor([-1.2, -1.0, -0.73, -0.5, -0.4321, -0.005, 0.0, 0.2, -0.9999])
    got = value_loss(logits.float(), targets, v_min=-1.0, v_max=0.0)
    ref = _reference_loss(logits.float().double().numpy(), targets.numpy(), -1.0, 0.0)
    assert got.dtype == torch.float32 and got.ndim == 0
    assert abs(float(got) - ref) < 1e-5 * max(1.0, abs(ref))


def test_loss_gradient_flows_and_perfect_logits_reach_the_target_entropy():
    targets = torch.tensor([-0.9, -0.5])
    probs, _, _, _ = two_hot(targets, num_bins=5, v_min=-1.0, v_max=0.0)
    logits = torch.log(probs.float().clamp_min(1e-30)).requires_grad_(True)
    loss = value_loss(logits, targets, v_min=-1.0, v_max=0.0)
    entropy = -(probs * probs.clamp_min(1e-30).log()).sum(1).mean()
    assert abs(float(loss.detach()) - float(entropy)) < 1e-5  # cross-entropy == entropy at the optimum
    loss.backward()
    assert logits.grad is not None and float(logits.grad.abs().max()) < 1e-5


def test_batch_metrics_categorical_accuracy_bin_distance_and_value_error():
    # 5 bins, dz = 0.25. targets: -0.9 (b=0.4: lower 0 is nearer), -0.4 (b=2.4: lower 2), -0.6 (b=1.6: upper 2)
    targets = torch.tensor([-0.9, -0.4, -0.6])
    logits = torch.full((3, 5), -30.0)
    logits[0, 0] = 30.0  # argmax 0: best and neighbour
    logits[1, 3] = 30.0  # argmax 3: neighbour (upper), not best
    logits[2, 4] = 30.0  # argmax 4: neither; 2 bins from upper 2
    m = batch_metrics(logits, targets, v_min=-1.0, v_max=0.0)
    assert m["cat_acc_best"] == pytest.approx(1 / 3)
    assert m["cat_acc_neighbor"] == pytest.approx(2 / 3)
    assert m["bin_distance"] == pytest.approx((0 + 0 + 2) * 0.25 / 3)
    # E[V] is (almost exactly) the argmax atom: -1.0, -0.25, 0.0
    assert m["value_error"] == pytest.approx((0.1 + 0.15 + 0.6) / 3, abs=1e-6)


def _reference_average_ranks(x):
    order = sorted(range(len(x)), key=lambda i: x[i])
    ranks = [0.0] * len(x)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def _reference_spearman(a, b):
    ra, rb = _reference_average_ranks(a), _reference_average_ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra)
    vb = sum((y - mb) ** 2 for y in rb)
    return cov / math.sqrt(va * vb)


def test_spearman_with_ties_uses_average_ranks():
    assert average_ranks(np.array([1.0, 2.0, 2.0, 3.0])).tolist() == [0.0, 1.5, 1.5, 3.0]
    # scipy.stats.spearmanr([1, 2, 2, 3], [1, 2, 3, 4]) = 0.9486832980505138
    assert spearman(np.array([1, 2, 2, 3]), np.array([1, 2, 3, 4])) == pytest.approx(0.9486832980505138, abs=1e-12)
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = rng.integers(0, 6, size=40).astype(float)  # many ties on both sides
        b = rng.integers(0, 4, size=40).astype(float)
        assert spearman(a, b) == pytest.approx(_reference_spearman(a.tolist(), b.tolist()), abs=1e-12)


def test_spearman_degenerate_cases_are_zero_and_perfect_orders_are_one():
    assert spearman(np.array([0.5]), np.array([0.1])) == 0.0
    assert spearman(np.array([1.0, 1.0, 1.0]), np.array([1.0, 2.0, 3.0])) == 0.0
    x = np.linspace(-1, 0, 50)
    assert spearman(x, x**3) == pytest.approx(1.0)
    assert spearman(x, -x) == pytest.approx(-1.0)


def test_set_metrics_means_and_population_std():
    m = set_metrics(np.array([-0.2, -0.4]), np.array([-0.1, -1.5]), v_min=-1.0, v_max=0.0)
    assert m["predicted_value_mean"] == pytest.approx(-0.3) and m["predicted_value_std"] == pytest.approx(0.1)
    assert m["target_value_mean"] == pytest.approx(-0.55) and m["target_value_std"] == pytest.approx(
        0.45
    )  # clamped -1.5 -> -1
    assert m["value_spearman"] == pytest.approx(1.0)
