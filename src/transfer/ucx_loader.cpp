// Loads the UCX plugin once per process (dlopen) and makes transports from it. Written by
// hand because only a runtime load keeps UCX's process-wide memory hooks out of processes
// that never move KV; its hooks are turned off here too (this code registers its regions
// once and never unmaps them, so UCX's registration cache has nothing to track).
#include <dlfcn.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <mutex>

#include "transfer/ucx_transport.h"

namespace transfer {
namespace {

std::string beside_this_binary(const char* name) {
  char path[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return name;
  std::string dir(path, static_cast<size_t>(n));
  return dir.substr(0, dir.rfind('/') + 1) + name;
}

}  // namespace

common::Result<std::unique_ptr<UcxTransport>> UcxTransport::create() {
  static std::once_flag once;
  static UcxTransportFactory factory = nullptr;
  static std::string load_error;
  std::call_once(once, [] {
    // Before the library's constructors read them; the environment still wins.
    setenv("UCX_MEM_MALLOC_HOOKS", "no", /*overwrite=*/0);
    setenv("UCX_MEM_MMAP_HOOK_MODE", "none", /*overwrite=*/0);
    setenv("UCX_MEM_EVENTS", "no", /*overwrite=*/0);
    std::string tried;
    for (const std::string& path :
         {beside_this_binary("libchunkpipe_ucx.so"), std::string(CHUNKPIPE_UCX_PLUGIN)}) {
      void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        tried += std::string(tried.empty() ? "" : "; ") + dlerror();
        continue;
      }
      factory = reinterpret_cast<UcxTransportFactory>(dlsym(handle, kUcxFactorySymbol));
      if (factory != nullptr) return;
      tried += "; " + path + " has no " + kUcxFactorySymbol;
    }
    load_error = "cannot load the UCX plugin libchunkpipe_ucx.so (" + tried + ")";
  });
  if (factory == nullptr) return common::Status(common::StatusCode::kInternal, load_error);
  std::string error;
  UcxTransport* t = factory(&error);
  if (t == nullptr) return common::Status(common::StatusCode::kInternal, error);
  return std::unique_ptr<UcxTransport>(t);
}

}  // namespace transfer
