// The `simpler._simpler` extension: the public C++ API (include/simpler/)
// bound for Python, with numpy arrays for host data. Imported once per
// interpreter; every function is called with the GIL held and releases it
// around each call that may block (init, close, submit, run, wait, memory
// calls). Python callables handed to the runtime (orchestrations, sub
// functions) are called back with the GIL taken on whichever thread or forked
// process runs them; a Python exception there fails that run, never the process.
#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <simpler/simpler.h>
#include <simpler/version.h>

#include "common.h"

namespace py = pybind11;

namespace simpler::python {
namespace {

// ---------------------------------------------------------------- errors

PyObject* g_error = nullptr;              // simpler.Error(RuntimeError): .code, .message
PyObject* g_invalid_argument = nullptr;   // simpler.InvalidArgumentError(Error, ValueError)
PyObject* g_not_found = nullptr;          // simpler.NotFoundError(Error, LookupError)
PyObject* g_deadline_exceeded = nullptr;  // simpler.DeadlineExceededError(Error, TimeoutError)
PyObject* g_run_error = nullptr;          // simpler.RunError(Error): a run that ended with an error

[[noreturn]] void raise_with(PyObject* cls, const Status& s, const std::string& context) {
  // The context names the call unless the message already starts with it.
  const bool named = context.empty() || s.message().rfind(context + ":", 0) == 0;
  const std::string text = named ? s.message() : context + ": " + s.message();
  py::object exc = py::reinterpret_steal<py::object>(PyObject_CallFunction(cls, "s", text.c_str()));
  if (!exc) throw py::error_already_set();
  exc.attr("code") = py::cast(s.code());
  exc.attr("message") = py::str(s.message());
  PyErr_SetObject(cls, exc.ptr());
  throw py::error_already_set();
}

// A refused call: the class follows the code (ValueError for a refused
// argument), the text is the Status's, which names the field.
[[noreturn]] void raise_status(const Status& s, const std::string& context = {}) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
      raise_with(g_invalid_argument, s, context);
    case StatusCode::kNotFound:
      raise_with(g_not_found, s, context);
    case StatusCode::kDeadlineExceeded:
      raise_with(g_deadline_exceeded, s, context);
    default:
      raise_with(g_error, s, context);
  }
}

void check(const Status& s, const std::string& context = {}) {
  if (!s.ok()) raise_status(s, context);
}

template <typename T>
T take(Result<T> r, const std::string& context = {}) {
  if (!r.ok()) raise_status(r.status(), context);
  return std::move(r).value();
}

[[noreturn]] void type_error(const std::string& text) { throw py::type_error(text); }
[[noreturn]] void value_error(const std::string& text) { throw py::value_error(text); }

// The text a Python exception becomes when it fails a run: its type, its
// message (`str(exc)` alone would not say which exception it was) and
// pybind11's "At:" list of the Python frames it came through.
std::string python_error_text(py::error_already_set& e, const char* where) {
  return std::string(where) + " raised " + e.what();
}

bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// ---------------------------------------------------------------- the GIL on simpler's threads

// Takes the GIL for a scope on any thread: one Python did not start (a
// scheduler thread, a sub worker's thread in its forked child) or a Python
// thread inside a call that released it. CPython's PyGILState calls, not
// pybind11's gil_scoped_acquire, which also looks up its internals and a TLS
// key of its own on every acquire (a third of a no-op sub function's cost in
// the child, by perf). A thread's Python state is kept from its first call to
// the thread's end: CPython would make and destroy one on every call on a
// thread it did not start, microseconds per run.
class GilOnNativeThread {
 public:
  GilOnNativeThread() : state_(PyGILState_Ensure()) {
    thread_local bool kept = false;
    if (!kept) {
      // One Ensure never released: the state's count stays above zero.
      (void)PyGILState_Ensure();
      kept = true;
    }
  }
  GilOnNativeThread(const GilOnNativeThread&) = delete;
  GilOnNativeThread& operator=(const GilOnNativeThread&) = delete;
  ~GilOnNativeThread() { PyGILState_Release(state_); }

 private:
  PyGILState_STATE state_;
};

// ---------------------------------------------------------------- Python references held by C++

// A Python object kept alive by C++ state (a std::function inside a callable
// or a registered sub function) that may be destroyed on any thread: the GIL
// is taken to drop it, unless the interpreter is gone, when it is leaked.
class PyRef {
 public:
  explicit PyRef(py::object o) : o_(std::move(o)) {}
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  ~PyRef() {
    if (!Py_IsInitialized() || interpreter_finalizing()) {
      (void)o_.release();
      return;
    }
    // The same GIL calls as GilOnNativeThread, so a thread never holds two Python states.
    const PyGILState_STATE gil = PyGILState_Ensure();
    o_ = py::object();
    PyGILState_Release(gil);
  }
  const py::object& get() const { return o_; }

 private:
  py::object o_;
};

// ---------------------------------------------------------------- dtypes

DType dtype_from_numpy(const py::dtype& d, const char* field) {
  const char kind = d.kind();
  const auto size = d.itemsize();
  if (kind == 'f' && size == 4) return DType::F32;
  if (kind == 'f' && size == 2) return DType::F16;
  if (kind == 'f' && size == 8) return DType::F64;
  if (kind == 'i' && size == 1) return DType::I8;
  if (kind == 'i' && size == 2) return DType::I16;
  if (kind == 'i' && size == 4) return DType::I32;
  if (kind == 'i' && size == 8) return DType::I64;
  if (kind == 'u' && size == 1) return DType::U8;
  if (kind == 'u' && size == 4) return DType::U32;
  if (kind == 'u' && size == 8) return DType::U64;
  type_error(std::string(field) + ": numpy dtype " + py::str(py::handle(d)).cast<std::string>() +
             " has no simpler.DType");
}

// bf16 has no numpy type: its elements are shown as their raw uint16 bits.
py::dtype numpy_dtype(DType t) {
  switch (t) {
    case DType::F32:
      return py::dtype("float32");
    case DType::F16:
      return py::dtype("float16");
    case DType::BF16:
      return py::dtype("uint16");
    case DType::I8:
      return py::dtype("int8");
    case DType::I16:
      return py::dtype("int16");
    case DType::I32:
      return py::dtype("int32");
    case DType::I64:
      return py::dtype("int64");
    case DType::U8:
      return py::dtype("uint8");
    case DType::U32:
      return py::dtype("uint32");
    case DType::U64:
      return py::dtype("uint64");
    case DType::F64:
      return py::dtype("float64");
    default:
      break;
  }
  value_error("dtype " + std::to_string(static_cast<int>(t)) + " is not a simpler.DType");
}

// A simpler.DType, a numpy dtype (or anything np.dtype() takes), or "bf16".
DType to_dtype(const py::handle& h, const char* field) {
  if (py::isinstance<DType>(h)) return h.cast<DType>();
  if (py::isinstance<py::str>(h)) {
    const std::string s = h.cast<std::string>();
    if (s == "bf16" || s == "bfloat16") return DType::BF16;
  }
  py::dtype d;
  try {
    d = py::dtype::from_args(py::reinterpret_borrow<py::object>(h));
  } catch (py::error_already_set&) {
    type_error(std::string(field) + ": expected a simpler.DType or a numpy dtype, got " +
               py::str(py::type::handle_of(h)).cast<std::string>());
  }
  return dtype_from_numpy(d, field);
}

std::vector<int64_t> to_shape(const py::handle& h, const char* field) {
  std::vector<int64_t> shape;
  if (py::isinstance<py::int_>(h)) {
    shape.push_back(h.cast<int64_t>());
  } else if (py::isinstance<py::sequence>(h) && !py::isinstance<py::str>(h)) {
    for (const py::handle item : h) {
      if (!py::isinstance<py::int_>(item)) type_error(std::string(field) + ": every extent must be an int");
      shape.push_back(item.cast<int64_t>());
    }
  } else {
    type_error(std::string(field) + ": expected an int or a sequence of ints");
  }
  if (shape.size() > static_cast<size_t>(kMaxDims)) {
    value_error(std::string(field) + ": " + std::to_string(shape.size()) + " dimensions, at most " +
                std::to_string(kMaxDims));
  }
  for (int64_t e : shape) {
    if (e < 0) value_error(std::string(field) + ": negative extent " + std::to_string(e));
  }
  return shape;
}

// ---------------------------------------------------------------- shared-heap arrays

// The base object of a numpy array over a shared-heap allocation
// (Worker.shared_array): it names the allocation, so TaskArgs can turn the
// array (or any view of it) back into a TensorView.
struct SharedAllocation {
  DeviceBuffer buffer;
};

// The allocation `arr` lies in, found through its chain of bases.
std::optional<DeviceBuffer> shared_buffer_of(const py::array& arr) {
  py::handle base = arr.base();
  for (int depth = 0; base && !base.is_none() && depth < 64; ++depth) {
    if (py::isinstance<SharedAllocation>(base)) return base.cast<const SharedAllocation&>().buffer;
    if (!py::hasattr(base, "base")) break;
    base = base.attr("base");
  }
  return std::nullopt;
}

py::array shared_array_over(const DeviceBuffer& buffer, const std::vector<int64_t>& shape, DType dtype) {
  py::object owner = py::cast(SharedAllocation{buffer});
  return py::array(numpy_dtype(dtype), shape, {}, reinterpret_cast<void*>(buffer.addr), owner);
}

