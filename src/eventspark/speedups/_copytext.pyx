# cython: language_level=3, boundscheck=False, wraparound=False
"""Postgres COPY data of whole lists of rows, in C: text for the direct writes
(`destinations.postgres.direct`), binary for the stages (`destinations.postgres.client`). The
bytes psycopg's per-row path (`Copy.set_types` + `Copy.write_row`) would send for the same rows,
built a block at a time (`binary_rows` below: the same contract, in the binary format).

`text_rows` encodes rows while every value is None or of its column's kind (bool, int, float,
str: the codes `KIND_CODES`) and can be written as psycopg writes it. At the first row holding a
value it leaves alone (another type, a str with U+0000 or one that cannot be UTF-8 encoded, a row
longer than the columns, a huge int whose `str` refuses) it stops before that row and says so:
the caller hands that row and the rest to psycopg, which then fails (or not) exactly as it would
have. So this never sends something psycopg would not have sent.

The text each value becomes, as psycopg's text dumpers write it: None → `\\N`; bool → `t` / `f`;
int → its decimal digits; float → `repr` (`1e+300`, `-0.0`, `inf`, `nan`: psycopg's
`PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0)`); str → UTF-8. Then the COPY text
escapes psycopg applies: backslash, and the controls \\b \\t \\n \\v \\f \\r as backslash + letter
(Postgres requires backslash, tab, newline and carriage return; the other three read back the
same). Values are separated by tabs, a row ends with a newline; a row shorter than the columns
gets `\\N` for its missing tail.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject, PyTypeObject
from libc.math cimport floor
from libc.string cimport memchr, memcpy, strlen


cdef extern from "Python.h":
    char* PyOS_double_to_string(double value, char format_code, int precision, int flags, int *kind) except NULL
    int Py_DTSF_ADD_DOT_0
    const char* PyUnicode_AsUTF8AndSize(object text, Py_ssize_t *size) except NULL
    PyObject** PySequence_Fast_ITEMS(object sequence)
    Py_ssize_t PyUnicode_FindChar(object text, Py_UCS4 character, Py_ssize_t start, Py_ssize_t end, int direction) except -2
    Py_ssize_t PySequence_Fast_GET_SIZE(object sequence)
    # Borrowed values are read without touching their reference counts: the rows are large and
    # cold in the cache, so a write to every value's header would cost more than the reading.
    PyTypeObject* type_of "Py_TYPE"(PyObject *value)
    PyTypeObject PyUnicode_Type
    PyTypeObject PyLong_Type
    PyTypeObject PyFloat_Type
    PyObject* NONE "Py_None"
    PyObject* TRUE "Py_True"
    PyObject* FALSE "Py_False"
    bint PyUnicode_IS_COMPACT_ASCII(PyObject *text)
    void* PyUnicode_DATA(PyObject *text)
    Py_ssize_t PyUnicode_GET_LENGTH(PyObject *text)
    double float_value "PyFloat_AS_DOUBLE"(PyObject *number)
    Py_ssize_t PY_SSIZE_T_MAX


KIND_CODES = {bool: b"b", int: b"i", float: b"f", str: b"s"}
"""The code of each column kind in `text_rows`'s `kinds`."""

cdef enum:
    # Room for any value but a str (a float's repr is at most 24 bytes) and its separator.
    _SCALAR_ROOM = 32
    _STOP = 1  # in _ESCAPES: U+0000, which psycopg refuses in text

cdef unsigned char _ESCAPES[256]
_ESCAPES[0] = _STOP
_ESCAPES[8] = b"b"
_ESCAPES[9] = b"t"
_ESCAPES[10] = b"n"
_ESCAPES[11] = b"v"
_ESCAPES[12] = b"f"
_ESCAPES[13] = b"r"
_ESCAPES[92] = b"\\"


cdef struct Buffer:
    char *data
    Py_ssize_t size
    Py_ssize_t capacity


