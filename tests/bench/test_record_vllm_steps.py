"""bench/record_vllm_steps.py: random workloads recorded live from vLLM's own scheduler agree with
kvemu's step for step (skipped only where the recorder's virtualenv with vLLM is absent; it is made
by running the recorder once), and the random workloads keep inside what vLLM would run."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import record_vllm_steps as rec
from replica.core.sched.steptrace import compare, kvemu_trace


@pytest.fixture(scope="module")
def live():
    py = rec.venv_python(create=False)
    if py is None:
        pytest.skip(f"no vLLM virtualenv at {rec.venv_dir()} (bench/record_vllm_steps.py makes it)")
    recorder = rec.LiveRecorder(py)
    yield recorder
    recorder.close()


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_random_workloads_take_the_steps_vllm_takes(live, seed):
    w = rec.random_workload(random.Random(seed), f"h{seed}")
    theirs = live.record(w)
    assert theirs["header"]["vllm"] == rec.VLLM_VERSION
    c = compare(kvemu_trace(w), theirs["steps"])
    assert c["first_difference"] is None, c


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_random_hybrid_workloads_take_the_steps_vllm_takes(live, seed):
    w = rec.random_workload(random.Random(seed), f"k{seed}", hybrid=True)
    c = compare(kvemu_trace(w), live.record(w)["steps"])
    assert c["first_difference"] is None, c


@pytest.mark.parametrize("seed", range(5))
def test_random_hybrid_workloads_fit_a_pool_vllm_would_start_with(seed):
    # every full group's blocks and each window group's at most its cap (two steps of tokens in flight)
    w = rec.random_workload(random.Random(seed), "r", hybrid=True)
    s = w["settings"]
    assert s["kv_groups"] in rec.hybrid_layouts() and s["prefix_caching"]
    assert rec._blocks_for(s, s["max_model_len"]) <= s["num_blocks"] - 1


@pytest.mark.parametrize("seed", range(20))
def test_random_workloads_fit_a_pool_vllm_would_start_with(seed):
    w = rec.random_workload(random.Random(seed), "r")
    s = w["settings"]
    assert s["max_model_len"] <= (s["num_blocks"] - 1) * s["block_size"]  # vLLM refuses to start otherwise
    assert 2 <= len(w["requests"]) <= 9 and all(r["arrive"] <= 25 for r in w["requests"])
