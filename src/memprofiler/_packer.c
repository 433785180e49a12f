/* The saved-tensor pack hook of `memprofiler.collectors.saved_tensors`, compiled.
 *
 * `Packer.pack` takes the steps `saved_tensors._PyPacker.pack` takes, and `Packer.still_held`
 * gives what `_PyPacker.still_held` gives: the collector reads either the same way. It runs
 * once per tensor autograd saves inside a collected call; written in C it pays no interpreter
 * frame, and the unpack hook (`Holder.t`, read by a C `attrgetter`) none in backward.
 *
 * Where the Python packer keeps a weak reference per holder (with a death callback) in a list
 * per storage, this one keeps per storage an `Entry` with a count of live holders and the save
 * number of the last death, which each `Holder` updates as it is freed while the call is open.
 * Nothing it makes per saved tensor is tracked by the cyclic garbage collector: thousands of
 * tracked objects living through a call would make the collector scan and promote them again
 * and again (measured: a third of the Python packer's cost at 1,002 modules).
 *
 * A tensor subclass (DTensor) gets its storage from the Python `storage_of(t)`; an unexpected
 * exception goes to `on_fault(err)` and switches the packer off; the tensor is still saved.
 * Built by setup.py as an optional extension: without a compiler the Python packer runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_tensor_facts.h"

/* The C++ answers to what the fast path asks of a plain tensor (`use_facts`), or NULL: then it
 * asks Python. */
static const TensorFacts *facts = NULL;

/* The stack walk reads CPython 3.11's interpreter frames directly: the public walk
 * (PyEval_GetFrame, PyFrame_GetBack, `f_locals`) makes a frame object for every frame it passes
 * and a locals dict for every `Module.__call__` it reads, about half of what attributing a new
 * storage cost (measured with callgrind at 1,002 modules). The layout of those frames changes
 * between CPython releases, so this is compiled for 3.11 only; elsewhere the public walk runs. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && !defined(PYPY_VERSION)
#define FRAME_INTERNALS 1
#ifndef Py_BUILD_CORE
#define Py_BUILD_CORE 1
#endif
#include <internal/pycore_frame.h>
#endif

/* ---- Clock: the save count of the call, and whether the call is still open ---- */

typedef struct {
    PyObject_HEAD
    Py_ssize_t count;
    int open;
} Clock;

static PyTypeObject ClockType = {
    PyVarObject_HEAD_INIT(NULL, 0) // the macro ends in a comma
        .tp_name = "memprofiler._packer.Clock",
    .tp_basicsize = sizeof(Clock),
    .tp_flags = Py_TPFLAGS_DEFAULT,
};

/* ---- Entry: one storage saved in the call ---- */

typedef struct {
    PyObject_HEAD
    PyObject *owner; /* label of the module that saved it first (a str: no cycle) */
    long long nbytes;
    Py_ssize_t alive;      /* holders of it still alive */
    Py_ssize_t last_death; /* save count when a holder of it last died in the call, or -1 */
} Entry;

static void Entry_dealloc(Entry *self) {
    Py_CLEAR(self->owner);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef Entry_members[] = {
    {"owner", T_OBJECT_EX, offsetof(Entry, owner), READONLY, "label of the module that saved it"},
    {"nbytes", T_LONGLONG, offsetof(Entry, nbytes), READONLY, "storage bytes"},
    {"alive", T_PYSSIZET, offsetof(Entry, alive), READONLY, "holders of it still alive"},
    {"last_death", T_PYSSIZET, offsetof(Entry, last_death), READONLY, "saves when a holder last died"},
    {NULL},
};

static PyTypeObject EntryType = {
    PyVarObject_HEAD_INIT(NULL, 0) // the macro ends in a comma
        .tp_name = "memprofiler._packer.Entry",
    .tp_doc = "One storage saved in the call.",
    .tp_basicsize = sizeof(Entry),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)Entry_dealloc,
    .tp_members = Entry_members,
};

/* ---- Holder: what the graph stores for one saved tensor; only the graph references it ---- */

typedef struct {
    PyObject_HEAD
    PyObject *t;
    PyObject *weakreflist;
    Entry *entry; /* the storage it counts for, or NULL */
    Clock *clock; /* set with entry */
} Holder;

