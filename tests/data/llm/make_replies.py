#!/usr/bin/env python3
"""Writes start.cpp and replies.json, the llm proposer's test fixtures, from the CPU rmsnorm
starter (kernels/rmsnorm/rmsnorm_cpu.cpp). Run it again after changing the starter.

start.cpp is the task's first version: the starter with a busy-wait in its row loop, so that a
reply removing it is faster beyond any noise. The replies, in the order the test asks:

  1 improves: a unified diff that drops the busy-wait                      -> KEEP
  2 does not compile                                                       -> COMPILE_ERROR
  3 is wrong: every row scaled by 1.01                                     -> WRONG
  4 cheats: skips the work when called again on the same buffers           -> not kept
  5 malformed JSON (echoing the Authorization header the server received)  -> BAD_REPLY
  6 never answers in time (twice: the test's client makes two attempts)    -> NO_REPLY
  7 HTTP 429, then the best file again under another comment                -> REVERT

Each answered reply reports 1000 prompt and 500 completion tokens.
"""
import difflib
import json
import os

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.normpath(os.path.join(here, "..", "..", ".."))
starter = open(os.path.join(root, "kernels", "rmsnorm", "rmsnorm_cpu.cpp")).read()

row = "    const acc_t inv_rms = acc_t(1)"
assert row in starter
spin = "    for (volatile int spin = 0; spin < 20000; ++spin) {\n    }\n"
start = starter.replace(row, spin + row)


def answer(text):
    return {"body": {"id": "chatcmpl-test", "object": "chat.completion", "model": "test-model",
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": text}}],
                     "usage": {"prompt_tokens": 1000, "completion_tokens": 500,
                               "total_tokens": 1500}}}


def whole_file(change, source):
    return answer(f"Change: {change}\n\n```cpp\n{source}```\n")


diff = "".join(difflib.unified_diff(start.splitlines(True), starter.splitlines(True),
                                    "a/kernel.cpp", "b/kernel.cpp"))
cheat = starter.replace(
    "  const int64_t M = kf_numel(&x) / N;\n",
    "  const int64_t M = kf_numel(&x) / N;\n"
    "  // The same buffers as last time: the answer is already there.\n"
    "  static const void* last_x = nullptr;\n"
    "  static void* last_y = nullptr;\n"
    "  if (x.data == last_x && y.data == last_y) return KF_OK;\n"
    "  last_x = x.data;\n"
    "  last_y = y.data;\n")
assert cheat != starter
replies = [
    answer("Change: drop the busy-wait in the row loop\n\nThe wait does nothing useful.\n\n"
           f"```diff\n{diff}```\n"),
    whole_file("accumulate with a typo", starter.replace(row, "    this does not compile;\n" + row)),
    whole_file("fold the epsilon into the scale", starter.replace("acc_t(1) /", "acc_t(1.01) /")),
    whole_file("reuse the previous answer for repeated calls", cheat),
    {"raw": '{"id": "chatcmpl-test", "note": "key {auth}", "choices": [{"message": {"content": '},
    {"delay": 6, "repeat": 2, "body": {"error": {"message": "too late"}}},
    {"status": 429, "headers": {"Retry-After": "0"},
     "body": {"error": {"message": "Rate limit reached", "type": "rate_limit"}}},
    whole_file("reword a comment", start.replace("// RMSNorm on the CPU", "// RMSNorm (CPU)")),
]
with open(os.path.join(here, "start.cpp"), "w") as f:
    f.write(start)
with open(os.path.join(here, "replies.json"), "w") as f:
    json.dump(replies, f, indent=1)
    f.write("\n")