cdef inline int _reserve(Buffer *buf, Py_ssize_t more) except -1:
    """Room for `more` bytes after `buf.size`."""
    if buf.size + more <= buf.capacity:
        return 0
    return _grow(buf, buf.size + more)


cdef int _grow(Buffer *buf, Py_ssize_t need) except -1:
    cdef Py_ssize_t capacity = max(need, 2 * buf.capacity)
    cdef char *grown
    grown = <char *>PyMem_Realloc(buf.data, capacity)
    if grown == NULL:
        raise MemoryError()
    buf.data = grown
    buf.capacity = capacity
    return 0


cdef inline void _put(Buffer *buf, const char *text, Py_ssize_t size) noexcept:
    memcpy(buf.data + buf.size, text, size)
    buf.size += size


cdef int _put_int(Buffer *buf, object number) except -1:
    """Decimal digits; 0 (nothing written) when `str` refuses the number (its digit limit)."""
    cdef int overflow = 0
    cdef long long value = PyLong_AsLongLongAndOverflow(number, &overflow)
    cdef unsigned long long rest
    cdef char digits[24]
    cdef int start = 24
    cdef bytes text
    if overflow:
        try:
            text = str(number).encode("ascii")
        except ValueError:
            return 0
        _reserve(buf, len(text) + 1)
        _put(buf, text, len(text))
        return 1
    # Unsigned: the magnitude of the smallest long long does not fit a long long.
    rest = (0ULL - <unsigned long long>value) if value < 0 else <unsigned long long>value
    while True:
        start -= 1
        digits[start] = <char>(48 + rest % 10)
        rest //= 10
        if rest == 0:
            break
    if value < 0:
        start -= 1
        digits[start] = b"-"
    _put(buf, digits + start, 24 - start)
    return 1


cdef double _POWERS[18]
for _k in range(18):
    _POWERS[_k] = 10.0 ** _k  # exact doubles (up to 1e22)


cdef int _put_fixed(Buffer *buf, double value) noexcept:
    """`_fixed_digits` written as repr writes them; 0 (nothing written) when it finds none."""
    cdef long long digits
    cdef int decimals
    if not _fixed_digits(value, &digits, &decimals):
        return 0
    _put_decimal(buf, digits, decimals, value < 0)
    return 1


cdef int _fixed_digits(double value, long long *found, int *decimals) noexcept:
    """The digits of `repr(value)` for the usual floats, with few decimals (prices, ratios), at a
    fraction of the cost of Python's shortest-repr search: |value| = `found` / 10**`decimals`;
    0 when this cannot be sure.

    The shortest decimal that reads back as `value` (what repr writes, with the closest of them
    when there are several) has the fewest decimals k for which one exists; for each k the
    closest candidate is m = round(value * 10**k) when the product's rounding error cannot move
    it across a half (checked), and m / 10**k is the double that text reads back as, exactly
    (both exact doubles below 2**53, a correctly rounded division: what strtod returns)."""
    cdef double magnitude = -value if value < 0 else value
    cdef double scaled, nearest, error
    cdef int k
    # repr writes these without an exponent (it uses one below 1e-4 and from 1e16).
    if not (1e-3 <= magnitude < 1e15):
        return 0
    for k in range(18):
        scaled = magnitude * _POWERS[k]
        if scaled >= 4503599627370496.0:  # 2**52: the bound on the error below
            return 0
        nearest = floor(scaled + 0.5)
        error = scaled - nearest
        if error < 0:
            error = -error
        if error > 0.5 - scaled * 2.220446049250313e-16:  # |scaled| * 2**-52 from a half
            return 0
        if nearest / _POWERS[k] == magnitude:
            found[0] = <long long>nearest
            decimals[0] = k
            return 1
    return 0


