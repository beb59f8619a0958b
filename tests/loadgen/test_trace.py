from loadgen.trace import TraceRequest, infinite_cache_hit_ratio


def test_infinite_cache_ceiling_counts_first_accesses_and_what_responses_put_in_the_cache():
    # turn 1 asks for blocks 1 2 3, its response completes block 4; turn 2 asks for 1 2 3 4 5
    reqs = [TraceRequest(0.0, "s", 0, [1, 2, 3], 48, 20), TraceRequest(1.0, "s", 1, [1, 2, 3, 4, 5], 80, 4)]
    # prompts only: 8 accesses, 5 distinct blocks -> 1 - 5/8
    assert infinite_cache_hit_ratio(reqs) == 1 - 5 / 8
    # with the response's block 4 cached after turn 1, only 1 2 3 and 5 are first accesses -> 1 - 4/8
    assert infinite_cache_hit_ratio(reqs, [[4], []]) == 1 - 4 / 8
    assert infinite_cache_hit_ratio([]) is None
