#!/usr/bin/env bash
# H200: fused_mlp at Qwen2-1.5B's MLP (4096 tokens, hidden 1536, intermediate 8960) against
# eager, kernel times by activity records; the library's nearest row (Llama's).
set -u
export KFORGE_GIT_SHA="$(cat .device/sha)"
mkdir -p .deps/nvidia-cutlass/cutlass_library/source
tar -C .deps/nvidia-cutlass/cutlass_library/source -xJf .device/cutlass-include.tar.xz
o=/tmp/qwen; mkdir -p $o
timeout 215 python3 bench/peers --ops fused_mlp --shapes 4096x1536x8960 --kernel-times \
  --no-compile --out $o/peers > $o/peers.log 2>&1
echo "peers rc $? at $SECONDS s"; grep -E "^\| fused|×|GPU time" $o/peers.log | cut -c1-400
python3 - $o/peers/peers.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    for who, t in r.get("kernel_times", {}).items():
        for k, us in t.get("kernel_median_us", {}).items():
            print(r["shape"], who, f"{us:9.2f}", k[:90])
PY
tar -C /tmp -czf $OUT/qwen.tgz qwen