cdef void _put_decimal(Buffer *buf, long long digits, int decimals, bint negative) noexcept:
    """`digits` / 10**decimals written as repr writes it: `-12.5`, `0.001`, `3.0`."""
    cdef char text[48]
    cdef int end = 48
    cdef int start = end
    cdef int i
    if decimals == 0:
        start -= 1
        text[start] = b"0"
        start -= 1
        text[start] = b"."
    for i in range(decimals):
        start -= 1
        text[start] = <char>(48 + digits % 10)
        digits //= 10
    if decimals > 0:
        start -= 1
        text[start] = b"."
    while True:
        start -= 1
        text[start] = <char>(48 + digits % 10)
        digits //= 10
        if digits == 0:
            break
    if negative:
        start -= 1
        text[start] = b"-"
    _put(buf, text + start, end - start)


cdef int _put_float(Buffer *buf, double value) except -1:
    cdef char *text
    if _put_fixed(buf, value):
        return 1
    text = PyOS_double_to_string(value, b"r", 0, Py_DTSF_ADD_DOT_0, NULL)
    _put(buf, text, <Py_ssize_t>strlen(text))
    PyMem_Free(text)
    return 1


cdef inline bint _plain(unsigned long long word) noexcept:
    """Whether none of the 8 bytes of `word` needs an escape or stops the encoder (`_ESCAPES`):
    no byte below 0x0E (all of its controls are), none equal to a backslash."""
    cdef unsigned long long low = (word - 0x0E0E0E0E0E0E0E0EULL) & ~word & 0x8080808080808080ULL
    cdef unsigned long long slash = word ^ 0x5C5C5C5C5C5C5C5CULL
    slash = (slash - 0x0101010101010101ULL) & ~slash & 0x8080808080808080ULL
    return (low | slash) == 0


cdef int _put_text(Buffer *buf, PyObject *text) except -1:
    """UTF-8, escaped; 0 (nothing written) for text psycopg refuses (U+0000, a lone surrogate)."""
    cdef Py_ssize_t size
    cdef Py_ssize_t i = 0
    cdef Py_ssize_t end
    cdef const unsigned char *src
    cdef unsigned char escape
    cdef unsigned long long word
    cdef char *out
    if PyUnicode_IS_COMPACT_ASCII(text):  # its characters are its UTF-8
        src = <const unsigned char *>PyUnicode_DATA(text)
        size = PyUnicode_GET_LENGTH(text)
    else:
        try:
            src = <const unsigned char *>PyUnicode_AsUTF8AndSize(<object>text, &size)
        except UnicodeEncodeError:
            return 0
    _reserve(buf, 2 * size + 8)  # + 8: the last word is stored whole
    out = buf.data + buf.size
    # 8 bytes at a time while none needs a look (the usual text has none), then byte by byte.
    while i < size:
        if size - i >= 8:
            memcpy(&word, src + i, 8)
        else:
            word = 0x2020202020202020ULL  # spaces past the end: plain
            memcpy(&word, src + i, size - i)
        if not _plain(word):
            break
        memcpy(out + i, &word, 8)
        i += 8
    if i >= size:
        buf.size += size
        return 1
    end = i  # a local: writes through `out` could alias `buf.size`
    while i < size:
        escape = _ESCAPES[src[i]]
        if escape == 0:
            out[end] = <char>src[i]
            end += 1
        elif escape == _STOP:
            return 0
        else:
            out[end] = b"\\"
            out[end + 1] = <char>escape
            end += 2
        i += 1
    buf.size += end
    return 1


cdef int _put_value(Buffer *buf, PyObject *value, unsigned char kind) except -1:
    """The value's text (then 1), or 0 when it is not of `kind` or psycopg must have it."""
    if value == NONE:
        _put(buf, b"\\N", 2)
        return 1
    if kind == b"s":
        return _put_text(buf, value) if type_of(value) == &PyUnicode_Type else 0
    if kind == b"i":
        return _put_int(buf, <object>value) if type_of(value) == &PyLong_Type else 0
    if kind == b"f":
        return _put_float(buf, float_value(value)) if type_of(value) == &PyFloat_Type else 0
    if kind == b"b":
        if value == TRUE:
            _put(buf, b"t", 1)
            return 1
        if value == FALSE:
            _put(buf, b"f", 1)
            return 1
    return 0


