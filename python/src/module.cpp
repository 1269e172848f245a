// tessera._C: nanobind bindings of the C++ API for the Python package (python/tessera).
//
// This layer is deliberately thin: it converts DLPack tensors (PyTorch tensors through
// torch._C._to_dlpack, or in the runtime wrappers' per-call bindings through PyTorch's DLPack C
// exchange API where it has one (RunArray); other arrays through __dlpack__; no copies) into
// tessera::TensorView, makes
// the tensors' GPU current for the call,
// passes the caller's CUDA stream through as a StreamHandle, and maps tessera::Error onto Python
// exceptions. Argument checking that names FlashInfer's argument names lives in the Python layer;
// everything else is checked by the C++ library, whose messages reach Python unchanged.
//
// The attention entry points take their variant (tessera/variant.h) as the keyword-only argument
// `variant`, a VariantArgs: the built-in options, their device tensors (which the caller keeps alive,
// through the VariantArgs, for as long as the call or the plan uses them) and an optional user
// variant given as CUDA source; single_prefill also takes a packed custom mask with its byte
// offsets. block_sparse_attention takes its few options, and the FlexAttention front end's
// generated mods, as keywords of their own.
#include <cuda_runtime_api.h>
#include <dlpack/dlpack.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <type_traits>
#include <utility>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "tessera/dlpack.h"
#include "tessera/runtime.h"
#include "tessera/tessera.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using tessera::DType;
using tessera::Layout;
using tessera::StatusCode;
using tessera::TensorView;

/// An array argument: nb::ndarray<> whose conversion from a torch.Tensor skips Tensor.__dlpack__'s
/// Python code (see the type_caster below).
struct TorchArray : nb::ndarray<> {
  TorchArray() = default;
  explicit TorchArray(nb::ndarray<>&& a) : nb::ndarray<>(std::move(a)) {}
};

using Array = TorchArray;
using OptArray = std::optional<TorchArray>;

/// An array argument of the runtime wrappers' per-call bindings (plan(), run(), the graph-mode
/// page-table copies): a torch.Tensor (exactly that type) is read through PyTorch's DLPack C
/// exchange API when this PyTorch has one (torch_dltensor below: its DLTensor filled in place by
/// a C function, no capsule, no allocation, no Python call); anything else, or a tensor that API
/// refuses, is converted as a TorchArray. The direct form copies the DLTensor's fields (shape and
/// strides included), so it holds no pointer into the tensor's metadata; its data pointer is the
/// tensor's, valid while the argument is, i.e. for the call (nanobind holds the arguments): a
/// RunArray is never kept beyond the call.
struct RunArray {
  bool direct = false;
  // The direct form: a DLTensor's fields.
  void* data = nullptr;
  int32_t device_type = 0, device_id = 0, ndim = 0;
  DLDataType dtype{};
  bool has_strides = false;
  uint64_t byte_offset = 0;
  int64_t shape[TensorView::kMaxDims] = {};
  int64_t strides[TensorView::kMaxDims] = {};
  // Otherwise.
  TorchArray array;
};

using OptRunArray = std::optional<RunArray>;

/// The part of DLPack's DLPackExchangeAPI (dlpack.h >= 1.3, which this build's DLPack header may
/// predate) that is read here: the header and the function table, in dlpack.h's order.
struct DLPackExchangeApiHeaderV1 {
  uint32_t major, minor;
  DLPackExchangeApiHeaderV1* prev_api;
};
/// DLManagedTensorVersioned of DLPack 1.x (the header this builds against may be 0.x).
struct DLManagedTensorVersionedV1 {
  uint32_t major, minor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersionedV1* self);
  uint64_t flags;
  DLTensor dl_tensor;
};
struct DLPackExchangeApiV1 {
  DLPackExchangeApiHeaderV1 header;
  /// Allocates a framework tensor like `prototype` (dtype, ndim, shape, device); 0 on success.
  int (*managed_tensor_allocator)(DLTensor* prototype, DLManagedTensorVersionedV1** out, void* error_ctx,
                                  void (*set_error)(void* error_ctx, const char* kind, const char* message));
  void* managed_tensor_from_py_object_no_sync;
  /// Wraps `tensor` (ownership taken) as a new reference to a framework tensor; 0 on success.
  int (*managed_tensor_to_py_object_no_sync)(DLManagedTensorVersionedV1* tensor, void** out_py_object);
  int (*dltensor_from_py_object_no_sync)(void* py_object, DLTensor* out);
  /// The framework's current stream of a device; 0 on success.
  int (*current_work_stream)(DLDeviceType device_type, int32_t device_id, void** out_current_stream);
};

/// torch.Tensor and its DLPack exchange table (torch.Tensor.__dlpack_c_exchange_api__, DLPack
/// major version 1), or nulls when this PyTorch has none. torch is looked up in sys.modules (never
/// imported here) until it is there; both are kept for the life of the process (DLPack's rule for
/// the table; a newer major version may chain older ones).
struct TorchExchange {
  PyTypeObject* tensor_type = nullptr;
  const DLPackExchangeApiV1* api = nullptr;
};

const TorchExchange& torch_exchange() {
  static TorchExchange found;
  static bool resolved = false;
  if (!resolved) {
    PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");  // borrowed
    if (torch == nullptr) return found;
    resolved = true;
    PyObject* tensor = PyObject_GetAttrString(torch, "Tensor");
    PyObject* api = tensor != nullptr ? PyObject_GetAttrString(tensor, "__dlpack_c_exchange_api__") : nullptr;
    if (tensor != nullptr && PyType_Check(tensor) && api != nullptr && PyCapsule_IsValid(api, "dlpack_exchange_api")) {
      auto* header = static_cast<DLPackExchangeApiHeaderV1*>(PyCapsule_GetPointer(api, "dlpack_exchange_api"));
      while (header != nullptr && header->major != 1) header = header->prev_api;
      if (header != nullptr) {
        found.api = reinterpret_cast<const DLPackExchangeApiV1*>(header);
        found.tensor_type = reinterpret_cast<PyTypeObject*>(tensor);  // kept for the life of the process
        tensor = nullptr;
      }
    }
    Py_XDECREF(tensor);
    Py_XDECREF(api);
    PyErr_Clear();
  }
  return found;
}

/// Fills `out` (the direct form) from the DLTensor `t`: false when `t` has more than
/// TensorView::kMaxDims dimensions or no shape.
bool fill_run_array(const DLTensor& t, RunArray& out) {
  if (t.ndim < 0 || t.ndim > TensorView::kMaxDims || (t.ndim > 0 && t.shape == nullptr)) return false;
  out.direct = true;
  out.data = t.data;
  out.device_type = static_cast<int32_t>(t.device.device_type);
  out.device_id = t.device.device_id;
  out.ndim = t.ndim;
  out.dtype = t.dtype;
  out.byte_offset = t.byte_offset;
  out.has_strides = t.strides != nullptr;
  for (int d = 0; d < t.ndim; ++d) {
    out.shape[d] = t.shape[d];
    out.strides[d] = out.has_strides ? t.strides[d] : 0;
  }
  return true;
}

/// Fills `out` (the direct form) from `o` when `o` is a torch.Tensor (exactly that type) and this
/// PyTorch exports it through its exchange table's dltensor_from_py_object_no_sync: the
/// non-owning export PyTorch itself offers for calls like this one (DLPack's "N0" use: the data is
/// used during the call, on the current stream). False otherwise, with no Python error left set
/// (the caller then converts `o` as a TorchArray: sparse tensors, more than TensorView::kMaxDims
/// dims, older PyTorch releases).
bool torch_dltensor(PyObject* o, RunArray& out) {
  const TorchExchange& torch = torch_exchange();
  if (torch.api == nullptr || torch.api->dltensor_from_py_object_no_sync == nullptr ||
      Py_TYPE(o) != torch.tensor_type) {
    return false;
  }
  DLTensor t{};
  if (torch.api->dltensor_from_py_object_no_sync(o, &t) != 0) {
    PyErr_Clear();
    return false;
  }
  return fill_run_array(t, out);
}

/// A DLPack capsule of `o` when it is a torch.Tensor (exactly that type), from
/// torch._C._to_dlpack, the function Tensor.__dlpack__() ends in; null otherwise, or when the export
/// fails (no Python error is left set). Tensor.__dlpack__ is Python code (a torch-function check,
/// autograd / conjugate / layout / current-device conditions, stream handling) costing microseconds
/// per tensor, several tensors a run() (W12, bench/README.md); the capsule is the same one. What
/// it skips: tensors that require grad export as they are (the kernels never touch autograd), and
/// the tensor's device need not be PyTorch's current one (DeviceGuard sets the device for the call).
/// The Python layer checks the tensors it passes; the library checks devices, dtypes and shapes.
/// torch is looked up in sys.modules (never imported here) until it is there; its type and function
/// are kept for the life of the process.
PyObject* torch_dlpack_capsule(PyObject* o) {
  static PyTypeObject* tensor_type = nullptr;
  static PyObject* to_dlpack = nullptr;
  static bool resolved = false;
  if (!resolved) {
    PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");  // borrowed
    if (torch == nullptr) return nullptr;
    resolved = true;
    PyObject* tensor = PyObject_GetAttrString(torch, "Tensor");
    PyObject* c = PyObject_GetAttrString(torch, "_C");
    PyObject* fn = c != nullptr ? PyObject_GetAttrString(c, "_to_dlpack") : nullptr;
    Py_XDECREF(c);
    if (tensor != nullptr && PyType_Check(tensor) && fn != nullptr && PyCallable_Check(fn)) {
      tensor_type = reinterpret_cast<PyTypeObject*>(tensor);  // both kept for the life of the process
      to_dlpack = fn;
    } else {
      Py_XDECREF(tensor);
      Py_XDECREF(fn);
    }
    PyErr_Clear();
  }
  if (to_dlpack == nullptr || Py_TYPE(o) != tensor_type) return nullptr;
  PyObject* capsule = PyObject_CallOneArg(to_dlpack, o);
  if (capsule == nullptr) PyErr_Clear();  // e.g. a sparse tensor: nanobind's own import says what is wrong
  return capsule;
}

}  // namespace

NAMESPACE_BEGIN(NB_NAMESPACE)
NAMESPACE_BEGIN(detail)
/// TorchArray from Python: a torch.Tensor through torch_dlpack_capsule, anything else (and a
/// tensor whose capsule nanobind refuses) as nb::ndarray<> converts it. Its name in signatures
/// and stubs is nb::ndarray<>'s.
template <>
struct type_caster<TorchArray> {
  using Base = make_caster<nb::ndarray<>>;
  NB_TYPE_CASTER(TorchArray, Base::Name)

  template <typename Flags>
  bool from_python(handle src, Flags flags, cleanup_list* cleanup) noexcept {
    Base base;
    bool ok = false;
    if (PyObject* capsule = torch_dlpack_capsule(src.ptr())) {
      ok = base.from_python(handle(capsule), flags, cleanup);
      Py_DECREF(capsule);
    }
    if (!ok) ok = base.from_python(src, flags, cleanup);
    if (ok) value = TorchArray(std::move(base.value));
    return ok;
  }

  static handle from_cpp(const TorchArray& a, rv_policy policy, cleanup_list* cleanup) noexcept {
    return Base::from_cpp(a, policy, cleanup);
  }
};

/// RunArray from Python: torch_dltensor, else as TorchArray. Arguments only (never returned).
template <>
struct type_caster<RunArray> {
  NB_TYPE_CASTER(RunArray, make_caster<nb::ndarray<>>::Name)

  template <typename Flags>
  bool from_python(handle src, Flags flags, cleanup_list* cleanup) noexcept {
    if (torch_dltensor(src.ptr(), value)) return true;
    make_caster<TorchArray> base;
    if (!base.from_python(src, flags, cleanup)) return false;
    value.direct = false;
    value.array = std::move(base.value);
    return true;
  }

  static handle from_cpp(const RunArray&, rv_policy, cleanup_list*) noexcept {
    PyErr_SetString(PyExc_TypeError, "tessera._C: an array argument cannot be returned");
    return handle();
  }
};
NAMESPACE_END(detail)
NAMESPACE_END(NB_NAMESPACE)

