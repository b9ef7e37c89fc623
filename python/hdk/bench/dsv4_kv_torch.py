"""Plain PyTorch implementations of the DeepSeek-V4 KV cache write side, the peers of
``bench/dsv4_vs_torch.py``: what an engine without hdk would write with torch ops, in fp32.

* ``store_entries``: FP8 quantize-and-scatter into MODEL1 pages (the same bytes as hdk);
* ``gather_entries``: gather + dequantize (the same values as hdk);
* ``Compressor``: one compressor call per step with the raw rows kept in buffers
  ([states, 2m, width] for CSA, [states, m, width] for HCA), the spec's softmax over them, RMSNorm,
  RoPE, FP8 or MXFP4 quantization (Hadamard first) and a scatter. Every row computes an entry (no
  host branch, so a step can be captured in a CUDA graph); rows whose window did not complete
  write it to a scratch page after the pool's last page.

The exponents are taken with frexp, so they are exact (a float log2 is not near powers of two).
FP8 codes use torch.float8_e4m3fn where torch has it, else the same rounding written out.
Slots must be non-negative here (the benchmark writes live rows only).
"""

import torch

from hdk.dsv4.ops import hadamard_matrix

ENTRY_BYTES, DATA_BYTES = 584, 576
KEY_DATA_BYTES, MXFP4_KEY_BYTES = 64, 68
HAS_FP8 = hasattr(torch, "float8_e4m3fn")


def _scale_exponent(amax, mantissa_limit, offset):
    """The smallest s with qmax * 2^s >= max(amax, 1e-4), qmax = mantissa_limit * 2^offset
    (448 = 0.875 * 2^9, 6 = 0.75 * 2^3), exactly."""
    m, e = torch.frexp(amax.clamp(min=1e-4))
    return e - offset + (m > mantissa_limit).to(e.dtype)


def fp8_codes(q):
    """E4M3 bytes of fp32 values with |q| <= 448, round to nearest even; -0 keeps its sign."""
    if HAS_FP8:
        return q.to(torch.float8_e4m3fn).view(torch.uint8)
    a = q.abs()
    m, e = torch.frexp(a)
    normal = (e + 6) * 8 + torch.round(m * 16).to(e.dtype) - 8
    subnormal = torch.round(a * 512).to(e.dtype)
    codes = torch.where(a >= 2.0**-6, normal, subnormal)
    return (codes | torch.signbit(q).to(e.dtype) * 0x80).to(torch.uint8)


def _fp8_values(codes):
    if HAS_FP8:
        return codes.view(torch.float8_e4m3fn).float()
    table = _E4M3_TABLE.get(codes.device)
    if table is None:
        all_codes = torch.arange(256)
        e, m = (all_codes >> 3) & 15, (all_codes & 7).float()
        magnitude = torch.where(e == 0, m * 2.0**-9, (8 + m) * torch.exp2(e.float() - 10))
        magnitude[(all_codes & 0x7F) == 0x7F] = float("nan")
        table = torch.where(all_codes >= 128, -magnitude, magnitude).to(codes.device)
        _E4M3_TABLE[codes.device] = table
    return table[codes.long()]


_E4M3_TABLE = {}


def encode_entries(values):
    """MODEL1 data [N, 576] and scale bytes [N, 8] of [N, 512] rows."""
    x = values.float()
    n = x.shape[0]
    nope = x[:, :448].reshape(n, 7, 64)
    finite = torch.isfinite(nope).all(-1)
    amax = torch.where(finite, nope.abs().amax(-1), torch.ones_like(finite, dtype=x.dtype))
    exponent = _scale_exponent(amax, 0.875, 9)
    codes = fp8_codes(nope / torch.exp2(exponent.float())[..., None])
    codes = torch.where(finite[..., None], codes, torch.full_like(codes, 0x7F))
    rope = x[:, 448:].to(torch.bfloat16).view(torch.uint8)
    data = torch.cat([codes.reshape(n, 448), rope], dim=1)
    scales = torch.where(finite, exponent + 127, torch.full_like(exponent, 255)).to(torch.uint8)
    return data, torch.cat([scales, torch.zeros_like(scales[:, :1])], dim=1)


def _pages(cache, block_size, data_bytes):
    blocks = cache.shape[0]
    tail = cache.shape[1] // block_size - data_bytes
    data = cache[:, : block_size * data_bytes].view(blocks, block_size, data_bytes)
    return data, cache[:, block_size * data_bytes :].view(blocks, block_size, tail)


def _scatter(cache, block_size, slots, data, tail, data_bytes):
    pages, offsets = slots // block_size, slots % block_size
    data_view, tail_view = _pages(cache, block_size, data_bytes)
    data_view[pages, offsets] = data
    tail_view[pages, offsets] = tail


def store_entries(values, slots, cache, block_size):
    data, scales = encode_entries(values)
    _scatter(cache, block_size, slots.long(), data, scales, DATA_BYTES)


