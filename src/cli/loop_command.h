// `kforge loop DIR`: the experiment loop over a workspace of tasks (`kforge plan --extract N
// --workspace DIR`). Each task folder gets a journal (src/loop/journal.h) whose repository starts
// from the op's starter kernel for the backend. Today a person or an external agent drives it:
//
//   kforge loop DIR                                    every task: experiments, kept, best, state
//   kforge loop DIR --status                           the same, read only, beside a running loop
//   kforge loop DIR --next [--task T]                  the brief of the task to work on next
//   kforge loop DIR --submit FILE --task T --note "…"  one experiment: check, time, keep or revert
//   kforge loop DIR --propose scripted:EDITS --task T  experiments from a proposer until it has
//                                                      no more or a move-on rule fires
//   kforge loop DIR --propose tuner --seconds 600      every task, in the order of the plan's
//                                                      whole-run gain, the budget spread by it
//
// An experiment a killed run left is evaluated again before anything new.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/common.h"
#include "loop/proposer.h"

namespace kforge {

struct LoopFlags {
  std::string workspace;
  std::string submit;  // a kernel file: the new version of the task's one file
  std::string task;    // a task folder's name (default: the only task, or the first)
  std::string note;    // the proposer's description of the change
  std::string proposer = "agent";
  std::string propose;  // a proposer spec (src/loop/proposer.h), e.g. scripted:DIR
  MoveOnRules rules;
  double total_seconds = 0;  // with --propose over every task: spread by expected gain
  double max_seconds = 1.0;  // timing cap per kernel per experiment
  std::string json_path;
  bool status = false;  // read-only state, beside a running loop
  bool next = false;    // the brief of the task to work on next
  std::string devices;  // "0,1" or "all": with --propose, tasks run side by side, one per device
};

CLI::App* add_loop_command(CLI::App& app, LoopFlags& flags, DeviceFlags& device);
// --max-reverts, --target-speedup, --task-seconds, --roofline.
void add_move_on_options(CLI::App* cmd, MoveOnRules& rules);
int cmd_loop(const LoopFlags& flags, const DeviceFlags& device);

}  // namespace kforge