static void Holder_dealloc(Holder *self) {
    if (self->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    if (self->entry != NULL) {
        if (self->clock->open) {
            self->entry->alive--;
            self->entry->last_death = self->clock->count;
        }
        Py_CLEAR(self->entry);
        Py_CLEAR(self->clock);
    }
    Py_CLEAR(self->t);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef Holder_members[] = {
    {"t", T_OBJECT_EX, offsetof(Holder, t), READONLY, "the saved tensor"},
    {NULL},
};

static PyTypeObject HolderType = {
    PyVarObject_HEAD_INIT(NULL, 0) // the macro ends in a comma
        .tp_name = "memprofiler._packer.Holder",
    .tp_doc = "What the autograd graph stores for one saved tensor.",
    .tp_basicsize = sizeof(Holder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)Holder_dealloc,
    .tp_members = Holder_members,
    .tp_weaklistoffset = offsetof(Holder, weakreflist),
};

/* A new holder of `t` (a new reference taken on `t`).
 *
 * Holders are not tracked by the cyclic garbage collector. Only an autograd node references a
 * holder, from C++, where the collector cannot follow anyway; the one cycle a holder could
 * close (an output saved by its own node) is broken by detaching that output. */
static Holder *holder_of(PyObject *t) {
    Holder *h = PyObject_New(Holder, &HolderType);
    if (h == NULL)
        return NULL;
    Py_INCREF(t);
    h->t = t;
    h->weakreflist = NULL;
    h->entry = NULL;
    h->clock = NULL;
    return h;
}

/* Count `h` as a live holder of `e`. */
static void attach(Holder *h, Entry *e, Clock *clock) {
    Py_INCREF(e);
    h->entry = e;
    Py_INCREF(clock);
    h->clock = clock;
    e->alive++;
}

/* ---- Packer ---- */

typedef struct {
    PyObject_HEAD
    PyObject *held;        /* dict: storage key -> Entry */
    PyObject *excluded;    /* dict: storage key -> parameter or buffer */
    PyObject *labels;      /* dict: id(module) -> label (the C stack walk) */
    PyObject *owner;       /* None, or a callable(frame) -> label used instead of the walk */
    PyObject *storage_of;  /* callable(t) -> storage or None, for tensor subclasses */
    PyObject *on_fault;    /* callable(err) */
    PyObject *next_nr;     /* callable() -> sequence number of the next autograd node */
    PyObject *tensor_type; /* torch.Tensor */
    PyObject *param_type;  /* torch.nn.Parameter */
    PyObject *call_code;   /* nn.Module._wrapped_call_impl.__code__ */
    PyObject *last_owner;
    PyObject *outside; /* the label of a save outside any module */
    Clock *clock;      /* the save count and whether the call is open (shared with holders) */
    long long packed_bytes;
    long long last_nr;
    /* The C functions behind the tensor and storage attributes read per save, looked up once:
     * calling them directly skips a method lookup per call (NULL: the generic call runs). */
    PyCFunction t_untyped_storage, t_detach;
    getter t_grad_fn, t_base;
    void *t_grad_fn_closure, *t_base_closure;
    PyTypeObject *storage_type; /* the storage type the next three were looked up on */
    PyCFunction st_nbytes, st_data_ptr;
    getter st_cdata;
    void *st_cdata_closure;
    int self_first; /* `self` is the first fast local of `Module.__call__` (read without f_locals) */
} Packer;

static PyObject *s_untyped_storage, *s_cdata, *s_grad_fn, *s_sequence_nr, *s_detach, *s_nbytes, *s_data_ptr,
    *s_base, *s_f_locals, *s_self;

static int Packer_traverse(Packer *self, visitproc visit, void *arg) {
    Py_VISIT(self->held);
    Py_VISIT(self->excluded);
    Py_VISIT(self->labels);
    Py_VISIT(self->owner);
    Py_VISIT(self->storage_of);
    Py_VISIT(self->on_fault);
    Py_VISIT(self->next_nr);
    Py_VISIT(self->tensor_type);
    Py_VISIT(self->param_type);
    Py_VISIT(self->call_code);
    Py_VISIT(self->last_owner);
    Py_VISIT(self->outside);
    return 0;
}

static int Packer_clear(Packer *self) {
    Py_CLEAR(self->held);
    Py_CLEAR(self->excluded);
    Py_CLEAR(self->labels);
    Py_CLEAR(self->owner);
    Py_CLEAR(self->storage_of);
    Py_CLEAR(self->on_fault);
    Py_CLEAR(self->next_nr);
    Py_CLEAR(self->tensor_type);
    Py_CLEAR(self->param_type);
    Py_CLEAR(self->call_code);
    Py_CLEAR(self->last_owner);
    Py_CLEAR(self->outside);
    return 0;
}

static void Packer_dealloc(Packer *self) {
    PyObject_GC_UnTrack(self);
    Packer_clear(self);
    if (self->clock != NULL)
        self->clock->open = 0; /* holders that outlive the packer stop counting */
    Py_CLEAR(self->clock);
    Py_CLEAR(self->storage_type);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define SET_NEW(field, value)                                                                                \
    do {                                                                                                     \
        Py_INCREF(value);                                                                                    \
        Py_XSETREF(self->field, value);                                                                      \
    } while (0)

/* The C function of the no-argument method `name` of `type`, or NULL where it is something else
 * (a Python override): then the generic call runs. Called directly it does what the generic call
 * does, less the lookup (an instance attribute of that name would shadow it there, not here). */
static PyCFunction noargs_of(PyTypeObject *type, PyObject *name) {
    PyObject *d = _PyType_Lookup(type, name); /* borrowed */
    if (d == NULL || !Py_IS_TYPE(d, &PyMethodDescr_Type))
        return NULL;
    PyMethodDef *def = ((PyMethodDescrObject *)d)->d_method;
    return (def->ml_flags & ~METH_COEXIST) == METH_NOARGS ? def->ml_meth : NULL;
}

/* The C getter of the attribute `name` of `type` (a data descriptor: no instance can shadow it),
 * or NULL where it is something else. */
static getter getter_of(PyTypeObject *type, PyObject *name, void **closure) {
    PyObject *d = _PyType_Lookup(type, name); /* borrowed */
    *closure = NULL;
    if (d == NULL || !Py_IS_TYPE(d, &PyGetSetDescr_Type))
        return NULL;
    PyGetSetDef *def = ((PyGetSetDescrObject *)d)->d_getset;
    *closure = def->closure;
    return def->get;
}

static PyObject *call_noargs(PyObject *obj, PyCFunction f, PyObject *name) {
    return f != NULL ? f(obj, NULL) : PyObject_CallMethodNoArgs(obj, name);
}

static PyObject *get_attr(PyObject *obj, getter g, void *closure, PyObject *name) {
    return g != NULL ? g(obj, closure) : PyObject_GetAttr(obj, name);
}

/* Look up the storage methods on the type of `st` (once: every storage of a run has one type). */
static void storage_methods(Packer *self, PyObject *st) {
    PyTypeObject *type = Py_TYPE(st);
    if (type == self->storage_type)
        return;
    Py_INCREF(type);
    Py_XSETREF(self->storage_type, type);
    self->st_nbytes = noargs_of(type, s_nbytes);
    self->st_data_ptr = noargs_of(type, s_data_ptr);
    self->st_cdata = getter_of(type, s_cdata, &self->st_cdata_closure);
}

static int Packer_init(Packer *self, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"storage_of", "on_fault",  "next_nr", "tensor_type",
                         "param_type", "call_code", "outside", NULL};
    PyObject *storage_of, *on_fault, *next_nr, *tensor_type, *param_type, *call_code, *outside;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOU", kw, &storage_of, &on_fault, &next_nr,
                                     &tensor_type, &param_type, &call_code, &outside))
        return -1;
    if (!PyType_Check(tensor_type) || !PyType_Check(param_type)) {
        PyErr_SetString(PyExc_TypeError, "tensor_type and param_type must be types");
        return -1;
    }
    PyObject *held = PyDict_New(), *excluded = PyDict_New(), *labels = PyDict_New();
    Clock *clock = PyObject_New(Clock, &ClockType);
    if (held == NULL || excluded == NULL || labels == NULL || clock == NULL) {
        Py_XDECREF(held);
        Py_XDECREF(excluded);
        Py_XDECREF(labels);
        Py_XDECREF(clock);
        return -1;
    }
    clock->count = 0;
    clock->open = 1;
    Py_XSETREF(self->held, held);
    Py_XSETREF(self->excluded, excluded);
    Py_XSETREF(self->labels, labels);
    if (self->clock != NULL)
        self->clock->open = 0;
    Py_XSETREF(self->clock, clock);
    SET_NEW(owner, Py_None);
    SET_NEW(storage_of, storage_of);
    SET_NEW(on_fault, on_fault);
    SET_NEW(next_nr, next_nr);
    SET_NEW(tensor_type, tensor_type);
    SET_NEW(param_type, param_type);
    SET_NEW(call_code, call_code);
    SET_NEW(outside, outside);
    SET_NEW(last_owner, outside);
    self->packed_bytes = 0;
    self->last_nr = -1;
    PyTypeObject *tt = (PyTypeObject *)tensor_type;
    self->t_untyped_storage = noargs_of(tt, s_untyped_storage);
    self->t_detach = noargs_of(tt, s_detach);
    self->t_grad_fn = getter_of(tt, s_grad_fn, &self->t_grad_fn_closure);
    self->t_base = getter_of(tt, s_base, &self->t_base_closure);
    Py_CLEAR(self->storage_type);
    self->self_first = 0;
#ifdef FRAME_INTERNALS
    if (PyCode_Check(call_code)) {
        PyCodeObject *co = (PyCodeObject *)call_code;
        self->self_first =
            co->co_argcount >= 1 && co->co_ncellvars == 0 && co->co_nlocalsplus > 0 &&
            PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(co->co_localsplusnames, 0), "self") == 0;
    }