cdef int _put_row(Buffer *buf, object row, const unsigned char *kinds, Py_ssize_t width) except -1:
    """The row's line (then 1), or 0 with `buf` as it was when psycopg must have the row."""
    cdef Py_ssize_t start = buf.size
    cdef Py_ssize_t size, i
    cdef PyObject **values
    if type(row) is not list and type(row) is not tuple:
        return 0
    size = PySequence_Fast_GET_SIZE(row)
    if size > width:
        return 0
    values = PySequence_Fast_ITEMS(row)
    for i in range(width):
        _reserve(buf, _SCALAR_ROOM)
        if i > 0:
            _put(buf, b"\t", 1)
        if i >= size:
            _put(buf, b"\\N", 2)
        elif not _put_value(buf, values[i], kinds[i]):
            buf.size = start
            return 0
    _reserve(buf, 1)
    _put(buf, b"\n", 1)
    return 1


cdef int _open(Buffer *buf, Py_ssize_t start, Py_ssize_t block_size) except -1:
    """The block's buffer, after checking the arguments: the rows are read without bounds checks
    (a negative `start` would read before the list's items), and an empty block would make the
    caller's loop (`write_blocks`) go on for ever."""
    if start < 0:
        raise ValueError(f"start must not be negative, not {start}")
    if block_size < 1 or block_size > PY_SSIZE_T_MAX - 4096:
        raise ValueError(f"block_size out of range: {block_size}")
    buf.size = 0
    buf.capacity = block_size + 4096
    buf.data = <char *>PyMem_Malloc(buf.capacity)
    if buf.data == NULL:
        raise MemoryError()
    return 0


def text_rows(object rows, Py_ssize_t start, bytes kinds, Py_ssize_t block_size):
    """`(data, end, stopped)`: the text COPY data of `rows[start:end]`, at least `block_size`
    bytes unless `end` is the last row or `stopped`; `stopped`: `rows[end]` holds a value left to
    psycopg (module docstring). `kinds`: a `KIND_CODES` code per column. Rows in anything but a
    list (a subclass: its own methods decide what psycopg sees) are all left to psycopg."""
    return _block(rows, start, kinds, block_size, _put_row)


ctypedef int (*PutRow)(Buffer *buf, object row, const unsigned char *kinds, Py_ssize_t width) except -1


cdef tuple _block(object rows, Py_ssize_t start, bytes kinds, Py_ssize_t block_size, PutRow put):
    """`text_rows` and `binary_rows`: the rows from `start` while `put` takes them, up to a block."""
    cdef Buffer buf
    cdef Py_ssize_t end = start
    cdef Py_ssize_t count
    cdef const unsigned char *codes = kinds
    cdef Py_ssize_t width = len(kinds)
    cdef bint stopped = False
    _open(&buf, start, block_size)
    try:
        if type(rows) is not list:
            return b"", start, True
        count = len(<list>rows)
        while end < count and buf.size < block_size:
            if not put(&buf, (<list>rows)[end], codes, width):
                stopped = True
                break
            end += 1
        return PyBytes_FromStringAndSize(buf.data, buf.size), end, stopped
    finally:
        PyMem_Free(buf.data)


# --- binary COPY (the staged path: `destinations.postgres.client.PostgresStageWriter`) -----------

BINARY_HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
"""The signature, the flags and the length of the header extension (both 0)."""
BINARY_TRAILER = b"\xff\xff"
STAGE_CODES = {"bigint": b"i", "float8": b"f", "boolean": b"b", "text": b"s"}
"""The code of each stage type in `binary_rows`'s `kinds` (`KIND_CODES`' Python types)."""