TensorView view_of_array(const py::array& arr, const char* field) {
  const std::optional<DeviceBuffer> buffer = shared_buffer_of(arr);
  if (!buffer) {
    type_error(std::string(field) +
               ": a numpy array must lie in the worker's shared heap (Worker.shared_array); pass device memory as "
               "DeviceBuffer.view(shape, dtype)");
  }
  const DType dtype = dtype_from_numpy(arr.dtype(), field);
  const auto item = static_cast<int64_t>(arr.itemsize());
  if (arr.ndim() > kMaxDims)
    value_error(std::string(field) + ": more than " + std::to_string(kMaxDims) + " dimensions");
  const auto delta = static_cast<int64_t>(reinterpret_cast<uintptr_t>(arr.data()) - buffer->addr);
  if (delta < 0 || delta % item != 0) value_error(std::string(field) + ": the array's start is not element-aligned");
  int64_t shape[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};
  for (py::ssize_t d = 0; d < arr.ndim(); ++d) {
    shape[d] = arr.shape(d);
    if (arr.strides(d) < 0 || arr.strides(d) % item != 0) {
      value_error(std::string(field) + ": dimension " + std::to_string(d) +
                  " has a negative or unaligned stride; make a copy in the shared heap first");
    }
    stride[d] = arr.strides(d) / item;
  }
  TensorView v = TensorView::from_parts(*buffer, dtype, static_cast<int>(arr.ndim()), shape, stride, delta / item);
  check(v.validate(), field);
  return v;
}

// A tensor argument as numpy sees it: an array over the host address of the
// view's first element, no copy; `base` keeps whatever owns the memory.
py::array array_over_view(const TensorView& t, py::object base) {
  const py::dtype dt = numpy_dtype(t.dtype());
  const auto item = static_cast<py::ssize_t>(dtype_size(t.dtype()));
  std::vector<py::ssize_t> shape, strides;
  for (int d = 0; d < t.ndim(); ++d) {
    shape.push_back(t.shape(d));
    strides.push_back(t.stride(d) * item);
  }
  auto* data = reinterpret_cast<void*>(t.buffer().addr + static_cast<uint64_t>(t.offset()) * dtype_size(t.dtype()));
  return py::array(dt, shape, strides, data, base);
}

// ---------------------------------------------------------------- TaskArgs

struct Output {  // simpler.Output(shape, dtype): a runtime-allocated Tag.Output argument
  std::vector<int64_t> shape;
  DType dtype;
};

void add_tensor(TaskArgs& args, const py::handle& tensor, Tag tag, const std::string& field) {
  if (py::isinstance<TensorView>(tensor)) {
    args.add_tensor(tensor.cast<const TensorView&>(), tag);
  } else if (py::isinstance<py::array>(tensor)) {
    args.add_tensor(view_of_array(py::reinterpret_borrow<py::array>(tensor), field.c_str()), tag);
  } else {
    type_error(field + ": expected a TensorView or a shared-heap numpy array, got " +
               py::str(py::type::handle_of(tensor)).cast<std::string>());
  }
}

// A scalar by its Python type: numpy scalars keep their width (np.float32 ->
// f32 bits, np.uint64 -> u64), a Python float is f64, a Python int is i64.
void add_scalar(TaskArgs& args, const py::handle& v, const std::string& field) {
  if (py::isinstance<py::bool_>(v)) {
    args.add_scalar(v.cast<bool>() ? 1 : 0);
    return;
  }
  // numpy's abstract scalar types, looked up once (the module lives as long as the process).
  static PyObject* const np_floating = py::object(py::module_::import("numpy").attr("floating")).release().ptr();
  static PyObject* const np_integer = py::object(py::module_::import("numpy").attr("integer")).release().ptr();
  if (PyObject_IsInstance(v.ptr(), np_floating) == 1 || PyObject_IsInstance(v.ptr(), np_integer) == 1) {
    const DType t = dtype_from_numpy(v.attr("dtype").cast<py::dtype>(), field.c_str());
    if (t == DType::F32) {
      args.add_scalar_f32(v.cast<float>());
    } else if (t == DType::F64 || t == DType::F16) {
      args.add_scalar_f64(v.cast<double>());
    } else if (t == DType::U64 || t == DType::U32 || t == DType::U8) {
      args.add_scalar_u64(v.cast<uint64_t>());
    } else {
      args.add_scalar(v.cast<int64_t>());
    }
    return;
  }
  if (py::isinstance<py::float_>(v)) {
    args.add_scalar_f64(v.cast<double>());
    return;
  }
  if (py::isinstance<py::int_>(v)) {
    try {
      args.add_scalar(v.cast<int64_t>());
    } catch (py::cast_error&) {
      try {
        args.add_scalar_u64(v.cast<uint64_t>());
      } catch (py::cast_error&) {
        value_error(field + ": the int does not fit in 64 bits");
      }
    }
    return;
  }
  type_error(field +
             ": expected (tensor, Tag), simpler.Output(shape, dtype) or a scalar (int, float, numpy scalar), got " +
             py::str(py::type::handle_of(v)).cast<std::string>());
}

void add_item(TaskArgs& args, const py::handle& item, size_t index) {
  const std::string field = "TaskArgs item " + std::to_string(index);
  if (args.size() >= kMaxTaskArgs) {
    value_error(field + ": more than " + std::to_string(kMaxTaskArgs) + " arguments");
  }
  if (py::isinstance<py::tuple>(item)) {
    const auto t = py::reinterpret_borrow<py::tuple>(item);
    if (t.size() != 2 || !py::isinstance<Tag>(t[1])) type_error(field + ": a tensor is given as (tensor, simpler.Tag)");
    add_tensor(args, t[0], t[1].cast<Tag>(), field);
  } else if (py::isinstance<Output>(item)) {
    const Output& o = item.cast<const Output&>();
    args.add_output(o.shape, o.dtype);
  } else {
    add_scalar(args, item, field);
  }
}

TaskArgs make_args(const py::args& items) {
  TaskArgs args;
  size_t i = 0;
  for (const py::handle item : items) add_item(args, item, i++);
  return args;
}

// A TaskArgs argument: a TaskArgs, or a list/tuple of items, or None (empty).
TaskArgs to_args(const py::handle& h, const char* field) {
  if (h.is_none()) return TaskArgs{};
  if (py::isinstance<TaskArgs>(h)) return h.cast<TaskArgs>();
  if (py::isinstance<py::list>(h)) {
    TaskArgs args;
    size_t i = 0;
    for (const py::handle item : h) add_item(args, item, i++);
    return args;
  }
  type_error(std::string(field) + ": expected a simpler.TaskArgs or a list of arguments");
}

// ---------------------------------------------------------------- orchestrators

// The orchestrator handed to a Python orchestration: valid only during the
// call (the C++ one is not kept); afterwards every method raises.
template <typename O>
struct Borrowed {
  O* o = nullptr;
  O& get() const {
    if (o == nullptr) {
      raise_status(
          Status(StatusCode::kFailedPrecondition,
                 "this orchestrator was used after its orchestration returned; it is valid only during the call"));
    }
    return *o;
  }
};
using PyChipOrchestrator = Borrowed<ChipOrchestrator>;
using PyNodeOrchestrator = Borrowed<Orchestrator>;

// `with o.scope():` — begin on enter, end on exit, each through the borrowed
// orchestrator, so a scope kept past its orchestration's call raises.
struct ScopeGuard {
  py::object orchestrator;  // a PyChipOrchestrator or a PyNodeOrchestrator
  bool manual = false;

  ChipOrchestrator* chip() const {
    return py::isinstance<PyChipOrchestrator>(orchestrator) ? &orchestrator.cast<PyChipOrchestrator&>().get() : nullptr;
  }
  Orchestrator& node() const { return orchestrator.cast<PyNodeOrchestrator&>().get(); }
};

py::list outputs_of(const TaskRef& ref) {
  py::list out;
  for (const TensorView& v : ref.outputs) out.append(py::cast(v));
  return out;
}

// Calls `fn(o, *extra)` with a borrowed orchestrator object that is
// invalidated after the call. A thread's calls share one such object while no
// orchestration keeps it (and none is running on the thread already, for an
// orchestration that runs another worker's): making and registering a
// pybind11 instance per call was a fifth of a one-task run's orchestration
// cost, by perf. One that is kept stays invalid; the next call makes another.
template <typename O, typename... Extra>
Status call_orchestration(PyObject* fn, O& o, const char* where, Extra&&... extra) {
  GilOnNativeThread gil;
  // The cache's reference is never dropped while it is reused: a thread may
  // end when the GIL cannot be taken.
  thread_local PyObject* cached = nullptr;
  thread_local Borrowed<O>* cached_borrowed = nullptr;
  Status result;
  try {
    py::object holder;
    Borrowed<O>* borrowed = nullptr;
    if (cached != nullptr && cached_borrowed->o == nullptr) {
      holder = py::reinterpret_borrow<py::object>(cached);
      borrowed = cached_borrowed;
    } else {
      holder = py::cast(Borrowed<O>{});
      borrowed = &holder.cast<Borrowed<O>&>();
      if (cached == nullptr) {
        cached = holder.inc_ref().ptr();
        cached_borrowed = borrowed;
      }
    }
    borrowed->o = &o;
    try {
      // Its return value is ignored (a lambda returns what its last call did): raising fails the run.
      if constexpr (sizeof...(Extra) == 0) {
        PyObject* r = PyObject_CallOneArg(fn, holder.ptr());
        if (r == nullptr) throw py::error_already_set();
        Py_DECREF(r);
      } else {
        (void)py::handle(fn)(holder, std::forward<Extra>(extra)...);
      }
    } catch (...) {
      borrowed->o = nullptr;
      throw;
    }
    borrowed->o = nullptr;
  } catch (py::error_already_set& e) {
    result = Status(StatusCode::kUserCodeFailed, python_error_text(e, where));
  } catch (const std::exception& e) {
    result = Status(StatusCode::kUserCodeFailed, std::string(where) + " raised " + e.what());
  }
  // Someone kept it (held beyond the cache's own reference): it stays theirs, invalid.
  if (cached != nullptr && Py_REFCNT(cached) != 1) {
    Py_DECREF(cached);
    cached = nullptr;
    cached_borrowed = nullptr;
  }
  return result;
}

