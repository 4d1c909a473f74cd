#include <simpler/simpler.h>

#include <cstdio>
#include <vector>

using namespace simpler;

int main() {
  KernelLibrary k;
  if (Status s = k.add_file(0, CoreType::AIV, KERNEL_PATH); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    return 1;
  }
  Result<Orchestration> orch = load_orchestration(ORCHESTRATION_PATH);
  if (!orch.ok()) {
    std::fprintf(stderr, "%s\n", orch.status().to_string().c_str());
    return 1;
  }
  Worker w(Level::Chip);
  auto h = w.register_callable(ChipCallable("scale", *orch, k, {Param::inout(), Param::scalar()}));
  if (!h.ok() || !w.init().ok()) return 1;
  std::vector<float> x(256, 2.0f);
  auto d = w.malloc(x.size() * 4);
  if (!d.ok() || !w.copy_to(*d, x.data(), x.size() * 4).ok()) return 1;
  TaskArgs args;
  args.add_tensor(d->view({256}, DType::F32), Tag::InOut).add_scalar_f32(1.5f);
  if (Status s = w.run(*h, args); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    return 1;
  }
  if (!w.copy_from(x.data(), *d, x.size() * 4).ok()) return 1;
  for (float v : x) {
    if (v != 3.0f) {
      std::fprintf(stderr, "got %f, want 3\n", v);
      return 1;
    }
  }
  std::puts("consumer: ok");
  return w.close().ok() ? 0 : 1;
}