cdef inline void _put_be(Buffer *buf, unsigned long long value, int size) noexcept:
    """The low `size` bytes of `value`, most significant first (network order)."""
    cdef unsigned char *out = <unsigned char *>buf.data + buf.size
    if size == 8:
        out[0] = <unsigned char>(value >> 56)
        out[1] = <unsigned char>(value >> 48)
        out[2] = <unsigned char>(value >> 40)
        out[3] = <unsigned char>(value >> 32)
        out += 4
    if size >= 4:
        out[0] = <unsigned char>(value >> 24)
        out[1] = <unsigned char>(value >> 16)
        out += 2
    if size >= 2:
        out[0] = <unsigned char>(value >> 8)
        out += 1
    out[0] = <unsigned char>value
    buf.size += size


cdef int _put_binary_value(Buffer *buf, PyObject *value, unsigned char kind) except -1:
    """The field (length and bytes; then 1), or 0 when it is not of `kind` or psycopg must have it."""
    cdef int overflow = 0
    cdef long long number
    cdef double real
    cdef unsigned long long bits
    cdef Py_ssize_t size
    cdef const char *src
    if value == NONE:
        _put_be(buf, 0xFFFFFFFF, 4)  # length -1
        return 1
    if kind == b"s" and type_of(value) == &PyUnicode_Type:
        if PyUnicode_IS_COMPACT_ASCII(value):
            src = <const char *>PyUnicode_DATA(value)
            size = PyUnicode_GET_LENGTH(value)
        else:
            try:
                src = PyUnicode_AsUTF8AndSize(<object>value, &size)
            except UnicodeEncodeError:
                return 0
        if size > 0x7FFFFFFF:
            return 0
        _reserve(buf, size + 4)
        _put_be(buf, <unsigned long long>size, 4)
        _put(buf, src, size)
        return 1
    if kind == b"i" and type_of(value) == &PyLong_Type:
        number = PyLong_AsLongLongAndOverflow(<object>value, &overflow)
        if overflow:
            return 0
        _put_be(buf, 8, 4)
        _put_be(buf, <unsigned long long>number, 8)
        return 1
    if kind == b"f" and type_of(value) == &PyFloat_Type:
        real = float_value(value)
        memcpy(&bits, &real, 8)  # the IEEE 754 bits
        _put_be(buf, 8, 4)
        _put_be(buf, bits, 8)
        return 1
    if kind == b"b" and (value == TRUE or value == FALSE):
        _put_be(buf, 1, 4)
        _put_be(buf, 1 if value == TRUE else 0, 1)
        return 1
    return 0


cdef int _put_binary_row(Buffer *buf, object row, const unsigned char *kinds, Py_ssize_t width) except -1:
    """The row's tuple (then 1), or 0 with `buf` as it was when psycopg must have the row."""
    cdef Py_ssize_t start = buf.size
    cdef Py_ssize_t i
    cdef PyObject **values
    if type(row) is not list and type(row) is not tuple:
        return 0
    if PySequence_Fast_GET_SIZE(row) != width or width > 0x7FFF:
        return 0
    values = PySequence_Fast_ITEMS(row)
    _reserve(buf, 2 + 13 * width)  # room for every field but text
    _put_be(buf, <unsigned long long>width, 2)
    for i in range(width):
        if not _put_binary_value(buf, values[i], kinds[i]):
            buf.size = start
            return 0
        if kinds[i] == b"s":
            _reserve(buf, 13 * (width - i))
    return 1


def binary_rows(object rows, Py_ssize_t start, bytes kinds, Py_ssize_t block_size):
    """`(data, end, stopped)` as `text_rows`, for a binary COPY: the tuples of `rows[start:end]`
    (a row of another length than `kinds` is left to psycopg too), without the header
    (`BINARY_HEADER`) or the trailer (`BINARY_TRAILER`). `kinds`: a `STAGE_CODES` code per column.
    Each field as psycopg's binary dumpers write it: big-endian bigint and float8, one byte 1/0
    for a boolean, the UTF-8 of a text; -1 as the length of a NULL."""
    return _block(rows, start, kinds, block_size, _put_binary_row)


