#!/usr/bin/env python3
"""Generate with a transformers model, with and without hdk's decode kernels.

    python examples/hf_generate.py --model deepseek_v4 --batch 8 --prompt 4096 --new 64
    python examples/hf_generate.py --model qwen3_next --batch 8 --prompt 4096 --new 64
    python examples/hf_generate.py --checkpoint /path/to/local/model --new 32

Without --checkpoint a tiny random model with the real layer structure is built
(hdk.integrations.tiny_models). The prompts are random tokens. Decode tokens per second are
measured as engines count them: the time of a generate() of 1 + NEW tokens minus the time of a
generate() of 1 token (the prefill and its first token), both after a warm-up, on one GPU. The
same greedy run is made with transformers' own decode and with hdk's, and the fraction of
generated tokens the two agree on is printed (tiny random models have nearly flat logits, so a
storage rounding can flip a token and the sequences part from there).
"""

import argparse
import json
import time

import torch

from hdk.integrations import tiny_models
from hdk.integrations import transformers as hdk_tf


def parse():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["deepseek_v4", "qwen3_next"], default="deepseek_v4")
    parser.add_argument("--checkpoint", help="a local model directory (overrides --model)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=4096, help="prompt tokens per row")
    parser.add_argument("--new", type=int, default=64, help="decode tokens per row")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs; the fastest counts")
    parser.add_argument("--json", help="also write the measured rates to this file")
    return parser.parse_args()


def load(args):
    if args.checkpoint:
        from transformers import AutoModelForCausalLM

        return (
            AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.bfloat16)
            .cuda()
            .eval()
        )
    return getattr(tiny_models, args.model)(device="cuda")


def timed_generate(model, ids, new):
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        tokens = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    torch.cuda.synchronize()
    return time.perf_counter() - start, tokens


def decode_rate(model, ids, new, repeats):
    """(decode tokens per second, the generated tokens) for batch ``ids``."""
    timed_generate(model, ids[:, :8], 2)  # warm-up: kernels, allocator
    prefill = min(timed_generate(model, ids, 1)[0] for _ in range(repeats))
    runs = [timed_generate(model, ids, 1 + new) for _ in range(repeats)]
    total = min(seconds for seconds, _ in runs)
    return ids.shape[0] * new / max(total - prefill, 1e-9), runs[0][1][:, ids.shape[1] :]


def main():
    args = parse()
    model = load(args)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.prompt), device="cuda")
    name = args.checkpoint or args.model
    print(
        f"{name}: batch {args.batch}, prompt {args.prompt}, {args.new} decode tokens a row, "
        f"{torch.cuda.get_device_name()}"
    )
    hf_rate, hf_tokens = decode_rate(model, ids, args.new, args.repeats)
    label = "transformers' decode:"
    print(f"  {label:<28}{hf_rate:10.1f} tokens/s")
    rows = [{"decode": "transformers", "tokens_per_s": hf_rate}]
    variants = [("hdk's decode", {})]
    if model.config.model_type == "deepseek_v4":
        sizes = {"max_requests": args.batch, "max_context": args.prompt + args.new + 8}
        variants = [
            ("hdk's decode, eager", dict(sizes, cuda_graph=False)),
            ("hdk's decode, CUDA graph", sizes),
        ]
    for label, options in variants:
        hdk_tf.enable(model, **options)
        try:
            rate, tokens = decode_rate(model, ids, args.new, args.repeats)
        finally:
            hdk_tf.disable(model)
        agree = (hf_tokens == tokens).float().mean().item()
        rows.append(
            {
                "decode": label,
                "tokens_per_s": rate,
                "x_transformers": rate / hf_rate,
                "tokens_equal": agree,
            }
        )
        print(
            f"  {label + ':':<28}{rate:10.1f} tokens/s ({rate / hf_rate:.2f}x); generated "
            f"tokens equal to transformers': {agree:.1%}"
        )
    if args.json:
        setup = {k: getattr(args, k) for k in ("model", "checkpoint", "batch", "prompt", "new")}
        setup["device"] = torch.cuda.get_device_name()
        with open(args.json, "w") as f:
            json.dump({"setup": setup, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
