# cython: language_level=3
"""Compiled walk of `eventspark.steps.flatten._flatten_into`, which stays the reference.

`flatten_into` returns the same count, writes the same `out` in the same order and raises the same
exceptions. The hit paths (a str key whose name or node is cached) make no Python call: the types
are compared as pointers, the node's dicts are read from its slots and searched with
`PyDict_GetItemWithError`, the event's items are read with `PyDict_Next`. The miss paths
(`_column`, `_child`) and arrays (`to_json`) call the Python module, looked up at each call: the
caches stay in one place, and whatever replaces them there (tests, `_make_room`) is seen here too.
The module is imported on first use, not here: it imports this one while it loads.
"""

from cpython.exc cimport PyErr_Clear, PyErr_ExceptionMatches, PyErr_Occurred
from cpython.object cimport PyObject

cdef extern from "Python.h":
    # Borrowed reference; NULL when missing or, with an exception set, when the lookup failed.
    PyObject* dict_lookup "PyDict_GetItemWithError"(object mapping, object key)
    bint dict_next "PyDict_Next"(object mapping, Py_ssize_t* position, PyObject** key, PyObject** value)
    Py_ssize_t dict_size "PyDict_GET_SIZE"(object mapping)
    int dict_store "PyDict_SetItem"(object mapping, PyObject* key, PyObject* value) except -1

cdef extern from *:
    """
    #include <structmember.h>

    /* Exact types, as _SCALAR_TYPES: a subclass of one of them is not a scalar there. */
    static inline int is_scalar(PyObject *value) {
        PyTypeObject *kind = Py_TYPE(value);
        return kind == &PyUnicode_Type || kind == &PyLong_Type || kind == &PyFloat_Type || kind == &PyBool_Type;
    }

    static inline int is_exact_str(PyObject *key) { return PyUnicode_CheckExact(key); }
    static inline int is_exact_dict(PyObject *value) { return PyDict_CheckExact(value); }

    /* Where a __slots__ member keeps its value in an object; -1 when descr is not such a member. */
    static Py_ssize_t slot_offset(PyObject *descr) {
        if (Py_TYPE(descr) != &PyMemberDescr_Type) return -1;
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        return member->type == T_OBJECT_EX ? member->offset : -1;
    }

    /* A slot's value, borrowed; NULL when unset. */
    static inline PyObject *slot_value(PyObject *obj, Py_ssize_t offset) {
        return *(PyObject **)((char *)obj + offset);
    }
    """
    bint is_scalar(PyObject* value) noexcept
    bint is_exact_str(PyObject* key) noexcept
    bint is_exact_dict(PyObject* value) noexcept
    Py_ssize_t slot_offset(object descr) noexcept
    PyObject* slot_value(object obj, Py_ssize_t offset) noexcept

# Must equal eventspark.steps.flatten.MAX_DEPTH (tests/steps/test_flatten_speedup.py checks).
MAX_DEPTH = 64
cdef Py_ssize_t _MAX_DEPTH = MAX_DEPTH

cdef enum Kind:
    LEAF     # stored as it is
    OBJECT   # a dict: flattened, or JSON when too deep
    ARRAY    # a list or tuple: JSON
    NOTHING  # None: no column

cdef object _python_module = None


cdef object _python():
    """The pure-Python flatten module, whose cache and helpers the miss paths use."""
    global _python_module
    if _python_module is None:
        import eventspark.steps.flatten as flatten_module
        _python_module = flatten_module
    return _python_module


cdef int _failed_unless_key_error() except -1:
    """After a NULL lookup: a KeyError means missing, as `except KeyError` does; others propagate."""
    if PyErr_Occurred() is NULL:
        return 0
    if PyErr_ExceptionMatches(KeyError):
        PyErr_Clear()
        return 0
    return -1


cdef int _failed() except -1:
    """After a NULL lookup: propagate the error if there is one (as dict.get would)."""
    return -1 if PyErr_Occurred() is not NULL else 0


cdef Kind _kind(object value, object kind) except *:
    # The reference's order of tests, less the isinstance calls it would make in vain: None and
    # exact lists and tuples are never dict instances, so testing them first changes no result.
    if kind is dict:
        return OBJECT
    if value is None:
        return NOTHING
    if kind is list or kind is tuple:
        return ARRAY
    if isinstance(value, dict):
        return OBJECT
    if isinstance(value, (list, tuple)):
        return ARRAY
    return LEAF