#endif
    return 0;
}

/* A call's result (a new reference, or NULL) as a C long long; -1 with an exception set on failure. */
static long long as_ll(PyObject *r) {
    if (r == NULL)
        return -1;
    long long v = PyLong_AsLongLong(r);
    Py_DECREF(r);
    return v;
}

/* `obj.name()` as a C long long. */
static long long call_ll(PyObject *obj, PyObject *name) {
    return as_ll(PyObject_CallMethodNoArgs(obj, name));
}

/* The label of `module` in `labels` (a new reference), NULL with no exception where it has none. */
static PyObject *label_of(Packer *self, PyObject *module) {
    PyObject *key = PyLong_FromVoidPtr(module);
    if (key == NULL)
        return NULL;
    PyObject *label = PyDict_GetItemWithError(self->labels, key); /* borrowed */
    Py_DECREF(key);
    Py_XINCREF(label);
    return label;
}

#ifdef FRAME_INTERNALS
/* `running_module` on the interpreter's own frames: `self` is read from the first fast local of
 * each `Module.__call__`, with no frame object or locals dict made. */
static PyObject *running_module_fast(Packer *self) {
    for (_PyInterpreterFrame *f = PyThreadState_Get()->cframe->current_frame; f != NULL; f = f->previous) {
        if ((PyObject *)f->f_code != self->call_code || _PyFrame_IsIncomplete(f) || f->localsplus[0] == NULL)
            continue;
        PyObject *label = label_of(self, f->localsplus[0]);
        if (label != NULL || PyErr_Occurred())
            return label;
    }
    Py_INCREF(self->outside);
    return self->outside;
}
#endif