# --- binary COPY into a table's own column types (direct writes) --------------------------------

DIRECT_CODES = {
    "boolean": b"b",
    "bigint": b"i",
    "integer": b"4",
    "smallint": b"2",
    "double precision": b"f",
    "text": b"s",
    "character varying": b"s",
    "numeric": b"n",
    "timestamp without time zone": b"t",
    "timestamp with time zone": b"z",
}
"""The code of each column type (as the catalog spells it, without its modifier) in
`binary_direct_rows`'s `kinds`."""

cdef enum:
    _NUMERIC_POS = 0x0000
    _NUMERIC_NEG = 0x4000
    _MAX_REPR = 32  # digits in a double's shortest repr (17) with room to spare

cdef long long _USECS_PER_DAY = 86400000000LL  # beyond an enum's int


cdef int _put_numeric(Buffer *buf, double value) except -1:
    """`value` as Postgres's binary numeric of the decimal its text COPY sends (`repr`, which
    numeric_in reads: the same digits and display scale); 0 for a NaN or an infinity."""
    cdef char *text
    cdef char digits[_MAX_REPR + 8]
    cdef int count = 0, point = 0, exponent = 0, scale, i
    cdef bint negative = False, after_point = False, exponent_negative = False
    cdef const char *c
    cdef long long fixed
    if value != value or value - value != 0:
        return 0
    if _fixed_digits(value, &fixed, &scale):
        # repr's digits without its search: `fixed` / 10**scale, and "x.0" when scale is 0
        negative = value < 0
        count = 0
        while True:
            digits[count] = fixed % 10
            fixed //= 10
            count += 1
            if fixed == 0:
                break
        for i in range(count // 2):
            digits[i], digits[count - 1 - i] = digits[count - 1 - i], digits[i]
        return _put_numeric_digits(buf, digits, count, count - scale, scale if scale > 0 else 1, negative)
    text = PyOS_double_to_string(value, b"r", 0, Py_DTSF_ADD_DOT_0, NULL)
    try:
        c = text
        if c[0] == b"-":
            negative = True
            c += 1
        while c[0] != 0 and c[0] != b"e":
            if c[0] == b".":
                after_point = True
            elif count < _MAX_REPR:
                digits[count] = c[0] - 48
                count += 1
                if not after_point:
                    point += 1
            else:
                return 0
            c += 1
        if c[0] == b"e":
            c += 1
            if c[0] == b"-":
                exponent_negative = True
                c += 1
            elif c[0] == b"+":
                c += 1
            while c[0] != 0:
                exponent = exponent * 10 + (c[0] - 48)
                c += 1
            if exponent_negative:
                exponent = -exponent
    finally:
        PyMem_Free(text)
    point += exponent  # the value is 0.d1d2... * 10**point
    scale = count - point
    if scale < 0:
        scale = 0
    return _put_numeric_digits(buf, digits, count, point, scale, negative)


cdef int _put_numeric_digits(Buffer *buf, const char *digits, int count, int point, int scale, bint negative) except -1:
    """The numeric 0.`digits` * 10**`point` (decimal digits 0-9, `count` of them), display scale
    `scale`, in Postgres's binary form; 0 when it would take more than 16 groups of four."""
    cdef int pad, groups, i, j, first, last, weight
    cdef unsigned short group_values[16]
    # Groups of four digits aligned on the decimal point: pad the left so that it falls between groups.
    pad = (4 - (point % 4 + 4) % 4) % 4
    weight = (point + pad) // 4 - 1
    groups = (pad + count + 3) // 4
    if groups > 16:
        return 0
    for i in range(groups):
        group_values[i] = 0
        for j in range(4):
            group_values[i] = group_values[i] * 10 + (
                digits[4 * i + j - pad] if 0 <= 4 * i + j - pad < count else 0
            )
    first = 0
    while first < groups and group_values[first] == 0:
        first += 1
        weight -= 1
    last = groups
    while last > first and group_values[last - 1] == 0:
        last -= 1
    if first == last:  # zero, always positive (as numeric_in makes it)
        weight = 0
        negative = False
    _reserve(buf, 4 + 8 + 2 * (last - first))
    _put_be(buf, <unsigned long long>(8 + 2 * (last - first)), 4)
    _put_be(buf, <unsigned long long>(last - first), 2)
    _put_be(buf, <unsigned long long>(<unsigned short>weight), 2)
    _put_be(buf, _NUMERIC_NEG if negative else _NUMERIC_POS, 2)
    _put_be(buf, <unsigned long long>scale, 2)
    for i in range(first, last):
        _put_be(buf, group_values[i], 2)
    return 1


cdef inline int _digits(const char *text, int size) noexcept:
    """The number written by `size` ASCII digits, or -1."""
    cdef int value = 0, i
    for i in range(size):
        if text[i] < b"0" or text[i] > b"9":
            return -1
        value = value * 10 + (text[i] - 48)
    return value


cdef long long _days_from_2000(int year, int month, int day) noexcept:
    """Days from 2000-01-01 to a date of the proleptic Gregorian calendar (days from civil)."""
    cdef int y = year - (1 if month <= 2 else 0)
    cdef int era = y // 400
    cdef int yoe = y - era * 400
    cdef int doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    cdef int doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return <long long>era * 146097 + doe - 730425  # 730425: 0000-03-01 to 2000-01-01


cdef int _month_days(int year, int month) noexcept:
    if month == 2:
        return 29 if (year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)) else 28
    return 30 if month in (4, 6, 9, 11) else 31


