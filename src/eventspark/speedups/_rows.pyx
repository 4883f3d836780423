# cython: language_level=3
"""The fast path of the executors' row buffers (`batch.chunks.ChunkBuffer.add`,
`batch.direct.DirectBuffer.add`) for a whole row at C speed.

`RowScan.passes` answers whether every value of a row would take the buffer's own fast path (the
value is of its column's kind and needs no work); then the buffer skips its loop. When one value
would not, it answers False at once and the buffer runs its own loop from the start: that loop
stays the reference and handles everything else. So this never changes a value, and it accepts
only what the Python loop passes over unchanged. `RowScan.take` also makes the row's list in column
order (`list(map(values.get, columns))`) in the same pass.
"""

from cpython.dict cimport PyDict_Next
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.object cimport PyObject, PyTypeObject, Py_TYPE
from cpython.ref cimport Py_INCREF
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.float cimport PyFloat_AS_DOUBLE


cdef extern from "Python.h":
    PyObject* PyDict_GetItemWithError(object d, object key) except? NULL
    Py_ssize_t PyUnicode_GET_LENGTH(object u)
    Py_ssize_t PyUnicode_FindChar(object u, Py_UCS4 ch, Py_ssize_t start, Py_ssize_t end, int direction) except -2
    Py_UCS4 PyUnicode_READ_CHAR(object u, Py_ssize_t index)
    bint PyUnicode_IS_ASCII(object u)
    void PyObject_GC_UnTrack(PyObject *op)
    const unsigned char* PyUnicode_1BYTE_DATA(object u)
    PyTypeObject PyLong_Type
    PyTypeObject PyFloat_Type
    PyTypeObject PyUnicode_Type


cdef object _NO_MARKER = object()  # a marker a buffer does not use: matches no column's kind


cdef inline bint _holds_nul(object text) except -1:
    return PyUnicode_FindChar(text, 0, 0, PyUnicode_GET_LENGTH(text), 1) >= 0


cdef inline bint _in_int64(object number) except -1:
    cdef int overflow = 0
    PyLong_AsLongLongAndOverflow(number, &overflow)
    return overflow == 0


cdef class RowScan:
    """One buffer's fast path. `text_nul`: a str value of a str column is searched for U+0000
    (DirectBuffer); the markers are the buffer's kinds of values that need a look (those a buffer
    does not have stay unset); `bounds`: column → the exclusive bound of a `bounded` column's
    floats; `is_timestamp`: `steps.typing.is_timestamp`, called for text of timestamp kinds."""

    cdef bint text_nul
    cdef object nul_free, timestamp, zoned, utc, bounded
    cdef dict bounds
    cdef object is_timestamp
    # `take`'s kinds in column order, made from `kinds` and `columns` (held, so that neither's
    # address can be reused) while neither changes; `stale` after a miss, as the buffer's own loop
    # may then change `kinds` in place.
    cdef list column_kinds
    cdef dict kinds
    cdef list columns
    cdef Py_ssize_t width
    cdef bint stale

    def __init__(
        self,
        *,
        bint text_nul,
        object is_timestamp,
        object nul_free=_NO_MARKER,
        object timestamp=_NO_MARKER,
        object zoned=_NO_MARKER,
        object utc=_NO_MARKER,
        object bounded=_NO_MARKER,
        dict bounds=None,
    ):
        self.text_nul = text_nul
        self.is_timestamp = is_timestamp
        self.nul_free = nul_free
        self.timestamp = timestamp
        self.zoned = zoned
        self.utc = utc
        self.bounded = bounded
        self.bounds = bounds if bounds is not None else {}
        self.stale = True

    def passes(self, object values, dict kinds):
        """Whether every value of `values` needs no work: of its column's kind in `kinds` (an int:
        within int64; with `text_nul`, a str: without U+0000), None, or of a marker kind and
        accepted by it. False as soon as one is not, and for a dict subclass (its own methods
        decide what the loop sees: the loop takes it)."""
        cdef Py_ssize_t pos = 0
        cdef PyObject *name
        cdef PyObject *value
        cdef PyObject *expect
        if type(values) is not dict:
            self.stale = True
            return False
        while PyDict_Next(values, &pos, &name, &value):
            expect = PyDict_GetItemWithError(kinds, <object>name)
            if not self._passes(<object>name, <object>value, expect):
                self.stale = True
                return False
        return True

    def take(self, object values, dict kinds, list columns):
        """`list(map(values.get, columns))` when `passes(values, kinds)`, else None; in one pass over the
        columns where it can. The caller changes `kinds` in place only after a row that missed
        (None or False from this scan), and `columns` only by appending or replacing it; and
        every column is in `kinds` (None where a value of it never takes the fast path)."""
        if type(values) is not dict:  # a dict subclass: the loop takes it (see `passes`)
            self.stale = True
            return None
        if self.stale or kinds is not self.kinds or columns is not self.columns or len(columns) != self.width:
            self._remember(kinds, columns)
        cdef Py_ssize_t width = self.width
        cdef Py_ssize_t index
        cdef Py_ssize_t found = 0
        cdef PyObject *value
        cdef list result = PyList_New(width)
        # Out of the cycle collector from the start, not only once full (below): `_passes` may call
        # back into Python (is_timestamp), where a tracked list would be found by gc.get_objects or
        # gc.get_referrers with NULL items still in it, and reading one crashes the interpreter.
        PyObject_GC_UnTrack(<PyObject *>result)
        for index in range(width):
            name = columns[index]
            value = PyDict_GetItemWithError(values, name)
            if value is NULL:
                item = None
            else:
                found += 1
                item = <object>value
                if not self._passes(name, item, <PyObject *>self.column_kinds[index]):
                    self.stale = True
                    return None  # the list is freed with its items set so far, the rest NULL
            Py_INCREF(item)
            PyList_SET_ITEM(result, index, item)
        if found != len(<dict>values) and not self.passes(values, kinds):  # a field without a column
            return None
        # Every item is a bool, int, float, str or None (each value took the fast path), so the
        # list cannot be part of a reference cycle: it stays out of the cycle collector, whose
        # passes over a task's many kept rows cost about as much as making them. (Items set later,
        # as `take` pads or converts a column, are of these types too.)
        return result

    cdef _remember(self, dict kinds, list columns):
        self.column_kinds = [kinds.get(name) for name in columns]
        self.kinds = kinds
        self.columns = columns
        self.width = len(columns)
        self.stale = False

    cdef inline bint _passes(self, object name, object value, PyObject *expect) except -1:
        cdef PyTypeObject *kind = Py_TYPE(value)
        if <PyObject *>kind is expect:
            if kind is &PyLong_Type:
                return _in_int64(value)
            if kind is &PyUnicode_Type and self.text_nul:
                return not _holds_nul(value)
            return True
        if value is None:
            return True
        if expect is NULL:
            return False
        marker = <object>expect
        if kind is &PyUnicode_Type:
            if marker is self.nul_free:
                return not _holds_nul(value)
            if marker is self.timestamp or marker is self.zoned:
                return _surely_timestamp(value) or bool(self.is_timestamp(value))
            if marker is self.utc:
                return self._utc(value)
            return False
        if kind is &PyFloat_Type and marker is self.bounded:
            return self._bounded(name, PyFloat_AS_DOUBLE(value))
        return False

    cdef inline bint _utc(self, object text) except -1:
        cdef Py_ssize_t length = PyUnicode_GET_LENGTH(text)
        if length == 0 or PyUnicode_READ_CHAR(text, length - 1) != u"Z":
            return False
        return _surely_timestamp(text) or bool(self.is_timestamp(text))

    cdef inline bint _bounded(self, object name, double number) except -1:
        cdef double bound = self.bounds[name]
        return -bound < number < bound


