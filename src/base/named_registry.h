// NamedRegistry: a table of plug-ins (backends, runtimes) by name, filled at
// static initialisation by each plug-in's own folder and read afterwards.
// Registration is single-threaded by construction (before main); lookups may
// come from any thread once main() has started. Owns copies of the infos.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "base/errors.h"

namespace simpler {

template <typename Info>
class NamedRegistry {
 public:
  // `kind` names what the registry holds ("backend"), `field` the config
  // field that selects one ("backend").
  NamedRegistry(const char* kind, const char* field) : kind_(kind), field_(field) {}

  // A duplicate name or a missing field is a build defect: it aborts, at
  // start-up, before any user code runs.
  bool add(const Info& info) {
    if (info.name == nullptr || info.description == nullptr || info.create == nullptr || find(info.name) != nullptr) {
      std::fprintf(stderr, "simpler: %s '%s' registered twice or incompletely\n", kind_,
                   info.name != nullptr ? info.name : "(null)");
      std::abort();
    }
    infos_.push_back(info);
    return true;
  }

  const Info* find(std::string_view name) const {
    for (const Info& i : infos_) {
      if (name == i.name) return &i;
    }
    return nullptr;
  }

  std::vector<const Info*> all() const {
    std::vector<const Info*> out;
    for (const Info& i : infos_) out.push_back(&i);
    std::sort(out.begin(), out.end(), [](const Info* a, const Info* b) { return std::string_view(a->name) < b->name; });
    return out;
  }

  // "a, b, c": what this build has, for error messages and `simpler info`.
  std::string names() const {
    std::string s;
    for (const Info* i : all()) s += (s.empty() ? "" : ", ") + std::string(i->name);
    return s;
  }

  Result<const Info*> named(const std::string& name) const {
    if (const Info* i = find(name)) return i;
    return invalid_argument("{} = '{}' is not a {} this build has; built: {}", field_, name, kind_, names());
  }

 private:
  const char* const kind_;
  const char* const field_;
  std::deque<Info> infos_;  // stable addresses: lookups hand out pointers
};

}  // namespace simpler
