// Whether a file changed, learned from inotify rather than by looking at the
// file: for readers on the gRPC handler path, which must not touch the file
// system on every call for something that changes rarely (the kubelet
// checkpoint, the pod-resources socket).
#pragma once

#include <filesystem>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace efa::plugin {

class FileChangeWatch {
 public:
  // Watches `file` through its directory, which need not exist yet.
  explicit FileChangeWatch(std::filesystem::path file);
  ~FileChangeWatch();
  FileChangeWatch(const FileChangeWatch&) = delete;
  FileChangeWatch& operator=(const FileChangeWatch&) = delete;

  // True when the file may have changed since the previous call: it was
  // created, written, renamed or removed, its directory appeared, events
  // were lost, or nothing on its path can be watched (no inotify instance,
  // a watch refused: then every call is true, and the next one asks for
  // them again). The first call is true. Costs a non-blocking read of the inotify
  // descriptor, also while the directory is absent. Thread-safe.
  bool Changed();

  const std::filesystem::path& file() const { return file_; }

 private:
  const std::filesystem::path file_;
  const std::string name_;  // file_'s name in its directory
  absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_) = -1;
  int wd_ ABSL_GUARDED_BY(mu_) = -1;           // the file's directory
  int ancestor_wd_ ABSL_GUARDED_BY(mu_) = -1;  // its nearest ancestor, while it is absent
  bool first_ ABSL_GUARDED_BY(mu_) = true;
};

}  // namespace efa::plugin