def gather_entries(cache, block_size, slots, dtype=torch.float32):
    """[N, L, 512] dequantized entries; negative slots give zero rows."""
    flat = slots.long()
    live = flat >= 0
    flat = flat.clamp(min=0)
    data_view, scale_view = _pages(cache, block_size, DATA_BYTES)
    pages, offsets = flat // block_size, flat % block_size
    data, scales = data_view[pages, offsets], scale_view[pages, offsets, :7]
    scale = torch.exp2(scales.float() - 127)
    scale = torch.where(scales == 255, torch.full_like(scale, float("nan")), scale)
    nope = _fp8_values(data[..., :448]).view(*flat.shape, 7, 64) * scale[..., None]
    rope = data[..., 448:].contiguous().view(torch.bfloat16).float()
    out = torch.cat([nope.reshape(*flat.shape, 448), rope], dim=-1)
    return torch.where(live[..., None], out, torch.zeros_like(out)).to(dtype)


def encode_mxfp4_keys(keys):
    """Packed E2M1 [N, 64] and UE8M0 scale bytes [N, 4] of [N, 128] (already rotated)."""
    x = keys.float()
    n = x.shape[0]
    groups = x.reshape(n, 4, 32)
    finite = torch.isfinite(groups).all(-1)
    amax = torch.where(finite, groups.abs().amax(-1), torch.ones_like(finite, dtype=x.dtype))
    exponent = _scale_exponent(amax, 0.75, 3)
    q = groups / torch.exp2(exponent.float())[..., None]
    a = q.abs()
    # Nearest E2M1 magnitude (0, 0.5, 1, 1.5, 2, 3, 4, 6), ties to the even code.
    code = (
        (a > 0.25).int()
        + (a >= 0.75).int()
        + (a > 1.25).int()
        + (a >= 1.75).int()
        + (a > 2.5).int()
        + (a >= 3.5).int()
        + (a > 5).int()
    )
    code = (code | torch.signbit(q).int() * 8) * finite[..., None].int()
    code = code.reshape(n, 128)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8)
    scales = torch.where(finite, exponent + 127, torch.full_like(exponent, 255)).to(torch.uint8)
    return packed, scales


class Compressor:
    """One layer's compressor in plain torch (see the module docstring). ``cache`` must have one
    page more than the block table uses: the scratch page of rows without a finished window."""

    def __init__(self, ratio, dim, num_states, device, rotate=True):
        self.ratio, self.dim, self.rotate = ratio, dim, rotate
        self.overlap = ratio == 4
        width = (2 if self.overlap else 1) * dim
        rows = 2 * ratio if self.overlap else ratio
        self.kv = torch.zeros(num_states, rows, width, device=device)
        self.score = torch.full((num_states, rows, width), float("-inf"), device=device)
        self.hadamard = hadamard_matrix(128, device) if dim == 128 else None
        self.offsets = torch.arange(ratio, device=device)

    def __call__(
        self,
        kv,
        score,
        ape,
        positions,
        state_slots,
        norm_weight,
        rope_cos,
        rope_sin,
        block_table,
        cache,
        block_size,
        norm_eps=1e-6,
    ):
        m, d = self.ratio, self.dim
        positions, slots = positions.long(), state_slots.long()
        window, offset = positions // m, positions % m
        row = (window % 2) * m + offset if self.overlap else offset
        self.kv[slots, row] = kv.float()
        self.score[slots, row] = score.float() + ape[offset]
        if self.overlap:
            current = ((window % 2) * m)[:, None] + self.offsets
            previous = (((window + 1) % 2) * m)[:, None] + self.offsets
            prev_score = self.score[slots[:, None], previous, :d]
            prev_score = torch.where(
                (window > 0)[:, None, None], prev_score, torch.full_like(prev_score, float("-inf"))
            )
            rows_score = torch.cat([prev_score, self.score[slots[:, None], current, d:]], 1)
            prev_kv = self.kv[slots[:, None], previous, :d] * (window > 0)[:, None, None]
            rows_kv = torch.cat([prev_kv, self.kv[slots[:, None], current, d:]], 1)
        else:
            rows_kv, rows_score = self.kv[slots], self.score[slots]
        x = (rows_kv * torch.softmax(rows_score, dim=1)).sum(1)
        y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + norm_eps) * norm_weight
        start = window * m
        cos, sin = rope_cos[start], rope_sin[start]
        x0, x1 = y[:, d - 64 :: 2], y[:, d - 63 :: 2]
        rope = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1).reshape(-1, 64)
        y = torch.cat([y[:, : d - 64], rope], dim=1)
        # The entry's slot, or the scratch page (the pool's last) for a window still open.
        complete = (positions + 1) % m == 0
        column = (window // block_size).clamp(max=block_table.shape[1] - 1)
        page = block_table.long().gather(1, column[:, None])[:, 0]
        slot = page * block_size + window % block_size
        target = torch.where(
            complete, slot, torch.full_like(slot, (cache.shape[0] - 1) * block_size)
        )
        if d == 512:
            data, tail = encode_entries(y)
            _scatter(cache, block_size, target, data, tail, DATA_BYTES)
        else:
            packed, scales = encode_mxfp4_keys(y @ self.hadamard.T if self.rotate else y)
            _scatter(cache, block_size, target, packed, scales, KEY_DATA_BYTES)
