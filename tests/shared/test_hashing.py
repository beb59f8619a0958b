import os
import random
import struct
import subprocess
import sys

import numpy as np
import pytest
import xxhash

from shared.errors import InputError
from shared.hashing import ROOT_HASH, block_hashes, chain_ids, content_id, xxh3_u64

SCRIPT = (
    "from shared.hashing import block_hashes, chain_ids;"
    "print(block_hashes(list(range(1000)), 16)[-1], chain_ids([5, 7, 9])[-1])"
)


def test_only_full_blocks_are_hashed():
    assert len(block_hashes(list(range(15)), 16)) == 0
    assert len(block_hashes(list(range(16)), 16)) == 1
    assert len(block_hashes(list(range(47)), 16)) == 2
    assert len(block_hashes(list(range(48)), 16)) == 3


def test_hashes_are_chained_to_the_parent():
    a = block_hashes([1] * 16 + [2] * 16)
    b = block_hashes([3] * 16 + [2] * 16)
    # same second block contents, different first block: the second hash differs
    assert a[1] != b[1]
    # a prefix has the same hashes as the longer prompt it starts
    assert block_hashes([1] * 16) == a[:1]
    # continuing from a parent equals hashing the whole prompt
    assert block_hashes([2] * 16, parent=a[0]) == a[1:]


def test_block_size_changes_the_hashes():
    toks = list(range(64))
    assert block_hashes(toks, 16)[0] != block_hashes(toks, 32)[0]
    assert len(block_hashes(toks, 32)) == 2


def test_numpy_and_list_inputs_agree():
    toks = list(range(100, 164))
    assert block_hashes(np.array(toks, dtype=np.int64)) == block_hashes(toks)
    assert block_hashes(np.array(toks, dtype=np.uint32)) == block_hashes(toks)


def test_values_are_unsigned_64_bit():
    hs = block_hashes(list(range(16 * 50)))
    assert all(0 <= h < 2**64 for h in hs)
    assert len(set(hs)) == 50
    assert 0 <= ROOT_HASH < 2**64


@pytest.mark.parametrize("bad", [[-1] * 16, [2**32] * 16, [1.5] * 16, [[1, 2]]])
def test_bad_tokens_name_the_field(bad):
    with pytest.raises(InputError) as err:
        block_hashes(bad)
    assert err.value.field == "token_ids"


def test_bad_block_size():
    with pytest.raises(InputError):
        block_hashes([1, 2, 3], 0)


def test_chain_ids_chains_per_block_ids():
    a = chain_ids([10, 20, 30])
    b = chain_ids([11, 20, 30])
    assert len(a) == 3 and a[1] != b[1] and a[2] != b[2]
    assert chain_ids([10, 20]) == a[:2]
    assert chain_ids([30], parent=a[1]) == a[2:]


def test_content_id_is_stable_and_distinct():
    assert content_id("s", 1) == content_id("s", 1)
    assert content_id("s", 1) != content_id("s", 2)
    assert content_id("s1", 2) != content_id("s", 12)


def test_deterministic_across_processes_with_different_hash_seeds():
    outputs = set()
    for seed in ("0", "1", "12345", "random"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        res = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
        outputs.add(res.stdout.strip())
    assert len(outputs) == 1
    # and equal to this process's own result
    assert outputs.pop() == f"{block_hashes(list(range(1000)), 16)[-1]} {chain_ids([5, 7, 9])[-1]}"


def test_xxh3_u64_equals_xxhash_on_packed_u64():
    rng = random.Random(3)
    values = [0, 1, 255, 2**32 - 1, 2**32, 2**63, 2**64 - 1] + [rng.getrandbits(64) for _ in range(2000)]
    for seed in (0, 1, 0xDEADBEEF, 2**63 + 5, 2**64 - 1):
        want = [xxhash.xxh3_64_intdigest(struct.pack("<Q", v), seed) for v in values]
        assert xxh3_u64(np.array(values, dtype=np.uint64), seed).tolist() == want


def test_a_prompt_cached_whole_reuses_all_but_its_last_block():
    from shared.hashing import reusable_prefix_tokens

    assert reusable_prefix_tokens(160, 160, 16) == 144  # 10 blocks held, the 10th computed again
    assert reusable_prefix_tokens(160, 170, 16) == 160  # a partial tail runs: every held block is a hit
    assert reusable_prefix_tokens(48, 64, 16) == 48  # less than the whole prompt held: all of it
    assert reusable_prefix_tokens(16, 16, 16) == 0  # one block, held: nothing reused
    assert reusable_prefix_tokens(5, 5, 1) == 4  # radix pages of one token: the last token runs
    assert reusable_prefix_tokens(0, 0, 16) == 0