cdef int _put_timestamp(Buffer *buf, PyObject *value, bint zoned) except -1:
    """An RFC 3339 text as Postgres's binary timestamp (microseconds from 2000-01-01, UTC); 0 for
    any text but `YYYY-MM-DD[T ]HH:MM:SS[.f{1,6}](Z|±HH:MM)` of a real date and time (the text
    path then reads it as the server does). A `timestamp` column takes only UTC offsets (its
    values are in UTC: `batch.direct`), a `timestamptz` column any, as the server applies it."""
    cdef const char *t
    cdef Py_ssize_t size, at
    cdef int year, month, day, hour, minute, second, fraction = 0, places = 0, offset = 0
    cdef int offset_hours, offset_minutes
    cdef long long micros
    if type_of(value) != &PyUnicode_Type or not PyUnicode_IS_COMPACT_ASCII(value):
        return 0
    t = <const char *>PyUnicode_DATA(value)
    size = PyUnicode_GET_LENGTH(value)
    if size < 20 or t[4] != b"-" or t[7] != b"-" or (t[10] != b"T" and t[10] != b" ") or t[13] != b":" or t[16] != b":":
        return 0
    year = _digits(t, 4)
    month = _digits(t + 5, 2)
    day = _digits(t + 8, 2)
    hour = _digits(t + 11, 2)
    minute = _digits(t + 14, 2)
    second = _digits(t + 17, 2)
    if year < 1 or month < 1 or month > 12 or day < 1 or day > _month_days(year, month):
        return 0
    if hour < 0 or hour > 23 or minute < 0 or minute > 59 or second < 0 or second > 59:
        return 0
    at = 19
    if t[at] == b".":
        at += 1
        while at < size and b"0" <= t[at] <= b"9":
            if places == 6:
                return 0  # more than microseconds: the server rounds, left to it
            fraction = fraction * 10 + (t[at] - 48)
            places += 1
            at += 1
        if places == 0:
            return 0
        while places < 6:
            fraction *= 10
            places += 1
    if at == size - 1 and t[at] == b"Z":
        offset = 0
    elif at == size - 6 and (t[at] == b"+" or t[at] == b"-") and t[at + 3] == b":":
        offset_hours = _digits(t + at + 1, 2)
        offset_minutes = _digits(t + at + 4, 2)
        if offset_hours < 0 or offset_hours > 15 or offset_minutes < 0 or offset_minutes > 59:
            return 0
        offset = offset_hours * 60 + offset_minutes
        if t[at] == b"-":
            offset = -offset
        if offset != 0 and not zoned:
            return 0
    else:
        return 0
    micros = _days_from_2000(year, month, day) * _USECS_PER_DAY
    micros += ((hour * 60 + minute - offset) * 60 + second) * 1000000LL + fraction
    _reserve(buf, 12)
    _put_be(buf, 8, 4)
    _put_be(buf, <unsigned long long>micros, 8)
    return 1


