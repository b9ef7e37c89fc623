"""hdk.dsv4's KV cache ops against the float64 oracle of dsv4_kv_reference.py, on every available
device: store bytes equal the oracle's byte for byte (zero groups, values beyond the FP8 range,
denormal-range values, NaN and infinity; indexer keys in MXFP4, NVFP4 and FP8), gathers equal the
oracle's decoding exactly (FP8 pages holding any fp32 scale too), the compressor over whole
sequences within the FP8 bound of the float64 entries, padding rows, the invalid counter,
quantize_indexer_query's bytes against store_indexer_keys' and the oracle's, errors naming the
argument, blocks_to_reserve, and (CUDA) check_indices and graph capture."""

import pytest
import torch

import dsv4_kv_reference as ref
import hdk
import hdk.dsv4
from conftest import CUDA_SKIP
from hdk._ops import run_op

needs_cuda = pytest.mark.skipif(CUDA_SKIP is not None, reason=str(CUDA_SKIP))
POISON = 0x5A


def hard_rows(n, width, g):
    """Random rows with the cases the formats must get right, one kind of group per 64 values:
    plain, all zeros, beyond the FP8 range, below the 1e-4 scale floor, fp32 denormals, mixed
    magnitudes, exact ties of the E4M3 / E2M1 rounding; and one NaN and one infinity."""
    x = torch.randn(n, width, generator=g) * 3
    for row in range(n):
        kind, start = row % 7, (row * 64) % (width - 64)
        group = slice(start, start + 64)
        if kind == 1:
            x[row, group] = 0
        elif kind == 2:
            x[row, group] *= 1e5
        elif kind == 3:
            x[row, group] *= 1e-6
        elif kind == 4:
            x[row, group] = torch.randn(64, generator=g) * 1e-40
        elif kind == 5:
            x[row, group] *= torch.exp2(torch.randint(-30, 30, (64,), generator=g).float())
        elif kind == 6:  # 8 significant bits: many halfway cases for 3 mantissa bits
            x[row, group] = torch.randint(-255, 256, (64,), generator=g).float() / 16
    x[n // 2, 5] = float("nan")
    x[n // 3, width - 3] = float("inf")
    return x


def poisoned(shape, device):
    return torch.full(shape, POISON, dtype=torch.uint8, device=device)


def distinct_slots(n, num_slots, g, skipped=2):
    """n distinct slots in [0, num_slots), the last `skipped` rows negative (skipped rows)."""
    slots = torch.randperm(num_slots, generator=g)[:n].clone()
    slots[n - skipped :] = -1 - torch.arange(skipped)
    return slots


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_store_entries_bytes_equal_the_oracle(device, dtype, slot_dtype):
    g = ref.generator(11)
    n, block_size, num_blocks = 30, 5, 8  # odd block size: pages not 16-byte aligned
    values = hard_rows(n, 512, g).to(dtype)
    slots = distinct_slots(n, num_blocks * block_size, g).to(slot_dtype)
    cache = poisoned((num_blocks, block_size * 584), device)
    counter = torch.full((1,), 7, dtype=torch.int64, device=device)
    hdk.dsv4.store_entries(
        values.to(device), slots.to(device), cache, block_size, invalid_count=counter
    )

    images, nonfinite = ref.encode_entries(values.double())
    expected = poisoned((num_blocks, block_size * 584), "cpu")
    ref.place(expected, block_size, slots, images, ref.DATA_BYTES)
    assert torch.equal(cache.cpu(), expected)
    live = slots >= 0
    assert int(counter.item()) == 7 + int((nonfinite & live).sum())
    assert int((nonfinite & live).sum()) == 2


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_gather_entries_equals_the_oracle_decoding(device, out_dtype):
    g = ref.generator(12)
    n, block_size, num_blocks = 24, 4, 7
    values = hard_rows(n, 512, g)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:n]
    cache = poisoned((num_blocks, block_size * 584), device)
    hdk.dsv4.store_entries(values.to(device), slots.to(device), cache, block_size)
    # [3, 10]: stored slots in a shuffled order, repeats, and negative slots (zero rows).
    read = torch.cat([slots, slots[:4], torch.tensor([-1, -5])])[torch.randperm(30, generator=g)]
    read = read.view(3, 10)
    out = torch.full((3, 10, 512), float("nan"), dtype=out_dtype, device=device)
    hdk.dsv4.gather_entries(cache, block_size, read.to(device), out=out)
    host = cache.cpu()
    for (row, column), slot in zip(
        torch.cartesian_prod(torch.arange(3), torch.arange(10)), read.flatten().tolist()
    ):
        got = out[row, column].cpu().double()
        if slot < 0:
            assert (got == 0).all(), f"slot {slot}: not a zero row"
            continue
        want = ref.decode_entry(ref.read(host, block_size, slot, 584, ref.DATA_BYTES))
        assert torch.equal(torch.isnan(got), torch.isnan(want))
        assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0)), f"slot {slot}"