OrchestrationFn chip_orchestration(py::object fn) {
  auto ref = std::make_shared<PyRef>(std::move(fn));
  return [ref](ChipOrchestrator& o, const TaskArgs& run_args) -> Status {
    return call_orchestration(ref->get().ptr(), o, "the orchestration", run_args);
  };
}

NodeOrchestrationFn node_orchestration(py::object fn) {
  auto ref = std::make_shared<PyRef>(std::move(fn));
  return [ref](Orchestrator& o, const TaskArgs& run_args) -> Status {
    return call_orchestration(ref->get().ptr(), o, "the node callable's orchestration", run_args);
  };
}

// A sub function: its tensors become numpy arrays over the shared heap (no
// copy, valid for the duration of the call), its scalars ints.
SubFunction sub_function(py::object fn) {
  auto ref = std::make_shared<PyRef>(std::move(fn));
  return [ref](const TaskArgsView& a) -> Status {
    GilOnNativeThread gil;
    try {
      py::list items(a.size());
      for (size_t i = 0; i < a.size(); ++i) {
        py::object item;
        if (a[i].kind == TaskArg::Kind::Tensor) {
          // The heap outlives the call; the capsule only marks the arrays as
          // views (no copy, no owner). One per process, made at its first use.
          static int view_marker = 0;
          static const PyObject* const no_owner = py::capsule(&view_marker, [](void*) {}).release().ptr();
          item = array_over_view(a[i].tensor, py::reinterpret_borrow<py::object>(const_cast<PyObject*>(no_owner)));
        } else {
          item = py::int_(a.scalar(i));
        }
        PyList_SET_ITEM(items.ptr(), static_cast<py::ssize_t>(i), item.release().ptr());
      }
      PyObject* r = PyObject_CallOneArg(ref->get().ptr(), items.ptr());
      if (r == nullptr) throw py::error_already_set();
      Py_DECREF(r);
      return Status();
    } catch (py::error_already_set& e) {
      return Status(StatusCode::kUserCodeFailed, python_error_text(e, "the sub function"));
    } catch (const std::exception& e) {
      return Status(StatusCode::kUserCodeFailed, std::string("the sub function raised ") + e.what());
    }
  };
}

// ---------------------------------------------------------------- callables

// What Python holds for a ChipCallable: the C++ value (copied into the worker
// at register) plus nothing else; the Python orchestration lives in its
// OrchestrationFn through a PyRef.
struct PyKernelLibrary {
  KernelLibrary lib;
};

std::vector<Param> to_signature(const py::handle& h) {
  std::vector<Param> sig;
  if (h.is_none()) return sig;
  size_t i = 0;
  for (const py::handle p : h) {
    const std::string field = "signature[" + std::to_string(i++) + "]";
    if (py::isinstance<Param>(p)) {
      sig.push_back(p.cast<Param>());
    } else if (py::isinstance<py::str>(p)) {
      const std::string s = p.cast<std::string>();
      if (s == "in" || s == "input") {
        sig.push_back(Param::input());
      } else if (s == "out" || s == "output") {
        sig.push_back(Param::output());
      } else if (s == "inout") {
        sig.push_back(Param::inout());
      } else if (s == "scalar") {
        sig.push_back(Param::scalar());
      } else {
        value_error(field + ": '" + s + "' is not one of 'in', 'out', 'inout', 'scalar'");
      }
    } else {
      type_error(field + ": expected a simpler.Param or one of 'in', 'out', 'inout', 'scalar'");
    }
  }
  return sig;
}

// ---------------------------------------------------------------- Worker

uint64_t to_u64(const py::handle& v, const std::string& field, uint64_t max) {
  if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v)) {
    type_error(field + " must be an int, not " + py::str(py::type::handle_of(v)).cast<std::string>());
  }
  const py::int_ i = py::reinterpret_borrow<py::int_>(v);
  if (i < py::int_(0) || i > py::int_(max)) {
    value_error(field + " = " + py::str(py::handle(i)).cast<std::string>() + " is out of range [0, " +
                std::to_string(max) + "]");
  }
  return i.cast<uint64_t>();
}

std::chrono::milliseconds to_ms(const py::handle& v, const std::string& field) {
  double seconds = 0;
  if (py::isinstance<py::float_>(v) || (py::isinstance<py::int_>(v) && !py::isinstance<py::bool_>(v))) {
    seconds = v.cast<double>();
  } else if (py::hasattr(v, "total_seconds")) {
    seconds = v.attr("total_seconds")().cast<double>();
  } else {
    type_error(field + " must be seconds (int or float) or a datetime.timedelta");
  }
  if (!(seconds >= 0) || seconds > 1e9) value_error(field + " must be between 0 and 1e9 seconds");
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0 + 0.5));
}

Geometry to_geometry(const py::handle& v) {
  if (py::isinstance<Geometry>(v)) return v.cast<Geometry>();
  if (py::isinstance<py::str>(v)) return take(Geometry::by_name(v.cast<std::string>()), "Worker: geometry");
  type_error("Worker: geometry must be a preset name ('small', 'a2a3', 'a5') or a simpler.Geometry");
}

// None is no diagnostics.
CallConfig to_call(const py::handle& v, const std::string& field) {
  if (v.is_none()) return CallConfig{};
  if (!py::isinstance<CallConfig>(v)) type_error(field + " must be a simpler.CallConfig or None");
  return v.cast<CallConfig>();
}

DumpArgs to_dump_args(const py::handle& v) {
  if (py::isinstance<DumpArgs>(v)) return v.cast<DumpArgs>();
  if (py::isinstance<py::str>(v)) {
    const std::string name = v.cast<std::string>();
    if (name == "off") return DumpArgs::Off;
    if (name == "partial") return DumpArgs::Partial;
    if (name == "hybrid") return DumpArgs::Hybrid;
    if (name == "full") return DumpArgs::Full;
    value_error("CallConfig: dump_args = '" + name + "' is not 'off', 'partial', 'hybrid' or 'full'");
  }
  type_error("CallConfig: dump_args must be a simpler.DumpArgs or one of 'off', 'partial', 'hybrid', 'full'");
}

WorkerConfig to_config(const py::kwargs& kw) {
  WorkerConfig c;
  for (const auto& [key, value] : kw) {
    const std::string k = key.cast<std::string>();
    if (k == "runtime" || k == "backend") {
      if (!py::isinstance<py::str>(value)) type_error("Worker: " + k + " must be a str");
      (k == "runtime" ? c.runtime : c.backend) = value.cast<std::string>();
    } else if (k == "geometry") {
      c.geometry = to_geometry(value);
    } else if (k == "chips") {
      c.chips = static_cast<uint32_t>(to_u64(value, "Worker: " + k, UINT32_MAX));
    } else if (k == "sub_workers") {
      c.sub_workers = static_cast<uint32_t>(to_u64(value, "Worker: " + k, UINT32_MAX));
    } else if (k == "pipeline_depth") {
      c.pipeline_depth = static_cast<uint32_t>(to_u64(value, "Worker: " + k, UINT32_MAX));
    } else if (k == "launch_depth") {
      c.launch_depth = static_cast<uint32_t>(to_u64(value, "Worker: " + k, UINT32_MAX));
    } else if (k == "device_memory_bytes") {
      c.device_memory_bytes = to_u64(value, "Worker: " + k, UINT64_MAX);
    } else if (k == "max_tasks_per_run") {
      c.max_tasks_per_run = static_cast<uint32_t>(to_u64(value, "Worker: " + k, UINT32_MAX));
    } else if (k == "shared_heap_bytes") {
      c.shared_heap_bytes = to_u64(value, "Worker: " + k, UINT64_MAX);
    } else if (k == "run_timeout") {
      c.run_timeout = to_ms(value, "Worker: " + k);
    } else if (k == "close_timeout") {
      c.close_timeout = to_ms(value, "Worker: " + k);
    } else if (k == "guard_device_memory") {
      if (value.is_none()) {
        c.guard_device_memory.reset();
      } else if (py::isinstance<py::bool_>(value)) {
        c.guard_device_memory = value.cast<bool>();
      } else {
        type_error("Worker: guard_device_memory must be a bool or None");
      }
    } else if (k == "runtime_env") {
      if (!py::isinstance<RuntimeEnv>(value)) type_error("Worker: runtime_env must be a simpler.RuntimeEnv");
      c.runtime_env = value.cast<RuntimeEnv>();
    } else if (k == "call") {
      c.call = to_call(value, "Worker: call");
    } else {
      type_error("Worker: unknown keyword argument '" + k + "'");
    }
  }
  return c;
}