namespace {

#ifndef TESSERA_PY_CUDA_ARCHS
#define TESSERA_PY_CUDA_ARCHS ""
#endif

/// Runs f() inside libtessera (tessera::call_catching) and rethrows a failure as a tessera::Error
/// thrown here, so the exception never crosses from libtessera's C++ runtime into this module's
/// (they can differ: see call_catching). `prefix` is prepended to the message.
template <typename F>
void checked(F&& f, const char* prefix = nullptr) {
  using Fn = std::remove_reference_t<F>;
  const tessera::Status status = tessera::call_catching([](void* c) { (*static_cast<Fn*>(c))(); }, &f);
  if (status.ok()) return;
  throw tessera::Error(status.code, prefix == nullptr ? status.message : std::string(prefix) + ": " + status.message);
}

/// A view of a DLPack-imported array (no copy). `name` prefixes conversion errors.
TensorView to_view(const nb::ndarray<>& a, const char* name) {
  const size_t ndim = a.ndim();
  // On the stack up to TensorView's dimensions (from_dlpack refuses more, with its message).
  int64_t shape_buf[TensorView::kMaxDims], strides_buf[TensorView::kMaxDims];
  std::vector<int64_t> shape_vec, strides_vec;
  int64_t* shape = shape_buf;
  int64_t* strides = strides_buf;
  if (ndim > static_cast<size_t>(TensorView::kMaxDims)) {
    shape_vec.resize(ndim);
    strides_vec.resize(ndim);
    shape = shape_vec.data();
    strides = strides_vec.data();
  }
  for (size_t d = 0; d < ndim; ++d) {
    shape[d] = static_cast<int64_t>(a.shape(d));
    strides[d] = static_cast<int64_t>(a.stride(d));
  }
  DLTensor t{};
  t.data = const_cast<void*>(a.data());  // nanobind has already applied byte_offset
  t.device.device_type = static_cast<DLDeviceType>(a.device_type());
  t.device.device_id = a.device_id();
  t.ndim = static_cast<int>(ndim);
  t.dtype.code = a.dtype().code;
  t.dtype.bits = a.dtype().bits;
  t.dtype.lanes = a.dtype().lanes;
  t.shape = shape;
  t.strides = strides;
  t.byte_offset = 0;
  TensorView view;
  checked([&] { view = tessera::from_dlpack(t); }, name);
  return view;
}

TensorView to_view(const OptArray& a, const char* name) { return a ? to_view(*a, name) : TensorView{}; }

/// A view of a runtime binding's array argument (no copy): the same view, and the same errors, as
/// to_view of the array converted through DLPack's capsule.
/// The DLTensor of a direct RunArray (pointing into it for the shape and strides).
DLTensor dl_tensor_of(const RunArray& a) {
  DLTensor t{};
  t.data = a.data;
  t.device.device_type = static_cast<DLDeviceType>(a.device_type);
  t.device.device_id = a.device_id;
  t.ndim = a.ndim;
  t.dtype = a.dtype;
  t.shape = const_cast<int64_t*>(a.shape);
  t.strides = a.has_strides ? const_cast<int64_t*>(a.strides) : nullptr;
  t.byte_offset = a.byte_offset;
  return t;
}

TensorView to_view(const RunArray& a, const char* name) {
  if (!a.direct) return to_view(a.array, name);
  const DLTensor t = dl_tensor_of(a);
  TensorView view;
  checked([&] { view = tessera::from_dlpack(t); }, name);
  return view;
}

TensorView to_view(const OptRunArray& a, const char* name) { return a ? to_view(*a, name) : TensorView{}; }

/// fp8 K/V (and an FP8 attention q) arrive as uint8 views (torch.Tensor.view(torch.uint8)) with
/// their dtype named in `kv_dtype` (`q_dtype`): not every PyTorch release exports fp8 through DLPack.
TensorView as_kv(TensorView t, const std::optional<DType>& kv_dtype) {
  if (kv_dtype && t.dtype == DType::kU8 && tessera::is_fp8(*kv_dtype)) t.dtype = *kv_dtype;
  return t;
}

/// tessera::KVScales from the bindings' keyword arguments (the library checks them); q_scale /
/// q_scale_device: FP8 attention's scale of q (the defaults leave it unset).
tessera::KVScales kv_scales(double k_scale, double v_scale, const OptArray& k_scale_device,
                            const OptArray& v_scale_device, double q_scale = 1.0,
                            const OptArray& q_scale_device = std::nullopt) {
  tessera::KVScales s;
  s.k = k_scale;
  s.v = v_scale;
  s.k_device = to_view(k_scale_device, "k_scale");
  s.v_device = to_view(v_scale_device, "v_scale");
  s.q = q_scale;
  s.q_device = to_view(q_scale_device, "q_scale");
  return s;
}

tessera::StreamHandle to_stream(uintptr_t stream) { return reinterpret_cast<tessera::StreamHandle>(stream); }

/// Makes the GPU of `t` current for the duration of a call (and restores the previous one). The
/// library works on the current device; PyTorch's notion of it may live in another copy of the
/// CUDA runtime, so the binding sets it explicitly.
class DeviceGuard {
 public:
  explicit DeviceGuard(const TensorView& t) {
    if (t.device.type != tessera::DeviceType::kCUDA) return;
    int current = 0;
    if (cudaGetDevice(&current) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    if (current == t.device.id) return;
    if (cudaSetDevice(t.device.id) == cudaSuccess) previous_ = current;
    else cudaGetLastError();
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

/// A workspace size query, size(), run with GPU `device` current (sizes depend on its SM count)
/// and its failure raised as a Python exception.
template <typename F>
int64_t workspace_bytes_on(int device, F&& size) {
  TensorView probe;
  probe.device = tessera::Device::cuda(device);
  DeviceGuard guard(probe);
  int64_t bytes = 0;
  checked([&] { bytes = size(); });
  return bytes;
}

/// A runtime binding's plan() call, plan(), run with GPU `device` current (the plan uploads to the
/// workspace there), the GIL released, and its failure raised as a Python exception.
template <typename F>
void plan_on(int device, F&& plan) {
  TensorView probe;
  probe.device = tessera::Device::cuda(device);
  DeviceGuard guard(probe);
  nb::gil_scoped_release release;
  checked(plan);
}

/// The Python exception of each StatusCode (the table in python/tessera/__init__.py's docstring).
/// Decided by the code alone: a message's wording never changes the type.
PyObject* exception_type(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument: return PyExc_ValueError;
    case StatusCode::kUnsupported: return PyExc_NotImplementedError;
    case StatusCode::kOk:  // never thrown
    case StatusCode::kCudaError:
    case StatusCode::kInternal: break;
  }
  return PyExc_RuntimeError;
}

/// tessera::Error -> the exception of its code, whose `status_code` attribute is the code (a
/// tessera._C.StatusCode) and whose message is the library's.
void translate_error(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const tessera::Error& e) {
    PyObject* type = exception_type(e.code());
    nb::object exception = nb::steal(PyObject_CallFunction(type, "s", e.what()));
    if (!exception.is_valid()) return;  // constructing it raised (e.g. out of memory): that error stands
    if (PyObject_SetAttrString(exception.ptr(), "status_code", nb::cast(e.code()).ptr()) != 0) return;
    PyErr_SetObject(type, exception.ptr());
  }
}

using VariantParamList = std::vector<std::pair<std::string, nb::object>>;

/// The variant of one call or plan as the Python layer passes it (the class _C.VariantArgs, the
/// `variant` keyword of the attention entry points): tessera::VariantOptions's built-in options,
/// its tensors as DLPack arrays this object keeps alive (the caller keeps the object for as long as
/// the call, or the plan, uses them), and an optional user variant (tessera::VariantSpec) given as
/// its name, CUDA source, parameters and softmax switch (empty user_name: none). The defaults give
/// the default variant (the ahead-of-time kernels).
struct VariantArgs {
  int64_t window_left = -1;
  int64_t num_sink_tokens = 0;
  double logits_soft_cap = 0.0;
  tessera::PosEncoding pos_encoding = tessera::PosEncoding::kNone;
  double rope_scale = 1.0;
  double rope_theta = 1e4;
  double llama31_factor = 8.0;
  double llama31_low_freq_factor = 1.0;
  double llama31_high_freq_factor = 4.0;
  double llama31_original_max_position = 8192.0;
  bool sigmoid = false;
  double sigmoid_bias = 0.0;
  OptArray alibi_slopes;
  OptArray rope_q_offset;
  OptArray rope_k_offset;
  std::string user_name;
  std::string user_source;
  VariantParamList user_params;
  bool user_use_softmax = true;
};

std::vector<tessera::VariantParam> variant_params(const VariantParamList& params);

/// The C++ options of `a` (null: the default variant). A user variant is built into `user`, which
/// the options point to: it must outlive the call.
tessera::VariantOptions variant_options(const VariantArgs* a, std::optional<tessera::VariantSpec>& user) {
  tessera::VariantOptions v;
  if (a == nullptr) return v;
  v.window_left = a->window_left;
  v.num_sink_tokens = a->num_sink_tokens;
  v.logits_soft_cap = a->logits_soft_cap;
  v.alibi_slopes = to_view(a->alibi_slopes, "alibi_slopes");
  v.sigmoid = a->sigmoid;
  v.sigmoid_bias = a->sigmoid_bias;
  v.rope.mode = a->pos_encoding;
  v.rope.scale = a->rope_scale;
  v.rope.theta = a->rope_theta;
  v.rope.llama31_factor = a->llama31_factor;
  v.rope.llama31_low_freq_factor = a->llama31_low_freq_factor;
  v.rope.llama31_high_freq_factor = a->llama31_high_freq_factor;
  v.rope.llama31_original_max_position = a->llama31_original_max_position;
  v.rope.q_offset = to_view(a->rope_q_offset, "q_rope_offset");
  v.rope.k_offset = to_view(a->rope_k_offset, "k_rope_offset");
  if (!a->user_name.empty()) {
    user.emplace();
    user->name = a->user_name;
    user->source = a->user_source;
    user->params = variant_params(a->user_params);
    user->use_softmax = a->user_use_softmax;
    v.user = &*user;
  }
  return v;
}

/// A runtime plan's custom mask: the packed bits on the device, the byte offsets on the host.
void set_custom_mask(tessera::VariantOptions& v, const OptArray& bits, const OptArray& byte_indptr) {
  v.custom_mask = to_view(bits, "custom_mask");
  v.custom_mask_indptr = to_view(byte_indptr, "custom_mask_indptr");
}

tessera::PlanShape plan_shape(int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim, DType dtype,
                              double sm_scale, bool causal, const tessera::VariantOptions& variant,
                              const std::optional<DType>& kv_dtype, const tessera::KVScales& scales,
                              int64_t head_dim_vo = 0) {
  tessera::PlanShape s;
  s.num_qo_heads = num_qo_heads;
  s.num_kv_heads = num_kv_heads;
  s.head_dim = head_dim;
  s.head_dim_vo = head_dim_vo;
  s.dtype = dtype;
  s.kv_dtype = kv_dtype;
  s.attention.sm_scale = sm_scale;
  s.attention.causal = causal;
  s.attention.variant = variant;
  s.attention.kv_scales = scales;
  return s;
}

nb::dict plan_info_dict(const tessera::PlanInfo& i) {
  nb::dict d;
  d["batch_size"] = i.batch_size;
  d["q_tile_rows"] = i.q_tile_rows;
  d["kv_tile_rows"] = i.kv_tile_rows;
  d["grid_cols"] = i.grid_cols;
  d["heads_per_cta"] = i.heads_per_cta;
  d["num_items"] = i.num_items;
  d["num_partials"] = i.num_partials;
  d["num_merges"] = i.num_merges;
  d["chunk_size"] = i.chunk_size;
  d["makespan"] = i.makespan;
  d["lower_bound"] = i.lower_bound;
  d["plan_bytes"] = i.plan_bytes;
  d["grouped_by_request"] = i.grouped_by_request;
  return d;
}

/// The paged cache of run(): separate K and V, or one combined tensor (exactly one of the two).
template <typename Opt>
tessera::PagedKVCache paged_cache(const Opt& k, const Opt& v, const Opt& kv, Layout layout,
                                  const TensorView& indices, const std::optional<DType>& kv_dtype) {
  if (kv) {
    const TensorView combined = as_kv(to_view(*kv, "paged_kv_cache"), kv_dtype);
    tessera::PagedKVCache c;
    checked([&] { c = tessera::PagedKVCache::from_combined(combined, layout, indices); });
    return c;
  }
  if (!k || !v) throw tessera::Error(StatusCode::kInvalidArgument, "paged_kv_cache: expected (k, v) or one tensor");
  tessera::PagedKVCache c;
  c.k = as_kv(to_view(*k, "paged_kv_cache[0]"), kv_dtype);
  c.v = as_kv(to_view(*v, "paged_kv_cache[1]"), kv_dtype);
  c.layout = layout;
  c.indices = indices;
  return c;
}

/// One level's paged cache as BatchCascadePagedWrapper.run() takes it from Python: (k, v, kv,
/// layout, indices), k and v or kv as for the other paged bindings' run().
using CascadeCacheArgs = std::tuple<OptRunArray, OptRunArray, OptRunArray, Layout, RunArray>;

/// `name`[`i`], the name of a list entry in conversion errors.
std::string entry_name(const char* name, size_t i) { return std::string(name) + "[" + std::to_string(i) + "]"; }

/// A user variant's parameters from Python: (name, value) pairs, value an int (i32), a float (f32)
/// or a device array (a tensor parameter, typed by its dtype).
std::vector<tessera::VariantParam> variant_params(const std::vector<std::pair<std::string, nb::object>>& params) {
  std::vector<tessera::VariantParam> out;
  out.reserve(params.size());
  for (const auto& [name, value] : params) {
    if (nb::isinstance<nb::bool_>(value)) {
      throw tessera::Error(StatusCode::kInvalidArgument, "variant parameter " + name + ": a bool, expected int, float or a tensor");
    } else if (nb::isinstance<nb::int_>(value)) {
      const int64_t v = nb::cast<int64_t>(value);
      if (v < INT32_MIN || v > INT32_MAX) {
        out.push_back(tessera::VariantParam::scalar_i64(name, v));
      } else {
        out.push_back(tessera::VariantParam::scalar_i32(name, static_cast<int32_t>(v)));
      }
    } else if (nb::isinstance<nb::float_>(value)) {
      out.push_back(tessera::VariantParam::scalar_f32(name, static_cast<float>(nb::cast<double>(value))));
    } else {
      out.push_back(tessera::VariantParam::device_tensor(name, to_view(nb::cast<Array>(value), name.c_str())));
    }
  }
  return out;
}

/// A user variant from the FlexAttention front end's generated mask / score functions (empty
/// function name: none); nullopt when neither is given.
std::optional<tessera::VariantSpec> flex_spec(const std::string& name, const std::string& mask_source,
                                              const std::string& mask_function, const std::string& score_source,
                                              const std::string& score_function,
                                              std::vector<tessera::VariantParam> params) {
  if (mask_function.empty() && score_function.empty()) return std::nullopt;
  const tessera::MaskMod mask{mask_source, mask_function};
  const tessera::ScoreMod score{score_source, score_function};
  tessera::VariantSpec spec;
  checked([&] {
    spec = tessera::flex_variant(name, mask_function.empty() ? nullptr : &mask,
                                 score_function.empty() ? nullptr : &score, std::move(params));
  });
  return spec;
}

/// The bounds a wrapper class takes, from the RuntimeBounds every Python-side runtime holder
/// builds (python/tessera/_runtime.py): the same struct, or MLA's, which reads max_batch_size,
/// max_total_qo_tokens and num_qo_heads (its heads; the shared latent is one KV head).
inline const tessera::RuntimeBounds& wrapper_bounds(const tessera::RuntimeBounds& b, const void*) { return b; }
inline tessera::MlaRuntimeBounds wrapper_bounds(const tessera::RuntimeBounds& b, const tessera::BatchMLAPagedWrapper*) {
  return tessera::MlaRuntimeBounds{b.max_batch_size, b.max_total_qo_tokens, b.num_qo_heads};
}

/// Whether W has min_workspace_size (the attention wrappers; not MLA's, whose workspace is fixed).
template <typename W, typename = void>
struct HasMinWorkspaceSize : std::false_type {};
template <typename W>
struct HasMinWorkspaceSize<W, std::void_t<decltype(W::min_workspace_size(std::declval<const tessera::RuntimeBounds&>(),
                                                                         std::declval<const tessera::RuntimeOptions&>()))>>
    : std::true_type {};

template <typename W>
void bind_common(nb::class_<W>& cls) {
  cls.def(
         "__init__",
         [](W* self, const Array& workspace, const tessera::RuntimeBounds& bounds,
            const tessera::RuntimeOptions& options) {
           const TensorView ws = to_view(workspace, "float_workspace_buffer");
           DeviceGuard guard(ws);
           checked([&] { new (self) W(ws, wrapper_bounds(bounds, static_cast<const W*>(nullptr)), options); });
         },
         "workspace"_a, "bounds"_a, "options"_a = tessera::RuntimeOptions{},
         HasMinWorkspaceSize<W>::value
             ? "Builds the wrapper over a caller-owned device workspace of at least min_workspace_size(bounds, "
               "options) bytes (below workspace_size it splits KV less; needs a GPU)."
             : "Builds the wrapper over a caller-owned device workspace of at least workspace_size(bounds, options) "
               "bytes (needs a GPU).")
      .def_static(
          "workspace_size",
          [](const tessera::RuntimeBounds& bounds, const tessera::RuntimeOptions& options, int device) {
            return workspace_bytes_on(device, [&] {
              return W::workspace_size(wrapper_bounds(bounds, static_cast<const W*>(nullptr)), options);
            });
          },
          "bounds"_a, "options"_a = tessera::RuntimeOptions{}, "device"_a = 0,
          "Bytes of device workspace a wrapper with these bounds needs on GPU `device`.");
  if constexpr (HasMinWorkspaceSize<W>::value) {
    cls.def_static(
        "min_workspace_size",
        [](const tessera::RuntimeBounds& bounds, const tessera::RuntimeOptions& options, int device) {
          return workspace_bytes_on(device, [&] { return W::min_workspace_size(bounds, options); });
        },
        "bounds"_a, "options"_a = tessera::RuntimeOptions{}, "device"_a = 0,
        "The smallest workspace a wrapper with these bounds takes on GPU `device` (below "
        "workspace_size it splits KV less).");
  }
  cls.def(
      "plan_info", [](const W& w) { return plan_info_dict(w.plan_info()); },
      "What the last plan() decided, as a dict (for tests, benchmarks and logs).");
}

/// set_variant_params(params) of the wrappers that take FlashInfer's JIT variants' run() arguments.
template <typename W>
void bind_set_variant_params(nb::class_<W>& cls) {
  cls.def(
      "set_variant_params",
      [](W& w, const VariantParamList& params) {
        const std::vector<tessera::VariantParam> vp = variant_params(params);
        checked([&] { w.set_variant_params(vp); });
      },
      "params"_a,
      "New values of the plan's user-variant parameters ((name, int | float | device array) pairs, the plan's "
      "names and kinds in its order) for the runs until the next plan().");
}

/// A view's fields, for tests: (data, device type, device id, dtype, shape, strides).
nb::tuple view_info(const TensorView& v) {
  nb::list shape, strides;
  for (int d = 0; d < v.ndim; ++d) {
    shape.append(v.shape[d]);
    strides.append(v.strides[d]);
  }
  return nb::make_tuple(reinterpret_cast<uintptr_t>(v.data), static_cast<int>(v.device.type), v.device.id,
                        static_cast<int>(v.dtype), nb::tuple(shape), nb::tuple(strides));
}

/// Pinned host memory and events of one GPU's index-array copies (copy_index_arrays): host
/// sources are copied into a slot here, then to the GPU asynchronously from it; a slot is written
/// again only once the copies out of it have completed (its event), so callers may modify or free
/// their host arrays as soon as the call returns, as after a copy from pageable memory. Made on a
/// GPU's first use and kept for the process (freeing pinned memory at exit could come after the
/// CUDA driver has shut down); `broken` when that failed (the copies then go through PyTorch).
struct HostStaging {
  static constexpr int kSlots = 16;                  // plans in flight before a slot must wait
  static constexpr size_t kSlotBytes = size_t{32} << 10;  // indptr + last_page_len up to 4095 requests
  char* host = nullptr;
  cudaEvent_t done[kSlots] = {};
  bool recorded[kSlots] = {};
  int next = 0;
  bool broken = false;
};

/// The staging of GPU `device` (the device current), made on first use; null when it cannot be made.
HostStaging* host_staging(int device) {
  static std::vector<HostStaging*> per_device;  // never freed (see HostStaging)
  if (device < 0 || device > 1 << 16) return nullptr;
  if (per_device.size() <= static_cast<size_t>(device)) per_device.resize(static_cast<size_t>(device) + 1, nullptr);
  HostStaging*& st = per_device[static_cast<size_t>(device)];
  if (st == nullptr) {
    st = new HostStaging;
    void* host = nullptr;
    if (cudaHostAlloc(&host, HostStaging::kSlotBytes * HostStaging::kSlots, cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();
      st->broken = true;
    } else {
      st->host = static_cast<char*>(host);
      for (auto& e : st->done) {
        if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
          cudaGetLastError();
          e = nullptr;
          st->broken = true;
        }
      }
    }
  }
  return st->broken ? nullptr : st;
}

/// Throws the CUDA error `err` of `what` (clearing it).
void throw_cuda(cudaError_t err, const char* what) {
  cudaGetLastError();
  throw tessera::Error(StatusCode::kCudaError, std::string("_copy_index_arrays: ") + what + " failed: " +
                                                   cudaGetErrorString(err));
}

/// One copy of copy_index_arrays: the first n entries of src into dst.
struct IndexCopy {
  TensorView dst, src;
  int64_t n = 0;
};

/// copy_index_arrays' conditions for one pair, else false: 1-D int32, n entries in each, stored
/// contiguously, dst on GPU `device` or in host memory, src in host memory or on GPU `device` (a
/// host dst takes a host src), the two ranges the same or disjoint.
bool copyable(const IndexCopy& c, int device) {
  for (const TensorView* t : {&c.dst, &c.src}) {
    if (t->ndim != 1 || t->dtype != DType::kI32 || t->shape[0] < c.n) return false;
    if (c.n > 1 && t->strides[0] != 1) return false;
    if (c.n > 0 && t->data == nullptr) return false;
    if (t->device.type == tessera::DeviceType::kCUDA && t->device.id != device) return false;
  }
  if (c.dst.device.is_host() && !c.src.device.is_host()) return false;
  const auto* d = static_cast<const char*>(c.dst.data);
  const auto* s = static_cast<const char*>(c.src.data);
  const int64_t bytes = c.n * 4;
  return d == s || d + bytes <= s || s + bytes <= d;
}

/// The copies of `copies` into host memory (memmove: a pair's ranges may be the same).
void copy_to_host(const std::vector<IndexCopy>& copies) {
  for (const IndexCopy& c : copies) {
    if (c.dst.device.is_host() && c.n > 0 && c.dst.data != c.src.data) {
      std::memmove(c.dst.data, c.src.data, static_cast<size_t>(c.n) * 4);
    }
  }
}

/// The copies of `copies` into device memory as one launch of tessera::copy_index_arrays (host
/// values in the launch's parameters: no staging, no event), with GPU `device` current: false,
/// with nothing enqueued, when they do not fit one launch or break its stricter rules (pairs whose
/// ranges overlap another pair's); a CUDA error is raised.
bool launch_index_copies(const std::vector<IndexCopy>& copies, cudaStream_t stream) {
  std::vector<tessera::IndexArrayCopy> device_copies;
  for (const IndexCopy& c : copies) {
    if (c.dst.device.is_host() || c.n == 0 || c.dst.data == c.src.data) continue;
    device_copies.push_back({c.dst, c.src, c.n});
  }
  struct Ctx {
    const std::vector<tessera::IndexArrayCopy>* copies;
    cudaStream_t stream;
    bool done;
  } ctx{&device_copies, stream, false};
  const tessera::Status status = tessera::call_catching(
      [](void* p) {
        auto* x = static_cast<Ctx*>(p);
        x->done = tessera::copy_index_arrays(x->copies->data(), static_cast<int>(x->copies->size()),
                                             reinterpret_cast<tessera::StreamHandle>(x->stream));
      },
      &ctx);
  if (status.code == StatusCode::kInvalidArgument) return false;
  if (!status.ok()) throw tessera::Error(status.code, std::string("_copy_index_arrays: ") + status.message);
  return ctx.done;
}

/// The graph-mode page-table copies of a plan (python/tessera/decode.py, prefill.py): up to four
/// (dst, src, n) copies on `stream` of GPU `device`, in one call instead of a torch copy_ each: one
/// kernel launch when they fit it (launch_index_copies), else host sources through pinned staging
/// (HostStaging) and device sources device to device; host destinations by memmove. All or
/// nothing: false, with nothing copied, when a pair does not meet `copyable`, the
/// host sources do not fit a staging slot, the staging cannot be made, or the stream is capturing
/// (a captured copy would read the staging slot at every replay); the caller then copies with
/// PyTorch. n must be >= 0 (ValueError).
bool copy_index_arrays(uintptr_t stream, int device, const std::vector<IndexCopy>& copies) {
  bool to_device = false;
  size_t staged = 0;
  for (const IndexCopy& c : copies) {
    if (c.n < 0 || c.n >= INT32_MAX) {
      throw tessera::Error(StatusCode::kInvalidArgument, "_copy_index_arrays: n = " + std::to_string(c.n) +
                                                             ", expected 0 <= n < 2^31");
    }
    if (!copyable(c, device)) return false;
    if (c.dst.device.is_host() || c.n == 0 || c.dst.data == c.src.data) continue;
    to_device = true;
    if (c.src.device.is_host()) staged += (static_cast<size_t>(c.n) * 4 + 15) / 16 * 16;
  }
  if (staged > HostStaging::kSlotBytes) return false;
  // Everything that can still refuse comes before the first copy.
  static std::mutex mutex;  // the staging slots (the GIL is held, but free-threaded builds have none)
  std::unique_lock<std::mutex> lock(mutex, std::defer_lock);
  std::optional<DeviceGuard> guard;
  const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  HostStaging* st = nullptr;
  int slot = 0;
  if (to_device) {
    TensorView probe;
    probe.device = tessera::Device::cuda(device);
    guard.emplace(probe);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (const cudaError_t err = cudaStreamIsCapturing(s, &capture); err != cudaSuccess) {
      throw_cuda(err, "cudaStreamIsCapturing");
    }
    if (capture != cudaStreamCaptureStatusNone) return false;
    if (launch_index_copies(copies, s)) {
      copy_to_host(copies);
      return true;
    }
    if (staged > 0) {
      lock.lock();
      st = host_staging(device);
      if (st == nullptr) return false;
      slot = st->next;
      if (st->recorded[slot]) {
        if (const cudaError_t err = cudaEventSynchronize(st->done[slot]); err != cudaSuccess) {
          throw_cuda(err, "cudaEventSynchronize");
        }
      }
    }
  }
  copy_to_host(copies);
  if (!to_device) return true;
  size_t offset = 0;
  cudaError_t failed = cudaSuccess;
  for (const IndexCopy& c : copies) {
    if (c.dst.device.is_host() || c.n == 0 || c.dst.data == c.src.data) continue;
    const size_t bytes = static_cast<size_t>(c.n) * 4;
    const void* from = c.src.data;
    cudaMemcpyKind kind = cudaMemcpyDeviceToDevice;
    if (c.src.device.is_host()) {
      char* at = st->host + static_cast<size_t>(slot) * HostStaging::kSlotBytes + offset;
      std::memcpy(at, c.src.data, bytes);
      offset += (bytes + 15) / 16 * 16;
      from = at;
      kind = cudaMemcpyHostToDevice;
    }
    failed = cudaMemcpyAsync(c.dst.data, from, bytes, kind, s);
    if (failed != cudaSuccess) break;
  }
  if (st != nullptr) {
    // Recorded after a failed copy too: copies enqueued before it may still read the slot.
    const cudaError_t err = cudaEventRecord(st->done[slot], s);
    st->recorded[slot] = err == cudaSuccess;
    st->next = (slot + 1) % HostStaging::kSlots;
    if (failed == cudaSuccess && err != cudaSuccess) failed = err;
  }
  if (failed != cudaSuccess) throw_cuda(failed, "an asynchronous copy");
  return true;
}

nb::dict device_properties(int device) {
  cudaDeviceProp prop{};
  const cudaError_t err = cudaGetDeviceProperties(&prop, device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw tessera::Error(StatusCode::kCudaError, std::string("cudaGetDeviceProperties(") + std::to_string(device) +
                                                     ") failed: " + cudaGetErrorString(err));
  }
  nb::dict d;
  d["name"] = std::string(prop.name);
  d["major"] = prop.major;
  d["minor"] = prop.minor;
  d["multi_processor_count"] = prop.multiProcessorCount;
  d["total_memory"] = static_cast<int64_t>(prop.totalGlobalMem);
  return d;
}

/// The four [nnz, heads, head_dim] tensors of the standalone RoPE bindings.
struct RopeViews {
  TensorView q, k, q_rope, k_rope;
  RopeViews(const Array& q_, const Array& k_, const Array& q_rope_, const Array& k_rope_)
      : q(to_view(q_, "q")), k(to_view(k_, "k")), q_rope(to_view(q_rope_, "q_rope")), k_rope(to_view(k_rope_, "k_rope")) {}
};

tessera::ApplyRopeOptions rope_options(int64_t rotary_dim, bool interleave, double rope_scale, double rope_theta) {
  tessera::ApplyRopeOptions o;
  o.rotary_dim = rotary_dim;
  o.interleave = interleave;
  o.rope_scale = rope_scale;
  o.rope_theta = rope_theta;
  return o;
}

tessera::ApplyLlama31RopeOptions llama31_rope_options(int64_t rotary_dim, bool interleave, double rope_scale,
                                                      double rope_theta, double low_freq_factor,
                                                      double high_freq_factor, double old_context_len) {
  tessera::ApplyLlama31RopeOptions o;
  o.rotary_dim = rotary_dim;
  o.interleave = interleave;
  o.rope_scale = rope_scale;
  o.rope_theta = rope_theta;
  o.low_freq_factor = low_freq_factor;
  o.high_freq_factor = high_freq_factor;
  o.old_context_len = old_context_len;
  return o;
}

/// The view of a direct RunArray, or false (nothing raised) when the library refuses it (a dtype
/// or layout it has no view of): the fast run's "not the common case".
bool try_view(const RunArray& a, TensorView& view) {
  if (!a.direct) return false;
  const DLTensor t = dl_tensor_of(a);
  struct Ctx {
    const DLTensor* t;
    TensorView* view;
  } ctx{&t, &view};
  return tessera::call_catching([](void* c) {
           auto* x = static_cast<Ctx*>(c);
           *x->view = tessera::from_dlpack(*x->t);
         },
         &ctx)
      .ok();
}

/// A paged runtime wrapper's run(q, paged_kv_cache[, out]) in its common case, in one call of the
/// bindings (W12: the host time of run() is the step time of small batches without CUDA Graphs):
/// made by plan() (python/tessera/decode.py, _paged_fast_run) with what the plan fixes (dtypes,
/// head counts and dims, a page's shape in the layout, the page ids run() reads) and called with
/// run()'s arguments. It reads the tensors through PyTorch's DLPack exchange table, allocates a
/// missing `out` with torch.empty_like (what the Python path does) and launches on PyTorch's
/// current stream of the plan's GPU (the exchange table's current_work_stream).
///
/// It returns out, or None with nothing done when anything is not the common case: an argument
/// that is not exactly a torch.Tensor (or a (k, v) tuple of them), a dtype, shape or device other
/// than the plan's, a PyTorch without the exchange table, a failed allocation. The Python path
/// then checks the arguments and names what is wrong. What the library checks itself (strides,
/// page ids on the GPU in checked mode) raises here as there.
class PagedFastRun {
 public:
  /// Runs the wrapper `wrapper` (the C++ object `owner` holds, kept alive) with q, the cache and o
  /// on `stream`.
  using RunFn = void (*)(void* wrapper, const TensorView& q, const tessera::PagedKVCache& kv, const TensorView& o,
                         tessera::StreamHandle stream);

