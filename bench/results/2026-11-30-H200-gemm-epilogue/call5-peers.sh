#!/usr/bin/env bash
# H200: two more bench/peers processes at matmul 4096^3 on call 4's machine (its build cached).
set -u
o=$OUT
for run in 3 4; do
  timeout 120 python3 bench/peers --ops matmul --shapes 4096x4096x4096 --no-compile \
    --kernel-times --out $o/peers-$run > $o/peers-$run.log 2>&1
  echo "peers $run rc $? at $SECONDS s"; grep "activity records\|x PyTorch" $o/peers-$run.log | tail -2
done
tar -C $o -cJf $o/peers-34.tar.xz peers-3 peers-4 && rm -rf $o/peers-3 $o/peers-4
