"""The C API's mirrors cannot drift: the Lua FFI declarations
(lua/st/ffi.lua) and the Python ctypes declarations
(python/sharedtensor/_lib.py, errors.py) are compared with the public
headers (include/st/*.h).

  - every function of client.h and errors.h is declared in both mirrors,
    with the same return and parameter types (Lua: the same C text, names
    aside; Python: the ctypes type each C type needs);
  - functions the mirrors take from dtype.h and dlpack.h match too;
  - structs (st_tensor_t, st_value_t, st_object_info_t,
    st_client_options_t, st_readers_t, ...) have the same fields in the same order, of
    matching types, in both mirrors;
  - the enum constants of client.h have the same values in both;
  - the error table Python builds from the library equals errors.h;
  - no client source spells an error code as a number.

Parses the headers itself (a small declaration parser for the subset of C
the headers use); needs no framework.
"""
import ctypes
import glob
import os
import re
import unittest

import st_fixture

st_fixture.add_package_path()

from sharedtensor import _lib, errors  # noqa: E402

SRC = st_fixture.env("ST_SOURCE_DIR")
HEADERS = ["client.h", "errors.h", "dtype.h", "dlpack.h"]
COMPLETE = ["client.h", "errors.h"]   # mirrored whole; the others in part

# C typedefs of enums: ints for the mirrors.
ENUMS = {"st_dtype_t", "st_device_kind_t", "st_value_kind_t", "st_errno_t"}
OPAQUE = {"st_client_t", "st_args_t", "st_result_t", "st_handoff_t", "st_buffer_t",
          "st_key_t"}
STRUCTS = {"st_tensor_t": _lib.Tensor, "st_value_t": _lib.Value,
           "st_object_info_t": _lib.ObjectInfo, "st_client_options_t": _lib.ClientOptions,
           "st_result_summary_t": _lib.ResultSummary, "st_buffer_info_t": _lib.BufferInfo,
           "st_readers_t": _lib.Readers, "st_pull_opts_t": _lib.PullOpts,
           "st_replicate_opts_t": _lib.ReplicateOpts}
SCALARS = {"int": ctypes.c_int, "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64,
           "size_t": ctypes.c_size_t, "double": ctypes.c_double, "float": ctypes.c_float,
           "uint8_t": ctypes.c_uint8, "uint16_t": ctypes.c_uint16, "uint32_t": ctypes.c_uint32,
           "char": ctypes.c_char}


def read(path):
    with open(path) as f:
        return f.read()


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def tokens(text):
    return re.findall(r"[A-Za-z_]\w*|\*|[(){},;=\[\]]|-?\d+", text)


def split_param(text):
    """'const char *key' -> (['const', 'char', '*'], 'key'); None for
    `void` (the headers name every parameter and field)."""
    toks = tokens(text)
    if toks == ["void"]:
        return None
    return toks[:-1], toks[-1]


def functions(text, api):
    """{name: (return type tokens, [param type tokens])} of the declarations
    in text (prefixed by ST_API when api)."""
    text = strip_comments(text)
    text = re.sub(r"#(?:[^\n]*\\\n)*[^\n]*", " ", text)     # preprocessor lines
    out = {}
    prefix = r"ST_API\s+" if api else r"(?:^|(?<=[;}]))\s*"
    pattern = prefix + r"([A-Za-z_][\w\s\*]*?)\b(st_\w+)\s*\(([^)]*)\)\s*;"
    for m in re.finditer(pattern, text, flags=re.S):
        ret, name, params = tokens(m.group(1)), m.group(2), m.group(3)
        if "typedef" in ret:
            continue
        types = []
        for p in params.split(","):
            sp = split_param(p)
            if sp is not None:
                types.append(sp[0])
        out[name] = (ret, types)
    return out


def enums(text):
    """{typedef name: [(constant, value)]} of `typedef enum {...} name;`."""
    text = strip_comments(text)
    out = {}
    for m in re.finditer(r"typedef\s+enum\s*\{([^}]*)\}\s*(\w+)\s*;", text):
        body, name = m.group(1), m.group(2)
        if "#" in body or "ST_ERRNO_MAP" in body or "ST_DTYPE_MAP" in body:
            continue
        value, consts = -1, []
        for item in body.split(","):
            item = item.strip()
            if not item:
                continue
            if "=" in item:
                k, v = item.split("=")
                value = int(v.strip(), 0)
                k = k.strip()
            else:
                k = item
                value += 1
            consts.append((k, value))
        out[name] = consts
    return out


