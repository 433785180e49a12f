/* What the compiled pack hook (_packer.c) asks of a plain `torch.Tensor` per save, answered in C++
 * by `memprofiler._tensor_facts` (_tensor_facts.cpp) and handed over as a capsule.
 *
 * Through Python each answer costs a Python object or a bound call (the storage object, its
 * `_cdata`, `grad_fn` and its `_sequence_nr()`, the next node number): most of what the hook
 * spends per save. Read from the tensor itself they cost a few loads.
 *
 * Every function answers only what it can answer exactly as the Python route would; otherwise it
 * returns FACTS_ASK_PYTHON and the caller takes the Python route, which gives the same answer or
 * raises the same error as before. Nothing here raises or leaves a Python exception set. */
#ifndef MEMPROFILER_TENSOR_FACTS_H
#define MEMPROFILER_TENSOR_FACTS_H

#include <Python.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TENSOR_FACTS_CAPSULE "memprofiler._tensor_facts.API"
#define TENSOR_FACTS_VERSION 1
#define FACTS_ASK_PYTHON (-2)

typedef struct {
    int version; /* TENSOR_FACTS_VERSION */
    /* The storage of `t` (a plain torch.Tensor): its key (the StorageImpl address, which is
     * `t.untyped_storage()._cdata`), bytes, and whether its data pointer is null (empty or on
     * the meta device). 0, or FACTS_ASK_PYTHON. */
    int (*storage)(PyObject *t, void **key, long long *nbytes, int *null_data);
    /* The sequence number the next autograd node will take on this thread
     * (`torch._C._autograd._get_sequence_nr()`). */
    long long (*next_nr)(void);
    /* 1 with `*nr` set to `t.grad_fn._sequence_nr()`, 0 where `t.grad_fn` is None, or
     * FACTS_ASK_PYTHON. */
    int (*grad_fn_nr)(PyObject *t, long long *nr);
    /* 1 where `t` is a view (its `_base` is not None), 0 where not, or FACTS_ASK_PYTHON. */
    int (*is_view)(PyObject *t);
} TensorFacts;

#ifdef __cplusplus
}
#endif

#endif
