# What torch.profiler records for an unannotated HF model: module ranges (with_stack /
# with_modules), op shapes. Writes the traces (gzipped) and a summary of event names.
import gzip, json, os, sys, collections
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
out = os.environ.get("OUT", "/tmp")
torch.manual_seed(0)
def build(name):
    if name == "llama":
        cfg = LlamaConfig(hidden_size=2048, num_hidden_layers=2, num_attention_heads=16,
                          num_key_value_heads=16, intermediate_size=5632, vocab_size=32000)
        return LlamaForCausalLM(cfg)
    cfg = Qwen2Config(hidden_size=1536, num_hidden_layers=2, num_attention_heads=12,
                      num_key_value_heads=2, intermediate_size=8960, vocab_size=32000)
    return Qwen2ForCausalLM(cfg)
for name in ["llama", "qwen2"]:
    model = build(name).to("cuda", torch.bfloat16)
    model.config._attn_implementation = "sdpa"
    ids = torch.randint(0, 32000, (4, 1024), device="cuda")
    with torch.no_grad():
        for _ in range(2):
            model(input_ids=ids, labels=ids)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA],
                                    record_shapes=True, with_stack=True, with_modules=True) as prof:
            with torch.profiler.record_function("step"):
                model(input_ids=ids, labels=ids)
            torch.cuda.synchronize()
    path = f"{out}/{name}-trace.json"
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    cats = collections.Counter(e.get("cat") for e in trace["traceEvents"])
    names = collections.Counter(e.get("name") for e in trace["traceEvents"] if e.get("cat") == "python_function")
    mods = [n for n in names if n.startswith("nn.Module")]
    print(name, "categories", dict(cats))
    print(name, "module events", len(mods), sorted(mods)[:40])
    ops = collections.Counter(e.get("name") for e in trace["traceEvents"] if e.get("cat") == "cpu_op")
    print(name, "cpu ops", ops.most_common(40))
    ex = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"][:3]
    print(name, "cpu_op args example", [e.get("args") for e in ex])
    with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
        g.write(f.read())
    os.remove(path)