def test_store_gather_round_trip_within_fp8_bound(device):
    g = ref.generator(3)
    n, block_size = 40, 16
    values = (torch.randn(n, 512, generator=g) * 3).to(device)
    slots = torch.randperm(3 * block_size, generator=g)[:n].to(device)
    cache = poisoned((3, block_size * 584), device)
    hdk.dsv4.store_entries(values, slots, cache, block_size)
    out = hdk.dsv4.gather_entries(cache, block_size, slots.view(1, n))[0].cpu().double()
    x = values.cpu().double()
    nope, rope = x[:, :448], x[:, 448:]
    amax = nope.view(n, 7, 64).abs().amax(-1).clamp(min=1e-4)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 448))).repeat_interleave(64, dim=1)
    bound = nope.abs() * hdk.dsv4.FP8_RELATIVE_ERROR_BOUND + scale / 1024
    assert ((out[:, :448] - nope).abs() <= bound).all()
    assert ((out[:, 448:] - rope).abs() <= rope.abs() / 256).all()
    # The scale bytes are UE8M0 of the group scales, the pad byte zero.
    page, offset = slots.cpu() // block_size, slots.cpu() % block_size
    scales = torch.stack(
        [
            cache.cpu()[p, block_size * 576 + o * 8 : block_size * 576 + o * 8 + 8]
            for p, o in zip(page.tolist(), offset.tolist())
        ]
    )
    assert torch.equal(scales[:, :7].double() - 127, torch.log2(scale[:, ::64]))
    assert (scales[:, 7] == 0).all()