def struct_body(text, start):
    """The text between the brace at `start` and its match, and the index
    after the match."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1:i], i + 1
    raise ValueError("unbalanced braces")


def fields(body):
    """[(name, type tokens | nested fields)] of a struct or union body."""
    out = []
    while True:
        body = body.strip()
        if not body:
            return out
        m = re.match(r"(struct|union)\s*\{", body)
        if m:
            inner, end = struct_body(body, body.index("{"))
            rest = body[end:]
            name, _, body = rest.partition(";")
            out.append((name.strip(), fields(inner)))
            continue
        decl, _, body = body.partition(";")
        decl = decl.strip()
        if decl:
            sp = split_param(decl)
            out.append((sp[1], sp[0]))


def structs(text):
    """{typedef name: fields} of the structs defined in text."""
    text = strip_comments(text)
    out = {}
    for m in re.finditer(r"(typedef\s+)?struct\s+(\w+)\s*\{", text):
        body, end = struct_body(text, m.end() - 1)
        tail = re.match(r"\s*(\w*)\s*;", text[end:])
        name = tail.group(1) if m.group(1) and tail and tail.group(1) else m.group(2) + "_t"
        out[name] = fields(body)
    return out


def lua_cdef():
    text = read(os.path.join(SRC, "lua", "st", "ffi.lua"))
    m = re.search(r"ffi\.cdef\s*\[\[(.*?)\]\]", text, flags=re.S)
    return m.group(1)


def header_texts():
    return {h: read(os.path.join(SRC, "include", "st", h)) for h in HEADERS}


def canonical(toks):
    """C type tokens without const, as (base, stars, const pointee)."""
    const_pointee = "const" in toks[:toks.index("*")] if "*" in toks else False
    base = [t for t in toks if t not in ("const", "*")]
    return " ".join(base), toks.count("*"), const_pointee


def expected_ctypes(toks, is_return):
    """The ctypes types that may stand for a C type (a tuple)."""
    base, stars, const = canonical(toks)
    if base in ENUMS:
        base = "int"
    P = ctypes.POINTER
    if stars == 0:
        if base == "void":
            return (None,)
        if base in STRUCTS:
            return (STRUCTS[base],)     # a struct member of a struct
        return (SCALARS[base],)
    if stars == 1:
        if base == "char":
            # a returned char * the caller frees must stay a raw pointer
            return (ctypes.c_char_p,) if const or not is_return else (ctypes.c_void_p,)
        if base in ("void",) or base in OPAQUE:
            return (ctypes.c_void_p,)
        if base in STRUCTS:
            return (P(STRUCTS[base]),)
        return (P(SCALARS[base]),)
    if stars == 2:
        if base in OPAQUE or base == "void":
            return (P(ctypes.c_void_p),)
        if base == "char":
            return (P(ctypes.c_char_p),)
        if base in STRUCTS:
            return (P(P(STRUCTS[base])),)
    raise AssertionError("no ctypes rule for %s" % " ".join(toks))


class MirrorsTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        texts = header_texts()
        cls.header = {}
        cls.complete = set()
        for h, text in texts.items():
            fns = functions(text, api=True)
            cls.header.update(fns)
            if h in COMPLETE:
                cls.complete.update(fns)
        cls.cdef_text = lua_cdef()
        cls.cdef = functions(cls.cdef_text, api=False)

    def test_the_parser_sees_the_headers(self):
        # A parser that missed declarations would let them drift unseen:
        # it must find one per ST_API line.
        texts = header_texts()
        for h in HEADERS:
            with self.subTest(header=h):
                want = len(re.findall(r"^ST_API\b", texts[h], flags=re.M))
                self.assertEqual(len(functions(texts[h], api=True)), want)
        self.assertIn("st_args_begin_list", self.complete)
        self.assertIn("st_err_name", self.complete)
        self.assertEqual(self.header["st_client_connect"][1][1], ["st_client_t", "*", "*"])
        self.assertEqual(self.header["st_value_get"][0], ["const", "st_value_t", "*"])
        want = len(re.findall(r"^[^\n]*\bst_\w+\s*\(", self.cdef_text, flags=re.M))
        self.assertEqual(len(self.cdef), want)

    def test_lua_declares_every_function_as_the_header(self):
        missing = sorted(self.complete - set(self.cdef))
        self.assertEqual(missing, [], "missing from lua/st/ffi.lua")
        for name, decl in sorted(self.cdef.items()):
            with self.subTest(function=name):
                self.assertIn(name, self.header, "declared in ffi.lua, not in include/st")
                self.assertEqual(decl, self.header[name])

    def test_python_declares_every_function_as_the_header(self):
        missing = sorted(self.complete - set(_lib._PROTOS))
        self.assertEqual(missing, [], "missing from python/sharedtensor/_lib.py")
        for name, (res, args) in sorted(_lib._PROTOS.items()):
            with self.subTest(function=name):
                self.assertIn(name, self.header, "declared in _lib.py, not in include/st")
                ret, params = self.header[name]
                self.assertIn(res, expected_ctypes(ret, True), "return type")
                self.assertEqual(len(args), len(params), "parameter count")
                for i, (py, c) in enumerate(zip(args, params)):
                    self.assertIn(py, expected_ctypes(c, False), "parameter %d" % (i + 1))

    def test_the_library_exports_what_the_mirrors_declare(self):
        lib = ctypes.CDLL(_lib.path)
        for name in sorted(set(self.cdef) | set(_lib._PROTOS)):
            with self.subTest(function=name):
                self.assertTrue(hasattr(lib, name))

    def test_structs_match(self):
        header = {}
        for text in header_texts().values():
            header.update(structs(text))
        lua = structs(self.cdef_text)
        for name, cls in STRUCTS.items():
            with self.subTest(struct=name):
                self.assertEqual(lua[name], header[name], "lua/st/ffi.lua")
                self.check_ctypes_struct(cls, header[name])

    def check_ctypes_struct(self, cls, want):
        got = cls._fields_
        self.assertEqual([n.rstrip("_") for n, _ in got], [n for n, _ in want], cls.__name__)
        for (pname, ptype), (cname, ctype) in zip(got, want):
            if isinstance(ctype, list) and ctype and isinstance(ctype[0], tuple):
                self.check_ctypes_struct(ptype, ctype)     # nested struct or union
            else:
                base, stars, _ = canonical(ctype)
                if stars and base in STRUCTS:
                    # pointers to structs; const st_tensor_t *const * too
                    target = STRUCTS[base]
                    for _ in range(stars):
                        target = ctypes.POINTER(target)
                    self.assertIs(ptype, target, "%s.%s" % (cls.__name__, pname))
                elif base == "char" and stars == 1:
                    # counted strings (str.ptr) may hold NULs: a raw pointer
                    self.assertIn(ptype, (ctypes.c_char_p, ctypes.c_void_p), pname)
                else:
                    self.assertIn(ptype, expected_ctypes(ctype, False),
                                  "%s.%s" % (cls.__name__, pname))

    def test_enum_constants_match(self):
        header = enums(header_texts()["client.h"])
        lua = enums(self.cdef_text)
        self.assertEqual(sorted(header),
                         ["st_call_flags_t", "st_device_kind_t", "st_value_kind_t"])
        for name, consts in header.items():
            with self.subTest(enum=name):
                self.assertEqual(lua.get(name), consts, "lua/st/ffi.lua")
                for k, v in consts:
                    self.assertEqual(getattr(_lib, k, None), v, "_lib.%s" % k)

    def test_python_errors_are_the_library_table(self):
        text = strip_comments(header_texts()["errors.h"])
        table = {m.group(1): int(m.group(2))
                 for m in re.finditer(r"X\((\w+),\s*(\d+),", text)}
        self.assertGreaterEqual(len(table), 20)
        got = {name: cls.code for name, cls in errors.BY_NAME.items()}
        self.assertEqual(got, table)
        for name, code in table.items():
            cls = errors.BY_NAME[name]
            self.assertEqual(cls.__name__,
                             "".join(p.capitalize() for p in name.split("_")) + "Error")
            self.assertIs(errors.BY_CODE[code], cls)

    def test_no_error_code_is_a_literal(self):
        pattern = re.compile(r"(==|~=|!=)\s*-\d|ERR_[A-Z_]+\s*=\s*-?\d|make\(\s*-?\d")
        files = glob.glob(os.path.join(SRC, "lua", "st", "*.lua")) + \
            glob.glob(os.path.join(SRC, "python", "sharedtensor", "*.py"))
        for path in files:
            for n, line in enumerate(read(path).splitlines(), 1):
                with self.subTest(file=os.path.relpath(path, SRC), line=n):
                    self.assertIsNone(pattern.search(line), line)


if __name__ == "__main__":
    unittest.main()
