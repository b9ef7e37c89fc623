"""hdk.bench.timeline's grouping of kernel records into replays (CPU: synthetic records)."""

import random

import pytest

from hdk.bench.timeline import format_timeline, is_flush_kernel, replay_timeline

FLUSH = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<unsigned char>>"


def records(replays, gaps, seed=5):
    """Flush then two kernels per replay, shuffled: the split kernel starts `gaps[r][0]` after the
    flush ends and lasts gaps[r][1]; the combine starts during it and ends gaps[r][2] later."""
    kernels, now = [], 100.0
    for first, length, tail in gaps[:replays]:
        kernels.append((FLUSH, now, now + 40.0))
        flush_end = now + 40.0
        kernels.append(("split", flush_end + first, flush_end + first + length))
        kernels.append(("combine", flush_end + first + 1.0, flush_end + first + length + tail))
        now = flush_end + 200.0
    random.Random(seed).shuffle(kernels)
    return kernels


def test_medians_of_each_kernel_from_the_flush_end():
    gaps = [(1.5, 10.0, 3.5), (1.6, 10.2, 3.7), (1.4, 9.8, 3.6)]
    timeline = replay_timeline(records(3, gaps), is_flush_kernel, replays=3)
    assert [entry[:2] for entry in timeline] == [(0, "split"), (1, "combine"), ("end", "")]
    assert timeline[0][2] == pytest.approx(1.5) and timeline[0][3] == pytest.approx(11.5)
    assert timeline[1][2] == pytest.approx(2.5) and timeline[1][3] == pytest.approx(15.0)
    assert timeline[2][3] == pytest.approx(15.0)
    lines = format_timeline(timeline)
    assert len(lines) == 3 and "split" in lines[0] and "end of the last kernel" in lines[2]


def test_records_before_the_first_flush_are_left_out():
    kernels = [("warm-up", 0.0, 5.0)] + records(2, [(1.0, 2.0, 1.0)] * 2)
    timeline = replay_timeline(kernels, is_flush_kernel)
    assert [entry[1] for entry in timeline] == ["split", "combine", ""]


def test_a_short_fill_is_a_kernel_of_the_call_not_a_flush():
    assert is_flush_kernel(FLUSH, 40.0)
    assert not is_flush_kernel(FLUSH, 3.0)
    assert not is_flush_kernel("sparse_decode_combine_kernel", 40.0)


def test_replays_that_differ_or_miscount_are_errors():
    kernels = records(2, [(1.0, 2.0, 1.0)] * 2)
    with pytest.raises(ValueError, match="3 expected"):
        replay_timeline(kernels, is_flush_kernel, replays=3)
    renamed = [("other" if name == "combine" and start > 300 else name, start, end)
               for name, start, end in kernels]
    with pytest.raises(ValueError, match="different kernels"):
        replay_timeline(renamed, is_flush_kernel)
    with pytest.raises(ValueError, match="no flush"):
        replay_timeline([("split", 0.0, 1.0)], is_flush_kernel)