  PagedFastRun(nb::object owner, void* wrapper, RunFn run, nb::object indices, nb::object host_ids, int device,
               DType dtype, DType kv_dtype, int64_t num_qo_heads, int64_t head_dim, int64_t head_dim_vo,
               int64_t q_rows, std::array<int64_t, 3> k_page, std::array<int64_t, 3> v_page, Layout layout,
               nb::object empty_like, nb::object contiguous_format)  // torch's, for allocate_out
      : owner_(std::move(owner)), wrapper_(wrapper), run_(run), indices_(std::move(indices)),
        host_ids_(std::move(host_ids)), device_(device), dtype_(dtype), kv_dtype_(kv_dtype), hq_(num_qo_heads),
        d_(head_dim), dv_(head_dim_vo), q_rows_(q_rows), k_page_(k_page), v_page_(v_page), layout_(layout),
        empty_like_(std::move(empty_like)), contiguous_format_(std::move(contiguous_format)),
        memory_format_kwnames_(nb::make_tuple("memory_format")), new_empty_name_(nb::str("new_empty")) {
    indices_view_ = to_view(nb::cast<RunArray>(indices_), "indices");
    TensorView probe;
    probe.dtype = dtype_;
    checked([&] { out_dtype_ = tessera::to_dlpack(probe).dtype; });
  }

  nb::object operator()(nb::handle q, nb::handle cache, nb::handle out) {
    const TorchExchange& torch = torch_exchange();
    if (torch.api == nullptr || torch.api->current_work_stream == nullptr) return nb::none();
    TensorView tq, to;
    if (!tensor(q, tq) || tq.dtype != dtype_ || tq.ndim != 3 || tq.shape[1] != hq_ || tq.shape[2] != d_ ||
        (q_rows_ >= 0 && tq.shape[0] != q_rows_)) {
      return nb::none();
    }
    const int64_t rows = tq.shape[0];
    const bool allocate = out.is_none();
    if (!allocate && (!tensor(out, to) || to.dtype != dtype_ || to.ndim != 3 || to.shape[0] != rows ||
                      to.shape[1] != hq_ || to.shape[2] != dv_)) {
      return nb::none();
    }
    tessera::PagedKVCache kv;
    if (!paged_cache(cache, kv)) return nb::none();
    const int64_t num_pages = kv.k.shape[0];
    if (!host_ids_.is_none() && num_pages != checked_pages_) {
      host_ids_.attr("check")(num_pages);  // page ids plan() had on the host, against this cache (raises)
      checked_pages_ = num_pages;
    }
    void* stream = nullptr;
    if (torch.api->current_work_stream(kDLCUDA, device_, &stream) != 0) {
      PyErr_Clear();
      return nb::none();
    }
    nb::object result = nb::borrow(out);
    if (allocate && !allocate_out(q, rows, result, to)) return nb::none();
    DeviceGuard guard(tq);
    nb::gil_scoped_release release;
    checked([&] { run_(wrapper_, tq, kv, to, reinterpret_cast<tessera::StreamHandle>(stream)); });
    return result;
  }

 private:
  /// The view of `o` when it is exactly a torch.Tensor on the plan's GPU.
  bool tensor(nb::handle o, TensorView& view) const {
    RunArray a;
    return torch_dltensor(o.ptr(), a) && try_view(a, view) && view.device.type == tessera::DeviceType::kCUDA &&
           view.device.id == device_;
  }

  /// One page of K (V) in the layout: shape[first..first + 2] == page.
  static bool page_is(const TensorView& t, int first, const std::array<int64_t, 3>& page) {
    return t.shape[first] == page[0] && t.shape[first + 1] == page[1] && t.shape[first + 2] == page[2];
  }

  /// The cache as (k, v) of the plan's page shapes, or one [pages, 2, ...] tensor where K and V
  /// pages have one shape.
  bool paged_cache(nb::handle cache, tessera::PagedKVCache& kv) const {
    if (PyTuple_CheckExact(cache.ptr()) && PyTuple_GET_SIZE(cache.ptr()) == 2) {
      TensorView k, v;
      if (!tensor(PyTuple_GET_ITEM(cache.ptr(), 0), k) || !tensor(PyTuple_GET_ITEM(cache.ptr(), 1), v) ||
          k.dtype != kv_dtype_ || v.dtype != kv_dtype_ || k.ndim != 4 || v.ndim != 4 || v.shape[0] != k.shape[0] ||
          !page_is(k, 1, k_page_) || !page_is(v, 1, v_page_)) {
        return false;
      }
      kv.k = k;
      kv.v = v;
      kv.layout = layout_;
      kv.indices = indices_view_;
      return true;
    }
    TensorView combined;
    if (k_page_ != v_page_ || !tensor(cache, combined) || combined.dtype != kv_dtype_ || combined.ndim != 5 ||
        combined.shape[1] != 2 || !page_is(combined, 2, k_page_)) {
      return false;
    }
    struct Ctx {
      const TensorView* combined;
      const PagedFastRun* self;
      tessera::PagedKVCache* kv;
    } ctx{&combined, this, &kv};
    return tessera::call_catching(
               [](void* c) {
                 auto* x = static_cast<Ctx*>(c);
                 *x->kv = tessera::PagedKVCache::from_combined(*x->combined, x->self->layout_, x->self->indices_view_);
               },
               &ctx)
        .ok();
  }

  /// A new contiguous [rows, Hq, Dv] output of q's dtype on q's device, as torch.empty_like(q,
  /// memory_format=torch.contiguous_format) makes it (q.new_empty((rows, Hq, Dv)) when Dv != D), in
  /// `result`, and its view in `view`; false, with no Python error set, when that fails (the
  /// Python path then allocates and reports). Called through the Python C API rather than the
  /// exchange table's allocator: its DLPack round trip (export, import with a deleter) measured
  /// slower than the call (W12, bench/results/LOG.md, session 37).
  bool allocate_out(nb::handle q, int64_t rows, nb::object& result, TensorView& view) const {
    PyObject* made = nullptr;
    if (dv_ == d_) {
      PyObject* args[2] = {q.ptr(), contiguous_format_.ptr()};
      made = PyObject_Vectorcall(empty_like_.ptr(), args, 1, memory_format_kwnames_.ptr());
    } else {
      nb::object shape = nb::make_tuple(rows, hq_, dv_);
      PyObject* args[2] = {q.ptr(), shape.ptr()};
      made = PyObject_VectorcallMethod(new_empty_name_.ptr(), args, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr);
    }
    if (made == nullptr) {
      PyErr_Clear();
      return false;
    }
    result = nb::steal(made);
    return tensor(result, view);
  }

