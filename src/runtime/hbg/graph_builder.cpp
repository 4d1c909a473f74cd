#include "runtime/hbg/graph_builder.h"

#include "base/errors.h"

namespace simpler::hbg {

GraphBuilder::GraphBuilder(HbgRuntime& rt, Slot& slot, const ChipCallable& callable)
    : RunBuilder(callable, slot.api, rt.memory_, slot.allocations, rt.capacity_.tasks), rt_(rt), s_(slot) {}

Status GraphBuilder::reserve(uint32_t, uint32_t tensors) {
  if (s_.desc_count + tensors > rt_.capacity_.descriptors) {
    return resource_exhausted("graph capacity: the run has more than {} tensor arguments", rt_.capacity_.descriptors);
  }
  return Status();
}

void GraphBuilder::add_edge(uint32_t from, uint32_t to) {
  if (from == to || s_.pred_mark[from] == to + 1) return;
  s_.pred_mark[from] = to + 1;
  s_.edges.emplace_back(from, to);
  trace_edge(from, to);
}

void GraphBuilder::add_dependencies(uint32_t task, const TensorView& view, Tag tag, uint64_t base) {
  const uint64_t shift = view.buffer().addr - base;
  s_.accesses.add(base, view, shift + view.first_byte(), shift + view.end_byte(), task, tag_writes(tag),
                  [&](uint32_t earlier) { add_edge(earlier, task); });
}

void GraphBuilder::place(const CheckedTask& t) {
  GraphTask& task = s_.tasks[t.id];
  task.kind = t.kind;
  task.id = t.id;
  task.blocks = t.blocks;
  task.nargs = static_cast<uint8_t>(t.args->size());
  for (uint32_t i = 0; i < 3; ++i) {
    task.func_id[i] = t.func_id[i];
    task.fn[i] = t.fn[i];
    task.name[i] = t.name[i];
  }
  write_kernel_args(t, task.args, s_.descriptors, s_.desc_count, [&](size_t i, const TensorView& v, Tag tag) {
    if (tag != Tag::NoDep && !t.local[i]) add_dependencies(t.id, v, tag, t.bases[i]);
  });
  for (uint32_t k = 0; k < t.dep_count; ++k) add_edge(t.deps[k], t.id);
  for (uint32_t u = 0; u < t.use_count; ++u) s_.use_pairs.emplace_back(t.id, t.uses[u]);
  task.guards_begin = static_cast<uint32_t>(s_.guards.size());
  if (memory().guarded()) collect_guard_checks(t, s_.guards);
  task.guards_count = static_cast<uint32_t>(s_.guards.size()) - task.guards_begin;
  s_.task_count = t.id + 1;
}

}  // namespace simpler::hbg