def test_nan_marks_the_group_and_counts(device):
    values = torch.randn(2, 512, device=device)
    values[1, 70] = float("nan")
    cache = torch.zeros((1, 4 * 584), dtype=torch.uint8, device=device)
    counter = torch.zeros(1, dtype=torch.int64, device=device)
    slots = torch.tensor([0, 2], device=device)
    hdk.dsv4.store_entries(values, slots, cache, 4, invalid_count=counter)
    assert int(counter.item()) == 1
    out = hdk.dsv4.gather_entries(cache, 4, slots.view(1, 2))[0].cpu()
    assert torch.isnan(out[1, 64:128]).all() and not torch.isnan(out[0]).any()
    assert not torch.isnan(out[1, :64]).any()


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "fp8"])
def test_store_indexer_keys_bytes_equal_the_oracle(device, fmt):
    g = ref.generator(13)
    n, block_size, num_blocks = 26, 3, 10
    keys = hard_rows(n, 128, g)
    slots = distinct_slots(n, num_blocks * block_size, g)
    shape = (num_blocks, block_size * hdk.dsv4.KEY_BYTES[fmt])
    cache = poisoned(shape, device)
    counter = torch.zeros((), dtype=torch.int32, device=device)
    hdk.dsv4.store_indexer_keys(
        keys.to(device),
        slots.to(device),
        cache,
        block_size,
        format=fmt,
        rotate=False,
        invalid_count=counter,
    )
    images, nonfinite = ref.encode_keys(keys.double(), fmt)
    data_bytes = ref.KEY_DATA_BYTES[fmt]
    expected = poisoned(shape, "cpu")
    ref.place(expected, block_size, slots, images, data_bytes)
    assert torch.equal(cache.cpu(), expected)
    assert int(counter.item()) == int((nonfinite & (slots >= 0)).sum())

    # Gather: the oracle's decoding of the stored bytes, exactly.
    read = slots[slots >= 0].view(2, -1)
    out = hdk.dsv4.gather_indexer_keys(cache, block_size, read.to(device), format=fmt).cpu()
    for (row, column), slot in zip(
        torch.cartesian_prod(torch.arange(2), torch.arange(12)), read.flatten().tolist()
    ):
        image = ref.read(expected, block_size, slot, shape[1] // block_size, data_bytes)
        want = ref.decode_key(image, fmt)
        got = out[row, column].double()
        assert torch.equal(got.nan_to_num(1234.0), want.nan_to_num(1234.0)), f"slot {slot}"


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4", "fp8"])
def test_rotated_keys_within_bound_of_float64_rotation(device, fmt):
    g = ref.generator(14)
    keys = torch.randn(16, 128, generator=g) * torch.rand(16, 1, generator=g) * 10
    cache = poisoned((4, 4 * hdk.dsv4.KEY_BYTES[fmt]), device)
    slots = torch.randperm(16, generator=g)
    hdk.dsv4.store_indexer_keys(keys.to(device), slots.to(device), cache, 4, format=fmt)
    out = hdk.dsv4.gather_indexer_keys(cache, 4, slots.view(1, 16).to(device), format=fmt)
    rotated = ref.hadamard(keys.double())
    if fmt == "fp8":  # one power-of-two scale per key, below 2 amax / 448
        scale = 2 * rotated.abs().amax(-1, keepdim=True) / 448
        error = (out[0].cpu().double() - rotated).abs()
        assert (error <= rotated.abs() * hdk.dsv4.FP8_RELATIVE_ERROR_BOUND + scale / 1024).all()
        return
    group = 32 if fmt == "mxfp4" else 16
    amax = rotated.view(16, -1, group).abs().amax(-1).repeat_interleave(group, dim=1)
    scale = amax / 6  # the scale up to its rounding to a power of two / to E4M3
    error = (out[0].cpu().double() - rotated).abs()
    assert (error <= 0.25 * torch.maximum(2 * scale, rotated.abs()) + 1e-6).all()


def test_fp8_keys_far_apart_scales_and_nan_markers(device):
    """FP8 keys of magnitudes 2^-130 .. 2^100 (fp32 denormals, below the 1e-4 floor, huge) in
    pages of 5, one with a NaN and one with an infinity: the oracle's bytes (an exact
    power-of-two fp32 scale per key; 128 x 0x7F and the fp32 NaN for the marked keys, counted),
    the gather its decoding, every value within the FP8 bound."""
    g = ref.generator(15)
    n, block_size, num_blocks = 24, 5, 6
    keys = torch.randn(n, 128, generator=g) * torch.exp2(torch.arange(n) * 10.0 - 130)[:, None]
    keys[7, 9] = float("nan")
    keys[16, 127] = float("-inf")
    slots = torch.randperm(num_blocks * block_size, generator=g)[:n]
    cache = poisoned((num_blocks, block_size * 132), device)
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    hdk.dsv4.store_indexer_keys(
        keys.to(device),
        slots.to(device),
        cache,
        block_size,
        format="fp8",
        rotate=False,
        invalid_count=counter,
    )
    images, nonfinite = ref.encode_keys(keys.double(), "fp8")
    expected = poisoned((num_blocks, block_size * 132), "cpu")
    ref.place(expected, block_size, slots, images, 128)
    assert torch.equal(cache.cpu(), expected)
    assert int(counter.item()) == 2 and nonfinite.nonzero().flatten().tolist() == [7, 16]
    assert (images[7, :128] == 0x7F).all() and images[7, 128:].tolist() == [0, 0, 0xC0, 0x7F]
    out = hdk.dsv4.gather_indexer_keys(cache, block_size, slots.view(1, n).to(device), format="fp8")
    out = out[0].cpu().double()
    for row in range(n):
        want = ref.decode_key(images[row], "fp8")
        assert torch.equal(out[row].nan_to_num(7.0), want.nan_to_num(7.0)), f"key {row}"
    finite = ~nonfinite
    x = keys.double()[finite]
    amax = x.abs().amax(-1, keepdim=True).clamp(min=1e-4)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 448)))
    bound = x.abs() * hdk.dsv4.FP8_RELATIVE_ERROR_BOUND + scale / 1024
    assert ((out[finite] - x).abs() <= bound).all()
    assert torch.isnan(out[~finite]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_gather_decodes_any_fp32_scale(device, dtype):
    """FP8 pages another engine wrote (or garbage) may hold any fp32 scale: the gather is code x
    scale rounded once (fp32, then bf16), NaN for NaN codes, NaN scales (any payload) and
    0 x infinity, exactly the oracle's; a key with a NaN scale is NaN everywhere."""
    g = ref.generator(16)
    scales = [0x7FC00000, 0xFFFFFFFF, 0x7F800000, 0xFF800000, 0x0, 0x80000000, 0x400,
              0x40533333, 0xBF400000, 0x7F7FFFFF, 0x00800000, 0x3F800000, 0x35800000,
              0x4B000001, 0x1F800000, 0x3E9A209B]  # fmt: skip
    block_size, num_blocks = 8, 2
    cache = torch.randint(0, 256, (num_blocks, block_size * 132), generator=g, dtype=torch.uint8)
    for key, bits in enumerate(scales):
        page, offset = divmod(key, block_size)
        start = block_size * 128 + offset * 4
        cache[page, start : start + 4] = torch.tensor(
            [(bits >> (8 * b)) & 0xFF for b in range(4)], dtype=torch.uint8
        )
        cache[page, offset * 128 + 3 : offset * 128 + 7] = torch.tensor(
            [0x00, 0x80, 0x7F, 0xFF], dtype=torch.uint8
        )
    slots = torch.cat([torch.randperm(16, generator=g), torch.tensor([-1, 4])]).view(2, 9)
    out = hdk.dsv4.gather_indexer_keys(
        cache.to(device), block_size, slots.to(device), format="fp8", dtype=dtype
    )
    out = out.cpu()
    for (row, column), slot in zip(
        torch.cartesian_prod(torch.arange(2), torch.arange(9)), slots.flatten().tolist()
    ):
        got = out[row, column]
        if slot < 0:
            assert (got == 0).all()
            continue
        want = ref.decode_key(ref.read(cache, block_size, slot, 132, 128), "fp8")
        want = want.float().to(dtype)
        assert torch.equal(torch.isnan(got), torch.isnan(want)), f"key {slot}"
        assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0)), f"key {slot}"
        if scales[slot] in (0x7FC00000, 0xFFFFFFFF):
            assert torch.isnan(got).all()
        nan_bits = 0x7FC00000 if dtype == torch.float32 else 0x7FC0
        as_int = got.view(torch.int32 if dtype == torch.float32 else torch.int16).long()
        assert (as_int[torch.isnan(got)] & 0xFFFFFFFF == nan_bits).all(), "canonical NaN"


# ------------------------------------------------------------------------------------------
# Compressor