  nb::object owner_;
  void* wrapper_;
  RunFn run_;
  nb::object indices_;       // the page ids run() reads (kept alive)
  TensorView indices_view_;  // [pages of the plan], int32, on the GPU (or pinned host memory)
  nb::object host_ids_;      // tessera._utils.HostPageIds of ids given on the host, or None
  int64_t checked_pages_ = -1;
  int device_;
  DType dtype_, kv_dtype_;
  DLDataType out_dtype_{};  // dtype_ in DLPack's terms
  int64_t hq_, d_, dv_, q_rows_;  // q_rows_ -1: any
  std::array<int64_t, 3> k_page_, v_page_;
  Layout layout_;
  nb::object empty_like_, contiguous_format_;  // torch.empty_like, torch.contiguous_format
  nb::object memory_format_kwnames_, new_empty_name_;
};

/// The decode wrapper's plan(indptr, indices, last_page_len) in its common case, in one call of the
/// bindings (W12: a serving step plans once; the Python around the C++ planner and the graph-mode
/// page-table copies measured 16-23 and 10-11 µs on an H100 host, bench/results/LOG.md, session 40).
/// Made by plan() (python/tessera/decode.py, _DecodeFastPlan) after a plan of one configuration
/// (one query per request, the default variant, a 16-bit cache) with what that fixes: the plan
/// shape, the page size, the runtime's batch bound and, with use_cuda_graph, the page-table buffers.
///
/// Called with plan()'s page table, it returns (batch, pages) after copying the buffers (graph mode)
/// and planning on PyTorch's current stream of the plan's GPU, or None with nothing done when
/// anything is not the common case: an argument that is not exactly a torch.Tensor, indptr or
/// last_page_len not contiguous host int32 of batch + 1 / batch entries, indptr not starting at 0 or
/// decreasing, page ids not contiguous int32 on the plan's GPU or fewer than indptr[-1], a batch
/// above the runtime's bound or the buffers', a capturing stream. The Python path then checks the
/// arguments and names what is wrong. What the C++ planner checks (last_page_len's values) raises
/// here as there.
class DecodeFastPlan {
 public:
  DecodeFastPlan(nb::object owner, tessera::BatchDecodeWrapper* wrapper, int device, int64_t max_batch,
                 int64_t page_size, tessera::PlanShape shape, nb::object graph_indptr, nb::object graph_indices,
                 nb::object graph_last_page_len)
      : owner_(std::move(owner)), wrapper_(wrapper), device_(device), max_batch_(max_batch), page_size_(page_size),
        shape_(std::move(shape)), graph_(!graph_indices.is_none()), graph_objects_{std::move(graph_indptr),
                                                                                  std::move(graph_indices),
                                                                                  std::move(graph_last_page_len)} {
    if (graph_) {
      graph_indptr_ = to_view(nb::cast<RunArray>(graph_objects_[0]), "paged_kv_indptr_buffer");
      graph_indices_ = to_view(nb::cast<RunArray>(graph_objects_[1]), "paged_kv_indices_buffer");
      graph_last_page_len_ = to_view(nb::cast<RunArray>(graph_objects_[2]), "paged_kv_last_page_len_buffer");
    }
  }

  nb::object operator()(nb::handle indptr, nb::handle indices, nb::handle last_page_len) {
    const TorchExchange& torch = torch_exchange();
    if (torch.api == nullptr || torch.api->current_work_stream == nullptr) return nb::none();
    TensorView ip, lp, ids;
    if (!index_array(indptr, ip, false) || ip.shape[0] < 1) return nb::none();
    const int64_t batch = ip.shape[0] - 1;
    if (!index_array(last_page_len, lp, false) || lp.shape[0] != batch || batch > max_batch_) return nb::none();
    const auto* offsets = static_cast<const int32_t*>(ip.data);
    if (offsets[0] != 0) return nb::none();
    for (int64_t b = 0; b < batch; ++b) {
      if (offsets[b + 1] < offsets[b]) return nb::none();
    }
    const int64_t pages = offsets[batch];
    if (!index_array(indices, ids, true) || ids.shape[0] < pages) return nb::none();
    void* stream = nullptr;
    if (torch.api->current_work_stream(kDLCUDA, device_, &stream) != 0) {
      PyErr_Clear();
      return nb::none();
    }
    const uintptr_t stream_handle = reinterpret_cast<uintptr_t>(stream);
    if (graph_) {
      if (batch >= graph_indptr_.shape[0] || batch > graph_last_page_len_.shape[0] || pages > graph_indices_.shape[0]) {
        return nb::none();
      }
      const std::vector<IndexCopy> copies = {
          {graph_indices_, ids, pages}, {graph_indptr_, ip, batch + 1}, {graph_last_page_len_, lp, batch}};
      if (!copy_index_arrays(stream_handle, device_, copies)) return nb::none();
    }
    plan_on(device_, [&] { wrapper_->plan(ip, lp, page_size_, shape_, to_stream(stream_handle)); });
    return nb::make_tuple(batch, pages);
  }

 private:
  /// The view of `o` when it is exactly a contiguous 1-D int32 torch.Tensor, on the plan's GPU
  /// (on_device) or in pageable host memory.
  bool index_array(nb::handle o, TensorView& view, bool on_device) const {
    RunArray a;
    if (!torch_dltensor(o.ptr(), a) || !try_view(a, view)) return false;
    const bool where = on_device ? view.device.type == tessera::DeviceType::kCUDA && view.device.id == device_
                                 : view.device.type == tessera::DeviceType::kCPU;
    return where && view.dtype == DType::kI32 && view.ndim == 1 && (view.shape[0] <= 1 || view.strides[0] == 1) &&
           (view.shape[0] == 0 || view.data != nullptr);
  }