/* Label of the innermost module of `labels` whose `__call__` is on the stack (new reference). */
static PyObject *running_module(Packer *self) {
#ifdef FRAME_INTERNALS
    if (self->owner == Py_None && self->self_first)
        return running_module_fast(self);
#endif
    PyFrameObject *frame = PyEval_GetFrame(); /* borrowed */
    if (frame == NULL) {
        Py_INCREF(self->outside);
        return self->outside;
    }
    Py_INCREF(frame);
    if (self->owner != Py_None) {
        PyObject *label = PyObject_CallOneArg(self->owner, (PyObject *)frame);
        Py_DECREF(frame);
        return label;
    }
    while (frame != NULL) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        int is_call = (PyObject *)code == self->call_code;
        Py_DECREF(code);
        if (is_call) {
            PyObject *locals = PyObject_GetAttr((PyObject *)frame, s_f_locals);
            if (locals == NULL) {
                Py_DECREF(frame);
                return NULL;
            }
            PyObject *module = PyObject_GetItem(locals, s_self);
            Py_DECREF(locals);
            if (module == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_KeyError)) {
                    Py_DECREF(frame);
                    return NULL;
                }
                PyErr_Clear();
            } else {
                PyObject *label = label_of(self, module);
                Py_DECREF(module);
                if (label != NULL || PyErr_Occurred()) {
                    Py_DECREF(frame);
                    return label;
                }
            }
        }
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    Py_INCREF(self->outside);
    return self->outside;
}

/* Whether the state Python may have replaced or deleted is still what the C code reads. */
static int state_ok(Packer *self) {
    if (self->held == NULL || self->excluded == NULL || self->labels == NULL ||
        !PyDict_CheckExact(self->held) || !PyDict_CheckExact(self->excluded) ||
        !PyDict_CheckExact(self->labels) || self->owner == NULL || self->storage_of == NULL ||
        self->on_fault == NULL || self->next_nr == NULL || self->last_owner == NULL) {
        PyErr_SetString(PyExc_TypeError, "packer state was replaced by something other than dicts");
        return 0;
    }
    return 1;
}

