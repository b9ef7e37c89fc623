"""Random inputs and comparisons shared by the Python tests."""

import torch

# Sizes valid on every backend (the CUDA one takes K, V in {64, 128, 256}); K != V so a state
# read in the wrong layout cannot pass.
H, HV, K, V = 2, 4, 64, 128

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def tolerance(input_dtype, state_dtype):
    """The spec's bounds on ||actual - reference|| / ||reference||."""
    if state_dtype == torch.bfloat16:
        return 1e-2
    if input_dtype != torch.float32:
        return 5e-3
    return 1e-5


def make_generator(seed):
    generator = torch.Generator()
    generator.manual_seed(seed)
    return generator


def randn(generator, shape, dtype=torch.float32, device="cpu", scale=1.0):
    x = torch.randn(shape, generator=generator, dtype=torch.float32) * scale
    return x.to(device=device, dtype=dtype)


def fused_gating(generator, lead, heads=HV, dtype=torch.float32, device="cpu"):
    """A_log, a, dt_bias, b with the magnitudes real checkpoints have (decays in (0, 1))."""
    return dict(
        A_log=(torch.rand(heads, generator=generator) * 2.5).to(device),
        a=randn(generator, lead + (heads,), dtype, device),
        dt_bias=randn(generator, (heads,), torch.float32, device, 0.5),
        b=randn(generator, lead + (heads,), dtype, device),
    )


def precomputed_gating(generator, lead, heads=HV, device="cpu"):
    return dict(
        g=(-torch.rand(lead + (heads,), generator=generator) * 2.0).to(device),
        beta=torch.rand(lead + (heads,), generator=generator).to(device),
    )


def make_pool(generator, slots, dtype, device, layout="vk", heads=HV):
    shape = (slots, heads, V, K) if layout == "vk" else (slots, heads, K, V)
    return randn(generator, shape, dtype, device, 0.5)


def poisoned(shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def relative_error(actual, expected):
    actual = actual.detach().to("cpu", torch.float64)
    expected = expected.to(torch.float64)
    denominator = expected.norm().item()
    return (actual - expected).norm().item() / max(denominator, 1e-30)


def assert_matches(actual, expected, tol, what):
    """Every element the reference writes was written (no NaN left) and is within `tol`
    (relative L2); elements the reference leaves NaN are still NaN; zeros are exact."""
    actual = actual.detach().to("cpu", torch.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    untouched = torch.isnan(expected)
    still_nan = torch.isnan(actual)
    missing = int((still_nan & ~untouched).sum())
    extra = int((~still_nan & untouched).sum())
    assert missing == 0, f"{what}: {missing} elements were not written (still NaN)"
    assert extra == 0, f"{what}: {extra} elements were written that must stay untouched"
    written = ~untouched
    exact_zero = written & (expected == 0)
    assert torch.all(actual[exact_zero] == 0), f"{what}: padding rows must be exactly zero"
    error = relative_error(actual[written], expected[written])
    assert error <= tol, f"{what}: relative error {error:.3g} > {tol:.3g}"


def assert_pool_matches(actual, before, expected, tol, what="state"):
    """Written slots match the reference; every other slot is bit-for-bit unchanged."""
    actual_cpu = actual.detach().to("cpu")
    before_cpu = before.detach().to("cpu")
    written = sorted(expected.written_slots)
    for slot in range(actual_cpu.shape[0]):
        if slot not in expected.written_slots:
            assert torch.equal(actual_cpu[slot], before_cpu[slot]), f"{what}: slot {slot} changed"
    if written:
        index = torch.tensor(written)
        error = relative_error(actual_cpu[index], expected.state[index])
        assert error <= tol, f"{what}: relative error {error:.3g} > {tol:.3g} on slots {written}"