  nb::object owner_;  // the Python object of wrapper_ (kept alive)
  tessera::BatchDecodeWrapper* wrapper_;
  int device_;
  int64_t max_batch_, page_size_;
  tessera::PlanShape shape_;
  bool graph_;
  nb::object graph_objects_[3];  // indptr, indices, last_page_len buffers (kept alive)
  TensorView graph_indptr_, graph_indices_, graph_last_page_len_;
};

/// W's run() as a PagedFastRun::RunFn.
template <typename W>
void run_paged_wrapper(void* w, const TensorView& q, const tessera::PagedKVCache& kv, const TensorView& o,
                       tessera::StreamHandle stream) {
  static_cast<W*>(w)->run(q, kv, o, TensorView{}, stream);
}

/// W.fast_run(...): the PagedFastRun of the plan just made.
template <typename W>
void bind_fast_run(nb::class_<W>& cls) {
  cls.def(
      "fast_run",
      [](nb::object self, nb::object indices, nb::object host_ids, int device, DType dtype, DType kv_dtype,
         int64_t num_qo_heads, int64_t head_dim, int64_t head_dim_vo, int64_t q_rows, std::array<int64_t, 3> k_page,
         std::array<int64_t, 3> v_page, Layout layout, nb::object empty_like, nb::object contiguous_format) {
        W* w = nb::cast<W*>(self);
        return PagedFastRun(self, w, &run_paged_wrapper<W>, std::move(indices), std::move(host_ids), device, dtype,
                            kv_dtype, num_qo_heads, head_dim, head_dim_vo, q_rows, k_page, v_page, layout,
                            std::move(empty_like), std::move(contiguous_format));
      },
      "indices"_a, "host_ids"_a.none(), "device"_a, "dtype"_a, "kv_dtype"_a, "num_qo_heads"_a, "head_dim"_a,
      "head_dim_vo"_a, "q_rows"_a, "k_page"_a, "v_page"_a, "layout"_a, "empty_like"_a, "contiguous_format"_a,
      "Private (python/tessera/decode.py): the PagedFastRun of this plan: run(q, paged_kv_cache[, out]) in one "
      "call for 16-bit q and K/V of these dtypes and shapes (q_rows -1: any), the page ids `indices` (kept alive), "
      "host_ids (an object whose check(num_pages) checks page ids given on the host) or None; outputs from "
      "empty_like(q, memory_format=contiguous_format) (torch's).");
}

}  // namespace


/// plan() and run() of the paged prefill wrappers, which take the same arguments
/// (BatchPrefillPagedWrapper; BatchPODPagedWrapper, whose C++ plan() refuses what it cannot run).
template <typename W>
void bind_paged_prefill_plan_run(nb::class_<W>& cls) {
  cls
      .def(
          "plan",
          [](W& w, const RunArray& qo_indptr, const RunArray& kv_indptr,
             const RunArray& last_page_len, int64_t page_size, int64_t num_qo_heads, int64_t num_kv_heads,
             int64_t head_dim, DType dtype, double sm_scale, bool causal, uintptr_t stream, int device,
             const VariantArgs* variant_args, const std::optional<DType>& kv_dtype, double k_scale, double v_scale,
             const OptArray& k_scale_device, const OptArray& v_scale_device, int64_t head_dim_vo,
             const OptArray& custom_mask, const OptArray& custom_mask_indptr, double q_scale,
             const OptArray& q_scale_device) {
            const TensorView qi = to_view(qo_indptr, "qo_indptr"), ip = to_view(kv_indptr, "paged_kv_indptr"),
                             lp = to_view(last_page_len, "paged_kv_last_page_len");
            const tessera::KVScales scales =
                kv_scales(k_scale, v_scale, k_scale_device, v_scale_device, q_scale, q_scale_device);
            std::optional<tessera::VariantSpec> user;
            tessera::VariantOptions variant = variant_options(variant_args, user);
            set_custom_mask(variant, custom_mask, custom_mask_indptr);
            plan_on(device, [&] {
              w.plan(qi, ip, lp, page_size,
                     plan_shape(num_qo_heads, num_kv_heads, head_dim, dtype, sm_scale, causal, variant, kv_dtype, scales,
                                head_dim_vo),
                     to_stream(stream));
            });
          },
          "qo_indptr"_a, "kv_indptr"_a, "last_page_len"_a, "page_size"_a, "num_qo_heads"_a, "num_kv_heads"_a,
          "head_dim"_a, "dtype"_a, "sm_scale"_a, "causal"_a, "stream"_a, "device"_a, nb::kw_only(),
          "variant"_a.none() = nb::none(), "kv_dtype"_a.none() = nb::none(), "k_scale"_a = 1.0, "v_scale"_a = 1.0,
          "k_scale_device"_a.none() = nb::none(), "v_scale_device"_a.none() = nb::none(), "head_dim_vo"_a = 0,
          "custom_mask"_a.none() = nb::none(), "custom_mask_indptr"_a.none() = nb::none(), "q_scale"_a = 1.0,
          "q_scale_device"_a.none() = nb::none(),
          "Plans a step from HOST int32 qo_indptr, kv_indptr [B + 1] and last_page_len [B]. Keyword options as "
          "for BatchDecodeWrapper.plan; head_dim_vo: v's and o's head dim (0: head_dim); custom_mask: u8 packed "
          "bits on the device with custom_mask_indptr, HOST int32 [B + 1] byte offsets; FP8 attention (dtype and "
          "kv_dtype e4m3): q_scale / q_scale_device, q's scale, as k_scale.")
      .def(
          "run",
          [](W& w, const RunArray& q, const OptRunArray& k, const OptRunArray& v,
             const OptRunArray& kv, Layout layout, const RunArray& indices, const RunArray& o, const OptRunArray& lse,
             uintptr_t stream, const std::optional<DType>& kv_dtype, const std::optional<DType>& q_dtype) {
            const TensorView tq = as_kv(to_view(q, "q"), q_dtype), to = to_view(o, "out"), tl = to_view(lse, "lse");
            const tessera::PagedKVCache cache = paged_cache(k, v, kv, layout, to_view(indices, "indices"), kv_dtype);
            DeviceGuard guard(tq);
            nb::gil_scoped_release release;
            checked([&] { w.run(tq, cache, to, tl, to_stream(stream)); });
          },
          "q"_a, "k"_a.none(), "v"_a.none(), "kv"_a.none(), "layout"_a, "indices"_a, "o"_a, "lse"_a.none(),
          "stream"_a, nb::kw_only(), "kv_dtype"_a.none() = nb::none(), "q_dtype"_a.none() = nb::none(),
          "Runs the planned step: q [rows, Hq, D] -> o, lse [rows, Hq] (base 2). FP8 attention: q as u8 with "
          "q_dtype e4m3, o f16/bf16.");
}

namespace {

/// The enums (status codes, dtypes, layouts, runtime options) and the plain structs (variant arguments, runtime bounds and options).
void bind_enums_and_structs(nb::module_& m) {
  nb::enum_<StatusCode>(m, "StatusCode",
                        "tessera::StatusCode, the `status_code` of every exception the library raises "
                        "(invalid_argument: ValueError, unsupported: NotImplementedError, cuda_error and "
                        "internal: RuntimeError).")
      .value("ok", StatusCode::kOk)
      .value("invalid_argument", StatusCode::kInvalidArgument)
      .value("unsupported", StatusCode::kUnsupported)
      .value("cuda_error", StatusCode::kCudaError)
      .value("internal", StatusCode::kInternal);
  nb::enum_<DType>(m, "DType", "Element types (tessera/dtype.h).")
      .value("f16", DType::kF16)
      .value("bf16", DType::kBF16)
      .value("f32", DType::kF32)
      .value("e4m3", DType::kE4M3)
      .value("e5m2", DType::kE5M2)
      .value("i32", DType::kI32)
      .value("u8", DType::kU8)
      .value("i64", DType::kI64);
  nb::enum_<Layout>(m, "Layout", "Paged KV layouts: NHD [pages, slot, head, dim], HND [pages, head, slot, dim].")
      .value("NHD", Layout::kNHD)
      .value("HND", Layout::kHND);
  nb::enum_<tessera::SplitKV>(m, "SplitKV", "How the runtime splits long KV ranges (tessera/runtime.h).")
      .value("auto", tessera::SplitKV::kAuto)
      .value("fixed", tessera::SplitKV::kFixed)
      .value("none", tessera::SplitKV::kNone);
  nb::enum_<tessera::QueryTile>(m, "QueryTile", "Query tile of the runtime's kernels (tessera/runtime.h).")
      .value("auto", tessera::QueryTile::kAuto)
      .value("t16", tessera::QueryTile::k16)
      .value("t64", tessera::QueryTile::k64)
      .value("t128", tessera::QueryTile::k128);
  nb::enum_<tessera::PosEncoding>(m, "PosEncoding",
                                  "Rotary position embedding fused into the attention kernels (tessera/variant.h).")
      .value("none", tessera::PosEncoding::kNone)
      .value("rope_llama", tessera::PosEncoding::kRopeLlama)
      .value("rope_llama31", tessera::PosEncoding::kRopeLlama31);
  nb::class_<VariantArgs>(m, "VariantArgs",
                          "The variant of one call or plan (tessera::VariantOptions with an optional user "
                          "tessera::VariantSpec), the `variant` keyword of the attention entry points; the C++ "
                          "library checks the values. Tensors: alibi_slopes f32 [Hq], rope_q_offset / "
                          "rope_k_offset i32 [batch], on the device of q; user_params (name, int | float | "
                          "device tensor) pairs. Empty user_name: no user variant.")
      .def(
          "__init__",
          [](VariantArgs* self, int64_t window_left, int64_t num_sink_tokens, double logits_soft_cap,
             tessera::PosEncoding pos_encoding, double rope_scale, double rope_theta, double llama31_factor,
             double llama31_low_freq_factor, double llama31_high_freq_factor, double llama31_original_max_position,
             bool sigmoid, double sigmoid_bias, const OptArray& alibi_slopes, const OptArray& rope_q_offset,
             const OptArray& rope_k_offset, const std::string& user_name, const std::string& user_source,
             const VariantParamList& user_params, bool user_use_softmax) {
            new (self) VariantArgs{window_left, num_sink_tokens, logits_soft_cap, pos_encoding, rope_scale,
                                   rope_theta, llama31_factor, llama31_low_freq_factor, llama31_high_freq_factor,
                                   llama31_original_max_position, sigmoid, sigmoid_bias, alibi_slopes,
                                   rope_q_offset, rope_k_offset, user_name, user_source, user_params,
                                   user_use_softmax};
          },
          nb::kw_only(), "window_left"_a = -1, "num_sink_tokens"_a = 0, "logits_soft_cap"_a = 0.0,
          "pos_encoding"_a = tessera::PosEncoding::kNone, "rope_scale"_a = 1.0, "rope_theta"_a = 1e4,
          "llama31_factor"_a = 8.0, "llama31_low_freq_factor"_a = 1.0, "llama31_high_freq_factor"_a = 4.0,
          "llama31_original_max_position"_a = 8192.0, "sigmoid"_a = false, "sigmoid_bias"_a = 0.0,
          "alibi_slopes"_a.none() = nb::none(), "rope_q_offset"_a.none() = nb::none(),
          "rope_k_offset"_a.none() = nb::none(), "user_name"_a = "", "user_source"_a = "",
          "user_params"_a = VariantParamList{}, "user_use_softmax"_a = true)
      .def_ro("window_left", &VariantArgs::window_left)
      .def_ro("num_sink_tokens", &VariantArgs::num_sink_tokens)
      .def_ro("logits_soft_cap", &VariantArgs::logits_soft_cap)
      .def_ro("pos_encoding", &VariantArgs::pos_encoding)
      .def_ro("rope_scale", &VariantArgs::rope_scale)
      .def_ro("rope_theta", &VariantArgs::rope_theta)
      .def_ro("llama31_factor", &VariantArgs::llama31_factor)
      .def_ro("llama31_low_freq_factor", &VariantArgs::llama31_low_freq_factor)
      .def_ro("llama31_high_freq_factor", &VariantArgs::llama31_high_freq_factor)
      .def_ro("llama31_original_max_position", &VariantArgs::llama31_original_max_position)
      .def_ro("sigmoid", &VariantArgs::sigmoid)
      .def_ro("sigmoid_bias", &VariantArgs::sigmoid_bias)
      .def_ro("user_name", &VariantArgs::user_name)
      .def_ro("user_use_softmax", &VariantArgs::user_use_softmax);

  nb::class_<tessera::RuntimeBounds>(m, "RuntimeBounds", "Upper bounds a runtime wrapper is built for.")
      .def(nb::init<>())
      .def_rw("max_batch_size", &tessera::RuntimeBounds::max_batch_size)
      .def_rw("max_total_qo_tokens", &tessera::RuntimeBounds::max_total_qo_tokens)
      .def_rw("num_qo_heads", &tessera::RuntimeBounds::num_qo_heads)
      .def_rw("num_kv_heads", &tessera::RuntimeBounds::num_kv_heads)
      .def_rw("head_dim", &tessera::RuntimeBounds::head_dim)
      .def_rw("head_dim_vo", &tessera::RuntimeBounds::head_dim_vo);
  nb::class_<tessera::RuntimeOptions>(m, "RuntimeOptions", "Options of a runtime wrapper, fixed at construction.")
      .def(nb::init<>())
      .def_rw("cuda_graph", &tessera::RuntimeOptions::cuda_graph)
      .def_rw("split_kv", &tessera::RuntimeOptions::split_kv)
      .def_rw("fixed_split_size", &tessera::RuntimeOptions::fixed_split_size)
      .def_rw("sm_budget", &tessera::RuntimeOptions::sm_budget)
      .def_rw("q_tile", &tessera::RuntimeOptions::q_tile)
      .def_rw("dtype", &tessera::RuntimeOptions::dtype)
      .def_rw("kv_dtype", &tessera::RuntimeOptions::kv_dtype);
  nb::class_<tessera::PodOptions>(m, "PodOptions",
                                  "Options of a BatchPODPagedWrapper, fixed at construction (decode_sms 0: chosen "
                                  "per plan).")
      .def(nb::init<>())
      .def_rw("cuda_graph", &tessera::PodOptions::cuda_graph)
      .def_rw("dtype", &tessera::PodOptions::dtype)
      .def_rw("decode_sms", &tessera::PodOptions::decode_sms)
      .def_rw("split_kv", &tessera::PodOptions::split_kv)
      .def_rw("fixed_split_size", &tessera::PodOptions::fixed_split_size);
  nb::class_<tessera::PodPlanInfo>(m, "PodPlanInfo",
                                   "What the last BatchPODPagedWrapper.plan() decided (read-only): the requests and "
                                   "CTAs of each side, and each side's plan as the dict the other wrappers' "
                                   "plan_info() returns (grid_cols 0: no CTAs on that side).")
      .def_ro("num_prefill_requests", &tessera::PodPlanInfo::num_prefill_requests)
      .def_ro("num_decode_requests", &tessera::PodPlanInfo::num_decode_requests)
      .def_ro("prefill_ctas", &tessera::PodPlanInfo::prefill_ctas)
      .def_ro("decode_ctas", &tessera::PodPlanInfo::decode_ctas)
      .def_ro("decode_copies", &tessera::PodPlanInfo::decode_copies)
      .def_prop_ro("prefill", [](const tessera::PodPlanInfo& i) { return plan_info_dict(i.prefill); })
      .def_prop_ro("decode", [](const tessera::PodPlanInfo& i) { return plan_info_dict(i.decode); });
}

/// What the build holds and what the device can run.
void bind_build_and_device_info(nb::module_& m) {
  m.def("version", [] { return std::string(tessera::version_string()); },
        "Version of the linked libtessera (MAJOR.MINOR.PATCH).");
  m.def("cuda_archs", [] { return std::string(TESSERA_PY_CUDA_ARCHS); },
        "Comma-separated GPU architectures the kernels were compiled for (TESSERA_CUDA_ARCHS).");
  m.def("supported_head_dims", [] {
    std::vector<int64_t> dims(std::begin(tessera::kSupportedHeadDims), std::end(tessera::kSupportedHeadDims));
    return dims;
  }, "Head dimensions with compiled attention kernels.");
  m.def("supported_prefill_split_head_dims", [] {
    std::vector<std::pair<int64_t, int64_t>> pairs;
    for (const auto& p : tessera::kSupportedPrefillSplitHeadDims) pairs.emplace_back(p[0], p[1]);
    return pairs;
  }, "(head_dim_qk, head_dim_vo) pairs of different head dims that prefill is built for.");
  m.def("cuda_runtime_version", [] {
    int v = 0;
    if (cudaRuntimeGetVersion(&v) != cudaSuccess) cudaGetLastError();
    return v;
  }, "Version of the CUDA runtime in use (1000 * major + 10 * minor).");
  m.def("cuda_driver_version", [] {
    int v = 0;
    if (cudaDriverGetVersion(&v) != cudaSuccess) cudaGetLastError();
    return v;
  }, "CUDA version the installed driver supports (0 when there is no driver).");
  m.def("cuda_device_count", [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  }, "Number of CUDA GPUs visible (0 when there is none or no driver).");
  m.def("cuda_unavailable_reason", [] { return tessera::cuda_unavailable_reason(); },
        "'' when a CUDA GPU is usable; otherwise why not and what to do (\"no CUDA driver: ...\" or "
        "\"no CUDA device: ...\"), the message every GPU entry point raises on such a machine.");
  m.def("cuda_device_properties", &device_properties, "device"_a,
        "name, compute capability (major, minor), SM count and memory of GPU `device`.");
  // Private (bench/host_standin.py): the host cost of the bindings themselves, without a GPU.
  m.def(
      "_run_arguments_probe",
      [](const RunArray& q, const OptRunArray& k, const OptRunArray& v, const OptRunArray& kv, Layout layout,
         const OptRunArray& indices, const RunArray& o, const OptRunArray& lse, uintptr_t stream,
         const std::optional<DType>& kv_dtype) {
        const TensorView tq = to_view(q, "q"), to = to_view(o, "out"), tl = to_view(lse, "lse");
        const tessera::PagedKVCache cache = paged_cache(k, v, kv, layout, to_view(indices, "indices"), kv_dtype);
        DeviceGuard guard(tq);
        nb::gil_scoped_release release;
        checked([&] { (void)cache, (void)tq, (void)to, (void)tl, (void)stream; });
      },
      "q"_a, "k"_a.none(), "v"_a.none(), "kv"_a.none(), "layout"_a, "indices"_a.none(), "o"_a, "lse"_a.none(),
      "stream"_a, nb::kw_only(), "kv_dtype"_a.none() = nb::none(),
      "Private: what a runtime wrapper's run() binding does before its C++ call (argument conversion, the DLPack "
      "import of every array, the views, the device guard, the GIL release), without the call; host arrays are "
      "accepted. For measuring the bindings' per-call cost without a GPU (bench/host_standin.py).");
  // Private (tests/python/test_host_path.py): the view the runtime bindings make of an array
  // (RunArray) and the one through DLPack's capsule (TorchArray), which must agree, and whether
  // the first took PyTorch's direct export.
  m.def(
      "_run_array_view",
      [](const RunArray& a) { return nb::make_tuple(a.direct, view_info(to_view(a, "a"))); }, "a"_a,
      "Private: (direct export taken, (data, device type, device id, dtype, shape, strides)) of a runtime "
      "binding's view of `a`.");
  m.def(
      "_capsule_array_view", [](const Array& a) { return view_info(to_view(a, "a")); }, "a"_a,
      "Private: (data, device type, device id, dtype, shape, strides) of the view of `a` through DLPack's capsule.");
  // Private (python/tessera/decode.py): a graph-mode plan()'s page-table copies in one call.
  m.def(
      "_copy_index_arrays",
      [](uintptr_t stream, int device, const OptRunArray& dst0, const OptRunArray& src0, int64_t n0,
         const OptRunArray& dst1, const OptRunArray& src1, int64_t n1, const OptRunArray& dst2,
         const OptRunArray& src2, int64_t n2, const OptRunArray& dst3, const OptRunArray& src3, int64_t n3) {
        std::vector<IndexCopy> copies;
        copies.reserve(4);
        const OptRunArray* dsts[4] = {&dst0, &dst1, &dst2, &dst3};
        const OptRunArray* srcs[4] = {&src0, &src1, &src2, &src3};
        const int64_t ns[4] = {n0, n1, n2, n3};
        for (int i = 0; i < 4; ++i) {
          if (!*dsts[i] && !*srcs[i]) continue;
          if (!*dsts[i] || !*srcs[i]) {
            throw tessera::Error(StatusCode::kInvalidArgument, "_copy_index_arrays: dst" + std::to_string(i) +
                                                                   " and src" + std::to_string(i) +
                                                                   " must be given together");
          }
          IndexCopy c;
          c.dst = to_view(**dsts[i], "dst");
          c.src = to_view(**srcs[i], "src");
          c.n = ns[i];
          copies.push_back(c);
        }
        return copy_index_arrays(stream, device, copies);
      },
      "stream"_a, "device"_a, "dst0"_a.none(), "src0"_a.none(), "n0"_a, "dst1"_a.none() = nb::none(),
      "src1"_a.none() = nb::none(), "n1"_a = 0, "dst2"_a.none() = nb::none(), "src2"_a.none() = nb::none(),
      "n2"_a = 0, "dst3"_a.none() = nb::none(), "src3"_a.none() = nb::none(), "n3"_a = 0,
      "Private: copies the first n_i entries of each int32 1-D contiguous src_i into dst_i (pairs given as None "
      "skipped) on `stream` of GPU `device`: dst on that GPU or in host memory, src in host memory (staged "
      "through pinned memory, so it may be reused at once) or on that GPU. All or nothing: returns False with "
      "nothing copied when a pair does not fit these rules or the stream is capturing (copy with PyTorch then).");
  m.def(
      "alibi_slopes",
      [](int64_t num_heads) {
        std::vector<float> slopes;
        checked([&] { slopes = tessera::alibi_slopes(num_heads); });
        return slopes;
      },
      "num_heads"_a, "tessera::alibi_slopes: the standard ALiBi slopes of `num_heads` heads (host values).");
}

/// The one-shot attention entry points (tessera/attention.h).
void bind_single_request_attention(nb::module_& m) {
  m.def(
      "single_decode",
      [](const Array& q, const Array& k, const Array& v, Layout layout, const Array& o, const OptArray& lse,
         double sm_scale, uintptr_t stream, const VariantArgs* variant, const std::optional<DType>& kv_dtype,
         double k_scale, double v_scale, const OptArray& k_scale_device, const OptArray& v_scale_device) {
        const TensorView tq = to_view(q, "q"), tk = as_kv(to_view(k, "k"), kv_dtype),
                         tv = as_kv(to_view(v, "v"), kv_dtype), to = to_view(o, "out"), tl = to_view(lse, "lse");
        std::optional<tessera::VariantSpec> user;
        tessera::AttentionOptions opt;
        opt.sm_scale = sm_scale;
        opt.variant = variant_options(variant, user);
        opt.kv_scales = kv_scales(k_scale, v_scale, k_scale_device, v_scale_device);
        DeviceGuard guard(tq);
        nb::gil_scoped_release release;
        checked([&] { tessera::single_decode(tq, tk, tv, layout, to, tl, opt, to_stream(stream)); });
      },
      "q"_a, "k"_a, "v"_a, "layout"_a, "o"_a, "lse"_a.none(), "sm_scale"_a, "stream"_a, nb::kw_only(),
      "variant"_a.none() = nb::none(), "kv_dtype"_a.none() = nb::none(), "k_scale"_a = 1.0, "v_scale"_a = 1.0,
      "k_scale_device"_a.none() = nb::none(), "v_scale_device"_a.none() = nb::none(),
      "tessera::single_decode: q [Hq, D], k/v [kv_len, Hkv, D] (NHD) or [Hkv, kv_len, D] (HND). Keyword "
      "options: variant, a VariantArgs (None: the default variant); fp8 K/V: k and v as uint8 views with "
      "kv_dtype e4m3/e5m2, scales k_scale/v_scale (host) times the optional f32 k_scale_device/v_scale_device "
      "([1] or [Hkv]).");
  m.def(
      "batch_decode_ragged",
      [](const Array& q, const Array& k, const Array& v, const Array& kv_indptr, const Array& o, const OptArray& lse,
         double sm_scale, uintptr_t stream, const VariantArgs* variant, const std::optional<DType>& kv_dtype,
         double k_scale, double v_scale, const OptArray& k_scale_device, const OptArray& v_scale_device) {
        const TensorView tq = to_view(q, "q"), tk = as_kv(to_view(k, "k"), kv_dtype),
                         tv = as_kv(to_view(v, "v"), kv_dtype), ti = to_view(kv_indptr, "kv_indptr"),
                         to = to_view(o, "out"), tl = to_view(lse, "lse");
        std::optional<tessera::VariantSpec> user;
        tessera::AttentionOptions opt;
        opt.sm_scale = sm_scale;
        opt.variant = variant_options(variant, user);
        opt.kv_scales = kv_scales(k_scale, v_scale, k_scale_device, v_scale_device);
        DeviceGuard guard(tq);
        nb::gil_scoped_release release;
        checked([&] { tessera::batch_decode_ragged(tq, tk, tv, ti, to, tl, opt, to_stream(stream)); });
      },
      "q"_a, "k"_a, "v"_a, "kv_indptr"_a, "o"_a, "lse"_a.none(), "sm_scale"_a, "stream"_a, nb::kw_only(),
      "variant"_a.none() = nb::none(), "kv_dtype"_a.none() = nb::none(), "k_scale"_a = 1.0, "v_scale"_a = 1.0,
      "k_scale_device"_a.none() = nb::none(), "v_scale_device"_a.none() = nb::none(),
      "tessera::batch_decode_ragged: q [B, Hq, D], k/v [total_kv, Hkv, D] (request b's rows kv_indptr[b] .. "
      "kv_indptr[b+1]-1, kv_indptr i32 [B + 1] on q's device). Keyword options as for single_decode.");
  m.def(
      "single_prefill",
      [](const Array& q, const Array& k, const Array& v, Layout layout, const Array& o, const OptArray& lse,
         double sm_scale, bool causal, uintptr_t stream, const VariantArgs* variant, const OptArray& custom_mask,
         const OptArray& custom_mask_indptr, const std::optional<DType>& kv_dtype, double k_scale, double v_scale,
         const OptArray& k_scale_device, const OptArray& v_scale_device, const std::optional<DType>& q_dtype,
         double q_scale, const OptArray& q_scale_device) {
        const TensorView tq = as_kv(to_view(q, "q"), q_dtype), tk = as_kv(to_view(k, "k"), kv_dtype),
                         tv = as_kv(to_view(v, "v"), kv_dtype), to = to_view(o, "out"), tl = to_view(lse, "lse");
        std::optional<tessera::VariantSpec> user;
        tessera::AttentionOptions opt;
        opt.sm_scale = sm_scale;
        opt.causal = causal;
        opt.variant = variant_options(variant, user);
        opt.variant.custom_mask = to_view(custom_mask, "packed_custom_mask");
        opt.variant.custom_mask_indptr = to_view(custom_mask_indptr, "custom_mask_indptr");
        opt.kv_scales = kv_scales(k_scale, v_scale, k_scale_device, v_scale_device);
        opt.kv_scales.q = q_scale;
        opt.kv_scales.q_device = to_view(q_scale_device, "q_scale");
        DeviceGuard guard(tq);
        nb::gil_scoped_release release;
        checked([&] { tessera::single_prefill(tq, tk, tv, layout, to, tl, opt, to_stream(stream)); });
      },
      "q"_a, "k"_a, "v"_a, "layout"_a, "o"_a, "lse"_a.none(), "sm_scale"_a, "causal"_a, "stream"_a,
      nb::kw_only(), "variant"_a.none() = nb::none(), "custom_mask"_a.none() = nb::none(),
      "custom_mask_indptr"_a.none() = nb::none(), "kv_dtype"_a.none() = nb::none(), "k_scale"_a = 1.0,
      "v_scale"_a = 1.0, "k_scale_device"_a.none() = nb::none(), "v_scale_device"_a.none() = nb::none(),
      "q_dtype"_a.none() = nb::none(), "q_scale"_a = 1.0, "q_scale_device"_a.none() = nb::none(),
      "tessera::single_prefill: q [qo_len, Hq, D], k/v as for single_decode. Keyword options as for "
      "single_decode, plus custom_mask: u8 packed bits (little bit order) of a row-major [qo_len, kv_len] "
      "mask (1 = visible) with custom_mask_indptr: i32 [0, bytes] on q's device (both or neither); FP8 "
      "attention: q as u8 with q_dtype e4m3, k/v likewise (kv_dtype), o f16/bf16, q_scale / q_scale_device "
      "as k_scale.");
}

/// The attention-state merges.
void bind_state_merge(nb::module_& m) {
  m.def(
      "merge_state",
      [](const Array& v_a, const Array& s_a, const Array& v_b, const Array& s_b, const Array& v_out,
         const OptArray& s_out, uintptr_t stream) {
        const TensorView a = to_view(v_a, "v_a"), sa = to_view(s_a, "s_a"), b = to_view(v_b, "v_b"),
                         sb = to_view(s_b, "s_b"), o = to_view(v_out, "v_out"), so = to_view(s_out, "s_out");
        DeviceGuard guard(a);
        nb::gil_scoped_release release;
        checked([&] { tessera::merge_state(a, sa, b, sb, o, so, to_stream(stream)); });
      },
      "v_a"_a, "s_a"_a, "v_b"_a, "s_b"_a, "v_out"_a, "s_out"_a.none(), "stream"_a,
      "tessera::merge_state (base-2 LSE).");
  m.def(
      "merge_states",
      [](const Array& v, const Array& s, const Array& v_out, const OptArray& s_out, uintptr_t stream) {
        const TensorView tv = to_view(v, "v"), ts = to_view(s, "s"), o = to_view(v_out, "v_out"),
                         so = to_view(s_out, "s_out");
        DeviceGuard guard(tv);
        nb::gil_scoped_release release;
        checked([&] { tessera::merge_states(tv, ts, o, so, to_stream(stream)); });
      },
      "v"_a, "s"_a, "v_out"_a, "s_out"_a.none(), "stream"_a, "tessera::merge_states (base-2 LSE).");
  m.def(
      "merge_states_ragged",
      [](const Array& v, const Array& s, const Array& indptr, const Array& v_out, const OptArray& s_out,
         uintptr_t stream) {
        const TensorView tv = to_view(v, "v"), ts = to_view(s, "s"), ti = to_view(indptr, "indptr"),
                         o = to_view(v_out, "v_out"), so = to_view(s_out, "s_out");
        DeviceGuard guard(tv);
        nb::gil_scoped_release release;
        checked([&] { tessera::merge_states_ragged(tv, ts, ti, o, so, to_stream(stream)); });
      },
      "v"_a, "s"_a, "indptr"_a, "v_out"_a, "s_out"_a.none(), "stream"_a,
      "tessera::merge_states_ragged (base-2 LSE).");
}

/// The paged KV cache's append functions.
void bind_kv_cache(nb::module_& m) {
  m.def(
      "append_paged_kv_cache_at",
      [](const Array& append_k, const Array& append_v, const Array& batch_indices, const Array& positions,
         const OptArray& k_cache, const OptArray& v_cache, const OptArray& kv_cache, Layout layout,
         const Array& indptr, const Array& indices, const Array& last_page_len, uintptr_t stream,
         const std::optional<DType>& cache_dtype, double k_scale, double v_scale, const OptArray& k_scale_device,
         const OptArray& v_scale_device) {
        const TensorView ak = to_view(append_k, "append_key"), av = to_view(append_v, "append_value"),
                         bi = to_view(batch_indices, "batch_indices"), pos = to_view(positions, "positions"),
                         ip = to_view(indptr, "kv_indptr"), ix = to_view(indices, "kv_indices"),
                         lp = to_view(last_page_len, "kv_last_page_len");
        tessera::PagedKV cache;
        if (kv_cache) {
          const TensorView combined = as_kv(to_view(*kv_cache, "paged_kv_cache"), cache_dtype);
          checked([&] { cache = tessera::PagedKV::from_combined(combined, layout, ip, ix, lp); });
        } else {
          cache.k = as_kv(to_view(k_cache, "paged_kv_cache[0]"), cache_dtype);
          cache.v = as_kv(to_view(v_cache, "paged_kv_cache[1]"), cache_dtype);
          cache.layout = layout;
          cache.indptr = ip;
          cache.indices = ix;
          cache.last_page_len = lp;
        }
        DeviceGuard guard(ak);
        nb::gil_scoped_release release;
        const tessera::KVScales scales = kv_scales(k_scale, v_scale, k_scale_device, v_scale_device);
        checked([&] { tessera::append_paged_kv_cache_at(ak, av, bi, pos, cache, to_stream(stream), scales); });
      },
      "append_k"_a, "append_v"_a, "batch_indices"_a, "positions"_a, "k_cache"_a.none(), "v_cache"_a.none(),
      "kv_cache"_a.none(), "layout"_a, "indptr"_a, "indices"_a, "last_page_len"_a, "stream"_a, nb::kw_only(),
      "cache_dtype"_a.none() = nb::none(), "k_scale"_a = 1.0, "v_scale"_a = 1.0,
      "k_scale_device"_a.none() = nb::none(), "v_scale_device"_a.none() = nb::none(),
      "tessera::append_paged_kv_cache_at: row i goes to request batch_indices[i] at positions[i]. An fp8 "
      "cache comes as uint8 views with cache_dtype e4m3/e5m2; rows are stored as x / scale.");
  m.def(
      "append_paged_mla_kv_cache",
      [](const Array& append_ckv, const Array& append_kpe, const Array& batch_indices, const Array& positions,
         const Array& ckv_cache, const Array& kpe_cache, const Array& indptr, const Array& indices,
         const Array& last_page_len, uintptr_t stream, const std::optional<DType>& cache_dtype) {
        const TensorView ack = as_kv(to_view(append_ckv, "append_ckv"), cache_dtype),
                         akp = as_kv(to_view(append_kpe, "append_kpe"), cache_dtype),
                         bi = to_view(batch_indices, "batch_indices"), pos = to_view(positions, "positions"),
                         ckv = as_kv(to_view(ckv_cache, "ckv_cache"), cache_dtype),
                         kpe = as_kv(to_view(kpe_cache, "kpe_cache"), cache_dtype),
                         ip = to_view(indptr, "kv_indptr"), ix = to_view(indices, "kv_indices"),
                         lp = to_view(last_page_len, "kv_last_page_len");
        DeviceGuard guard(ckv);
        nb::gil_scoped_release release;
        checked([&] {
          tessera::append_paged_mla_kv_cache(ack, akp, bi, pos, ckv, kpe, ip, ix, lp, to_stream(stream));
        });
      },
      "append_ckv"_a, "append_kpe"_a, "batch_indices"_a, "positions"_a, "ckv_cache"_a, "kpe_cache"_a, "indptr"_a,
      "indices"_a, "last_page_len"_a, "stream"_a, nb::kw_only(), "cache_dtype"_a.none() = nb::none(),
      "tessera::append_paged_mla_kv_cache: MLA latent rows append_ckv [nnz, ckv_dim] and append_kpe [nnz, kpe_dim] "
      "into ckv_cache [num_pages, page_size, ckv_dim] and kpe_cache [num_pages, page_size, kpe_dim]; row i goes to "
      "request batch_indices[i] at positions[i]. An fp8 cache: all four as uint8 views with cache_dtype e4m3 / "
      "e5m2 (a bit copy).");
}

/// The standalone RoPE kernels (tessera/rope.h).
void bind_rope(nb::module_& m) {
  // Out of place; the Python _inplace functions pass q and k as their own outputs.
  m.def(
      "apply_rope",
      [](const Array& q, const Array& k, const Array& q_rope, const Array& k_rope, const Array& indptr,
         const Array& offsets, int64_t rotary_dim, bool interleave, double rope_scale, double rope_theta,
         uintptr_t stream) {
        const RopeViews v(q, k, q_rope, k_rope);
        const TensorView ip = to_view(indptr, "indptr"), of = to_view(offsets, "offsets");
        const tessera::ApplyRopeOptions o = rope_options(rotary_dim, interleave, rope_scale, rope_theta);
        DeviceGuard guard(v.q);
        nb::gil_scoped_release release;
        checked([&] { tessera::apply_rope(v.q, v.k, v.q_rope, v.k_rope, ip, of, o, to_stream(stream)); });
      },
      "q"_a, "k"_a, "q_rope"_a, "k_rope"_a, "indptr"_a, "offsets"_a, "rotary_dim"_a, "interleave"_a, "rope_scale"_a,
      "rope_theta"_a, "stream"_a,
      "tessera::apply_rope: q [nnz, Hq, D], k [nnz, Hk, D] rotated into q_rope, k_rope at the positions of a ragged "
      "batch (row indptr[b] + j at offsets[b] + j); rotary_dim 0 means D.");
  m.def(
      "apply_rope_pos_ids",
      [](const Array& q, const Array& k, const Array& q_rope, const Array& k_rope, const Array& pos_ids,
         int64_t rotary_dim, bool interleave, double rope_scale, double rope_theta, uintptr_t stream) {
        const RopeViews v(q, k, q_rope, k_rope);
        const TensorView ids = to_view(pos_ids, "pos_ids");
        const tessera::ApplyRopeOptions o = rope_options(rotary_dim, interleave, rope_scale, rope_theta);
        DeviceGuard guard(v.q);
        nb::gil_scoped_release release;
        checked([&] { tessera::apply_rope_pos_ids(v.q, v.k, v.q_rope, v.k_rope, ids, o, to_stream(stream)); });
      },
      "q"_a, "k"_a, "q_rope"_a, "k_rope"_a, "pos_ids"_a, "rotary_dim"_a, "interleave"_a, "rope_scale"_a,
      "rope_theta"_a, "stream"_a,
      "tessera::apply_rope_pos_ids: row r of q and k rotated at pos_ids[r] (i32 or i64); rotary_dim 0 means D.");
  m.def(
      "apply_llama31_rope",
      [](const Array& q, const Array& k, const Array& q_rope, const Array& k_rope, const Array& indptr,
         const Array& offsets, int64_t rotary_dim, bool interleave, double rope_scale, double rope_theta,
         double low_freq_factor, double high_freq_factor, double old_context_len, uintptr_t stream) {
        const RopeViews v(q, k, q_rope, k_rope);
        const TensorView ip = to_view(indptr, "indptr"), of = to_view(offsets, "offsets");
        const tessera::ApplyLlama31RopeOptions o = llama31_rope_options(
            rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor, high_freq_factor, old_context_len);
        DeviceGuard guard(v.q);
        nb::gil_scoped_release release;
        checked([&] { tessera::apply_llama31_rope(v.q, v.k, v.q_rope, v.k_rope, ip, of, o, to_stream(stream)); });
      },
      "q"_a, "k"_a, "q_rope"_a, "k_rope"_a, "indptr"_a, "offsets"_a, "rotary_dim"_a, "interleave"_a, "rope_scale"_a,
      "rope_theta"_a, "low_freq_factor"_a, "high_freq_factor"_a, "old_context_len"_a, "stream"_a,
      "tessera::apply_llama31_rope: apply_rope with Llama 3.1 frequencies (rope_scale is the smoothing factor).");
  m.def(
      "apply_llama31_rope_pos_ids",
      [](const Array& q, const Array& k, const Array& q_rope, const Array& k_rope, const Array& pos_ids,
         int64_t rotary_dim, bool interleave, double rope_scale, double rope_theta, double low_freq_factor,
         double high_freq_factor, double old_context_len, uintptr_t stream) {
        const RopeViews v(q, k, q_rope, k_rope);
        const TensorView ids = to_view(pos_ids, "pos_ids");
        const tessera::ApplyLlama31RopeOptions o = llama31_rope_options(
            rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor, high_freq_factor, old_context_len);
        DeviceGuard guard(v.q);
        nb::gil_scoped_release release;
        checked([&] {
          tessera::apply_llama31_rope_pos_ids(v.q, v.k, v.q_rope, v.k_rope, ids, o, to_stream(stream));
        });
      },
      "q"_a, "k"_a, "q_rope"_a, "k_rope"_a, "pos_ids"_a, "rotary_dim"_a, "interleave"_a, "rope_scale"_a,
      "rope_theta"_a, "low_freq_factor"_a, "high_freq_factor"_a, "old_context_len"_a, "stream"_a,
      "tessera::apply_llama31_rope_pos_ids: apply_rope_pos_ids with Llama 3.1 frequencies.");
  m.def(
      "apply_rope_with_cos_sin_cache",
      [](const Array& positions, const Array& query, const Array& key, int64_t head_size, const Array& cos_sin_cache,
         bool is_neox, const Array& query_out, const Array& key_out, uintptr_t stream) {
        const TensorView pos = to_view(positions, "positions"), tq = to_view(query, "query"), tk = to_view(key, "key"),
                         cache = to_view(cos_sin_cache, "cos_sin_cache"), qo = to_view(query_out, "query_out"),
                         ko = to_view(key_out, "key_out");
        DeviceGuard guard(tq);
        nb::gil_scoped_release release;
        checked([&] {
          tessera::apply_rope_with_cos_sin_cache(pos, tq, tk, head_size, cache, is_neox, qo, ko, to_stream(stream));
        });
      },
      "positions"_a, "query"_a, "key"_a, "head_size"_a, "cos_sin_cache"_a, "is_neox"_a, "query_out"_a, "key_out"_a,
      "stream"_a,
      "tessera::apply_rope_with_cos_sin_cache: query [nnz, Hq * head_size], key [nnz, Hk * head_size] rotated with "
      "cos/sin read from cos_sin_cache f32 [max_position, rotary_dim] at row positions[r].");
}

/// Multi-head latent attention (DeepSeek MLA), one-shot.
void bind_mla(nb::module_& m) {
  m.def(
      "batch_mla_paged",
      [](const Array& q_nope, const Array& q_pe, const OptArray& qo_indptr, int64_t max_qo_len, const Array& ckv,
         const Array& kpe, const Array& kv_indptr, const Array& kv_indices, const Array& kv_last_page_len,
         const Array& o, const OptArray& lse, double sm_scale, bool causal, int64_t num_kv_splits,
         const OptArray& workspace, uintptr_t stream, const std::optional<DType>& kv_dtype, double k_scale,
         double v_scale, const OptArray& k_scale_device, const OptArray& v_scale_device) {
        const TensorView qn = to_view(q_nope, "q_nope"), qp = to_view(q_pe, "q_pe"),
                         qi = to_view(qo_indptr, "qo_indptr"), to = to_view(o, "out"), tl = to_view(lse, "lse");
        tessera::PagedLatentCache kv;
        kv.ckv = as_kv(to_view(ckv, "ckv_cache"), kv_dtype);
        kv.kpe = as_kv(to_view(kpe, "kpe_cache"), kv_dtype);
        kv.scales = kv_scales(k_scale, v_scale, k_scale_device, v_scale_device);
        kv.indptr = to_view(kv_indptr, "kv_indptr");
        kv.indices = to_view(kv_indices, "kv_indices");
        kv.last_page_len = to_view(kv_last_page_len, "kv_last_page_len");
        tessera::MlaOptions opt;
        opt.sm_scale = sm_scale;
        opt.causal = causal;
        opt.num_kv_splits = num_kv_splits;
        opt.workspace = to_view(workspace, "float_workspace_buffer");
        DeviceGuard guard(qn);
        nb::gil_scoped_release release;
        checked([&] { tessera::batch_mla_paged(qn, qp, qi, max_qo_len, kv, to, tl, opt, to_stream(stream)); });
      },
      "q_nope"_a, "q_pe"_a, "qo_indptr"_a.none(), "max_qo_len"_a, "ckv"_a, "kpe"_a, "kv_indptr"_a, "kv_indices"_a,
      "kv_last_page_len"_a, "o"_a, "lse"_a.none(), "sm_scale"_a, "causal"_a, "num_kv_splits"_a, "workspace"_a.none(),
      "stream"_a, nb::kw_only(), "kv_dtype"_a.none() = nb::none(), "k_scale"_a = 1.0, "v_scale"_a = 1.0,
      "k_scale_device"_a.none() = nb::none(), "v_scale_device"_a.none() = nb::none(),
      "tessera::batch_mla_paged: MLA (absorbed) over a paged latent cache; q_nope [total_q, H, 512], q_pe "
      "[total_q, H, 64], ckv [num_pages, page_size, 512], kpe [num_pages, page_size, 64], o [total_q, H, 512], "
      "lse f32 [total_q, H] base 2 or None; num_kv_splits > 1 needs a workspace of "
      "batch_mla_paged_workspace_bytes bytes. An fp8 latent cache: ckv and kpe as u8 with kv_dtype e4m3 / e5m2, "
      "its key and value scales as k_scale / v_scale (host) and k_scale_device / v_scale_device (f32 [1]).");
  m.def(
      "batch_mla_paged_num_kv_splits",
      [](int64_t batch_size, int64_t max_qo_len, int64_t num_heads, int64_t max_kv_len, int64_t sm_count) {
        int64_t splits = 1;
        checked([&] {
          splits = tessera::batch_mla_paged_num_kv_splits(batch_size, max_qo_len, num_heads, max_kv_len, sm_count);
        });
        return splits;
      },
      "batch_size"_a, "max_qo_len"_a, "num_heads"_a, "max_kv_len"_a, "sm_count"_a,
      "tessera::batch_mla_paged_num_kv_splits: the KV split count for a batch (the SMs its CTAs leave idle, at "
      "least 256 tokens a split).");
  m.def(
      "batch_mla_paged_workspace_bytes",
      [](int64_t total_q, int64_t num_heads, int64_t num_kv_splits, DType dtype) {
        int64_t bytes = 0;
        checked([&] { bytes = tessera::batch_mla_paged_workspace_bytes(total_q, num_heads, num_kv_splits, dtype); });
        return bytes;
      },
      "total_q"_a, "num_heads"_a, "num_kv_splits"_a, "dtype"_a,
      "tessera::batch_mla_paged_workspace_bytes: bytes of the split states (0 for one split); dtype DType.f16 or bf16.");
}

/// Block-sparse attention and the FlexAttention front end's kernels.
void bind_block_sparse_and_flex(nb::module_& m) {
  m.def(
      "block_sparse_attention",
      [](const Array& q, const Array& k, const Array& v, const Array& indptr, const Array& indices,
         const OptArray& block_flags, int64_t block_rows, int64_t block_cols, const Array& o, const OptArray& lse,
         double sm_scale, bool causal, uintptr_t stream, const std::string& variant_name,
         const std::string& mask_source, const std::string& mask_function, const std::string& score_source,
         const std::string& score_function, const std::vector<std::pair<std::string, nb::object>>& params,
         int64_t window_left, double logits_soft_cap, const OptArray& alibi_slopes) {
        const TensorView tq = to_view(q, "q"), to = to_view(o, "out"), tl = to_view(lse, "lse");
        tessera::BlockSparse kv;
        kv.block_rows = block_rows;
        kv.block_cols = block_cols;
        kv.num_rows = tq.ndim == 3 ? tq.shape[0] : 0;
        kv.k = to_view(k, "k");
        kv.v = to_view(v, "v");
        kv.indptr = to_view(indptr, "indptr");
        kv.indices = to_view(indices, "indices");
        kv.block_flags = to_view(block_flags, "block_flags");
        const std::optional<tessera::VariantSpec> spec = flex_spec(
            variant_name, mask_source, mask_function, score_source, score_function, variant_params(params));
        tessera::AttentionOptions opt;
        opt.sm_scale = sm_scale;
        opt.causal = causal;
        opt.variant.window_left = window_left;
        opt.variant.logits_soft_cap = logits_soft_cap;
        opt.variant.alibi_slopes = to_view(alibi_slopes, "alibi_slopes");
        opt.variant.user = spec ? &*spec : nullptr;
        DeviceGuard guard(tq);
        nb::gil_scoped_release release;
        checked([&] { tessera::block_sparse_attention(tq, kv, to, tl, opt, to_stream(stream)); });
      },
      "q"_a, "k"_a, "v"_a, "indptr"_a, "indices"_a, "block_flags"_a.none(), "block_rows"_a, "block_cols"_a, "o"_a,
      "lse"_a.none(), "sm_scale"_a, "causal"_a, "stream"_a, nb::kw_only(), "variant_name"_a = "flex",
      "mask_source"_a = "", "mask_function"_a = "", "score_source"_a = "", "score_function"_a = "",
      "params"_a = std::vector<std::pair<std::string, nb::object>>{}, "window_left"_a = -1,
      "logits_soft_cap"_a = 0.0, "alibi_slopes"_a.none() = nb::none(),
      "tessera::block_sparse_attention: q [M, Hq, D], k/v [N, Hkv, D], the BSR indptr (i32 [ceil(M / "
      "block_rows) + 1]) and indices (i32 column blocks) with optional u8 block_flags (1 = full) -> o [M, Hq, D], "
      "lse [M, Hq] (base 2). Keyword options: a user variant given as a mask function and/or a score function "
      "(tessera::flex_variant: mask_source defines bool mask_function(params, b, h, q_idx, kv_idx), "
      "score_source float score_function(params, score, b, h, q_idx, kv_idx)) with params: (name, int | float | "
      "device tensor) pairs; built-in window_left, logits_soft_cap, alibi_slopes.");
  m.def(
      "build_block_mask",
      [](const std::string& mask_source, const std::string& mask_function,
         const std::vector<std::pair<std::string, nb::object>>& params, int64_t q_len, int64_t kv_len,
         int64_t block_rows, int64_t block_cols, int32_t batch, int32_t head, const Array& indptr,
         const Array& indices, const Array& block_flags, uintptr_t stream) {
        const TensorView ti = to_view(indptr, "indptr"), tx = to_view(indices, "indices"),
                         tf = to_view(block_flags, "block_flags");
        const std::vector<tessera::VariantParam> vp = variant_params(params);
        const tessera::MaskMod mask{mask_source, mask_function};
        DeviceGuard guard(ti);
        nb::gil_scoped_release release;
        checked([&] {
          tessera::build_block_mask(mask, vp, q_len, kv_len, block_rows, block_cols, batch, head, ti, tx, tf,
                                    to_stream(stream));
        });
      },
      "mask_source"_a, "mask_function"_a, "params"_a, "q_len"_a, "kv_len"_a, "block_rows"_a, "block_cols"_a,
      "batch"_a, "head"_a, "indptr"_a, "indices"_a, "block_flags"_a, "stream"_a,
      "tessera::build_block_mask: evaluates the mask function on the GPU over a q_len x kv_len grid cut into "
      "(block_rows, block_cols) blocks and writes the BSR of the blocks with a visible pair (indptr i32 "
      "[row blocks + 1], indices i32, block_flags u8 1 = full).");
}

/// The plan/run runtime: tessera::BatchDecodeWrapper.
/// PagedFastRun (the paged wrappers' fast_run()).
void bind_fast_plan_class(nb::module_& m) {
  nb::class_<DecodeFastPlan>(m, "DecodeFastPlan",
                             "Private: BatchDecodeWrapper.fast_plan()'s object; call it with (indptr, indices, "
                             "last_page_len) -> (batch, pages), or None for the full plan() path.")
      .def("__call__", &DecodeFastPlan::operator(), "indptr"_a, "indices"_a, "last_page_len"_a,
           "Plans the step (copying the page table into the graph buffers first, when given) and returns (batch, "
           "pages), or None with nothing done when an argument is not the common case.");
}

void bind_fast_run_class(nb::module_& m) {
  nb::class_<PagedFastRun>(m, "PagedFastRun",
                           "Private: a paged plan's run(q, paged_kv_cache[, out]) in one call (W12); made by a "
                           "paged wrapper's fast_run().")
      .def("__call__", &PagedFastRun::operator(), "q"_a, "paged_kv_cache"_a, "out"_a.none() = nb::none(),
           "Runs the plan and returns out (allocated when None), or None with nothing done when an argument is "
           "not the plan's common case (exact torch.Tensors of its dtypes, shapes and GPU).");
}

void bind_decode_wrapper(nb::module_& m) {
  nb::class_<tessera::BatchDecodeWrapper> decode(m, "BatchDecodeWrapper",
                                                 "tessera::BatchDecodeWrapper (paged KV, one query per request).");
  bind_common(decode);
  bind_set_variant_params(decode);
  bind_fast_run(decode);
  decode
      .def(
          "fast_plan",
          [](nb::object self, int device, int64_t max_batch, int64_t page_size, int64_t num_qo_heads,
             int64_t num_kv_heads, int64_t head_dim, DType dtype, double sm_scale, nb::object graph_indptr,
             nb::object graph_indices, nb::object graph_last_page_len) {
            auto* w = nb::cast<tessera::BatchDecodeWrapper*>(self);
            return DecodeFastPlan(self, w, device, max_batch, page_size,
                                  plan_shape(num_qo_heads, num_kv_heads, head_dim, dtype, sm_scale, false,
                                             tessera::VariantOptions{}, std::nullopt, tessera::KVScales{}),
                                  std::move(graph_indptr), std::move(graph_indices), std::move(graph_last_page_len));
          },
          "device"_a, "max_batch"_a, "page_size"_a, "num_qo_heads"_a, "num_kv_heads"_a, "head_dim"_a, "dtype"_a,
          "sm_scale"_a, "graph_indptr"_a.none(), "graph_indices"_a.none(), "graph_last_page_len"_a.none(),
          "Private (python/tessera/decode.py): a DecodeFastPlan of this configuration (the default variant, K/V "
          "of dtype): plan(indptr, indices, last_page_len) in one call, -> (batch, pages) or None; with the graph "
          "buffers (int32 on GPU `device`) it also copies the page table into them.")
      .def(
          "plan",
          [](tessera::BatchDecodeWrapper& w, const RunArray& kv_indptr, const RunArray& last_page_len, int64_t page_size,
             int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim, DType dtype, double sm_scale,
             uintptr_t stream, int device, const VariantArgs* variant_args, const std::optional<DType>& kv_dtype,
             double k_scale, double v_scale, const OptArray& k_scale_device, const OptArray& v_scale_device) {
            const TensorView ip = to_view(kv_indptr, "indptr"), lp = to_view(last_page_len, "last_page_len");
            const tessera::KVScales scales = kv_scales(k_scale, v_scale, k_scale_device, v_scale_device);
            std::optional<tessera::VariantSpec> user;
            const tessera::VariantOptions variant = variant_options(variant_args, user);
            plan_on(device, [&] {
              w.plan(ip, lp, page_size,
                     plan_shape(num_qo_heads, num_kv_heads, head_dim, dtype, sm_scale, false, variant, kv_dtype, scales),
                     to_stream(stream));
            });
          },
          "kv_indptr"_a, "last_page_len"_a, "page_size"_a, "num_qo_heads"_a, "num_kv_heads"_a, "head_dim"_a,
          "dtype"_a, "sm_scale"_a, "stream"_a, "device"_a, nb::kw_only(), "variant"_a.none() = nb::none(),
          "kv_dtype"_a.none() = nb::none(), "k_scale"_a = 1.0, "v_scale"_a = 1.0,
          "k_scale_device"_a.none() = nb::none(), "v_scale_device"_a.none() = nb::none(),
          "Plans a step from HOST int32 kv_indptr [B + 1] and last_page_len [B]. Keyword options: variant, a "
          "VariantArgs of the built-in softmax variants (its tensors on GPU `device`, kept alive while the plan is "
          "used).")
      .def(
          "run",
          [](tessera::BatchDecodeWrapper& w, const RunArray& q, const OptRunArray& k, const OptRunArray& v,
             const OptRunArray& kv, Layout layout, const RunArray& indices, const RunArray& o, const OptRunArray& lse,
             uintptr_t stream, const std::optional<DType>& kv_dtype) {
            const TensorView tq = to_view(q, "q"), to = to_view(o, "out"), tl = to_view(lse, "lse");
            const tessera::PagedKVCache cache = paged_cache(k, v, kv, layout, to_view(indices, "indices"), kv_dtype);
            DeviceGuard guard(tq);
            nb::gil_scoped_release release;
            checked([&] { w.run(tq, cache, to, tl, to_stream(stream)); });
          },
          "q"_a, "k"_a.none(), "v"_a.none(), "kv"_a.none(), "layout"_a, "indices"_a, "o"_a, "lse"_a.none(),
          "stream"_a, nb::kw_only(), "kv_dtype"_a.none() = nb::none(), "Runs the planned step: q [B, Hq, D] -> o [B, Hq, D], lse [B, Hq] (base 2).");
}

/// The plan/run runtime: tessera::BatchPrefillPagedWrapper.
void bind_prefill_paged_wrapper(nb::module_& m) {
  nb::class_<tessera::BatchPrefillPagedWrapper> prefill_paged(
      m, "BatchPrefillPagedWrapper", "tessera::BatchPrefillPagedWrapper (paged KV, any query length).");
  bind_common(prefill_paged);
  bind_set_variant_params(prefill_paged);
  bind_paged_prefill_plan_run(prefill_paged);
  bind_fast_run(prefill_paged);
}

/// The plan/run runtime: tessera::BatchPODPagedWrapper.
void bind_pod_wrapper(nb::module_& m) {
  // Its options are a PodOptions and its plan_info() a PodPlanInfo, so bind_common does not fit.
  using Pod = tessera::BatchPODPagedWrapper;
  nb::class_<Pod> pod(
      m, "BatchPODPagedWrapper",
      "tessera::BatchPODPagedWrapper (paged KV, a batch mixing prefill chunks and decode requests in one launch whose "
      "CTAs are divided between the two; the default variant, 16-bit K/V of q's dtype, equal head dims).");
  pod.def(
         "__init__",
         [](Pod* self, const Array& workspace, const tessera::RuntimeBounds& bounds, const tessera::PodOptions& options) {
           const TensorView ws = to_view(workspace, "float_workspace_buffer");
           DeviceGuard guard(ws);
           checked([&] { new (self) Pod(ws, bounds, options); });
         },
         "workspace"_a, "bounds"_a, "options"_a = tessera::PodOptions{},
         "Builds the wrapper over a caller-owned device workspace of at least workspace_size(bounds, options) "
         "bytes (needs a GPU).")
      .def_static(
          "workspace_size",
          [](const tessera::RuntimeBounds& bounds, const tessera::PodOptions& options, int device) {
            return workspace_bytes_on(device, [&] { return Pod::workspace_size(bounds, options); });
          },
          "bounds"_a, "options"_a = tessera::PodOptions{}, "device"_a = 0,
          "Bytes of device workspace a wrapper with these bounds needs on GPU `device`.")
      .def(
          "plan_info", [](const Pod& w) { return w.plan_info(); },
          "What the last plan() decided, as a PodPlanInfo (a copy; for tests, benchmarks and logs).");
  bind_paged_prefill_plan_run(pod);
  bind_fast_run(pod);
}

/// The plan/run runtime: tessera::BatchPrefillRaggedWrapper.
void bind_prefill_ragged_wrapper(nb::module_& m) {
  nb::class_<tessera::BatchPrefillRaggedWrapper> prefill_ragged(
      m, "BatchPrefillRaggedWrapper", "tessera::BatchPrefillRaggedWrapper (ragged KV, any query length).");
  bind_common(prefill_ragged);
  bind_set_variant_params(prefill_ragged);
  prefill_ragged
      .def(
          "plan",
          [](tessera::BatchPrefillRaggedWrapper& w, const RunArray& qo_indptr, const RunArray& kv_indptr,
             int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim, DType dtype, double sm_scale, bool causal,
             uintptr_t stream, int device, const VariantArgs* variant_args, const std::optional<DType>& kv_dtype,
             double k_scale, double v_scale, const OptArray& k_scale_device, const OptArray& v_scale_device,
             int64_t head_dim_vo, const OptArray& custom_mask, const OptArray& custom_mask_indptr, double q_scale,
             const OptArray& q_scale_device) {
            const TensorView qi = to_view(qo_indptr, "qo_indptr"), ki = to_view(kv_indptr, "kv_indptr");
            const tessera::KVScales scales =
                kv_scales(k_scale, v_scale, k_scale_device, v_scale_device, q_scale, q_scale_device);
            std::optional<tessera::VariantSpec> user;
            tessera::VariantOptions variant = variant_options(variant_args, user);
            set_custom_mask(variant, custom_mask, custom_mask_indptr);
            plan_on(device, [&] {
              w.plan(qi, ki,
                     plan_shape(num_qo_heads, num_kv_heads, head_dim, dtype, sm_scale, causal, variant, kv_dtype, scales,
                                head_dim_vo),
                     to_stream(stream));
            });
          },
          "qo_indptr"_a, "kv_indptr"_a, "num_qo_heads"_a, "num_kv_heads"_a, "head_dim"_a, "dtype"_a, "sm_scale"_a,
          "causal"_a, "stream"_a, "device"_a, nb::kw_only(), "variant"_a.none() = nb::none(),
          "kv_dtype"_a.none() = nb::none(), "k_scale"_a = 1.0, "v_scale"_a = 1.0,
          "k_scale_device"_a.none() = nb::none(), "v_scale_device"_a.none() = nb::none(), "head_dim_vo"_a = 0,
          "custom_mask"_a.none() = nb::none(), "custom_mask_indptr"_a.none() = nb::none(), "q_scale"_a = 1.0,
          "q_scale_device"_a.none() = nb::none(),
          "Plans a step from HOST int32 qo_indptr and kv_indptr [B + 1]. Keyword options as for "
          "BatchDecodeWrapper.plan; head_dim_vo: v's and o's head dim (0: head_dim); custom_mask, "
          "custom_mask_indptr, q_scale and q_scale_device as for BatchPrefillPagedWrapper.plan.")
      .def(
          "run",
          [](tessera::BatchPrefillRaggedWrapper& w, const RunArray& q, const RunArray& k, const RunArray& v,
             const RunArray& o, const OptRunArray& lse, uintptr_t stream, const std::optional<DType>& kv_dtype,
             const std::optional<DType>& q_dtype) {
            const TensorView tq = as_kv(to_view(q, "q"), q_dtype), tk = as_kv(to_view(k, "k"), kv_dtype),
                             tv = as_kv(to_view(v, "v"), kv_dtype), to = to_view(o, "out"), tl = to_view(lse, "lse");
            DeviceGuard guard(tq);
            nb::gil_scoped_release release;
            checked([&] { w.run(tq, tk, tv, to, tl, to_stream(stream)); });
          },
          "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a.none(), "stream"_a, nb::kw_only(), "kv_dtype"_a.none() = nb::none(),
          "q_dtype"_a.none() = nb::none(),
          "Runs the planned step: q [rows, Hq, D], k/v [kv_rows, Hkv, D] -> o, lse (base 2). FP8 attention: q as "
          "u8 with q_dtype e4m3, o f16/bf16.");
}

/// The plan/run runtime: tessera::BatchMLAPagedWrapper.
void bind_mla_wrapper(nb::module_& m) {
  nb::class_<tessera::BatchMLAPagedWrapper> mla_runtime(
      m, "BatchMLAPagedWrapper",
      "tessera::BatchMLAPagedWrapper (MLA over a paged latent cache through the plan/run runtime; bounds: "
      "max_batch_size, max_total_qo_tokens and num_qo_heads = its heads).");
  bind_common(mla_runtime);
  mla_runtime
      .def(
          "plan",
          [](tessera::BatchMLAPagedWrapper& w, const RunArray& qo_indptr, const RunArray& kv_indptr,
             const RunArray& last_page_len, int64_t page_size, int64_t num_heads, DType dtype, double sm_scale,
             bool causal, uintptr_t stream, int device, const std::optional<DType>& kv_dtype, double k_scale,
             double v_scale, const OptArray& k_scale_device, const OptArray& v_scale_device) {
            const TensorView qi = to_view(qo_indptr, "qo_indptr"), ip = to_view(kv_indptr, "kv_indptr"),
                             lp = to_view(last_page_len, "last_page_len");
            tessera::MlaPlanShape shape{num_heads, dtype, sm_scale, causal};
            shape.kv_dtype = kv_dtype;
            shape.kv_scales = kv_scales(k_scale, v_scale, k_scale_device, v_scale_device);
            plan_on(device, [&] { w.plan(qi, ip, lp, page_size, shape, to_stream(stream)); });
          },
          "qo_indptr"_a, "kv_indptr"_a, "last_page_len"_a, "page_size"_a, "num_heads"_a, "dtype"_a, "sm_scale"_a,
          "causal"_a, "stream"_a, "device"_a, nb::kw_only(), "kv_dtype"_a.none() = nb::none(), "k_scale"_a = 1.0,
          "v_scale"_a = 1.0, "k_scale_device"_a.none() = nb::none(), "v_scale_device"_a.none() = nb::none(),
          "Plans a step from HOST int32 qo_indptr (query tokens), kv_indptr (pages) [B + 1] and last_page_len [B]; "
          "an fp8 latent cache: kv_dtype e4m3 / e5m2 and its key / value scales (host factors, one-element f32 "
          "device tensors).")
      .def(
          "run",
          [](tessera::BatchMLAPagedWrapper& w, const RunArray& q_nope, const RunArray& q_pe, const RunArray& ckv,
             const RunArray& kpe, const RunArray& kv_indices, const RunArray& o, const OptRunArray& lse,
             uintptr_t stream, const std::optional<DType>& kv_dtype) {
            const TensorView qn = to_view(q_nope, "q_nope"), qp = to_view(q_pe, "q_pe"),
                             tc = as_kv(to_view(ckv, "ckv_cache"), kv_dtype),
                             tk = as_kv(to_view(kpe, "kpe_cache"), kv_dtype), ti = to_view(kv_indices, "kv_indices"),
                             to = to_view(o, "out"), tl = to_view(lse, "lse");
            DeviceGuard guard(qn);
            nb::gil_scoped_release release;
            checked([&] { w.run(qn, qp, tc, tk, ti, to, tl, to_stream(stream)); });
          },
          "q_nope"_a, "q_pe"_a, "ckv"_a, "kpe"_a, "kv_indices"_a, "o"_a, "lse"_a.none(), "stream"_a, nb::kw_only(),
          "kv_dtype"_a.none() = nb::none(),
          "Runs the planned step: q_nope [rows, H, 512], q_pe [rows, H, 64] over ckv [pages, page_size, 512], kpe "
          "[pages, page_size, 64] -> o [rows, H, 512], lse [rows, H] (base 2). An fp8 cache: ckv and kpe as u8 with "
          "kv_dtype e4m3 / e5m2.");
}

/// The plan/run runtime: tessera::BatchCascadePagedWrapper.
void bind_cascade_wrapper(nb::module_& m) {
  // Its constructor and workspace_size take num_levels before the bounds, so bind_common does not fit.
  using Cascade = tessera::BatchCascadePagedWrapper;
  nb::class_<Cascade> cascade(
      m, "BatchCascadePagedWrapper",
      "tessera::BatchCascadePagedWrapper (shared-prefix attention over a paged KV cache in num_levels levels, one "
      "workspace, levels merged in level order; bounds.max_batch_size bounds the groups of any level).");
  cascade
      .def(
          "__init__",
          [](Cascade* self, const Array& workspace, int64_t num_levels, const tessera::RuntimeBounds& bounds,
             const tessera::RuntimeOptions& options) {
            const TensorView ws = to_view(workspace, "float_workspace_buffer");
            DeviceGuard guard(ws);
            checked([&] { new (self) Cascade(ws, num_levels, bounds, options); });
          },
          "workspace"_a, "num_levels"_a, "bounds"_a, "options"_a = tessera::RuntimeOptions{},
          "Builds the wrapper over a caller-owned device workspace of at least workspace_size(num_levels, bounds, "
          "options) bytes (needs a GPU).")
      .def_static(
          "workspace_size",
          [](int64_t num_levels, const tessera::RuntimeBounds& bounds, const tessera::RuntimeOptions& options,
             int device) {
            return workspace_bytes_on(device, [&] { return Cascade::workspace_size(num_levels, bounds, options); });
          },
          "num_levels"_a, "bounds"_a, "options"_a = tessera::RuntimeOptions{}, "device"_a = 0,
          "Bytes of device workspace a wrapper with these levels and bounds needs on GPU `device`.")
      .def("num_levels", &Cascade::num_levels, "The number of levels the wrapper was built for.")
      .def(
          "plan_info",
          [](const Cascade& w, int64_t level) {
            const tessera::PlanInfo* info = nullptr;
            checked([&] { info = &w.plan_info(level); });
            return plan_info_dict(*info);
          },
          "level"_a, "What the last plan() decided for level `level` (0 <= level < num_levels), as a dict.")
      .def(
          "plan",
          [](Cascade& w, const std::vector<Array>& qo_indptr, const std::vector<Array>& kv_indptr,
             const std::vector<Array>& last_page_len, int64_t page_size, int64_t num_qo_heads, int64_t num_kv_heads,
             int64_t head_dim, DType dtype, double sm_scale, bool causal, uintptr_t stream, int device,
             const VariantArgs* variant_args, const std::optional<DType>& kv_dtype, double k_scale, double v_scale,
             const OptArray& k_scale_device, const OptArray& v_scale_device, int64_t head_dim_vo) {
            // The three lists are zipped into levels here; the library checks their count against num_levels.
            if (kv_indptr.size() != qo_indptr.size() || last_page_len.size() != qo_indptr.size()) {
              throw tessera::Error(StatusCode::kInvalidArgument,
                                   "qo_indptr has " + std::to_string(qo_indptr.size()) + " entries, kv_indptr " +
                                       std::to_string(kv_indptr.size()) + ", last_page_len " +
                                       std::to_string(last_page_len.size()) + ": expected one entry per level in each");
            }
            std::vector<tessera::CascadeLevel> levels(qo_indptr.size());
            for (size_t i = 0; i < levels.size(); ++i) {
              levels[i].qo_indptr = to_view(qo_indptr[i], entry_name("qo_indptr", i).c_str());
              levels[i].kv_indptr = to_view(kv_indptr[i], entry_name("kv_indptr", i).c_str());
              levels[i].last_page_len = to_view(last_page_len[i], entry_name("last_page_len", i).c_str());
            }
            const tessera::KVScales scales = kv_scales(k_scale, v_scale, k_scale_device, v_scale_device);
            std::optional<tessera::VariantSpec> user;
            const tessera::VariantOptions variant = variant_options(variant_args, user);
            plan_on(device, [&] {
              w.plan(levels, page_size,
                     plan_shape(num_qo_heads, num_kv_heads, head_dim, dtype, sm_scale, causal, variant, kv_dtype, scales,
                                head_dim_vo),
                     to_stream(stream));
            });
          },
          "qo_indptr"_a, "kv_indptr"_a, "last_page_len"_a, "page_size"_a, "num_qo_heads"_a, "num_kv_heads"_a,
          "head_dim"_a, "dtype"_a, "sm_scale"_a, "causal"_a, "stream"_a, "device"_a, nb::kw_only(),
          "variant"_a.none() = nb::none(), "kv_dtype"_a.none() = nb::none(), "k_scale"_a = 1.0, "v_scale"_a = 1.0,
          "k_scale_device"_a.none() = nb::none(), "v_scale_device"_a.none() = nb::none(), "head_dim_vo"_a = 0,
          "Plans a step from one entry per level (outermost first) of HOST int32 qo_indptr [groups + 1] (every "
          "level ending at the batch's rows), kv_indptr [groups + 1] (pages) and last_page_len [groups]. causal "
          "applies to the last level only. Keyword options as for BatchPrefillPagedWrapper.plan, of which the "
          "variant may set logits_soft_cap only (anything position-dependent is NotImplementedError).")
      .def(
          "run",
          [](Cascade& w, const RunArray& q, const std::vector<CascadeCacheArgs>& kv, const RunArray& o,
             const OptRunArray& lse, uintptr_t stream, const std::optional<DType>& kv_dtype) {
            const TensorView tq = to_view(q, "q"), to = to_view(o, "out"), tl = to_view(lse, "lse");
            std::vector<tessera::PagedKVCache> caches;
            caches.reserve(kv.size());
            for (size_t i = 0; i < kv.size(); ++i) {
              const auto& [k, v, combined, layout, indices] = kv[i];
              caches.push_back(
                  paged_cache(k, v, combined, layout, to_view(indices, (entry_name("kv", i) + ".indices").c_str()),
                              kv_dtype));
            }
            DeviceGuard guard(tq);
            nb::gil_scoped_release release;
            checked([&] { w.run(tq, caches, to, tl, to_stream(stream)); });
          },
          "q"_a, "kv"_a, "o"_a, "lse"_a.none(), "stream"_a, nb::kw_only(), "kv_dtype"_a.none() = nb::none(),
          "Runs the planned step: q [rows, Hq, D] over one paged cache per level, each a tuple (k, v, kv, layout, "
          "indices) with (k, v) or kv given as for BatchPrefillPagedWrapper.run and indices that level's page ids "
          "-> o [rows, Hq, D], lse [rows, Hq] (base 2).");
}

/// The plan/run runtime: tessera::BatchBlockSparsePagedWrapper. plan() and run() take
/// BatchPrefillPagedWrapper's arguments (bind_paged_prefill_plan_run) with the block mask added:
/// its block rows' offsets and block shape in plan(), its column blocks and flags in run().
void bind_block_sparse_paged_wrapper(nb::module_& m) {
  using W = tessera::BatchBlockSparsePagedWrapper;
  nb::class_<W> cls(m, "BatchBlockSparsePagedWrapper",
                    "tessera::BatchBlockSparsePagedWrapper (paged KV under a block mask at each request's logical "
                    "positions; bounds.max_batch_size bounds both the requests and the block rows).");
  bind_common(cls);
  cls.def(
         "plan",
         [](W& w, const RunArray& qo_indptr, const RunArray& kv_indptr, const RunArray& last_page_len,
            int64_t page_size, const RunArray& mask_indptr, int64_t block_rows, int64_t block_cols,
            int64_t num_qo_heads, int64_t num_kv_heads, int64_t head_dim, DType dtype, double sm_scale, bool causal,
            uintptr_t stream, int device, const VariantArgs* variant_args, const std::optional<DType>& kv_dtype,
            double k_scale, double v_scale, const OptArray& k_scale_device, const OptArray& v_scale_device) {
           const TensorView qi = to_view(qo_indptr, "qo_indptr"), ip = to_view(kv_indptr, "paged_kv_indptr"),
                            lp = to_view(last_page_len, "paged_kv_last_page_len"),
                            mi = to_view(mask_indptr, "mask_indptr");
           std::optional<tessera::VariantSpec> user;  // the plan's user variant, alive for the call
           const tessera::PlanShape shape =
               plan_shape(num_qo_heads, num_kv_heads, head_dim, dtype, sm_scale, causal,
                          variant_options(variant_args, user), kv_dtype,
                          kv_scales(k_scale, v_scale, k_scale_device, v_scale_device));
           plan_on(device,
                   [&] { w.plan(qi, ip, lp, page_size, mi, block_rows, block_cols, shape, to_stream(stream)); });
         },
         "qo_indptr"_a, "kv_indptr"_a, "last_page_len"_a, "page_size"_a, "mask_indptr"_a, "block_rows"_a,
         "block_cols"_a, "num_qo_heads"_a, "num_kv_heads"_a, "head_dim"_a, "dtype"_a, "sm_scale"_a, "causal"_a,
         "stream"_a, "device"_a, nb::kw_only(), "variant"_a.none() = nb::none(), "kv_dtype"_a.none() = nb::none(),
         "k_scale"_a = 1.0, "v_scale"_a = 1.0, "k_scale_device"_a.none() = nb::none(),
         "v_scale_device"_a.none() = nb::none(),
         "Plans a step from HOST int32 qo_indptr, kv_indptr [B + 1] (pages), last_page_len [B] and mask_indptr "
         "[R + 1] (column blocks per block row; R = sum over requests of ceil(qo_len / block_rows)). Keyword "
         "options as for BatchDecodeWrapper.plan.")
      .def(
          "run",
          [](W& w, const RunArray& q, const OptRunArray& k, const OptRunArray& v, const OptRunArray& kv,
             Layout layout, const RunArray& indices, const RunArray& mask_indices, const OptRunArray& mask_flags,
             const RunArray& o, const OptRunArray& lse, uintptr_t stream, const std::optional<DType>& kv_dtype) {
            const TensorView tq = to_view(q, "q"), to = to_view(o, "out"), tl = to_view(lse, "lse"),
                             mi = to_view(mask_indices, "mask_indices"), mf = to_view(mask_flags, "mask_flags");
            const tessera::PagedKVCache cache = paged_cache(k, v, kv, layout, to_view(indices, "indices"), kv_dtype);
            DeviceGuard guard(tq);
            nb::gil_scoped_release release;
            checked([&] { w.run(tq, cache, mi, mf, to, tl, to_stream(stream)); });
          },
          "q"_a, "k"_a.none(), "v"_a.none(), "kv"_a.none(), "layout"_a, "indices"_a, "mask_indices"_a,
          "mask_flags"_a.none(), "o"_a, "lse"_a.none(), "stream"_a, nb::kw_only(), "kv_dtype"_a.none() = nb::none(),
          "Runs the planned step: q [rows, Hq, D] over the paged cache ((k, v) or kv, and indices, the page ids, "
          "as for BatchPrefillPagedWrapper.run) under the block mask: mask_indices, int32 [>= mask_indptr[R]] "
          "column blocks (device or pinned host memory), mask_flags, u8 of as many entries on q's device (1: the "
          "block is fully visible) or None -> o [rows, Hq, D], lse [rows, Hq] (base 2).");
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "Tessera's C++ API (low level; use the functions and classes of the `tessera` package).";
  nb::register_exception_translator(translate_error);
  // Wrapper objects referenced from tracebacks or torch's caches can outlive the module at exit;
  // that is not a leak worth a warning.
  nb::set_leak_warnings(false);

  bind_enums_and_structs(m);
  bind_build_and_device_info(m);
  bind_single_request_attention(m);
  bind_state_merge(m);
  bind_kv_cache(m);
  bind_rope(m);
  bind_mla(m);
  bind_block_sparse_and_flex(m);
  bind_fast_run_class(m);
  bind_fast_plan_class(m);
  bind_decode_wrapper(m);
  bind_prefill_paged_wrapper(m);
  bind_pod_wrapper(m);
  bind_prefill_ragged_wrapper(m);
  bind_mla_wrapper(m);
  bind_cascade_wrapper(m);
  bind_block_sparse_paged_wrapper(m);
}