cdef int _put_direct_value(Buffer *buf, PyObject *value, unsigned char kind) except -1:
    """A field of `binary_direct_rows` (then 1), or 0 when the text path must have the value."""
    cdef int overflow = 0
    cdef long long number
    if value == NONE:
        _reserve(buf, 4)
        _put_be(buf, 0xFFFFFFFF, 4)
        return 1
    if kind == b"4" or kind == b"2":
        if type_of(value) != &PyLong_Type:
            return 0
        number = PyLong_AsLongLongAndOverflow(<object>value, &overflow)
        if overflow or (kind == b"4" and not -2147483648 <= number <= 2147483647) or (
            kind == b"2" and not -32768 <= number <= 32767
        ):
            return 0
        _reserve(buf, 8)
        _put_be(buf, 4 if kind == b"4" else 2, 4)
        _put_be(buf, <unsigned long long>number, 4 if kind == b"4" else 2)
        return 1
    if kind == b"n":
        if type_of(value) != &PyFloat_Type:
            return 0
        return _put_numeric(buf, float_value(value))
    if kind == b"t" or kind == b"z":
        return _put_timestamp(buf, value, kind == b"z")
    if kind == b"s" and type_of(value) == &PyUnicode_Type:
        # U+0000, which Postgres text cannot hold: the text path fails as it fails.
        if PyUnicode_IS_COMPACT_ASCII(value):
            if memchr(PyUnicode_DATA(value), 0, PyUnicode_GET_LENGTH(value)) != NULL:
                return 0
        elif PyUnicode_FindChar(<object>value, 0, 0, PyUnicode_GET_LENGTH(value), 1) != -1:
            return 0
    _reserve(buf, 13)
    return _put_binary_value(buf, value, kind)


cdef int _put_direct_row(Buffer *buf, object row, const unsigned char *kinds, Py_ssize_t width) except -1:
    """The row's tuple, a shorter row's missing tail NULL (then 1), or 0 with `buf` as it was."""
    cdef Py_ssize_t start = buf.size
    cdef Py_ssize_t size, i
    cdef PyObject **values
    if type(row) is not list or width > 0x7FFF:
        return 0
    size = PySequence_Fast_GET_SIZE(row)
    if size > width:
        return 0
    values = PySequence_Fast_ITEMS(row)
    _reserve(buf, 2)
    _put_be(buf, <unsigned long long>width, 2)
    for i in range(width):
        if i >= size:
            _reserve(buf, 4)
            _put_be(buf, 0xFFFFFFFF, 4)
        elif not _put_direct_value(buf, values[i], kinds[i]):
            buf.size = start
            return 0
    return 1


def binary_direct_rows(object rows, Py_ssize_t start, bytes kinds, Py_ssize_t block_size):
    """`(data, end, stopped)` as `binary_rows`, into a table's own column types (`DIRECT_CODES`
    per column: numeric and timestamps too, a row shorter than `kinds` ending in NULLs).
    `stopped` at the first value whose binary form this cannot be sure of, as the server would
    read its text (module docstring): the caller then sends the whole split as text instead."""
    return _block(rows, start, kinds, block_size, _put_direct_row)