Level to_level(const py::handle& v) {
  if (py::isinstance<py::int_>(v) && !py::isinstance<py::bool_>(v)) {
    const int l = v.cast<int>();
    if (l == 2) return Level::Chip;
    if (l == 3) return Level::Node;
    if (l == 4) return Level::Network;
    value_error("Worker: level = " + std::to_string(l) + " is not 2 (chip), 3 (node) or 4 (network)");
  }
  type_error("Worker: level must be 2, 3 or 4");
}

struct PyWorker {
  std::unique_ptr<Worker> w;

  Worker& get() {
    if (!w) {
      raise_status(Status(StatusCode::kFailedPrecondition,
                          "this Worker was handed to add_next_level_worker and belongs to its network worker now"));
    }
    return *w;
  }
  ~PyWorker() {
    // Closing drains runs whose orchestration may need the GIL (on a device thread).
    py::gil_scoped_release release;
    w.reset();
  }
};

DeviceBuffer to_buffer(const py::handle& h, const char* field) {
  if (py::isinstance<DeviceBuffer>(h)) return h.cast<DeviceBuffer>();
  if (py::isinstance<py::array>(h)) {
    const auto arr = py::reinterpret_borrow<py::array>(h);
    if (auto b = shared_buffer_of(arr); b && reinterpret_cast<uintptr_t>(arr.data()) == b->addr) return *b;
    type_error(std::string(field) + ": this numpy array is not the start of a shared-heap allocation");
  }
  type_error(std::string(field) + ": expected a DeviceBuffer or an array from Worker.shared_array");
}

// RunHandle.wait(timeout): the GIL is released while waiting, in slices, so a
// signal (Ctrl-C) reaches Python between them; the run goes on regardless.
constexpr auto kWaitSlice = std::chrono::milliseconds(50);

void raise_run_error(const RunHandle& h, const Status& s) {
  raise_with(g_run_error, s, "run " + std::to_string(h.run_id()));
}

void wait_handle(const RunHandle& h, std::optional<double> timeout) {
  if (timeout && !(*timeout >= 0)) value_error("wait: timeout must be >= 0 seconds or None");
  const auto start = std::chrono::steady_clock::now();
  const auto limit = timeout
                         ? std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(*timeout))
                         : std::chrono::nanoseconds::max();
  for (;;) {
    const auto elapsed = std::chrono::steady_clock::now() - start;
    const auto left = limit == std::chrono::nanoseconds::max() ? limit : limit - elapsed;
    if (!h.done()) {
      py::gil_scoped_release release;
      (void)h.wait_for(std::min<std::chrono::nanoseconds>(left, kWaitSlice));
    }
    if (h.done()) {
      const Status s = h.result();
      if (!s.ok()) raise_run_error(h, s);
      return;
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (limit != std::chrono::nanoseconds::max() && std::chrono::steady_clock::now() - start >= limit) {
      PyErr_SetString(PyExc_TimeoutError, ("run " + std::to_string(h.run_id()) + " not finished after " +
                                           std::to_string(*timeout) + " s; it goes on")
                                              .c_str());
      throw py::error_already_set();
    }
  }
}

// ---------------------------------------------------------------- the per-run calls, without pybind11's dispatcher

// A run from Python makes three calls into the module (Worker.submit,
// Orchestrator.submit_sub in the orchestration, RunHandle.wait), and
// pybind11's dispatcher costs about 250 ns a call here (RunHandle.done()
// 290 ns against a Python method's 28 ns, on the loaded machine). These
// methods are CPython method descriptors whose common form (one positional
// argument, or none for wait) goes straight to the C++; every other form is
// handed to the pybind11 binding it replaced, so refusals, texts and
// keywords stay the binding's.
struct FastMethod {
  PyMethodDef def{};
  std::string doc;
  PyObject* general = nullptr;  // the pybind11 binding (a function taking self first); kept for the process
};

PyObject* call_general(const FastMethod& m, PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                       PyObject* kwnames) {
  const Py_ssize_t nkw = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
  std::vector<PyObject*> all;
  all.reserve(static_cast<size_t>(1 + nargs + nkw));
  all.push_back(self);
  all.insert(all.end(), args, args + nargs + nkw);
  return PyObject_Vectorcall(m.general, all.data(), static_cast<size_t>(1 + nargs), kwnames);
}

// What pybind11's dispatcher does with an exception our code throws.
template <typename F>
PyObject* translating(F&& f) noexcept {
  try {
    return f();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const py::builtin_exception& e) {
    e.set_error();
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

FastMethod g_submit, g_submit_sub, g_wait;

// Worker.submit(orch) and Worker.submit(callable_handle): no args, the Worker's CallConfig.
PyObject* fast_submit(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  if (nargs != 1 || kwnames != nullptr) return call_general(g_submit, self, args, nargs, kwnames);
  PyObject* what = args[0];
  const bool orchestration = PyCallable_Check(what) != 0;
  if (!orchestration && !py::isinstance<CallableHandle>(what)) {
    return call_general(g_submit, self, args, nargs, kwnames);
  }
  return translating([&]() -> PyObject* {
    Worker& w = py::handle(self).cast<PyWorker&>().get();
    RunHandle h;
    if (orchestration) {
      // Borrowed, as in the binding: submit runs it before it returns.
      std::function<Status(Orchestrator&)> orch = [what](Orchestrator& o) {
        return call_orchestration(what, o, "the orchestration");
      };
      py::gil_scoped_release release;
      h = w.submit(std::move(orch));
    } else {
      const CallableHandle c = py::handle(what).cast<CallableHandle>();
      const TaskArgs none;
      py::gil_scoped_release release;
      h = w.submit(c, none);
    }
    return py::cast(std::move(h)).release().ptr();
  });
}

// Orchestrator.submit_sub(fn): no args.
PyObject* fast_submit_sub(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  if (nargs != 1 || kwnames != nullptr || !py::isinstance<FunctionHandle>(args[0])) {
    return call_general(g_submit_sub, self, args, nargs, kwnames);
  }
  return translating([&]() -> PyObject* {
    const PyNodeOrchestrator& o = py::handle(self).cast<const PyNodeOrchestrator&>();
    const FunctionHandle f = py::handle(args[0]).cast<FunctionHandle>();
    return py::cast(take(o.get().submit_sub(f, TaskArgs{}), "submit_sub")).release().ptr();
  });
}

// RunHandle.wait(): no timeout.
PyObject* fast_wait(PyObject* self, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  if (nargs != 0 || kwnames != nullptr) return call_general(g_wait, self, args, nargs, kwnames);
  return translating([&]() -> PyObject* {
    wait_handle(py::handle(self).cast<const RunHandle&>(), std::nullopt);
    Py_RETURN_NONE;
  });
}

// Replaces `cls.name` (a pybind11 method) by `fast`, which hands every form it
// does not handle to the replaced binding. The docstring is the binding's.
void install_fast_method(const py::object& cls, const char* name, FastMethod& m, _PyCFunctionFastWithKeywords fast) {
  py::object general = cls.attr(name);  // on the class: the binding itself, taking self first
  m.doc = py::str(general.attr("__doc__")).cast<std::string>();
  m.general = general.release().ptr();
  m.def.ml_name = name;
  m.def.ml_meth = reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast));
  m.def.ml_flags = METH_FASTCALL | METH_KEYWORDS;
  m.def.ml_doc = m.doc.c_str();
  py::object descr =
      py::reinterpret_steal<py::object>(PyDescr_NewMethod(reinterpret_cast<PyTypeObject*>(cls.ptr()), &m.def));
  if (!descr) throw py::error_already_set();
  if (PyObject_SetAttrString(cls.ptr(), name, descr.ptr()) != 0) throw py::error_already_set();
}

// A noop kernel for benchmarks and tests (the one `simpler bench` uses is in bench/).
extern "C" void simpler_python_noop_kernel(int64_t* /*args*/) {}

py::object example_kernel_path(const std::string& kernel) {
  return py::str(take(examples::kernel_path(kernel), "example_kernel"));
}

}  // namespace
}  // namespace simpler::python

using namespace simpler;
using namespace simpler::python;

