"""A Hugging Face `transformers` model as users run it: built from a config with random weights
(nothing is downloaded), unannotated, each iteration inside one NVTX range named `step` — the
only thing added for kforge.

    kforge profile --torch --range step --skip 2 -- python3 python/examples/hf_model.py llama
    python3 python/examples/hf_model.py llama --time        # eager and torch.compile step times

Models (--layers changes the depth of any of them):

| name    | class                   | config                                                       |
|---------|-------------------------|--------------------------------------------------------------|
| llama   | LlamaForCausalLM        | hidden 2048, 16 heads, intermediate 5632, vocab 32000        |
| qwen2   | Qwen2ForCausalLM        | hidden 1536, 12 heads / 2 KV heads, intermediate 8960, q/k/v biases, vocab 32000 |
| mistral | MistralForCausalLM      | hidden 2048, 16 heads / 8 KV heads, intermediate 5632, vocab 32000 |
| gpt2    | GPT2LMHeadModel         | hidden 1024, 16 heads, vocab 50257                           |
| bert    | BertForMaskedLM         | hidden 1024, 16 heads, intermediate 4096, vocab 30522        |

Every model has 8 layers by default and runs a forward with labels (the loss included) under
torch.no_grad(), in bf16, on batch 4 x 1024 tokens (bert: 4 x 512, its position limit).
"""

import argparse
import sys
import time

import torch
import transformers as tf


def build(name, layers):
    if name == "llama":
        config = tf.LlamaConfig(hidden_size=2048, num_hidden_layers=layers, num_attention_heads=16,
                                num_key_value_heads=16, intermediate_size=5632, vocab_size=32000)
        return tf.LlamaForCausalLM(config), 32000, 1024
    if name == "qwen2":
        config = tf.Qwen2Config(hidden_size=1536, num_hidden_layers=layers, num_attention_heads=12,
                                num_key_value_heads=2, intermediate_size=8960, vocab_size=32000)
        return tf.Qwen2ForCausalLM(config), 32000, 1024
    if name == "mistral":
        config = tf.MistralConfig(hidden_size=2048, num_hidden_layers=layers,
                                  num_attention_heads=16, num_key_value_heads=8,
                                  intermediate_size=5632, vocab_size=32000)
        return tf.MistralForCausalLM(config), 32000, 1024
    if name == "gpt2":
        config = tf.GPT2Config(n_embd=1024, n_layer=layers, n_head=16, n_positions=1024)
        return tf.GPT2LMHeadModel(config), config.vocab_size, 1024
    if name == "bert":
        config = tf.BertConfig(hidden_size=1024, num_hidden_layers=layers, num_attention_heads=16,
                               intermediate_size=4096)
        return tf.BertForMaskedLM(config), config.vocab_size, 512
    sys.exit(f"unknown model {name!r}: llama, qwen2, mistral, gpt2 or bert")


def step_ms(forward, inputs, iters):
    """Mean GPU time of one step over `iters` steps, after three warm-up steps."""
    for _ in range(3):
        forward(**inputs)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        forward(**inputs)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, help="tokens per sequence (default 1024; bert 512)")
    parser.add_argument("--steps", type=int, default=5, help="iterations, each a `step` range")
    parser.add_argument("--attention", default="sdpa", help="attn_implementation: sdpa or eager")
    parser.add_argument("--time", action="store_true",
                        help="instead: print the mean step time of eager and torch.compile")
    args = parser.parse_args()

    torch.manual_seed(0)
    model, vocab, seq = build(args.model, args.layers)
    seq = args.seq or seq
    model.config._attn_implementation = args.attention
    model = model.to("cuda", torch.bfloat16).eval()
    ids = torch.randint(0, vocab, (args.batch, seq), device="cuda")
    inputs = {"input_ids": ids, "labels": ids}
    print(f"{args.model}: {type(model).__name__}, {args.layers} layers, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters, "
          f"batch {args.batch} x {seq}, bf16, {args.attention} attention", flush=True)

    with torch.no_grad():
        if args.time:
            eager = step_ms(model, inputs, 20)
            began = time.time()
            compiled = torch.compile(model)
            compiled_ms = step_ms(compiled, inputs, 20)
            print(f"eager_step_ms={eager:.3f} compile_step_ms={compiled_ms:.3f} "
                  f"compile_speedup={eager / compiled_ms:.3f} "
                  f"(compile and warm-up {time.time() - began:.0f} s)")
            return
        for _ in range(args.steps):
            with torch.cuda.nvtx.range("step"):
                loss = model(**inputs).loss
        torch.cuda.synchronize()
        print(f"loss={loss.item():.4f}")


if __name__ == "__main__":
    main()
