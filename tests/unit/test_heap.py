"""`keep_freed_memory`: freed 12 MB blocks are reused without the kernel zeroing them again, on
the main thread and on another, and 40 MB ones too."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from asyncrl.heap import SWITCH, keep_freed_memory

# allocates and fills `blocks` buffers of `size` bytes at once and frees them, 20 times (as the
# engine makes a logits tensor and its sampler's copies every decode pass, the trainer its
# logits every step), on the main thread or on one of its own (as the engine steps), and prints
# the minor page faults that took, after `keep_freed_memory` or without it. By default malloc
# raises its mmap threshold past a freed block's size (up to 32 MiB) but trims the heap's free
# top once it exceeds twice that, and a thread's arena unmaps a 64 MiB heap once it empties.
CHILD = """
import ctypes, json, resource, sys, threading
from asyncrl.heap import keep_freed_memory
prctl = getattr(ctypes.CDLL(None), 'prctl', None)  # Linux only
if prctl is not None:
    prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: a fault per 4 KiB page, as counted
mode, count, size, where = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
kept = keep_freed_memory() if mode == "keep" else False
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
taken = []
def allocate():
    blocks = [bytearray(size) for _ in range(count)]  # the first ones fault either way
    del blocks
    before = faults()
    for _ in range(20):
        blocks = [bytearray(size) for _ in range(count)]
        del blocks
    taken.append(faults() - before)
if where == "thread":
    thread = threading.Thread(target=allocate)
    thread.start()
    thread.join()
else:
    allocate()
print(json.dumps({"kept": kept, "faults": taken[0]}))
"""


def faults(
    mode: str, blocks: int = 3, size: int = 12_000_000, where: str = "main", **env: str
) -> dict[str, int]:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(blocks), str(size), where], capture_output=True,
        text=True, check=True,
        env={"PATH": "", **env},
    )  # fmt: skip
    return json.loads(result.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_reused_block_is_not_zeroed_again_by_the_kernel() -> None:
    default, kept = faults("default"), faults("keep")
    pages = 3 * 12_000_000 // 4096  # of one round's blocks
    assert default["faults"] > 5 * pages  # fresh pages in most rounds (here 119k of 176k)
    assert kept["kept"] and kept["faults"] < pages  # the first round's pages, reused


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_thread_s_blocks_past_one_arena_heap_are_reused_too() -> None:
    # six 12 MB blocks outgrow a thread arena's 64 MiB heap: with the thresholds alone 58k
    # faults here, since the emptied second heap is unmapped; on the main arena none
    default, kept = faults("default", 6, where="thread"), faults("keep", 6, where="thread")
    pages = 6 * 12_000_000 // 4096
    assert default["faults"] > 5 * pages
    assert kept["kept"] and kept["faults"] < pages


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_blocks_past_the_largest_mmap_threshold_are_reused_too() -> None:
    # 40 MB: past the 32 MiB ceiling of the threshold, as the trainer's logits are
    default, kept = faults("default", 2, 40_000_000), faults("keep", 2, 40_000_000)
    pages = 2 * 40_000_000 // 4096
    assert default["faults"] > 5 * pages
    assert kept["kept"] and kept["faults"] < pages


def test_glibc_s_own_variables_win_and_asyncrl_s_switch_turns_it_off() -> None:
    assert faults("keep", MALLOC_TRIM_THRESHOLD_="131072")["kept"] is False
    assert faults("keep", MALLOC_MMAP_MAX_="65536")["kept"] is False
    assert faults("keep", ASYNCRL_KEEP_FREED_MEMORY="0")["kept"] is False
    for tunables in ("glibc.malloc.trim_threshold=131072", "glibc.malloc.arena_max=2"):
        assert faults("keep", GLIBC_TUNABLES=tunables)["kept"] is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_user_s_arena_count_leaves_asyncrl_s_other_settings_in_place() -> None:
    # an image that presets MALLOC_ARENA_MAX (common) keeps the blocks past 32 MiB reused
    kept = faults("keep", 2, 40_000_000, MALLOC_ARENA_MAX="4")
    assert kept["kept"] is False and kept["faults"] < 2 * 40_000_000 // 4096


def test_a_switch_that_is_neither_1_nor_0_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(SWITCH, "false")
    with pytest.raises(ValueError, match="ASYNCRL_KEEP_FREED_MEMORY='false': expected 1"):
        keep_freed_memory()