# The node's dicts, read straight from its slots: an attribute lookup each would cost about a
# tenth of the walk. Only for the exact class whose slots were measured, held here so that its
# address cannot be reused by another type; anything else goes through getattr.
cdef object _node_class = None
cdef Py_ssize_t _columns_offset = -1
cdef Py_ssize_t _children_offset = -1


cdef int _measure_node_class() except -1:
    global _node_class, _columns_offset, _children_offset
    node_class = _python()._NameNode
    _columns_offset = slot_offset(node_class.__dict__["columns"])
    _children_offset = slot_offset(node_class.__dict__["children"])
    _node_class = node_class
    return 0


cdef dict _columns(object node):
    if _node_class is None:
        _measure_node_class()
    if type(node) is _node_class and _columns_offset >= 0:
        found = slot_value(node, _columns_offset)
        if found is not NULL:
            return <object>found
    return node.columns  # raises as the reference does when the slot is unset


cdef dict _children(object node):
    if _node_class is None:
        _measure_node_class()
    if type(node) is _node_class and _children_offset >= 0:
        found = slot_value(node, _children_offset)
        if found is not NULL:
            return <object>found
    return node.children


cdef object _column_name(dict columns, object node, object key):
    found = dict_lookup(columns, key)
    if found is NULL:
        _failed()
        return _python()._column(node, key)
    return <object>found


cdef object _child_node(dict children, object node, object key):
    found = dict_lookup(children, key)
    if found is NULL:
        _failed()
        return _python()._child(node, key)
    return <object>found


cdef Py_ssize_t _walk(object obj, object node, dict out, Py_ssize_t depth) except? -1:
    """The reference's loop, with its hit paths (str key, cached name or node) inline."""
    cdef Py_ssize_t leaves = len(obj)
    cdef dict columns = _columns(node)
    cdef dict children = None  # read when the first nested object needs it
    cdef Py_ssize_t position = 0
    cdef Py_ssize_t size
    cdef PyObject* key
    cdef PyObject* value
    cdef PyObject* found
    if type(obj) is not dict:  # a subclass may iterate its own way: through its items()
        for key_object, value_object in obj.items():
            leaves += _add(key_object, value_object, node, columns, out, depth)
        return leaves
    size = dict_size(obj)
    while dict_next(obj, &position, &key, &value):
        # Borrowed references are safe until Python code may run: with an exact str key, not in
        # the lookups nor in storing a scalar. Walking a subtree or _add may run any (the module's
        # functions), so what they use is held first.
        if is_exact_str(key):
            if is_scalar(value):
                found = dict_lookup(columns, <object>key)
                if found is not NULL:
                    dict_store(out, found, value)
                    continue
                _failed_unless_key_error()
            elif is_exact_dict(value) and dict_size(<object>value) and depth < _MAX_DEPTH:
                if children is None:
                    children = _children(node)
                found = dict_lookup(children, <object>key)
                if found is not NULL:
                    value_object = <object>value
                    child = <object>found
                    leaves += _walk(value_object, child, out, depth + 1) - 1
                    _check_size(obj, size)
                    continue
                _failed()
        key_object = <object>key
        value_object = <object>value
        leaves += _add(key_object, value_object, node, columns, out, depth)
        _check_size(obj, size)
    return leaves


cdef inline int _check_size(dict obj, Py_ssize_t size) except -1:
    """What the reference's items() iterator raises next when code run by the walk changed obj."""
    if dict_size(obj) != size:
        raise RuntimeError("dictionary changed size during iteration")
    return 0


cdef Py_ssize_t _add(object key, object value, object node, dict columns, dict out, Py_ssize_t depth) except? -1:
    """One item of the reference's loop; returns what it adds to the count (0, -1 or the subtree's less one)."""
    cdef Kind kind
    value_type = type(value)
    if value_type is str or value_type is int or value_type is float or value_type is bool:
        found = dict_lookup(columns, key)
        if found is not NULL:
            out[<object>found] = value
        else:
            _failed_unless_key_error()
            out[_python()._column(node, key)] = value
        return 0
    kind = _kind(value, value_type)
    if kind == OBJECT:
        if not value:
            return -1
        if depth < _MAX_DEPTH:
            child = _child_node(_children(node), node, key)
            return _walk(value, child, out, depth + 1) - 1
        value = _python().to_json(value)
    elif kind == NOTHING:
        return -1
    elif kind == ARRAY:
        value = _python().to_json(value)
    out[_column_name(columns, node, key)] = value
    return 0


def flatten_into(obj, node, dict out not None, Py_ssize_t depth):
    """`_flatten_into` of eventspark.steps.flatten (its docstring), compiled; `out` a plain dict."""
    return _walk(obj, node, out, depth)
