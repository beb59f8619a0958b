import gc

from shared.gc_tuning import gc_paused


def test_the_collector_is_off_during_a_run_and_as_before_afterwards():
    for before in (True, False):
        (gc.enable if before else gc.disable)()
        with gc_paused():
            assert not gc.isenabled()
        assert gc.isenabled() is before
    gc.enable()
