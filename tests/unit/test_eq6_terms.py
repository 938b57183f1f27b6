"""The allocator meter's Eq. 6 terms (dcp.profiler.measure.eq6_terms): exact at r = 0 and r = L, and never
below the step's true (convex, piecewise-linear) peak in between."""

from __future__ import annotations

import pytest

from dcp.profiler.measure import eq6_terms


def _true_peak(r: int, L: int, m_act: float, head_peak: float, b_work: float, fixed: float) -> float:
    head = (L - r) * m_act + head_peak  # the head's forward and backward, every stored layer alive
    plain = (L - r) * m_act + b_work if r < L else 0.0  # the last plain layer's backward
    recomputed = m_act + b_work if r > 0 else 0.0  # a recomputed layer's backward, the plain ones freed
    return fixed + max(head, plain, recomputed)


@pytest.mark.parametrize(
    "m_act, head_peak, b_work",
    [
        (500.0, 100.0, 80.0),  # Transformer-2D-like: a layer's activations outweigh the head
        (200.0, 1500.0, 80.0),  # Transformer-1D-like: the vocabulary's logits dominate
        (300.0, 300.0, 0.0),
        (0.0, 50.0, 10.0),
    ],
)
@pytest.mark.parametrize("L", [1, 2, 8])
def test_eq6_is_exact_at_both_ends_and_conservative_between(m_act, head_peak, b_work, L):
    m, m_c = eq6_terms(m_act=m_act, head_peak=head_peak, b_work=b_work, num_layers=L, fixed=1000.0)
    for r in range(L + 1):
        predicted = (L - r) * m + m_c
        true = _true_peak(r, L, m_act, head_peak, b_work, 1000.0)
        if r in (0, L):
            assert predicted == pytest.approx(true)
        assert predicted >= true - 1e-9
    assert 0.0 <= m <= m_act


def test_a_recomputed_layer_is_not_counted_twice_without_recompute():
    # the old terms (m = m_act, M_C = fixed + m_act + b_work) over-predicted r = 0 by one m_act here
    m, m_c = eq6_terms(m_act=500.0, head_peak=100.0, b_work=80.0, num_layers=8, fixed=0.0)
    assert 8 * m + m_c == pytest.approx(8 * 500.0 + 100.0)
