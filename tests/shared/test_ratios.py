from shared.ratios import CacheCounts, ratio


def test_ratio_of_nothing_is_zero():
    assert ratio(0, 0) == 0.0 and ratio(1, 4) == 0.25


def test_counts_add_before_dividing():
    # replica a: 3 of 4 blocks hit (costs 1,2,3 of 1,2,3,4); replica b: 0 of 2 (costs 1,2)
    a = CacheCounts(4, 3, 64, 48, 10.0, 6.0)
    b = CacheCounts(2, 0, 32, 0, 3.0, 0.0)
    both = a + b
    assert both.ratios() == {"block_hit_ratio": 0.5, "token_hit_ratio": 0.5, "csr": 6.0 / 13.0}
    assert a.csr == 0.6 and b.block_hit_ratio == 0.0