/* The entry of `key` (borrowed) if some holder of it is alive, else NULL; -1 on error. */
static int live_entry(Packer *self, PyObject *key, Entry **out) {
    PyObject *e = PyDict_GetItemWithError(self->held, key); /* borrowed */
    *out = NULL;
    if (e == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (Py_TYPE(e) != &EntryType) {
        PyErr_SetString(PyExc_TypeError, "packer.held holds something other than entries");
        return -1;
    }
    if (((Entry *)e)->alive > 0)
        *out = (Entry *)e;
    return 1;
}

/* Attribute a new storage to the running module and count `h` for it (node `nr`). */
static int new_entry(Packer *self, PyObject *key, long long n, long long nr, Holder *h) {
    if (nr != self->last_nr) {
        /* the saves of one node (one op call: LayerNorm's input, mean and rstd) share one walk */
        PyObject *label = running_module(self);
        if (label == NULL)
            return -1;
        Py_SETREF(self->last_owner, label);
        self->last_nr = nr;
    }
    Entry *e = PyObject_New(Entry, &EntryType);
    if (e == NULL)
        return -1;
    Py_INCREF(self->last_owner);
    e->owner = self->last_owner;
    e->nbytes = n;
    e->alive = 0;
    e->last_death = -1;
    int set = PyDict_SetItem(self->held, key, (PyObject *)e);
    if (set == 0)
        attach(h, e, self->clock);
    Py_DECREF(e);
    return set;
}

static long long next_node_nr(Packer *self) {
    if (facts != NULL)
        return facts->next_nr();
    return as_ll(PyObject_CallNoArgs(self->next_nr));
}

static Holder *holder_of_detached(Packer *self, PyObject *t) {
    PyCFunction detach = Py_TYPE(t) == (PyTypeObject *)self->tensor_type ? self->t_detach : NULL;
    PyObject *d = call_noargs(t, detach, s_detach);
    if (d == NULL)
        return NULL;
    Holder *h = holder_of(d);
    Py_DECREF(d);
    return h;
}

/* A tensor subclass (DTensor shards): its storage through `storage_of` (`to_local`). */
static Holder *pack_subclass(Packer *self, PyObject *t) {
    PyObject *st = NULL, *key = NULL;
    Holder *h = holder_of_detached(self, t), *result = NULL;
    if (h == NULL)
        return NULL;
    st = PyObject_CallOneArg(self->storage_of, t);
    if (st == NULL)
        goto done;
    if (st == Py_None) {
        result = h;
        goto done;
    }
    storage_methods(self, st);
    key = get_attr(st, self->st_cdata, self->st_cdata_closure, s_cdata);
    if (key == NULL)
        goto done;
    long long n = as_ll(call_noargs(st, self->st_nbytes, s_nbytes));
    if (n == -1 && PyErr_Occurred())
        goto done;
    self->packed_bytes += n;
    int excluded = PyDict_Contains(self->excluded, key);
    if (excluded < 0)
        goto done;
    if (!excluded) {
        Entry *e;
        if (live_entry(self, key, &e) < 0)
            goto done;
        if (e != NULL) {
            attach(h, e, self->clock);
        } else {
            long long nr = next_node_nr(self);
            if ((nr == -1 && PyErr_Occurred()) || new_entry(self, key, n, nr, h) < 0)
                goto done;
        }
    }
    result = h;
done:
    Py_XDECREF(st);
    Py_XDECREF(key);
    if (result == NULL)
        Py_XDECREF(h);
    return result;
}

/* The storage of a plain tensor as the fast path reads it: from the C++ tensor where
 * `_tensor_facts` is loaded, else through its Python storage object (`st`). */
typedef struct {
    PyObject *st;  /* the storage object, or NULL where the facts answered */
    PyObject *key; /* `st._cdata` */
    long long nbytes;
    int null_data;
} StorageFacts;

/* 1 with `sf` set, 0 where `t` has no storage (sparse, nested), -1 with an exception set. */
static int storage_facts(Packer *self, PyObject *t, StorageFacts *sf) {
    void *impl;
    sf->st = NULL;
    sf->nbytes = -1;
    sf->null_data = -1;
    if (facts != NULL && facts->storage(t, &impl, &sf->nbytes, &sf->null_data) == 0) {
        sf->key = PyLong_FromVoidPtr(impl);
        return sf->key == NULL ? -1 : 1;
    }
    sf->st = call_noargs(t, self->t_untyped_storage, s_untyped_storage);
    if (sf->st == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_RuntimeError) &&
            !PyErr_ExceptionMatches(PyExc_NotImplementedError) && !PyErr_ExceptionMatches(PyExc_TypeError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    storage_methods(self, sf->st);
    sf->key = get_attr(sf->st, self->st_cdata, self->st_cdata_closure, s_cdata);
    if (sf->key == NULL) {
        Py_CLEAR(sf->st);
        return -1;
    }
    return 1;
}

static void storage_facts_clear(StorageFacts *sf) {
    Py_CLEAR(sf->st);
    Py_CLEAR(sf->key);
}

/* The storage's bytes; -1 with an exception set on failure. */
static long long storage_nbytes(Packer *self, StorageFacts *sf) {
    if (sf->st == NULL)
        return sf->nbytes;
    return as_ll(call_noargs(sf->st, self->st_nbytes, s_nbytes));
}

/* Whether the storage's data pointer is null (empty, or on the meta device); -1 on failure. */
static int storage_null(Packer *self, StorageFacts *sf) {
    if (sf->st == NULL)
        return sf->null_data;
    long long ptr = as_ll(call_noargs(sf->st, self->st_data_ptr, s_data_ptr));
    if (ptr == -1 && PyErr_Occurred())
        return -1;
    return ptr == 0;
}

/* Whether `t` is an output its own node `nr - 1` saves; -1 with an exception set. */
static int own_output(Packer *self, PyObject *t, long long nr) {
    long long g_nr;
    int has = facts != NULL ? facts->grad_fn_nr(t, &g_nr) : FACTS_ASK_PYTHON;
    if (has == FACTS_ASK_PYTHON) {
        PyObject *g = get_attr(t, self->t_grad_fn, self->t_grad_fn_closure, s_grad_fn);
        if (g == NULL)
            return -1;
        has = g != Py_None;
        if (has)
            g_nr = call_ll(g, s_sequence_nr);
        Py_DECREF(g);
        if (has && g_nr == -1 && PyErr_Occurred())
            return -1;
    }
    return has && g_nr == nr - 1;
}

/* Whether `t` is a view of a parameter; -1 with an exception set. */
static int parameter_view(Packer *self, PyObject *t) {
    if (facts != NULL && facts->is_view(t) == 0)
        return 0;
    PyObject *base = get_attr(t, self->t_base, self->t_base_closure, s_base);
    if (base == NULL)
        return -1;
    int param_view = 0;
    if (base != Py_None && Py_TYPE(base) != (PyTypeObject *)self->tensor_type)
        param_view = PyObject_IsInstance(base, self->param_type);
    Py_DECREF(base);
    return param_view;
}

/* The fast path; NULL with an exception set where the caller reports a fault. */
static Holder *pack_fast(Packer *self, PyObject *t) {
    StorageFacts sf = {NULL, NULL, -1, -1};
    Entry *live = NULL;
    Holder *h = NULL, *result = NULL;
    if (!state_ok(self))
        return NULL;
    self->clock->count++;
    if (Py_TYPE(t) != (PyTypeObject *)self->tensor_type) {
        int param = PyObject_IsInstance(t, self->param_type);
        if (param < 0)
            return NULL;
        if (param) /* a leaf: resident anyway, and no cycle */
            return holder_of(t);
        return pack_subclass(self, t);
    }
    int has_storage = storage_facts(self, t, &sf);
    if (has_storage < 0)
        return NULL;
    if (!has_storage) /* no storage (sparse, nested): saved detached, counted as nothing */
        return holder_of_detached(self, t);
    int known = live_entry(self, sf.key, &live);
    if (known < 0)
        goto done;
    Py_XINCREF(live); /* Python code may run below (the node number, grad_fn): keep it */
    if (!known) {
        int excluded = PyDict_Contains(self->excluded, sf.key);
        if (excluded < 0)
            goto done;
        if (excluded) {
            /* a parameter or buffer, or a view of one: resident anyway, made before the node */
            long long n = storage_nbytes(self, &sf);
            if (n == -1 && PyErr_Occurred())
                goto done;
            self->packed_bytes += n;
            result = holder_of(t);
            goto done;
        }
    }
    long long nr = next_node_nr(self);
    if (nr == -1 && PyErr_Occurred())
        goto done;
    int own = own_output(self, t, nr);
    if (own < 0)
        goto done;
    /* an output saved by its own node is detached, as autograd detaches it (no cycle) */
    h = own ? holder_of_detached(self, t) : holder_of(t);
    if (h == NULL)
        goto done;
    if (live != NULL && live->alive > 0) {
        /* the same live storage again (a ReLU output the next Linear saves too) */
        self->packed_bytes += live->nbytes;
        attach(h, live, self->clock);
        result = h;
        h = NULL;
        goto done;
    }
    long long n = storage_nbytes(self, &sf);
    if (n == -1 && PyErr_Occurred())
        goto done;
    int null = n ? storage_null(self, &sf) : 1;
    if (null < 0)
        goto done;
    if (null) { /* empty, or on the meta device: no bytes */
        result = h;
        h = NULL;
        goto done;
    }
    self->packed_bytes += n;
    int param_view = parameter_view(self, t);
    if (param_view < 0)
        goto done;
    /* a view of a parameter the model does not list (no model given) is not counted */
    if (!param_view && new_entry(self, sf.key, n, nr, h) < 0)
        goto done;
    result = h;
    h = NULL;
done:
    storage_facts_clear(&sf);
    Py_XDECREF(live);
    Py_XDECREF(h);
    return result;
}

static PyObject *Packer_pack(Packer *self, PyObject *t) {
    if (self->clock->open) {
        Holder *h = pack_fast(self, t);
        if (h != NULL || !PyErr_ExceptionMatches(PyExc_Exception))
            return (PyObject *)h;
        /* a fault: switch off, report it, and save the tensor all the same */
        self->clock->open = 0;
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL && value != NULL)
            PyException_SetTraceback(value, tb);
        PyObject *r = PyObject_CallOneArg(self->on_fault, value != NULL ? value : Py_None);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    return (PyObject *)holder_of_detached(self, t);
}

static PyObject *Packer_still_held(Packer *self, PyObject *unused) {
    if (!state_ok(self))
        return NULL;
    PyObject *by_module = PyDict_New();
    if (by_module == NULL)
        return NULL;
    long long unique = 0;
    Py_ssize_t pos = 0, last = self->clock->count;
    PyObject *key, *value;
    while (PyDict_Next(self->held, &pos, &key, &value)) {
        if (Py_TYPE(value) != &EntryType)
            continue;
        Entry *e = (Entry *)value;
        /* alive now (the graph the call ends with), or let go after the call's last save */
        if (e->alive <= 0 && e->last_death < last)
            continue;
        unique += e->nbytes;
        PyObject *prev = PyDict_GetItemWithError(by_module, e->owner); /* borrowed */
        if (prev == NULL && PyErr_Occurred())
            goto fail;
        long long sum = e->nbytes + (prev == NULL ? 0 : PyLong_AsLongLong(prev));
        if (sum == -1 && PyErr_Occurred())
            goto fail;
        PyObject *total = PyLong_FromLongLong(sum);
        if (total == NULL)
            goto fail;
        int set = PyDict_SetItem(by_module, e->owner, total);
        Py_DECREF(total);
        if (set < 0)
            goto fail;
    }
    return Py_BuildValue("(LN)", unique, by_module);
fail:
    Py_DECREF(by_module);
    return NULL;
}

/* `use_facts(capsule)`: read plain tensors through `memprofiler._tensor_facts.API` from now on;
 * `use_facts(None)`: through Python again. */
static PyObject *use_facts(PyObject *module, PyObject *capsule) {
    if (capsule == Py_None) {
        facts = NULL;
        Py_RETURN_NONE;
    }
    const TensorFacts *api = PyCapsule_GetPointer(capsule, TENSOR_FACTS_CAPSULE);
    if (api == NULL)
        return NULL;
    if (api->version != TENSOR_FACTS_VERSION)
        return PyErr_Format(PyExc_ValueError, "tensor facts version %d, expected %d", api->version,
                            TENSOR_FACTS_VERSION);
    facts = api;
    Py_RETURN_NONE;
}

static PyObject *facts_in_use(PyObject *module, PyObject *unused) { return PyBool_FromLong(facts != NULL); }

static PyMethodDef module_methods[] = {
    {"use_facts", use_facts, METH_O,
     "Read plain tensors through this tensor-facts capsule (None: through Python)."},
    {"facts_in_use", facts_in_use, METH_NOARGS,
     "Whether plain tensors are read through the tensor-facts capsule."},
    {NULL},
};

static PyMethodDef Packer_methods[] = {
    {"pack", (PyCFunction)Packer_pack, METH_O, "The saved-tensor pack hook: a holder of `t`."},
    {"still_held", (PyCFunction)Packer_still_held, METH_NOARGS,
     "(bytes, bytes by module) of the storages still held at the call's last save."},
    {NULL},
};

static PyObject *Packer_get_count(Packer *self, void *closure) {
    return PyLong_FromSsize_t(self->clock->count);
}

static PyObject *Packer_get_enabled(Packer *self, void *closure) {
    return PyBool_FromLong(self->clock->open);
}

static int Packer_set_enabled(Packer *self, PyObject *value, void *closure) {
    int on = value == NULL ? 0 : PyObject_IsTrue(value);
    if (on < 0)
        return -1;
    self->clock->open = on;
    return 0;
}

static PyGetSetDef Packer_getset[] = {
    {"count", (getter)Packer_get_count, NULL, "tensors saved so far in the call", NULL},
    {"enabled", (getter)Packer_get_enabled, (setter)Packer_set_enabled,
     "whether the call is open (packing and counting deaths)", NULL},
    {NULL},
};

static PyMemberDef Packer_members[] = {
    {"held", T_OBJECT_EX, offsetof(Packer, held), 0, NULL},
    {"excluded", T_OBJECT_EX, offsetof(Packer, excluded), 0, NULL},
    {"labels", T_OBJECT_EX, offsetof(Packer, labels), 0, NULL},
    {"owner", T_OBJECT_EX, offsetof(Packer, owner), 0, NULL},
    {"last_owner", T_OBJECT_EX, offsetof(Packer, last_owner), READONLY, NULL},
    {"packed_bytes", T_LONGLONG, offsetof(Packer, packed_bytes), READONLY, NULL},
    {"last_nr", T_LONGLONG, offsetof(Packer, last_nr), READONLY, NULL},
    {NULL},
};

static PyTypeObject PackerType = {
    PyVarObject_HEAD_INIT(NULL, 0) // the macro ends in a comma
        .tp_name = "memprofiler._packer.Packer",
    .tp_doc = "Counts what autograd saves in one collected call (see saved_tensors._PyPacker).",
    .tp_basicsize = sizeof(Packer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Packer_init,
    .tp_dealloc = (destructor)Packer_dealloc,
    .tp_traverse = (traverseproc)Packer_traverse,
    .tp_clear = (inquiry)Packer_clear,
    .tp_methods = Packer_methods,
    .tp_members = Packer_members,
    .tp_getset = Packer_getset,
};

static struct PyModuleDef packer_module = {
    PyModuleDef_HEAD_INIT,
    "memprofiler._packer",
    "The compiled saved-tensor pack hook (see memprofiler.collectors.saved_tensors).",
    -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__packer(void) {
    if (PyType_Ready(&ClockType) < 0 || PyType_Ready(&EntryType) < 0 || PyType_Ready(&HolderType) < 0 ||
        PyType_Ready(&PackerType) < 0)
        return NULL;
#define INTERN(var, text)                                                                                    \
    if ((var = PyUnicode_InternFromString(text)) == NULL)                                                    \
        return NULL;
    INTERN(s_untyped_storage, "untyped_storage");
    INTERN(s_cdata, "_cdata");
    INTERN(s_grad_fn, "grad_fn");
    INTERN(s_sequence_nr, "_sequence_nr");
    INTERN(s_detach, "detach");
    INTERN(s_nbytes, "nbytes");
    INTERN(s_data_ptr, "data_ptr");
    INTERN(s_base, "_base");
    INTERN(s_f_locals, "f_locals");
    INTERN(s_self, "self");
#undef INTERN
    PyObject *m = PyModule_Create(&packer_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&HolderType);
    if (PyModule_AddObject(m, "Holder", (PyObject *)&HolderType) < 0) {
        Py_DECREF(&HolderType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&PackerType);
    if (PyModule_AddObject(m, "Packer", (PyObject *)&PackerType) < 0) {
        Py_DECREF(&PackerType);
        Py_DECREF(m);
        return NULL;
    }
#ifndef PACKER_SOURCE_SHA256
#define PACKER_SOURCE_SHA256 "" /* built without setup.py: the source it came from is not known */
#endif
    /* the SHA-256 of the _packer.c this was built from (setup.py): a stale build can be told */
    if (PyModule_AddStringConstant(m, "SOURCE_SHA256", PACKER_SOURCE_SHA256) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