def compressor_case(
    ratio,
    dim,
    fmt,
    device,
    seed,
    rows=3,
    tokens=1,
    steps=None,
    block_size=3,
    input_dtype=torch.float32,
):
    """Runs `steps` calls of hdk.dsv4.compress and the float64 oracle side by side for `rows`
    requests (row 1 is a padding row in every odd step, row 2 joins at step 5: the requests
    interleave at different positions; block ids are scattered) and checks every completed
    entry. The state starts as NaN: garbage a window must never read."""
    g = ref.generator(seed)
    coff = 2 if ratio == 4 else 1
    width = coff * dim
    steps = steps or (12 * ratio) // tokens
    max_position = steps * tokens + ratio
    entries_per_row = max_position // ratio + 1
    pages = -(-entries_per_row // block_size)
    num_blocks = rows * pages + 2
    block_table = torch.randperm(num_blocks, generator=g)[: rows * pages].view(rows, pages)
    block_table = block_table.to(torch.int32)
    entry_bytes = 584 if dim == 512 else hdk.dsv4.KEY_BYTES[fmt]
    cache = poisoned((num_blocks, block_size * entry_bytes), device)
    state = torch.full(
        (rows + 2, hdk.dsv4.compressor_accumulators(ratio), 3, dim), float("nan"), device=device
    )
    state_slots = torch.tensor([2, 0, 3][:rows])
    ape = torch.randn(ratio, width, generator=g)
    norm_weight = torch.rand(dim, generator=g) + 0.5
    cos, sin = ref.rope_tables(max_position, g)
    counter = torch.zeros(1, dtype=torch.int64, device=device)
    oracle = ref.Compressor(ratio, dim)
    positions = torch.zeros(rows, dtype=torch.int64)
    expected = {}  # (row, entry index) -> float64 values
    for step in range(steps):
        kv = torch.randn(rows, tokens, width, generator=g).to(input_dtype)
        score = (torch.randn(rows, tokens, width, generator=g) * 2).to(input_dtype)
        slots_now = state_slots.clone()
        if step % 2 == 1 and rows > 1:
            slots_now[1] = -1  # padding: touches nothing, its request does not advance
        if step < 5 and rows > 2:
            slots_now[2] = -1  # not admitted yet
        state_before = state[state_slots[1]].clone() if step % 2 == 1 and rows > 1 else None
        hdk.dsv4.compress(
            kv.to(device),
            score.to(device),
            ape.to(device),
            positions.to(device),
            slots_now.to(device),
            state,
            norm_weight.to(device),
            cos.to(device),
            sin.to(device),
            block_table.to(device),
            cache,
            block_size,
            ratio,
            key_format=fmt,
            invalid_count=counter,
        )
        if state_before is not None:
            assert torch.equal(
                state[state_slots[1]].nan_to_num(7.0), state_before.nan_to_num(7.0)
            ), "a padding row changed its state"
        for row, index, value in oracle.run(
            kv.float(), score.float(), ape, positions, slots_now, norm_weight, cos, sin
        ):
            expected[(row, index)] = value
        positions = positions + torch.where(slots_now >= 0, tokens, 0)
    assert len(expected) >= 3 * rows - 2
    assert int(counter.item()) == 0

    host = cache.cpu()
    written = torch.zeros_like(host, dtype=torch.bool)
    worst = 0.0
    for (row, index), value in sorted(expected.items()):
        slot = int(block_table[row, index // block_size]) * block_size + index % block_size
        data = 576 if dim == 512 else ref.KEY_DATA_BYTES[fmt]
        image = ref.read(host, block_size, slot, entry_bytes, data)
        page, offset = divmod(slot, block_size)
        written[page, offset * data : (offset + 1) * data] = True
        tail = entry_bytes - data
        written[
            page, block_size * data + offset * tail : block_size * data + (offset + 1) * tail
        ] = 1
        worst = max(worst, ref.check_entry(image, value, fmt))
    # Nothing outside the completed entries was written.
    assert (host[~written] == POISON).all()
    return worst


@pytest.mark.parametrize("dim,fmt", [(512, "mxfp4"), (128, "mxfp4"), (128, "nvfp4"), (128, "fp8")])
def test_compressor_csa_sequences(device, dim, fmt):
    # 12+ windows of m = 4, one token a call; then MTP-like calls of 3 tokens.
    compressor_case(4, dim, fmt, device, seed=21 + dim)
    compressor_case(4, dim, fmt, device, seed=22 + dim, tokens=3, steps=18)


def test_compressor_hca_three_windows(device):
    # HCA with m = 128 over 3+ windows, 32 tokens a call (T <= ratio); bf16 inputs.
    compressor_case(
        128,
        512,
        "mxfp4",
        device,
        seed=31,
        rows=2,
        tokens=32,
        steps=14,
        block_size=2,
        input_dtype=torch.bfloat16,
    )


def test_compressor_small_hca_ratio(device):
    compressor_case(8, 512, "mxfp4", device, seed=32, tokens=1, steps=50, block_size=4)


def test_compressor_padding_rows_touch_nothing(device):
    state = torch.full((2, 3, 3, 512), 3.0, device=device)
    cache = poisoned((2, 2 * 584), device)
    kv, score = torch.randn(2, 1024, device=device), torch.randn(2, 1024, device=device)
    cos, sin = ref.rope_tables(8, ref.generator(1))
    hdk.dsv4.compress(
        kv,
        score,
        torch.zeros(4, 1024, device=device),
        torch.tensor([3, 7], device=device),
        torch.tensor([-1, -2], device=device),
        state,
        torch.ones(512, device=device),
        cos.to(device),
        sin.to(device),
        torch.zeros(2, 1, dtype=torch.int32, device=device),
        cache,
        2,
        4,
    )
    assert (state == 3.0).all() and (cache == POISON).all()


def compress_pair_calls(device, rows=5, seed=41):
    """A CSA layer's main (d = 512) and indexer (d = 128, FP8 keys) compress calls as dicts of
    hdk.dsv4.compress's arguments: rows at positions that complete a window (even rows) or not,
    row 2 padding, each row on its own state slot and pages."""
    g = ref.generator(seed)
    cos, sin = ref.rope_tables(4 * 40, g)
    positions = torch.tensor([4 * (7 + r) + (3 if r % 2 == 0 else 1) for r in range(rows)])
    slots = torch.tensor([-1 if r == 2 else (r + 3) % (rows + 1) for r in range(rows)])
    table = torch.arange(rows * 4, dtype=torch.int32).view(rows, 4)
    calls = []
    for dim, fmt in ((512, "mxfp4"), (128, "fp8")):
        entry_bytes = 584 if dim == 512 else hdk.dsv4.KEY_BYTES[fmt]
        calls.append(
            dict(
                kv=torch.randn(rows, 1, 2 * dim, generator=g).to(device),
                score=(torch.randn(rows, 1, 2 * dim, generator=g) * 2).to(device),
                ape=torch.randn(4, 2 * dim, generator=g).to(device),
                positions=positions.to(device),
                state_slots=slots.to(device),
                state=torch.randn(rows + 1, 3, 3, dim, generator=g).to(device),
                norm_weight=(torch.rand(dim, generator=g) + 0.5).to(device),
                rope_cos=cos.to(device),
                rope_sin=sin.to(device),
                block_table=table.to(device),
                cache=poisoned((rows * 4, 8 * entry_bytes), device),
                block_size=8,
                ratio=4,
                key_format=fmt,
            )
        )
    return calls


def test_compress_pair_equals_two_calls(device):
    first, second = compress_pair_calls(device)
    apart = [
        {k: v.clone() if torch.is_tensor(v) else v for k, v in c.items()} for c in (first, second)
    ]
    counter_apart = torch.full((1,), 3, dtype=torch.int64, device=device)
    counter_pair = counter_apart.clone()
    first["kv"][0, 0, -1] = float("nan")  # row 0's entry carries NaN markers: counted once
    apart[0]["kv"][0, 0, -1] = float("nan")
    for call in apart:
        hdk.dsv4.compress(**call, invalid_count=counter_apart)
    hdk.dsv4.compress_pair(first, second, invalid_count=counter_pair)
    for got, want in zip((first, second), apart):
        assert torch.equal(got["cache"], want["cache"])
        # Byte for byte: row 0's state holds the NaN.
        assert torch.equal(got["state"].view(torch.int32), want["state"].view(torch.int32))
        assert not (got["cache"] == POISON).all()
    assert int(counter_pair.item()) == int(counter_apart.item()) == 4


def test_compress_pair_refuses_calls_that_touch_each_other(device):
    first, second = compress_pair_calls(device, rows=3)
    before = [c["cache"].clone() for c in (first, second)]
    second_on_first = dict(second, state=first["kv"].view(-1)[: 3 * 3 * 128].view(1, 3, 3, 128))
    overlap = "second call's state' overlaps 'first call's kv"
    with pytest.raises(hdk.dsv4.ops.HdkError, match=overlap):
        hdk.dsv4.compress_pair(first, second_on_first)
    bad = dict(second, ratio=1)
    with pytest.raises(hdk.dsv4.ops.HdkError, match=r"compress \(second call\): option 'ratio'"):
        hdk.dsv4.compress_pair(first, bad)
    with pytest.raises(hdk.dsv4.ops.HdkError, match="the first call has unknown arguments"):
        hdk.dsv4.compress_pair(dict(first, sink=1), second)
    with pytest.raises(hdk.dsv4.ops.HdkError, match=r"the second call misses \['cache'\]"):
        hdk.dsv4.compress_pair(first, {k: v for k, v in second.items() if k != "cache"})
    assert all(torch.equal(c["cache"], b) for c, b in zip((first, second), before))


def swa_store(device, rows, seed=43):
    """A store_entries call as a dict: bf16 rows (row 1 with an infinity) on distinct slots of a
    poisoned ring of its own, slot 3 skipped."""
    g = ref.generator(seed)
    values = torch.randn(rows, 512, generator=g).to(torch.bfloat16)
    values[1, 7] = float("inf")
    slots = torch.randperm(2 * rows, generator=g)[:rows]
    slots[3] = -1
    return dict(
        values=values.to(device),
        slots=slots.to(device),
        cache=poisoned((2, rows * 584), device),
        block_size=rows,
    )


@pytest.mark.parametrize("compressors", [1, 2])
def test_store_and_compress_equals_the_calls_in_turn(device, compressors):
    calls = compress_pair_calls(device)[:compressors]
    store = swa_store(device, rows=6)
    copy = lambda call: {k: v.clone() if torch.is_tensor(v) else v for k, v in call.items()}
    apart, store_apart = [copy(c) for c in calls], copy(store)
    counter_apart = torch.full((1,), 3, dtype=torch.int64, device=device)
    counter_one = counter_apart.clone()
    hdk.dsv4.store_entries(**store_apart, invalid_count=counter_apart)
    for call in apart:
        hdk.dsv4.compress(**call, invalid_count=counter_apart)
    caches = hdk.dsv4.store_and_compress(store, *calls, invalid_count=counter_one)
    assert len(caches) == 1 + compressors and caches[0] is store["cache"]
    assert torch.equal(store["cache"], store_apart["cache"])
    assert not (store["cache"] == POISON).all()
    for got, want in zip(calls, apart):
        assert torch.equal(got["cache"], want["cache"])
        assert torch.equal(got["state"].view(torch.int32), want["state"].view(torch.int32))
    assert int(counter_one.item()) == int(counter_apart.item()) == 4  # the infinity's row


def test_store_and_compress_refuses_a_ring_in_a_pool_and_bad_calls(device):
    first, second = compress_pair_calls(device, rows=3)
    store = swa_store(device, rows=4)
    before = [c["cache"].clone() for c in (store, first, second)]
    ring_in_pool = dict(store, cache=first["cache"][:2, : 4 * 584])
    with pytest.raises(hdk.dsv4.ops.HdkError, match="'store's cache' overlaps 'first compressor's"):
        hdk.dsv4.store_and_compress(ring_in_pool, first, second)
    bad = dict(first, ratio=1)
    with pytest.raises(hdk.dsv4.ops.HdkError, match=r"\(compressor\): option 'ratio'"):
        hdk.dsv4.store_and_compress(store, bad)
    with pytest.raises(hdk.dsv4.ops.HdkError, match="the store has unknown arguments"):
        hdk.dsv4.store_and_compress(dict(store, rotate=True), first)
    with pytest.raises(hdk.dsv4.ops.HdkError, match=r"the second compressor call misses"):
        hdk.dsv4.store_and_compress(store, first, {k: v for k, v in second.items() if k != "kv"})
    assert all(torch.equal(c["cache"], b) for c, b in zip((store, first, second), before))


# ------------------------------------------------------------------------------------------
# The indexer's quantized query


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotate", [False, True])
def test_quantize_indexer_query_is_the_mxfp4_key_store(device, dtype, rotate):
    """Each [n, h] vector becomes the 64 + 4 bytes store_indexer_keys writes for it as an mxfp4
    key (on the same device), and, unrotated, the oracle's bytes; rotated ones decode within the
    FP4 bound of the float64 rotation. Non-finite vectors are marked and counted; given outputs
    are written in place (their padding untouched) and returned."""
    g = ref.generator(61 + rotate)
    n, h = 3, 5
    q = hard_rows(n * h, 128, g).to(dtype)
    counter = torch.zeros(1, dtype=torch.int64, device=device)
    packed_buffer = poisoned((n, h, 70), device)
    scales_buffer = poisoned((n, h, 6), device)
    packed, scales = hdk.dsv4.quantize_indexer_query(
        q.view(n, h, 128).to(device),
        rotate=rotate,
        q_packed=packed_buffer[:, :, 3:67],
        q_scales=scales_buffer[:, :, 1:5],
        invalid_count=counter,
    )
    assert packed.data_ptr() == packed_buffer[:, :, 3:67].data_ptr()
    assert (packed_buffer[:, :, :3] == POISON).all() and (packed_buffer[:, :, 67:] == POISON).all()
    assert (scales_buffer[:, :, :1] == POISON).all() and (scales_buffer[:, :, 5:] == POISON).all()
    cache = poisoned((n * h, 68), device)
    key_counter = torch.zeros(1, dtype=torch.int64, device=device)
    hdk.dsv4.store_indexer_keys(
        q.to(device),
        torch.arange(n * h, device=device),
        cache,
        1,
        rotate=rotate,
        invalid_count=key_counter,
    )
    stored = cache.cpu()
    assert torch.equal(packed.cpu().reshape(n * h, 64), stored[:, :64])
    assert torch.equal(scales.cpu().reshape(n * h, 4), stored[:, 64:])
    images, nonfinite = ref.encode_keys(ref.hadamard(q.double()) if rotate else q.double(), "mxfp4")
    assert int(counter.item()) == int(key_counter.item()) == int(nonfinite.sum()) == 2
    if not rotate:
        assert torch.equal(stored, images)
        return
    for row in range(n * h):
        if not nonfinite[row]:
            ref.check_entry(stored[row], q[row].double(), "mxfp4")
        else:
            assert (stored[row, 64:] == 0xFF).all() and (stored[row, :64] == 0).all()


def test_quantize_indexer_query_allocates_and_names_bad_arguments(device):
    q = torch.randn(2, 64, 128, device=device)
    packed, scales = hdk.dsv4.quantize_indexer_query(q)
    assert packed.shape == (2, 64, 64) and packed.dtype == torch.uint8
    assert scales.shape == (2, 64, 4) and scales.dtype == torch.uint8
    assert packed.device == q.device and scales.device == q.device
    # The fp32 rotation may round a value across a code boundary: compare decoded values.
    for row in range(0, 128, 17):
        image = torch.cat([packed.cpu().view(128, 64)[row], scales.cpu().view(128, 4)[row]])
        ref.check_entry(image, q.cpu()[row // 64, row % 64].double(), "mxfp4")
    untouched = poisoned((2, 64, 64), device)
    with pytest.raises(
        hdk.HdkError,
        match=r"hdk::dsv4::quantize_indexer_query: argument 'q' must have shape \[N, H, 128\] "
        r"= \[2, 64, 128\], got \[2, 64, 64\]",
    ):
        hdk.dsv4.quantize_indexer_query(q[:, :, :64], q_packed=untouched)
    assert (untouched == POISON).all()
    with pytest.raises(hdk.HdkError, match="argument 'q_scales' must have shape \\[N, H, 4\\]"):
        hdk.dsv4.quantize_indexer_query(
            q, q_packed=untouched, q_scales=torch.zeros(2, 64, 8, dtype=torch.uint8, device=device)
        )
    with pytest.raises(hdk.HdkError, match="argument 'q_packed' must have dtype uint8"):
        hdk.dsv4.quantize_indexer_query(q, q_packed=torch.zeros(2, 64, 64, device=device))
    with pytest.raises(hdk.HdkError, match="argument 'q' must have dtype float32 or bfloat16"):
        hdk.dsv4.quantize_indexer_query(q.half())
    with pytest.raises(hdk.HdkError, match="argument 'q' must have rank 3"):
        hdk.dsv4.quantize_indexer_query(q[0])
    assert (untouched == POISON).all()
    with pytest.raises(TypeError, match="argument 'q_scales' must be a torch.Tensor"):
        hdk.dsv4.quantize_indexer_query(q, q_scales=[1, 2])


# ------------------------------------------------------------------------------------------
# Errors and helpers


def test_errors_name_the_argument():
    values = torch.zeros(2, 448)
    cache = torch.zeros((1, 4 * 584), dtype=torch.uint8)
    with pytest.raises(hdk.HdkError, match="argument 'values' must have shape"):
        hdk.dsv4.store_entries(values, torch.tensor([0, 1]), cache, 4)
    with pytest.raises(hdk.HdkError, match="slots\\[1\\] = 9 is beyond the cache"):
        hdk.dsv4.store_entries(torch.zeros(2, 512), torch.tensor([0, 9]), cache, 4)
    with pytest.raises(hdk.HdkError, match="argument 'cache' must have block_size \\* 584"):
        hdk.dsv4.store_entries(torch.zeros(2, 512), torch.tensor([0, 1]), cache, 3)
    with pytest.raises(hdk.HdkError, match="argument 'out' must have shape"):
        hdk.dsv4.gather_entries(
            cache, 4, torch.zeros(1, 2, dtype=torch.long), out=torch.zeros(1, 2, 128)
        )
    with pytest.raises(hdk.HdkError, match="key format must be 'mxfp4', 'nvfp4' or 'fp8'"):
        hdk.dsv4.store_indexer_keys(
            torch.zeros(1, 128),
            torch.tensor([0]),
            torch.zeros((1, 68), dtype=torch.uint8),
            1,
            format="fp4",
        )
    with pytest.raises(
        hdk.HdkError,
        match=r"argument 'cache' must have block_size \* 132 = 132 bytes per page \(FP8",
    ):
        hdk.dsv4.store_indexer_keys(
            torch.zeros(1, 128),
            torch.tensor([0]),
            torch.zeros((1, 68), dtype=torch.uint8),
            1,
            format="fp8",
        )
    # The ops take the format as an int: 0, 1 or 2; another is refused, naming the option.
    with pytest.raises(
        hdk.HdkError,
        match=r"hdk::dsv4::store_indexer_keys: option 'format' must be 0 \(mxfp4\), "
        r"1 \(nvfp4\) or 2 \(fp8\), got 3",
    ):
        run_op(
            torch.ops.hdk.dsv4_store_indexer_keys,
            torch.zeros(1, 128),
            torch.tensor([0]),
            torch.zeros((1, 68), dtype=torch.uint8),
            1,
            3,
            True,
            None,
            False,
        )
    with pytest.raises(hdk.HdkError, match="option 'key_format' must be 0 \\(mxfp4\\)"):
        run_op(
            torch.ops.hdk.dsv4_compress,
            torch.zeros(1, 256),
            torch.zeros(1, 256),
            torch.zeros(4, 256),
            torch.tensor([3]),
            torch.tensor([0]),
            torch.zeros(1, 3, 3, 128),
            torch.ones(128),
            torch.zeros(8, 32),
            torch.zeros(8, 32),
            torch.tensor([[0]], dtype=torch.int32),
            torch.zeros((1, 132), dtype=torch.uint8),
            1,
            4,
            1e-6,
            -1,
            True,
            None,
            False,
        )
    with pytest.raises(hdk.HdkError, match="argument 'cache' must have block_size \\* 72"):
        hdk.dsv4.store_indexer_keys(
            torch.zeros(1, 128),
            torch.tensor([0]),
            torch.zeros((1, 68), dtype=torch.uint8),
            1,
            format="nvfp4",
        )
    cos = torch.zeros(8, 32)
    with pytest.raises(hdk.HdkError, match="block_table\\[0, 0\\] = 5"):
        hdk.dsv4.compress(
            torch.zeros(1, 1024),
            torch.zeros(1, 1024),
            torch.zeros(4, 1024),
            torch.tensor([3]),
            torch.tensor([0]),
            torch.zeros(1, 3, 3, 512),
            torch.ones(512),
            cos,
            cos,
            torch.tensor([[5]], dtype=torch.int32),
            torch.zeros((1, 584), dtype=torch.uint8),
            1,
            4,
        )


def test_blocks_to_reserve():
    assert hdk.dsv4.blocks_to_reserve(4, 64, 0, 4) == 1
    assert hdk.dsv4.blocks_to_reserve(128, 1, 0, 384) == 3
    assert hdk.dsv4.blocks_to_reserve(4, 64, 4, 256) == 0
    assert hdk.dsv4.blocks_to_reserve(4, 64, 256, 260) == 1
    for before, after in [(0, 3), (5, 9), (100, 1000), (7, 7)]:
        want = -(-(after // 4) // 3) - (-(-(before // 4) // 3))
        assert hdk.dsv4.blocks_to_reserve(4, 3, before, after) == want


def test_compressor_accumulators():
    assert hdk.dsv4.compressor_accumulators(4) == 3
    assert hdk.dsv4.compressor_accumulators(128) == 1


# ------------------------------------------------------------------------------------------
# CUDA only: out-of-range slots are counted (or raised with check_indices), graph capture


@needs_cuda
def test_cuda_out_of_range_slots_counted_or_raised():
    cache = poisoned((2, 4 * 584), "cuda")
    counter = torch.zeros(1, dtype=torch.int64, device="cuda")
    values = torch.randn(3, 512, device="cuda")
    slots = torch.tensor([1, 99, 2], device="cuda")
    hdk.dsv4.store_entries(values, slots, cache, 4, invalid_count=counter)
    assert int(counter.item()) == 1
    expected = poisoned((2, 4 * 584), "cpu")
    ref.place(
        expected,
        4,
        torch.tensor([1, -1, 2]),
        ref.encode_entries(values.cpu().double())[0],
        ref.DATA_BYTES,
    )
    assert torch.equal(cache.cpu(), expected)
    with pytest.raises(hdk.HdkError, match="slots\\[1\\] = 99 is beyond the cache"):
        hdk.dsv4.store_entries(values, slots, cache, 4, check_indices=True)


@needs_cuda
def test_cuda_graph_replays_store_and_compress():
    g = ref.generator(41)
    block_size, ratio = 4, 4
    values = torch.randn(2, 512, generator=g).cuda()
    kv, score = torch.randn(2, 1024, generator=g).cuda(), torch.randn(2, 1024, generator=g).cuda()
    ape, norm = torch.randn(4, 1024, generator=g).cuda(), torch.ones(512, device="cuda")
    cos, sin = (t.cuda() for t in ref.rope_tables(64, g))
    positions = torch.tensor([0, 4], device="cuda")
    swa_slots = torch.tensor([0, 128], device="cuda")
    state_slots = torch.tensor([0, 1], device="cuda")
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device="cuda")
    swa = poisoned((2, 128 * 584), "cuda")
    cache = poisoned((4, block_size * 584), "cuda")
    state = torch.zeros(2, 3, 3, 512, device="cuda")

    def step():
        hdk.dsv4.store_entries(values, swa_slots, swa, 128)
        hdk.dsv4.compress(
            kv,
            score,
            ape,
            positions,
            state_slots,
            state,
            norm,
            cos,
            sin,
            table,
            cache,
            block_size,
            ratio,
        )
        positions.add_(1)
        swa_slots.add_(1)

    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    # The same steps eagerly on the CPU.
    cpu = dict(
        positions=torch.tensor([0, 4]),
        swa_slots=torch.tensor([0, 128]),
        swa=poisoned((2, 128 * 584), "cpu"),
        cache=poisoned((4, block_size * 584), "cpu"),
        state=torch.zeros(2, 3, 3, 512),
    )
    positions.copy_(cpu["positions"])
    swa_slots.copy_(cpu["swa_slots"])
    for _ in range(4):
        graph.replay()
        hdk.dsv4.store_entries(values.cpu(), cpu["swa_slots"], cpu["swa"], 128)
        hdk.dsv4.compress(
            kv.cpu(),
            score.cpu(),
            ape.cpu(),
            cpu["positions"],
            state_slots.cpu(),
            cpu["state"],
            norm.cpu(),
            cos.cpu(),
            sin.cpu(),
            table.cpu(),
            cpu["cache"],
            block_size,
            ratio,
        )
        cpu["positions"] += 1
        cpu["swa_slots"] += 1
    torch.cuda.synchronize()
    assert torch.equal(swa.cpu(), cpu["swa"])
    assert (cache.cpu() != POISON).any()
    out = hdk.dsv4.gather_entries(cache, block_size, torch.tensor([[0, 8]], device="cuda"))
    want = hdk.dsv4.gather_entries(cpu["cache"], block_size, torch.tensor([[0, 8]]))
    assert torch.allclose(out.cpu(), want, rtol=0.13, atol=1e-3)
