// TaskArgs: the ordered arguments of a run or a task (tensors with tags, and
// scalars). A value type, built by one thread and then read-only.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "simpler/tensor.h"

namespace simpler {

inline constexpr size_t kMaxTaskArgs = 32;

struct TaskArg {
  enum class Kind : uint8_t { Tensor = 0, Scalar = 1 };
  Kind kind = Kind::Scalar;
  Tag tag = Tag::NoDep;  // tensors only
  TensorView tensor;     // tensors only
  uint64_t scalar = 0;   // scalars only: raw 64 bits
  bool dump = false;     // tensors only: captured under DumpArgs::Partial and Hybrid (TaskArgs::dump)
};

class TaskArgs {
 public:
  TaskArgs& add_tensor(const TensorView& view, Tag tag);
  // A runtime-allocated output of the given shape (Tag::Output, no buffer).
  TaskArgs& add_output(const std::vector<int64_t>& shape, DType dtype);
  TaskArgs& add_scalar(int64_t v);
  TaskArgs& add_scalar_u64(uint64_t v);
  TaskArgs& add_scalar_f64(double v);
  TaskArgs& add_scalar_f32(float v);
  // Marks the argument added last (a tensor) for argument dumps that
  // capture only marked arguments (Partial) or only their bytes (Hybrid).
  TaskArgs& dump();

  size_t size() const { return args_.size(); }
  bool empty() const { return args_.empty(); }
  const TaskArg& operator[](size_t i) const { return args_[i]; }
  TaskArg& operator[](size_t i) { return args_[i]; }
  const std::vector<TaskArg>& all() const { return args_; }
  void clear() { args_.clear(); }

  // Each argument well-formed: at most kMaxTaskArgs, tensors valid and inside
  // their buffers (unless an unbound Output). Names the offending index.
  Status validate() const;

 private:
  std::vector<TaskArg> args_;
  bool dump_without_argument_ = false;  // dump() before any add_: refused by validate()
};

// One parameter of a callable's signature: a tensor with its direction, or a
// scalar. Run arguments are checked against it at submit.
struct Param {
  TaskArg::Kind kind = TaskArg::Kind::Scalar;
  Tag tag = Tag::NoDep;
  // Tensors only, checked at submit when set: the argument's dtype, and its
  // rank and extents (-1: any extent in that dimension).
  std::optional<DType> dtype{};
  std::optional<std::vector<int64_t>> shape{};

  static Param input() { return {TaskArg::Kind::Tensor, Tag::Input}; }
  static Param output() { return {TaskArg::Kind::Tensor, Tag::OutputExisting}; }
  static Param inout() { return {TaskArg::Kind::Tensor, Tag::InOut}; }
  static Param scalar() { return {TaskArg::Kind::Scalar, Tag::NoDep}; }

  // This parameter, its tensor required to be of dtype `t`.
  Param with_dtype(DType t) const {
    Param p = *this;
    p.dtype = t;
    return p;
  }
  // This parameter, its tensor required to have `extents.size()` dimensions
  // of these extents (-1: any).
  Param with_shape(std::vector<int64_t> extents) const {
    Param p = *this;
    p.shape = std::move(extents);
    return p;
  }
  // This parameter, its tensor required to have `rank` dimensions.
  Param with_rank(int rank) const { return with_shape(std::vector<int64_t>(static_cast<size_t>(rank), -1)); }
};

// TaskArgsView: the arguments of a sub function as its sub worker decoded
// them. Every tensor lies in the node's shared heap (checked before the call),
// so its buffer address is a host address in the sub worker process.
// Read-only; valid for the duration of the call.
class TaskArgsView {
 public:
  explicit TaskArgsView(const TaskArgs& args) : args_(&args) {}
  size_t size() const { return args_->size(); }
  const TaskArg& operator[](size_t i) const { return (*args_)[i]; }
  // The host address of tensor argument i's first element.
  template <typename T>
  T* data(size_t i) const {
    const TensorView& t = (*args_)[i].tensor;
    return reinterpret_cast<T*>(t.buffer().addr + static_cast<uint64_t>(t.offset()) * dtype_size(t.dtype()));
  }
  int64_t scalar(size_t i) const { return static_cast<int64_t>((*args_)[i].scalar); }

 private:
  const TaskArgs* args_;
};

}  // namespace simpler
