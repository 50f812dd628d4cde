// A library the hardening tests preload (LD_PRELOAD) into headroom to stop it at an exact point of a checkpoint
// save: the process SIGKILLs itself at the rename whose destination's last component is HR_KILL_AT_RENAME_TO (and
// whose source's is HR_KILL_AT_RENAME_FROM, when that is set too), before the rename happens. With
// HR_NO_RENAME_EXCHANGE set, renameat2's RENAME_EXCHANGE fails with EINVAL, as on a file system without it.
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

const char* last_component(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

void kill_if_named(const char* from, const char* to) {
  const char* want_to = std::getenv("HR_KILL_AT_RENAME_TO");
  const char* want_from = std::getenv("HR_KILL_AT_RENAME_FROM");
  if (!want_to || std::strcmp(last_component(to), want_to) != 0) return;
  if (want_from && std::strcmp(last_component(from), want_from) != 0) return;
  static const char kMsg[] = "kill_on_rename: SIGKILL before the rename\n";
  (void)!::write(2, kMsg, sizeof kMsg - 1);
  ::kill(::getpid(), SIGKILL);
}

template <typename F>
F next(const char* name) {
  return reinterpret_cast<F>(::dlsym(RTLD_NEXT, name));
}

}  // namespace

extern "C" int rename(const char* from, const char* to) {
  kill_if_named(from, to);
  static const auto real = next<int (*)(const char*, const char*)>("rename");
  return real(from, to);
}

extern "C" int renameat(int from_dir, const char* from, int to_dir, const char* to) {
  kill_if_named(from, to);
  static const auto real = next<int (*)(int, const char*, int, const char*)>("renameat");
  return real(from_dir, from, to_dir, to);
}

extern "C" int renameat2(int from_dir, const char* from, int to_dir, const char* to, unsigned flags) {
  kill_if_named(from, to);
  if ((flags & RENAME_EXCHANGE) && std::getenv("HR_NO_RENAME_EXCHANGE")) {
    errno = EINVAL;
    return -1;
  }
  static const auto real = next<int (*)(int, const char*, int, const char*, unsigned)>("renameat2");
  return real(from_dir, from, to_dir, to, flags);
}
