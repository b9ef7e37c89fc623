"""A float64 oracle of the DeepSeek-V4 KV cache formats and compressor (docs/spec.md,
docs/dsv4-kv-cache.md), written from the spec for the Python tests. Encoders search the nearest
representable value in a table (no bit tricks), the compressor keeps the raw rows and takes the
spec's softmax over them. Slow on purpose; shares nothing with hdk's code."""

import torch

F64 = torch.float64
ENTRY_BYTES, DATA_BYTES = 584, 576
KEY_BYTES = {"mxfp4": 68, "nvfp4": 72, "fp8": 132}
# Bytes of a key's data (codes) at the start of its image; the scales follow.
KEY_DATA_BYTES = {"mxfp4": 64, "nvfp4": 64, "fp8": 128}


def _e4m3_table():
    """Magnitudes of the E4M3 codes 0 .. 0x7E (0x7F is NaN), increasing with the code."""
    values = []
    for code in range(0x7F):
        exponent, mantissa = code >> 3, code & 7
        if exponent == 0:
            values.append(mantissa * 2.0**-9)
        else:
            values.append((1 + mantissa / 8) * 2.0 ** (exponent - 7))
    return torch.tensor(values, dtype=F64)


E4M3 = _e4m3_table()
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=F64)


def nearest_code(magnitudes, table):
    """The code of the nearest table value (ties: the even code), saturating at the last."""
    m = magnitudes.clamp(max=float(table[-1]))
    above = torch.searchsorted(table, m).clamp(max=len(table) - 1)
    below = (above - 1).clamp(min=0)
    d_above, d_below = table[above] - m, m - table[below]
    pick_below = (d_below < d_above) | ((d_below == d_above) & (below % 2 == 0))
    return torch.where(pick_below, below, above)


def pow2_exponent(amax, qmax):
    """The smallest e with qmax * 2^e >= max(amax, 1e-4), exactly."""
    a = amax.clamp(min=1e-4)
    e = torch.ceil(torch.log2(a / qmax))
    e = torch.where(qmax * torch.exp2(e - 1) >= a, e - 1, e)
    return torch.where(qmax * torch.exp2(e) < a, e + 1, e)


def _signed(codes, negative, sign_bit):
    return codes | torch.where(negative, sign_bit, 0)


def _negative(x):
    """True for x < 0 and for -0.0 (a value rounding to zero keeps its sign)."""
    return torch.signbit(x) if hasattr(torch, "signbit") else (1.0 / x < 0)


def bf16_bytes(x):
    """Little-endian bf16 of fp32-representable values, round to nearest even."""
    return x.to(torch.float32).to(torch.bfloat16).view(torch.uint8).reshape(*x.shape[:-1], -1)


def encode_entries(values):
    """MODEL1 images [N, 584] (576 data bytes, then the 7 scales and a zero pad) and the
    non-finite flags [N] of float64 rows [N, 512]."""
    n = values.shape[0]
    nope = values[:, :448].reshape(n, 7, 64)
    finite = torch.isfinite(nope).all(-1)
    amax = torch.where(torch.isfinite(nope), nope.abs(), torch.zeros_like(nope)).amax(-1)
    exponent = pow2_exponent(amax, 448.0)
    scaled = nope / torch.exp2(exponent)[..., None]
    codes = nearest_code(scaled.abs().nan_to_num(0.0, 0.0, 0.0), E4M3)
    codes = _signed(codes, _negative(scaled), 0x80)
    codes = torch.where(finite[..., None], codes, torch.full_like(codes, 0x7F))
    scales = torch.where(finite, exponent + 127, torch.full_like(exponent, 255)).long()
    image = torch.zeros(n, ENTRY_BYTES, dtype=torch.uint8)
    image[:, :448] = codes.reshape(n, 448).to(torch.uint8)
    image[:, 448:576] = bf16_bytes(values[:, 448:])
    image[:, 576:583] = scales.to(torch.uint8)
    nonfinite = ~torch.isfinite(values).all(-1)
    return image, nonfinite


