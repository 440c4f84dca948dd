// Child processes of this binary: spawn with chosen fds inherited and a parent-death signal
// (a stage never outlives the server that started it), and non-blocking exit checks.
// Thread-safety: all functions are safe to call from any thread.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace dist {

// fork + exec of `binary` with `args` (argv[1..]); `inherit_fds` stay open in the child.
// The child gets SIGKILL when the thread that spawned it exits (PR_SET_PDEATHSIG follows the
// thread, not the process), so spawn from a thread that lives as long as the child should.
// With own_process_group the child leads a new process group (pid == pgid), so that a signal to
// -pid reaches what it starts in turn (a script's server).
common::Result<pid_t> spawn_process(const std::string& binary, const std::vector<std::string>& args,
                                    const std::vector<int>& inherit_fds,
                                    bool own_process_group = false);

// If `pid` has exited, reaps it and describes how ("exited with status 1", "was killed by signal
// 9 (Killed)"); nullopt while it runs.
std::optional<std::string> reap_if_exited(pid_t pid);

// This process's own binary (for spawning more ranks of it).
std::string self_binary();

}  // namespace dist
