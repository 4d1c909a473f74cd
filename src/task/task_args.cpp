#include "simpler/task_args.h"

#include "base/errors.h"

namespace simpler {

TaskArgs& TaskArgs::add_tensor(const TensorView& view, Tag tag) {
  TaskArg a;
  a.kind = TaskArg::Kind::Tensor;
  a.tag = tag;
  a.tensor = view;
  args_.push_back(a);
  return *this;
}

TaskArgs& TaskArgs::add_output(const std::vector<int64_t>& shape, DType dtype) {
  return add_tensor(TensorView::unbound(shape, dtype), Tag::Output);
}

TaskArgs& TaskArgs::add_scalar_u64(uint64_t v) {
  TaskArg a;
  a.kind = TaskArg::Kind::Scalar;
  a.scalar = v;
  args_.push_back(a);
  return *this;
}

TaskArgs& TaskArgs::add_scalar(int64_t v) { return add_scalar_u64(static_cast<uint64_t>(v)); }

TaskArgs& TaskArgs::add_scalar_f64(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return add_scalar_u64(bits);
}

TaskArgs& TaskArgs::add_scalar_f32(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return add_scalar_u64(bits);
}

TaskArgs& TaskArgs::dump() {
  if (args_.empty()) {
    dump_without_argument_ = true;
  } else {
    args_.back().dump = true;
  }
  return *this;
}

Status TaskArgs::validate() const {
  if (args_.size() > kMaxTaskArgs) {
    return invalid_argument("args: {} arguments exceed the limit of {}", args_.size(), kMaxTaskArgs);
  }
  if (dump_without_argument_) return invalid_argument("args: dump() was called before any argument was added");
  for (size_t i = 0; i < args_.size(); ++i) {
    const TaskArg& a = args_[i];
    if (a.kind == TaskArg::Kind::Scalar && a.dump) {
      return invalid_argument("args[{}]: dump() marks a scalar; only tensor arguments are captured", i);
    }
    if (a.kind == TaskArg::Kind::Scalar) continue;
    if (a.kind != TaskArg::Kind::Tensor) return invalid_argument("args[{}]: unknown argument kind", i);
    if (static_cast<size_t>(a.tag) >= static_cast<size_t>(Tag::kCount)) {
      return invalid_argument("args[{}]: tag {} is not a valid Tag", i, static_cast<int>(a.tag));
    }
    if (!a.tensor.buffer().bound() && a.tag != Tag::Output) {
      return invalid_argument("args[{}]: a tensor tagged {} needs a device buffer (only output may be unbound)", i,
                              tag_name(a.tag));
    }
    SIMPLER_RETURN_IF_ERROR(a.tensor.validate(), "args[{}] ({})", i, tag_name(a.tag));
  }
  return Status();
}

}  // namespace simpler