def fp32_bytes(values):
    """Little-endian bytes [..., 4] of float64 values exact in fp32."""
    bits = values.to(torch.float32).view(torch.int32)
    return torch.stack([(bits >> (8 * b)) & 0xFF for b in range(4)], dim=-1).to(torch.uint8)


def encode_fp8_keys(keys):
    """FP8 key images [N, 132] (128 E4M3 codes, then the little-endian fp32 scale) of float64
    [N, 128] and the non-finite flags [N]: one power-of-two scale per key, 2^ceil(log2(max(amax,
    1e-4) / 448)); a key with a NaN or infinity is 128 x 0x7F and the fp32 NaN 0x7FC00000."""
    n = keys.shape[0]
    finite = torch.isfinite(keys).all(-1)
    amax = torch.where(torch.isfinite(keys), keys.abs(), torch.zeros_like(keys)).amax(-1)
    exponent = pow2_exponent(amax, 448.0)
    scaled = keys / torch.exp2(exponent)[:, None]
    codes = nearest_code(scaled.abs().nan_to_num(0.0, 0.0, 0.0), E4M3)
    codes = _signed(codes, _negative(scaled), 0x80)
    codes = torch.where(finite[:, None], codes, torch.full_like(codes, 0x7F))
    scale = fp32_bytes(torch.exp2(exponent))
    nan = torch.tensor([0x00, 0x00, 0xC0, 0x7F], dtype=torch.uint8).expand(n, 4)
    image = torch.zeros(n, KEY_BYTES["fp8"], dtype=torch.uint8)
    image[:, :128] = codes.to(torch.uint8)
    image[:, 128:] = torch.where(finite[:, None], scale, nan)
    return image, ~finite


