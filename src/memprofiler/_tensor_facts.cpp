/* The tensor facts the compiled pack hook reads per save, answered from the C++ tensor
 * (see _tensor_facts.h). Built by setup.py against the torch it is installed beside, where that
 * torch and a C++ compiler are found; without it the hook asks Python, with the same results.
 *
 * Only exact `torch.Tensor` objects reach these functions (the hook sends subclasses, DTensor and
 * fake tensors among them, down its Python route). Any C++ exception is caught and answered
 * FACTS_ASK_PYTHON: the Python route then raises what it always raised. */
#include "_tensor_facts.h"

#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/SequenceNumber.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/python_variable.h>

namespace {

/* Under a torch function mode, attribute reads and method calls on a tensor go through the mode's
 * `__torch_function__`, as they do for a subclass: the Python route takes them. (An exact
 * `torch.Tensor` has no `__torch_function__` of its own to send them there.) */
bool through_python(PyObject *) { return at::impl::torch_function_mode_enabled(); }

int storage(PyObject *t, void **key, long long *nbytes, int *null_data) {
    try {
        if (through_python(t))
            return FACTS_ASK_PYTHON;
        const at::Tensor &v = THPVariable_Unpack(t);
        if (!v.has_storage())
            return FACTS_ASK_PYTHON;          /* sparse, nested, ...: `untyped_storage()` tells */
        const c10::Storage &st = v.storage(); /* throws where storage access is not allowed */
        c10::StorageImpl *impl = st.unsafeGetStorageImpl();
        if (impl == nullptr)
            return FACTS_ASK_PYTHON;
        const size_t n = impl->nbytes(); /* throws where the size is symbolic */
        /* Read without `mutable_data()`, which would materialise a copy-on-write storage: only
         * whether it is null counts. A null pointer with bytes off the meta device is what Python
         * calls an invalid storage: its error is raised there. */
        const bool null = impl->data() == nullptr;
        if (null && n != 0 && impl->device_type() != c10::DeviceType::Meta)
            return FACTS_ASK_PYTHON;
        *key = static_cast<void *>(impl);
        *nbytes = static_cast<long long>(n);
        *null_data = null ? 1 : 0;
        return 0;
    } catch (...) {
        return FACTS_ASK_PYTHON;
    }
}

long long next_nr() { return static_cast<long long>(at::sequence_number::peek()); }

int grad_fn_nr(PyObject *t, long long *nr) {
    try {
        if (through_python(t))
            return FACTS_ASK_PYTHON;
        /* what the `grad_fn` attribute returns (a view's node may be made again here, as there) */
        const auto fn = THPVariable_Unpack(t).grad_fn();
        if (!fn)
            return 0;
        *nr = static_cast<long long>(fn->sequence_nr());
        return 1;
    } catch (...) {
        return FACTS_ASK_PYTHON;
    }
}

int is_view(PyObject *t) {
    try {
        if (through_python(t))
            return FACTS_ASK_PYTHON;
        return THPVariable_Unpack(t).is_view() ? 1 : 0;
    } catch (...) {
        return FACTS_ASK_PYTHON;
    }
}

TensorFacts facts = {TENSOR_FACTS_VERSION, storage, next_nr, grad_fn_nr, is_view};

PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "memprofiler._tensor_facts",
    "Tensor facts for the compiled pack hook, read from the C++ tensor (a capsule, `API`).",
    -1,
    nullptr,
};

} // namespace

PyMODINIT_FUNC PyInit__tensor_facts(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == nullptr)
        return nullptr;
    PyObject *cap = PyCapsule_New(&facts, TENSOR_FACTS_CAPSULE, nullptr);
    if (cap == nullptr || PyModule_AddObject(m, "API", cap) < 0) {
        Py_XDECREF(cap);
        Py_DECREF(m);
        return nullptr;
    }
#ifndef FACTS_TORCH_VERSION
#define FACTS_TORCH_VERSION ""
#endif
#ifndef FACTS_SOURCE_SHA256
#define FACTS_SOURCE_SHA256 "" /* built without setup.py: the source it came from is not known */
#endif
    /* the torch this was compiled against, and the SHA-256 of its sources (setup.py): a build
     * for another torch is not used, and a stale one can be told */
    if (PyModule_AddStringConstant(m, "TORCH_VERSION", FACTS_TORCH_VERSION) < 0 ||
        PyModule_AddStringConstant(m, "SOURCE_SHA256", FACTS_SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