PYBIND11_MODULE(_simpler, m) {
  m.doc() = "simpler's C++ API for Python (use the `simpler` package, which re-exports it)";

  py::enum_<StatusCode>(m, "StatusCode", "Why a call or a run failed (simpler::StatusCode).")
      .value("OK", StatusCode::kOk)
      .value("INVALID_ARGUMENT", StatusCode::kInvalidArgument)
      .value("NOT_FOUND", StatusCode::kNotFound)
      .value("FAILED_PRECONDITION", StatusCode::kFailedPrecondition)
      .value("OUT_OF_RANGE", StatusCode::kOutOfRange)
      .value("RESOURCE_EXHAUSTED", StatusCode::kResourceExhausted)
      .value("KERNEL_FAILED", StatusCode::kKernelFailed)
      .value("DEADLINE_EXCEEDED", StatusCode::kDeadlineExceeded)
      .value("ABORTED", StatusCode::kAborted)
      .value("UNIMPLEMENTED", StatusCode::kUnimplemented)
      .value("INTERNAL", StatusCode::kInternal)
      .value("USER_CODE_FAILED", StatusCode::kUserCodeFailed)
      .value("DEVICE_FAULT", StatusCode::kDeviceFault);

  py::object error = py::reinterpret_steal<py::object>(PyErr_NewExceptionWithDoc(
      "simpler.Error", "A simpler call failed. .code is the simpler.StatusCode, .message the text.", PyExc_RuntimeError,
      nullptr));
  g_error = error.ptr();
  auto derived = [&](const char* name, const char* doc, PyObject* builtin) {
    py::tuple bases = py::make_tuple(error, py::handle(builtin));
    PyObject* cls = PyErr_NewExceptionWithDoc(name, doc, bases.ptr(), nullptr);
    if (cls == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(cls);
  };
  py::object invalid =
      derived("simpler.InvalidArgumentError", "A refused argument; the text names the field.", PyExc_ValueError);
  py::object not_found =
      derived("simpler.NotFoundError", "An unknown callable, func_id, runtime or file.", PyExc_LookupError);
  py::object deadline = derived("simpler.DeadlineExceededError", "A bounded call ran out of time.", PyExc_TimeoutError);
  py::object run_error = py::reinterpret_steal<py::object>(PyErr_NewExceptionWithDoc(
      "simpler.RunError", "A run ended with an error: .code (simpler.StatusCode) and .message are the run's.",
      error.ptr(), nullptr));
  g_invalid_argument = invalid.ptr();
  g_not_found = not_found.ptr();
  g_deadline_exceeded = deadline.ptr();
  g_run_error = run_error.ptr();
  m.attr("Error") = error;
  m.attr("InvalidArgumentError") = invalid;
  m.attr("NotFoundError") = not_found;
  m.attr("DeadlineExceededError") = deadline;
  m.attr("RunError") = run_error;
  // The module holds them for the life of the process.
  for (py::object* o : {&error, &invalid, &not_found, &deadline, &run_error}) (void)o->inc_ref();

  py::enum_<DType>(m, "DType", "Element types (simpler::DType).")
      .value("F32", DType::F32)
      .value("F16", DType::F16)
      .value("BF16", DType::BF16)
      .value("I8", DType::I8)
      .value("I16", DType::I16)
      .value("I32", DType::I32)
      .value("I64", DType::I64)
      .value("U8", DType::U8)
      .value("U32", DType::U32)
      .value("U64", DType::U64)
      .value("F64", DType::F64);
  py::enum_<Tag>(m, "Tag", "How a task uses a tensor argument; dependencies follow the tags.")
      .value("Input", Tag::Input)
      .value("Output", Tag::Output)
      .value("InOut", Tag::InOut)
      .value("OutputExisting", Tag::OutputExisting)
      .value("NoDep", Tag::NoDep);
  py::enum_<CoreType>(m, "CoreType").value("AIC", CoreType::AIC).value("AIV", CoreType::AIV);

  py::class_<Geometry>(m, "Geometry", "The shape of a simulated chip: clusters of 1 AIC + 2 AIV, AICPU threads.")
      .def(py::init([](std::string name, uint32_t clusters, uint32_t aicpu_threads) {
             return Geometry{std::move(name), clusters, aicpu_threads};
           }),
           py::arg("name"), py::arg("clusters"), py::arg("aicpu_threads"))
      .def_static("by_name", [](const std::string& n) { return take(Geometry::by_name(n), "geometry"); })
      .def_static("presets", &Geometry::presets)
      .def_readonly("name", &Geometry::name)
      .def_readonly("clusters", &Geometry::clusters)
      .def_readonly("aicpu_threads", &Geometry::aicpu_threads)
      .def("__repr__", [](const Geometry& g) {
        return "Geometry('" + g.name + "', clusters=" + std::to_string(g.clusters) +
               ", aicpu_threads=" + std::to_string(g.aicpu_threads) + ")";
      });

  py::class_<RuntimeEnv>(m, "RuntimeEnv", "How tensormap_and_ringbuffer sizes a run; 0 = the default.")
      .def(py::init([](uint32_t task_window, uint64_t heap_ring_bytes, uint32_t dep_pool_entries,
                       std::chrono::milliseconds stall_timeout) {
             return RuntimeEnv{task_window, heap_ring_bytes, dep_pool_entries, stall_timeout};
           }),
           py::kw_only(), py::arg("task_window") = 0, py::arg("heap_ring_bytes") = 0, py::arg("dep_pool_entries") = 0,
           py::arg("stall_timeout") = std::chrono::milliseconds(0))
      .def_readonly("task_window", &RuntimeEnv::task_window)
      .def_readonly("heap_ring_bytes", &RuntimeEnv::heap_ring_bytes)
      .def_readonly("dep_pool_entries", &RuntimeEnv::dep_pool_entries)
      .def_readonly("stall_timeout", &RuntimeEnv::stall_timeout);

  py::enum_<DumpArgs>(m, "DumpArgs", "Which task arguments a run's argument dump captures (docs/diagnostics.md).")
      .value("Off", DumpArgs::Off)
      .value("Partial", DumpArgs::Partial)
      .value("Hybrid", DumpArgs::Hybrid)
      .value("Full", DumpArgs::Full);

  py::class_<CallConfig>(m, "CallConfig",
                         "A run's diagnostics: swimlane_level 0-4 and argument dumps, written under trace_dir "
                         "(checked at submit, naming the field).")
      .def(py::init([](uint32_t swimlane_level, std::string trace_dir, const py::handle& dump_args) {
             return CallConfig{swimlane_level, std::move(trace_dir), to_dump_args(dump_args)};
           }),
           py::kw_only(), py::arg("swimlane_level") = 0, py::arg("trace_dir") = "", py::arg("dump_args") = "off")
      .def_readonly("swimlane_level", &CallConfig::swimlane_level)
      .def_readonly("trace_dir", &CallConfig::trace_dir)
      .def_readonly("dump_args", &CallConfig::dump_args)
      .def("__repr__", [](const CallConfig& c) {
        static const char* const kNames[] = {"off", "partial", "hybrid", "full"};
        return "CallConfig(swimlane_level=" + std::to_string(c.swimlane_level) + ", trace_dir='" + c.trace_dir +
               "', dump_args='" + kNames[static_cast<int>(c.dump_args) & 3] + "')";
      });

  m.def(
      "available_runtimes",
      [] {
        std::vector<std::pair<std::string, std::string>> out;
        for (const ComponentInfo& c : available_runtimes()) out.emplace_back(c.name, c.description);
        return out;
      },
      "(name, description) of every chip runtime this build has; each name is a valid Worker(runtime=...).");
  m.def(
      "available_backends",
      [] {
        std::vector<std::pair<std::string, std::string>> out;
        for (const ComponentInfo& c : available_backends()) out.emplace_back(c.name, c.description);
        return out;
      },
      "(name, description) of every device backend; each name is a valid Worker(backend=...).");
  m.def("version", [] { return std::string(version_string()); });
  m.def("mpi_rank", &mpi_rank, "This process's MPI rank, from mpirun's environment (0 outside mpirun).");
  m.def("mpi_size", &mpi_size, "The MPI job's size, from mpirun's environment (1 outside mpirun).");

  py::class_<DeviceBuffer>(m, "DeviceBuffer", "Memory a Worker allocated: device memory, or the shared heap.")
      .def_readonly("addr", &DeviceBuffer::addr)
      .def_readonly("bytes", &DeviceBuffer::bytes)
      .def(
          "view",
          [](const DeviceBuffer& b, const py::handle& shape, const py::handle& dtype, int64_t offset) {
            TensorView v(b, to_shape(shape, "shape"), to_dtype(dtype, "dtype"), offset);
            check(v.validate(), "view");
            return v;
          },
          py::arg("shape"), py::arg("dtype"), py::arg("offset") = 0,
          "A dense row-major TensorView of `shape` at element `offset`; refused if it does not fit.")
      .def("__repr__", [](const DeviceBuffer& b) {
        return "DeviceBuffer(addr=0x" + fmt::format("{:x}", b.addr) + ", bytes=" + std::to_string(b.bytes) + ")";
      });

  py::class_<TensorView>(m, "TensorView", "A strided window into a DeviceBuffer (or a runtime-allocated output).")
      .def_property_readonly("buffer", &TensorView::buffer)
      .def_property_readonly("dtype", &TensorView::dtype)
      .def_property_readonly("shape",
                             [](const TensorView& t) {
                               std::vector<int64_t> s;
                               for (int d = 0; d < t.ndim(); ++d) s.push_back(t.shape(d));
                               return py::tuple(py::cast(s));
                             })
      .def_property_readonly("strides",
                             [](const TensorView& t) {
                               std::vector<int64_t> s;
                               for (int d = 0; d < t.ndim(); ++d) s.push_back(t.stride(d));
                               return py::tuple(py::cast(s));
                             })
      .def_property_readonly("offset", &TensorView::offset)
      .def_property_readonly("numel", &TensorView::numel)
      .def(
          "tile",
          [](const TensorView& t, const std::vector<int64_t>& start, const std::vector<int64_t>& len) {
            return take(t.tile(start, len), "tile");
          },
          py::arg("start"), py::arg("len"), "The sub-window [start, start + len) of each dimension.");

  py::class_<Output>(m, "Output", "A runtime-allocated Tag.Output argument of this shape and dtype.")
      .def(py::init([](const py::handle& shape, const py::handle& dtype) {
             return Output{to_shape(shape, "Output.shape"), to_dtype(dtype, "Output.dtype")};
           }),
           py::arg("shape"), py::arg("dtype"));

  py::class_<TaskArgs>(m, "TaskArgs",
                       "The ordered arguments of a run or a task: TaskArgs((tensor, Tag.Input), Output(shape, dtype), "
                       "3, np.float32(0.5)). A tensor is a TensorView or a numpy array in the shared heap.")
      .def(py::init(&make_args))
      .def(
          "add_tensor",
          [](TaskArgs& a, const py::handle& t, Tag tag) -> TaskArgs& {
            add_item(a, py::make_tuple(t, tag), a.size());
            return a;
          },
          py::arg("tensor"), py::arg("tag"), py::return_value_policy::reference_internal)
      .def(
          "add_output",
          [](TaskArgs& a, const py::handle& shape, const py::handle& dtype) -> TaskArgs& {
            add_item(a, py::cast(Output{to_shape(shape, "shape"), to_dtype(dtype, "dtype")}), a.size());
            return a;
          },
          py::arg("shape"), py::arg("dtype"), py::return_value_policy::reference_internal)
      .def(
          "add_scalar",
          [](TaskArgs& a, const py::handle& v) -> TaskArgs& {
            add_scalar(a, v, "TaskArgs item " + std::to_string(a.size()));
            return a;
          },
          py::arg("value"), py::return_value_policy::reference_internal)
      .def(
          "add_scalar_f32", [](TaskArgs& a, float v) -> TaskArgs& { return a.add_scalar_f32(v); }, py::arg("value"),
          py::return_value_policy::reference_internal)
      .def(
          "add_scalar_f64", [](TaskArgs& a, double v) -> TaskArgs& { return a.add_scalar_f64(v); }, py::arg("value"),
          py::return_value_policy::reference_internal)
      .def(
          "add_scalar_u64", [](TaskArgs& a, uint64_t v) -> TaskArgs& { return a.add_scalar_u64(v); }, py::arg("value"),
          py::return_value_policy::reference_internal)
      .def(
          "dump", [](TaskArgs& a) -> TaskArgs& { return a.dump(); },
          "Marks the argument added last (a tensor) for DumpArgs.Partial and Hybrid dumps.",
          py::return_value_policy::reference_internal)
      .def("__len__", &TaskArgs::size)
      .def("validate", [](const TaskArgs& a) { check(a.validate(), "TaskArgs"); })
      .def(
          "tensor",
          [](const TaskArgs& a, size_t i) {
            if (i >= a.size() || a[i].kind != TaskArg::Kind::Tensor) {
              value_error("TaskArgs.tensor: argument " + std::to_string(i) + " is not a tensor");
            }
            return a[i].tensor;
          },
          py::arg("index"))
      .def(
          "scalar",
          [](const TaskArgs& a, size_t i) {
            if (i >= a.size() || a[i].kind != TaskArg::Kind::Scalar) {
              value_error("TaskArgs.scalar: argument " + std::to_string(i) + " is not a scalar");
            }
            return static_cast<int64_t>(a[i].scalar);
          },
          py::arg("index"), "The raw 64 bits of scalar argument `index`, as a signed int.");

  py::class_<Param>(m, "Param", "One parameter of a chip callable's signature, checked at submit.")
      .def_static("input", &Param::input)
      .def_static("output", &Param::output)
      .def_static("inout", &Param::inout)
      .def_static("scalar", &Param::scalar)
      .def(
          "with_dtype", [](const Param& p, const py::handle& d) { return p.with_dtype(to_dtype(d, "dtype")); },
          py::arg("dtype"))
      .def("with_shape", &Param::with_shape, py::arg("extents"))
      .def("with_rank", &Param::with_rank, py::arg("rank"));

  py::class_<PyKernelLibrary>(m, "KernelLibrary", "Maps func_ids to native kernels.")
      .def(py::init<>())
      .def(
          "add_file",
          [](PyKernelLibrary& k, uint32_t func_id, CoreType core, const std::string& path) {
            check(k.lib.add_file(func_id, core, path), "KernelLibrary.add_file");
          },
          py::arg("func_id"), py::arg("core"), py::arg("path"),
          "Loads a kernel .so built with simpler_add_kernel (exports kernel_entry).")
      .def(
          "add_noop",
          [](PyKernelLibrary& k, uint32_t func_id, CoreType core) {
            check(k.lib.add_function(func_id, core, "simpler_python_noop_kernel", &simpler_python_noop_kernel),
                  "KernelLibrary.add_noop");
          },
          py::arg("func_id"), py::arg("core"), "A kernel that does nothing (for latency measurements and tests).")
      .def("func_ids", [](const PyKernelLibrary& k) {
        std::vector<uint32_t> ids;
        for (const auto& [id, info] : k.lib.all()) ids.push_back(id);
        return ids;
      });
  m.def("example_kernel", &example_kernel_path, py::arg("name"),
        "The path of one of the examples' kernels (e.g. 'vector_add_add'), from $SIMPLER_KERNEL_DIR, the install "
        "tree or the build tree.");

  py::class_<ChipCallable>(m, "ChipCallable",
                           "A chip run: an orchestration `def orch(o, args)`, its kernels and its signature.")
      .def(py::init([](std::string name, py::object orchestration, const PyKernelLibrary& kernels,
                       const py::handle& signature) {
             if (!PyCallable_Check(orchestration.ptr())) {
               type_error("ChipCallable: orchestration must be callable as orch(o, args)");
             }
             return ChipCallable(std::move(name), chip_orchestration(std::move(orchestration)), kernels.lib,
                                 to_signature(signature));
           }),
           py::arg("name"), py::arg("orchestration"), py::arg("kernels"), py::arg("signature") = py::none())
      .def_static(
          "from_file",
          [](std::string name, const std::string& path, const PyKernelLibrary& kernels, const py::handle& signature) {
            return ChipCallable(std::move(name), take(load_orchestration(path), "ChipCallable.from_file"), kernels.lib,
                                to_signature(signature));
          },
          py::arg("name"), py::arg("path"), py::arg("kernels"), py::arg("signature") = py::none(),
          "A callable whose orchestration is a native .so built with simpler_add_orchestration.")
      .def_property_readonly("name", &ChipCallable::name)
      .def_property_readonly("digest", [](const ChipCallable& c) { return digest_hex(c.digest()); });

  py::class_<NodeCallable>(m, "NodeCallable", "A node run a network worker runs on a node: `def orch(o, args)`.")
      .def(py::init([](std::string name, py::object orchestration) {
             if (!PyCallable_Check(orchestration.ptr())) {
               type_error("NodeCallable: orchestration must be callable as orch(o, args)");
             }
             return NodeCallable(std::move(name), node_orchestration(std::move(orchestration)));
           }),
           py::arg("name"), py::arg("orchestration"))
      .def_property_readonly("name", &NodeCallable::name);

  py::class_<CallableHandle>(m, "CallableHandle", "A registered chip or node callable.")
      .def_readonly("id", &CallableHandle::id)
      .def_property_readonly("digest", [](const CallableHandle& h) { return digest_hex(h.digest); });
  py::class_<FunctionHandle>(m, "FunctionHandle", "A registered sub function.")
      .def_readonly("id", &FunctionHandle::id)
      .def_property_readonly("digest", [](const FunctionHandle& h) { return digest_hex(h.digest); });

  py::class_<RunStats>(m, "RunStats")
      .def_readonly("tasks", &RunStats::tasks)
      .def_readonly("executed", &RunStats::executed)
      .def_readonly("released_early", &RunStats::released_early)
      .def_readonly("chained", &RunStats::chained)
      .def_readonly("taken_back", &RunStats::taken_back)
      .def_readonly("build_us", &RunStats::build_us)
      .def_readonly("device_us", &RunStats::device_us);

  py::class_<Status>(m, "Status", "A run's result: .ok, .code, .message.")
      .def_property_readonly("ok", &Status::ok)
      .def_property_readonly("code", &Status::code)
      .def_property_readonly("message", &Status::message)
      .def("__repr__", [](const Status& s) { return "Status(" + s.to_string() + ")"; })
      .def("__bool__", &Status::ok);

  py::class_<RunHandle>(m, "RunHandle", "The future of one submitted run; wait on it from any thread.")
      .def("done", &RunHandle::done, "True once the run is terminal; never blocks.")
      .def("wait", &wait_handle, py::arg("timeout") = py::none(),
           "Blocks until the run is terminal (the GIL released). Raises simpler.RunError if it failed, TimeoutError "
           "after `timeout` seconds (the run goes on), KeyboardInterrupt on Ctrl-C (the run goes on).")
      .def("result", &RunHandle::result, "The terminal Status; FAILED_PRECONDITION while the run is not done.")
      .def_property_readonly("stats", &RunHandle::stats)
      .def_property_readonly("run_id", &RunHandle::run_id);

  py::class_<TaskRef>(m, "TaskRef", "A submitted chip task: its id and its runtime-allocated outputs.")
      .def_readonly("id", &TaskRef::id)
      .def_property_readonly("outputs", [](const TaskRef& r) { return outputs_of(r); });

  py::class_<ScopeGuard>(m, "Scope")
      .def("__enter__",
           [](ScopeGuard& s) {
             if (ChipOrchestrator* chip = s.chip()) {
               if (s.manual) {
                 check(chip->manual_scope_begin(), "manual scope");
               } else {
                 chip->scope_begin();
               }
             } else {
               s.node().scope_begin();
             }
           })
      .def("__exit__", [](ScopeGuard& s, const py::handle& exc_type, const py::handle&, const py::handle&) {
        ChipOrchestrator* chip = s.chip();
        const Status st = chip != nullptr ? chip->scope_end() : s.node().scope_end();
        if (!st.ok() && exc_type.is_none()) raise_status(st, "scope");
        return false;
      });

  py::class_<PyChipOrchestrator>(
      m, "ChipOrchestrator", "What a chip orchestration `def orch(o, args)` submits through; valid during the call.")
      .def(
          "submit_aiv",
          [](PyChipOrchestrator& o, uint32_t f, const py::handle& a) {
            return take(o.get().submit_aiv(f, to_args(a, "args")), "submit_aiv");
          },
          py::arg("func_id"), py::arg("args") = py::none())
      .def(
          "submit_aic",
          [](PyChipOrchestrator& o, uint32_t f, const py::handle& a) {
            return take(o.get().submit_aic(f, to_args(a, "args")), "submit_aic");
          },
          py::arg("func_id"), py::arg("args") = py::none())
      .def(
          "submit_mix",
          [](PyChipOrchestrator& o, uint32_t aic, uint32_t aiv0, uint32_t aiv1, const py::handle& a) {
            return take(o.get().submit_mix(MixKernels{aic, aiv0, aiv1}, to_args(a, "args")), "submit_mix");
          },
          py::arg("aic"), py::arg("aiv0"), py::arg("aiv1"), py::arg("args") = py::none())
      .def(
          "submit_aiv_spmd",
          [](PyChipOrchestrator& o, uint32_t f, const py::handle& a, uint32_t blocks) {
            return take(o.get().submit_aiv_spmd(f, to_args(a, "args"), blocks), "submit_aiv_spmd");
          },
          py::arg("func_id"), py::arg("args"), py::arg("block_num"))
      .def(
          "submit_aic_spmd",
          [](PyChipOrchestrator& o, uint32_t f, const py::handle& a, uint32_t blocks) {
            return take(o.get().submit_aic_spmd(f, to_args(a, "args"), blocks), "submit_aic_spmd");
          },
          py::arg("func_id"), py::arg("args"), py::arg("block_num"))
      .def(
          "alloc",
          [](PyChipOrchestrator& o, const py::handle& shape, const py::handle& dtype) {
            return take(o.get().alloc(to_shape(shape, "shape"), to_dtype(dtype, "dtype")), "alloc");
          },
          py::arg("shape"), py::arg("dtype"), "An intermediate in device memory owned by the run.")
      .def(
          "scope",
          [](py::object self, bool manual) {
            (void)self.cast<PyChipOrchestrator&>().get();  // raises when used after the call
            return ScopeGuard{self, manual};
          },
          py::arg("manual") = false, "`with o.scope():` (manual=True: a manual scope, see set_dependencies).")
      .def(
          "set_dependencies",
          [](PyChipOrchestrator& o, const std::vector<uint32_t>& p) {
            check(o.get().set_dependencies(p), "set_dependencies");
          },
          py::arg("predecessors"))
      .def_property_readonly("task_count", [](PyChipOrchestrator& o) { return o.get().task_count(); });

  py::class_<PyNodeOrchestrator>(
      m, "Orchestrator", "What a node or network orchestration `def orch(o)` submits through; valid during the call.")
      .def(
          "submit_next_level",
          [](PyNodeOrchestrator& o, const CallableHandle& c, const py::handle& a, uint32_t worker) {
            return take(o.get().submit_next_level(c, to_args(a, "args"), worker), "submit_next_level");
          },
          py::arg("callable"), py::arg("args"), py::arg("worker"))
      .def(
          "submit_sub",
          [](PyNodeOrchestrator& o, const FunctionHandle& f, const py::handle& a) {
            return take(o.get().submit_sub(f, to_args(a, "args")), "submit_sub");
          },
          py::arg("fn"), py::arg("args") = py::none())
      .def(
          "submit_next_level_group",
          [](PyNodeOrchestrator& o, const CallableHandle& c, const py::sequence& args,
             const std::vector<uint32_t>& workers) {
            std::vector<TaskArgs> all;
            for (const py::handle a : args) all.push_back(to_args(a, "args"));
            return take(o.get().submit_next_level_group(c, all, workers), "submit_next_level_group");
          },
          py::arg("callable"), py::arg("args"), py::arg("workers"))
      .def(
          "submit_sub_group",
          [](PyNodeOrchestrator& o, const FunctionHandle& f, const py::sequence& args) {
            std::vector<TaskArgs> all;
            for (const py::handle a : args) all.push_back(to_args(a, "args"));
            return take(o.get().submit_sub_group(f, all), "submit_sub_group");
          },
          py::arg("fn"), py::arg("args"))
      .def(
          "alloc",
          [](PyNodeOrchestrator& o, const py::handle& shape, const py::handle& dtype) {
            return take(o.get().alloc(to_shape(shape, "shape"), to_dtype(dtype, "dtype")), "alloc");
          },
          py::arg("shape"), py::arg("dtype"), "An intermediate in the shared heap owned by the run.")
      .def(
          "scope",
          [](py::object self) {
            (void)self.cast<PyNodeOrchestrator&>().get();
            return ScopeGuard{self, false};
          },
          "`with o.scope():` intermediates allocated inside are freed once it ended and their last user finished.")
      .def_property_readonly("task_count", [](PyNodeOrchestrator& o) { return o.get().task_count(); });

  py::class_<SharedAllocation>(m, "SharedAllocation", "The owner of a shared-heap numpy array (its .base).")
      .def_readonly("buffer", &SharedAllocation::buffer);

  py::class_<PyWorker>(m, "Worker",
                       "simpler's entry point at every level: Worker(level=2|3|4, runtime=..., geometry=..., "
                       "pipeline_depth=..., launch_depth=..., chips=..., sub_workers=..., ...); keywords are "
                       "WorkerConfig's fields.")
      .def(py::init([](const py::handle& level, const py::kwargs& kw) {
             auto w = std::make_unique<PyWorker>();
             w->w = std::make_unique<Worker>(to_level(level), to_config(kw));
             return w;
           }),
           py::arg("level"))
      .def_property_readonly("level", [](PyWorker& w) { return static_cast<int>(w.get().level()); })
      .def_property_readonly("runtime", [](PyWorker& w) { return w.get().config().runtime; })
      .def_property_readonly("pipeline_depth", [](PyWorker& w) { return w.get().config().pipeline_depth; })
      .def(
          "register",
          [](PyWorker& w, const py::handle& what) -> py::object {
            if (py::isinstance<ChipCallable>(what)) {
              return py::cast(take(w.get().register_callable(what.cast<ChipCallable>()), "register"));
            }
            if (py::isinstance<NodeCallable>(what)) {
              return py::cast(take(w.get().register_callable(what.cast<NodeCallable>()), "register"));
            }
            if (PyCallable_Check(what.ptr())) {
              return py::cast(
                  take(w.get().register_function(sub_function(py::reinterpret_borrow<py::object>(what))), "register"));
            }
            type_error("register: expected a ChipCallable, a NodeCallable or a Python function (a sub function)");
          },
          py::arg("callable"),
          "Before init(): a ChipCallable (Level 2/3), a NodeCallable (Level 4) or a Python function `def f(args)` "
          "that the sub workers run in their forked processes (Level 3/4).")
      .def(
          "add_next_level_worker",
          [](PyWorker& w, PyWorker& node) {
            Worker& self = w.get();
            Worker& child = node.get();
            return take(self.add_next_level_worker(std::move(child)), "add_next_level_worker");
          },
          py::arg("worker"), "Level 4, before init(): an uninitialised Level 3 Worker becomes next-level worker i.")
      .def(
          "add_remote_worker",
          [](PyWorker& w, int rank, const py::handle& heartbeat_timeout, const py::handle& ready_timeout) {
            RemoteNodeOptions o;
            if (!heartbeat_timeout.is_none()) {
              o.heartbeat_timeout = to_ms(heartbeat_timeout, "add_remote_worker: heartbeat_timeout");
            }
            if (!ready_timeout.is_none()) o.ready_timeout = to_ms(ready_timeout, "add_remote_worker: ready_timeout");
            return take(w.get().add_remote_worker(rank, o), "add_remote_worker");
          },
          py::arg("rank"), py::kw_only(), py::arg("heartbeat_timeout") = py::none(),
          py::arg("ready_timeout") = py::none(),
          "Level 4, before init(), under mpirun on rank 0: next-level worker i (returned) is the node that "
          "serve_node() serves on MPI rank `rank`. Timeouts in seconds or a timedelta; None keeps the default.")
      .def(
          "init",
          [](PyWorker& w) {
            Worker& self = w.get();
            Status s;
            {
              py::gil_scoped_release release;
              s = self.init();
            }
            check(s, "init");
          },
          "Validates the config (naming the field), starts the device or forks the children.")
      .def(
          "close",
          [](PyWorker& w) {
            if (!w.w) return;
            Status s;
            {
              py::gil_scoped_release release;
              s = w.w->close();
            }
            check(s, "close");
          },
          "Drains in-flight runs and frees everything. Idempotent; afterwards every call raises simpler.Error.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](PyWorker& w, const py::handle& exc_type, const py::handle&, const py::handle&) {
             if (!w.w) return false;
             Status s;
             {
               py::gil_scoped_release release;
               s = w.w->close();
             }
             if (exc_type.is_none()) check(s, "close");
             return false;
           })
      .def(
          "malloc",
          [](PyWorker& w, uint64_t bytes) {
            Worker& self = w.get();
            Result<DeviceBuffer> r = Status();
            {
              py::gil_scoped_release release;
              r = self.malloc(bytes);
            }
            return take(std::move(r), "malloc");
          },
          py::arg("bytes"), "Level 2: device memory.")
      .def(
          "malloc_on",
          [](PyWorker& w, uint32_t worker, uint64_t bytes) {
            Worker& self = w.get();
            Result<DeviceBuffer> r = Status();
            {
              py::gil_scoped_release release;
              r = self.malloc_on(worker, bytes);
            }
            return take(std::move(r), "malloc_on");
          },
          py::arg("worker"), py::arg("bytes"), "Level 3: device memory of chip `worker`.")
      .def(
          "malloc_shared",
          [](PyWorker& w, uint64_t bytes) { return take(w.get().malloc_shared(bytes), "malloc_shared"); },
          py::arg("bytes"), "Level 3/4: host memory in the shared heap every child maps at the same address.")
      .def(
          "shared_array",
          [](PyWorker& w, const py::handle& shape, const py::handle& dtype) {
            const std::vector<int64_t> s = to_shape(shape, "shape");
            const DType t = to_dtype(dtype, "dtype");
            uint64_t n = 1;
            for (int64_t e : s) n *= static_cast<uint64_t>(e);
            const DeviceBuffer b =
                take(w.get().malloc_shared(std::max<uint64_t>(1, n) * dtype_size(t)), "shared_array");
            return shared_array_over(b, s, t);
          },
          py::arg("shape"), py::arg("dtype"),
          "Level 3/4: a numpy array in the shared heap (no copy anywhere: sub workers see the same memory). Valid "
          "until free()d or the Worker is closed; pass it (or a view of it) to TaskArgs as a tensor.")
      .def(
          "free",
          [](PyWorker& w, const py::handle& b) {
            Worker& self = w.get();
            const DeviceBuffer buf = to_buffer(b, "free");
            Status s;
            {
              py::gil_scoped_release release;
              s = self.free(buf);
            }
            check(s, "free");
          },
          py::arg("buffer"))
      .def(
          "copy_to",
          [](PyWorker& w, const py::handle& dst, const py::array& src, uint64_t dst_offset) {
            Worker& self = w.get();
            const DeviceBuffer buf = to_buffer(dst, "copy_to: dst");
            const py::array c = py::array::ensure(src, py::array::c_style);
            if (!c) throw py::error_already_set();
            const void* data = c.data();
            const auto bytes = static_cast<uint64_t>(c.nbytes());
            Status s;
            {
              py::gil_scoped_release release;
              s = self.copy_to(buf, data, bytes, dst_offset);
            }
            check(s, "copy_to");
          },
          py::arg("dst"), py::arg("src"), py::arg("dst_offset") = 0,
          "Copies the numpy array `src` (its bytes, C order) into `dst` at byte `dst_offset`.")
      .def(
          "copy_from",
          [](PyWorker& w, const py::handle& src, const py::object& shape, const py::object& dtype,
             const py::object& out, uint64_t src_offset) {
            Worker& self = w.get();
            const DeviceBuffer buf = to_buffer(src, "copy_from: src");
            py::array dst;
            if (!out.is_none()) {
              if (!shape.is_none() || !dtype.is_none()) value_error("copy_from: give either out or shape and dtype");
              if (!py::isinstance<py::array>(out)) type_error("copy_from: out must be a numpy array");
              dst = py::reinterpret_borrow<py::array>(out);
              if (!(dst.flags() & py::array::c_style) || !dst.writeable()) {
                value_error("copy_from: out must be a writeable C-contiguous array");
              }
            } else {
              if (shape.is_none() || dtype.is_none()) type_error("copy_from: give shape and dtype, or out");
              const DType t = to_dtype(dtype, "dtype");
              const std::vector<int64_t> s = to_shape(shape, "shape");
              dst = py::array(numpy_dtype(t), s);
            }
            void* data = dst.mutable_data();
            const auto bytes = static_cast<uint64_t>(dst.nbytes());
            Status s;
            {
              py::gil_scoped_release release;
              s = self.copy_from(data, buf, bytes, src_offset);
            }
            check(s, "copy_from");
            return dst;
          },
          py::arg("src"), py::arg("shape") = py::none(), py::arg("dtype") = py::none(), py::kw_only(),
          py::arg("out") = py::none(), py::arg("src_offset") = 0,
          "Copies from `src` at byte `src_offset` into a new array of `shape` and `dtype` (or into `out`); returns it.")
      .def(
          "memory_info",
          [](PyWorker& w) {
            Worker& self = w.get();
            Result<MemoryInfo> r = Status();
            {
              py::gil_scoped_release release;
              r = self.memory_info();
            }
            const MemoryInfo m = take(std::move(r), "memory_info");
            return py::make_tuple(m.total_bytes, m.free_bytes);
          },
          "(total_bytes, free_bytes) of device memory (Level 3/4: summed over the chips).")
      .def(
          "memory_info_on",
          [](PyWorker& w, uint32_t worker) {
            Worker& self = w.get();
            Result<MemoryInfo> r = Status();
            {
              py::gil_scoped_release release;
              r = self.memory_info_on(worker);
            }
            const MemoryInfo m = take(std::move(r), "memory_info_on");
            return py::make_tuple(m.total_bytes, m.free_bytes);
          },
          py::arg("worker"), "(total_bytes, free_bytes) of chip `worker` (Level 3) or node `worker` (Level 4).")
      .def(
          "submit",
          [](PyWorker& w, const py::handle& what, const py::handle& args, const py::handle& call) {
            Worker& self = w.get();
            const CallConfig diagnostics = call.is_none() ? self.config().call : to_call(call, "submit: call");
            if (PyCallable_Check(what.ptr())) {
              if (!args.is_none()) type_error("submit: a node orchestration takes no args (capture them)");
              // Borrowed: submit runs the orchestration on this thread before it
              // returns and keeps no copy, and `what` outlives this call.
              PyObject* fn = what.ptr();
              std::function<Status(Orchestrator&)> orch = [fn](Orchestrator& o) {
                return call_orchestration(fn, o, "the orchestration");
              };
              py::gil_scoped_release release;
              return self.submit(std::move(orch), diagnostics);
            }
            if (py::isinstance<CallableHandle>(what)) {
              const CallableHandle c = what.cast<CallableHandle>();
              const TaskArgs a = to_args(args, "args");
              py::gil_scoped_release release;
              return self.submit(c, a, diagnostics);
            }
            type_error("submit: expected a CallableHandle (with args) or a node orchestration `def orch(o)`");
          },
          py::arg("callable"), py::arg("args") = py::none(), py::kw_only(), py::arg("call") = py::none(),
          "Level 2: submit(callable_handle, args). Level 3/4: submit(orch) with `def orch(o)`. `call`: this run's "
          "CallConfig (None: the Worker's). Returns a RunHandle; a refused submission is a handle already done with "
          "the error.")
      .def(
          "run",
          [](PyWorker& w, const py::handle& what, const py::handle& args, const py::handle& call) {
            py::object self = py::cast(&w, py::return_value_policy::reference);
            RunHandle h = self.attr("submit")(what, args, py::arg("call") = call).cast<RunHandle>();
            wait_handle(h, std::nullopt);
            return h;
          },
          py::arg("callable"), py::arg("args") = py::none(), py::kw_only(), py::arg("call") = py::none(),
          "submit + wait; returns the finished RunHandle.");

  m.def(
      "serve_node",
      [](PyWorker& node, std::vector<NodeCallable> callables, const py::handle& tensor_heap_bytes,
         const py::handle& heartbeat_period, const py::handle& network_timeout, const py::handle& hello_timeout) {
        ServeOptions o;
        if (!tensor_heap_bytes.is_none())
          o.tensor_heap_bytes = to_u64(tensor_heap_bytes, "serve_node: tensor_heap_bytes", UINT64_MAX);
        if (!heartbeat_period.is_none()) o.heartbeat_period = to_ms(heartbeat_period, "serve_node: heartbeat_period");
        if (!network_timeout.is_none()) o.network_timeout = to_ms(network_timeout, "serve_node: network_timeout");
        if (!hello_timeout.is_none()) o.hello_timeout = to_ms(hello_timeout, "serve_node: hello_timeout");
        Worker& w = node.get();
        Status s;
        {
          // The node's Python orchestrations take the GIL on its threads while this one serves.
          py::gil_scoped_release release;
          s = serve_node(std::move(w), std::move(callables), o);
        }
        check(s, "serve_node");
      },
      py::arg("node"), py::arg("callables"), py::kw_only(), py::arg("tensor_heap_bytes") = py::none(),
      py::arg("heartbeat_period") = py::none(), py::arg("network_timeout") = py::none(),
      py::arg("hello_timeout") = py::none(),
      "On an MPI rank other than 0: initialises `node` (an uninitialised Level 3 Worker with its chip callables "
      "and sub functions registered; it forks its children before MPI starts) and serves the network on rank 0, "
      "running the NodeCallables in `callables` (the network registers the same names). Blocks until the network "
      "closes; raises with why the node stopped serving otherwise. `node` is closed afterwards.");

  install_fast_method(m.attr("Worker"), "submit", g_submit, fast_submit);
  install_fast_method(m.attr("Orchestrator"), "submit_sub", g_submit_sub, fast_submit_sub);
  install_fast_method(m.attr("RunHandle"), "wait", g_wait, fast_wait);
}