def encode_keys(keys, fmt):
    """Key images [N, KEY_BYTES[fmt]] (the data bytes, then the scales) of float64 [N, 128]
    (already rotated as wanted) and the non-finite flags [N]: FP4 keys are 64 packed E2M1 bytes
    and 4 UE8M0 / 8 E4M3 scales, FP8 keys encode_fp8_keys'."""
    if fmt == "fp8":
        return encode_fp8_keys(keys)
    n = keys.shape[0]
    group = 32 if fmt == "mxfp4" else 16
    x = keys.reshape(n, 128 // group, group)
    finite = torch.isfinite(x).all(-1)
    amax = torch.where(torch.isfinite(x), x.abs(), torch.zeros_like(x)).amax(-1)
    if fmt == "mxfp4":
        exponent = pow2_exponent(amax, 6.0)
        scale = torch.exp2(exponent)
        scale_bytes = torch.where(finite, exponent + 127, torch.full_like(exponent, 255)).long()
    else:
        scale_codes = nearest_code(amax / 6.0, E4M3)
        scale = E4M3[scale_codes]
        scale_bytes = torch.where(finite, scale_codes, torch.full_like(scale_codes, 0x7F))
    live = finite & (scale > 0)
    quotient = torch.where(live[..., None], x / torch.where(live, scale, 1.0)[..., None], 0.0)
    codes = _signed(nearest_code(quotient.abs(), E2M1), _negative(quotient) & live[..., None], 8)
    codes = codes.reshape(n, 128)
    image = torch.zeros(n, KEY_BYTES[fmt], dtype=torch.uint8)
    image[:, :64] = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    image[:, 64:] = scale_bytes.to(torch.uint8)
    return image, ~torch.isfinite(keys).all(-1)


def place(cache, block_size, slots, images, data_bytes):
    """Writes images [N, bytes] into pages: data at offset * data_bytes, the rest at
    block_size * data_bytes + offset * (bytes - data_bytes). Negative slots are skipped."""
    tail = images.shape[1] - data_bytes
    for slot, image in zip(slots.tolist(), images):
        if slot < 0:
            continue
        page, offset = divmod(slot, block_size)
        cache[page, offset * data_bytes : (offset + 1) * data_bytes] = image[:data_bytes]
        start = block_size * data_bytes + offset * tail
        cache[page, start : start + tail] = image[data_bytes:]


def read(cache, block_size, slot, total, data_bytes):
    """The image of one slot (inverse of place)."""
    page, offset = divmod(slot, block_size)
    tail = total - data_bytes
    start = block_size * data_bytes + offset * tail
    return torch.cat(
        [
            cache[page, offset * data_bytes : (offset + 1) * data_bytes],
            cache[page, start : start + tail],
        ]
    )


def decode_entry(image):
    """float64 [512] of a MODEL1 image: FP8 x 2^(s - 127), bf16 RoPE; NaN for marked groups."""
    codes = image[:448].long()
    magnitude = torch.where(
        (codes & 0x7F) == 0x7F,
        torch.tensor(float("nan"), dtype=F64),
        E4M3[(codes & 0x7F).clamp(max=0x7E)],
    )
    value = torch.where(codes >= 0x80, -magnitude, magnitude).reshape(7, 64)
    scale_bytes = image[576:583].double()
    scale = torch.where(
        scale_bytes == 255, torch.tensor(float("nan"), dtype=F64), torch.exp2(scale_bytes - 127)
    )
    rope = image[448:576].clone().view(torch.bfloat16).double()
    return torch.cat([(value * scale[:, None]).reshape(448), rope])


def decode_key(image, fmt):
    """float64 [128] of a key image. FP8: code x the image's fp32 scale, whatever fp32 it is
    (NaN codes and NaN scales give NaN); round the result to fp32 once to get what hdk's fp32
    gather returns for any scale (exact for the power-of-two scales hdk writes)."""
    if fmt == "fp8":
        codes = image[:128].long()
        magnitude = torch.where(
            (codes & 0x7F) == 0x7F,
            torch.tensor(float("nan"), dtype=F64),
            E4M3[(codes & 0x7F).clamp(max=0x7E)],
        )
        value = torch.where(codes >= 0x80, -magnitude, magnitude)
        bits = sum(int(image[128 + b]) << (8 * b) for b in range(4))
        bits = bits - (1 << 32) if bits >= 1 << 31 else bits
        scale = torch.tensor([bits], dtype=torch.int32).view(torch.float32).double()
        return value * scale
    codes = torch.stack([image[:64] & 15, image[:64] >> 4], dim=1).reshape(128).long()
    value = torch.where(codes >= 8, -E2M1[codes & 7], E2M1[codes & 7])
    if fmt == "mxfp4":
        s = image[64:68].double()
        scale = torch.where(s == 255, torch.tensor(float("nan"), dtype=F64), torch.exp2(s - 127))
    else:
        s = image[64:72].long()
        scale = torch.where(
            s == 0x7F, torch.tensor(float("nan"), dtype=F64), E4M3[s.clamp(max=126)]
        )
    return (value.reshape(scale.shape[0], -1) * scale[:, None]).reshape(128)


def hadamard(x):
    """H_128 / sqrt(128) applied to the last dimension, Sylvester order, float64."""
    h = torch.ones(1, 1, dtype=F64)
    while h.shape[0] < x.shape[-1]:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return x @ h.T / h.shape[0] ** 0.5


class Compressor:
    """The spec's compressor for one layer and compressor, over whole sequences, in float64.
    Keeps each state slot's raw rows per window; run() returns the entries a call completes as
    (batch row, entry index within the request, float64 values after norm and RoPE)."""

    def __init__(self, ratio, dim):
        self.ratio, self.dim = ratio, dim
        self.rows = {}  # state slot -> {window: (kv [ratio, width], score [ratio, width])}

    def run(
        self, kv, score, ape, positions, state_slots, norm_weight, rope_cos, rope_sin, norm_eps=1e-6
    ):
        m, d = self.ratio, self.dim
        kv, score = kv.double(), score.double()
        if kv.dim() == 2:
            kv, score = kv[:, None], score[:, None]
        entries = []
        for n in range(kv.shape[0]):
            slot = int(state_slots[n])
            if slot < 0:
                continue
            windows = self.rows.setdefault(slot, {})
            for t in range(kv.shape[1]):
                pos = int(positions[n]) + t
                w, r = divmod(pos, m)
                if r == 0:
                    windows.pop(w - 2, None)
                    windows[w] = (
                        torch.zeros(m, kv.shape[2], dtype=F64),
                        torch.full((m, kv.shape[2]), float("-inf"), dtype=F64),
                    )
                windows[w][0][r] = kv[n, t]
                windows[w][1][r] = score[n, t] + ape[r].double()
                if (pos + 1) % m == 0:
                    entries.append(
                        (n, w, self._entry(windows, w, norm_weight, rope_cos, rope_sin, norm_eps))
                    )
        return entries

    def _entry(self, windows, w, norm_weight, rope_cos, rope_sin, norm_eps):
        m, d = self.ratio, self.dim
        cur_kv, cur_score = windows[w]
        if m == 4:
            if w > 0:
                prev_kv, prev_score = windows[w - 1][0][:, :d], windows[w - 1][1][:, :d]
            else:
                prev_kv = torch.zeros(m, d, dtype=F64)
                prev_score = torch.full((m, d), float("-inf"), dtype=F64)
            rows_kv = torch.cat([prev_kv, cur_kv[:, d:]])
            rows_score = torch.cat([prev_score, cur_score[:, d:]])
        else:
            rows_kv, rows_score = cur_kv, cur_score
        x = (rows_kv * torch.softmax(rows_score, dim=0)).sum(0)
        y = x / torch.sqrt((x * x).mean() + norm_eps) * norm_weight.double()
        start = w * m
        cos, sin = rope_cos[start].double(), rope_sin[start].double()
        x0, x1 = y[d - 64 :: 2].clone(), y[d - 64 + 1 :: 2].clone()
        y[d - 64 :: 2] = x0 * cos - x1 * sin
        y[d - 64 + 1 :: 2] = x0 * sin + x1 * cos
        return y


FP8_RELATIVE_ERROR_BOUND = 2.0**-4


def check_entry(image, value, fmt="mxfp4"):
    """Asserts that a stored entry (MODEL1 for 512 values) or key (128 values, compared with
    the float64 rotation of `value`) decodes within the format's bound of the float64 `value`
    (plus 1e-5 relative for the backend's fp32 arithmetic before quantizing). Returns the largest
    error: relative for MODEL1 and FP8 keys, relative to the group amax for FP4 keys."""
    if value.shape[0] == 512:
        got = decode_entry(image)
        nope, rope = value[:448], value[448:]
        amax = nope.view(7, 64).abs().amax(-1).clamp(min=1e-4)
        scale = torch.exp2(torch.ceil(torch.log2(amax / 448))).repeat_interleave(64)
        bound = nope.abs() * (FP8_RELATIVE_ERROR_BOUND + 1e-5) + scale / 1024
        assert ((got[:448] - nope).abs() <= bound).all(), "MODEL1 values beyond the FP8 bound"
        assert ((got[448:] - rope).abs() <= rope.abs() / 256 + 1e-6).all(), "RoPE beyond bf16"
        return float(((got[:448] - nope).abs() / nope.abs()).max())
    got = decode_key(image, fmt)
    rotated = hadamard(value[None])[0]
    if fmt == "fp8":
        # One power-of-two scale per key (the backend's fp32 rotation may take the next one).
        amax = rotated.abs().amax().clamp(min=1e-4)
        scale = torch.exp2(torch.ceil(torch.log2(amax / 448)))
        bound = rotated.abs() * (FP8_RELATIVE_ERROR_BOUND + 1e-5) + 2 * scale / 1024
        error = (got - rotated).abs()
        assert (error <= bound).all(), "FP8 key beyond the FP8 bound"
        return float((error / torch.maximum(rotated.abs(), amax / 256)).max())
    group = 32 if fmt == "mxfp4" else 16
    amax = rotated.view(-1, group).abs().amax(-1).repeat_interleave(group)
    error = (got - rotated).abs()
    assert (error <= 0.25 * torch.maximum(amax / 3, rotated.abs()) + 1e-5).all(), "key error"
    return float((error / amax).max())


def generator(seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def rope_tables(max_position, g):
    angles = torch.rand(max_position, 32, generator=g) * 6.3
    return torch.cos(angles), torch.sin(angles)