cdef inline int _digits(const unsigned char *text, Py_ssize_t start, Py_ssize_t count):
    """The number in text[start:start + count] when all are ASCII digits, else -1."""
    cdef int number = 0
    cdef Py_ssize_t index
    cdef unsigned char c
    for index in range(start, start + count):
        c = text[index]
        if c < 48 or c > 57:
            return -1
        number = number * 10 + (c - 48)
    return number


cdef inline int _days_in_month(int year, int month):
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


cdef bint _surely_timestamp(object text) except -1:
    """True only for text that `steps.typing.is_timestamp` accepts: the common RFC 3339 shape
    `YYYY-MM-DDTHH:MM:SS[.f{1,9}](Z|±HH:MM)` with every field in range, a year from 2 to 9998 (no
    edge of datetime's range) and an offset below 24 hours with minutes below 60. False means
    "ask `is_timestamp`", never "not a timestamp"."""
    if not PyUnicode_IS_ASCII(text):
        return False
    cdef Py_ssize_t length = PyUnicode_GET_LENGTH(text)
    if length < 20 or length > 35:
        return False
    cdef const unsigned char *s = PyUnicode_1BYTE_DATA(text)
    if s[4] != b'-' or s[7] != b'-' or s[10] != b'T' or s[13] != b':' or s[16] != b':':
        return False
    cdef int year = _digits(s, 0, 4), month = _digits(s, 5, 2), day = _digits(s, 8, 2)
    if year < 2 or year > 9998 or month < 1 or month > 12 or day < 1 or day > _days_in_month(year, month):
        return False
    cdef int hour = _digits(s, 11, 2), minute = _digits(s, 14, 2), second = _digits(s, 17, 2)
    if hour < 0 or hour > 23 or minute < 0 or minute > 59 or second < 0 or second > 59:
        return False
    cdef Py_ssize_t end = 19
    if s[end] == b'.':
        end += 1
        while end < length and end < 29 and 48 <= s[end] <= 57:
            end += 1
        if end == 20:  # a point without a digit
            return False
    if end == length - 1:
        return s[end] == b'Z'
    if end != length - 6 or (s[end] != b'+' and s[end] != b'-') or s[end + 3] != b':':
        return False
    cdef int offset_hours = _digits(s, end + 1, 2), offset_minutes = _digits(s, end + 4, 2)
    return 0 <= offset_hours <= 23 and 0 <= offset_minutes <= 59


def surely_timestamp(str text):
    """`_surely_timestamp`, for the tests: True only for text `is_timestamp` accepts."""
    return _surely_timestamp(text)


