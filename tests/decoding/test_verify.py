import numpy as np

from localspec.decoding.verify import residual, verify_greedy


def test_greedy_accepts_the_matching_prefix_then_recovers():
    v = verify_greedy([5, 6, 7], target_argmax=[5, 6, 9, 1])
    assert (v.accepted, v.token, v.kind) == (2, 9, "recovered")


def test_greedy_all_accepted_earns_the_bonus():
    v = verify_greedy([5, 6], target_argmax=[5, 6, 4])
    assert (v.accepted, v.token, v.kind) == (2, 4, "bonus")


def test_empty_draft_is_plain_decoding():
    assert verify_greedy([], target_argmax=[3]).token == 3


def test_residual_is_the_normalized_positive_part():
    p = np.array([0.5, 0.3, 0.2])
    q = np.array([0.7, 0.1, 0.2])
    np.testing.assert_allclose(residual(p, q, 0), [0.0, 1.0, 0.0])
    np.testing.assert_allclose(residual(p, None, 0), [0.0, 0.6, 0.4])
    np.testing.assert_allclose(residual(p, p, 0), p)  # nothing under-proposed: p itself
