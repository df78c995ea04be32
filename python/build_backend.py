"""The build backend of the sharedtensor Python package (PEP 517).

It needs nothing but the standard library, so `pip install ./python` works
offline, in a venv or system-wide, with pip's default build isolation.

The wheel holds the package and, when one is found, libstclient itself
(sharedtensor/libstclient.so.0), so `import sharedtensor` needs no
environment variable. The library is taken from, first match wins:
$ST_CLIENT_LIB at build time, then the repository's build tree
(../build/lib/libstclient.so.0, the README's build). Without one the wheel
is pure Python and finds an installed library at import time
(sharedtensor/_lib.py says where it looks).
"""
import base64
import hashlib
import io
import os
import re
import sysconfig
import tarfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = "sharedtensor"
SONAME = "libstclient.so.0"


def _project():
    """name, version, description and requires-python of pyproject.toml."""
    text = open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8").read()
    section = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S).group(1)
    fields = dict(re.findall(r'^([\w-]+)\s*=\s*"([^"]*)"\s*$', section, re.M))
    return fields


def _library():
    env = os.environ.get("ST_CLIENT_LIB")
    if env:
        if not os.path.isfile(env):
            raise RuntimeError("ST_CLIENT_LIB=%s: no such file" % env)
        return env
    built = os.path.join(HERE, os.pardir, "build", "lib", SONAME)
    return built if os.path.isfile(built) else None


def _platform_tag():
    return re.sub(r"[-.]", "_", sysconfig.get_platform())


def _metadata(p):
    lines = ["Metadata-Version: 2.1", "Name: " + p["name"], "Version: " + p["version"],
             "Summary: " + p.get("description", ""),
             "Requires-Python: " + p.get("requires-python", ">=3.8"),
             "Provides-Extra: torch", 'Requires-Dist: torch; extra == "torch"',
             "Provides-Extra: numpy", 'Requires-Dist: numpy; extra == "numpy"']
    doc = os.path.join(HERE, os.pardir, "docs", "python.md")
    text = "\n".join(lines) + "\n"
    if os.path.isfile(doc):
        text += "Description-Content-Type: text/markdown\n\n"
        text += open(doc, encoding="utf-8").read()
    return text


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "%s,sha256=%s,%d" % (name, digest.decode(), len(data))


def _files():
    """(archive name, bytes) of the package's modules, sorted."""
    src = os.path.join(HERE, PACKAGE)
    out = []
    for f in sorted(os.listdir(src)):
        if f.endswith(".py") and f != "_libpath.py":
            out.append(("%s/%s" % (PACKAGE, f), open(os.path.join(src, f), "rb").read()))
    return out


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    p = _project()
    lib = _library()
    tag = "py3-none-" + (_platform_tag() if lib else "any")
    dist = "%s-%s" % (p["name"], p["version"])
    files = _files()
    if lib:
        files.append(("%s/%s" % (PACKAGE, SONAME), open(lib, "rb").read()))
    info = dist + ".dist-info"
    files.append((info + "/METADATA", _metadata(p).encode()))
    files.append((info + "/WHEEL", ("Wheel-Version: 1.0\nGenerator: sharedtensor build_backend\n"
                                    "Root-Is-Purelib: %s\nTag: %s\n"
                                    % ("false" if lib else "true", tag)).encode()))
    record = [_record_line(n, d) for n, d in files] + [info + "/RECORD,,"]
    files.append((info + "/RECORD", ("\n".join(record) + "\n").encode()))
    name = "%s-%s.whl" % (dist, tag)
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files:
            zi = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = (0o755 if n.endswith(SONAME) else 0o644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, d)
    return name


def build_sdist(sdist_directory, config_settings=None):
    p = _project()
    dist = "%s-%s" % (p["name"], p["version"])
    name = dist + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, name), "w:gz") as t:
        entries = [("pyproject.toml", open(os.path.join(HERE, "pyproject.toml"), "rb").read()),
                   ("build_backend.py", open(os.path.join(HERE, "build_backend.py"), "rb").read()),
                   ("PKG-INFO", _metadata(p).encode())] + _files()
        for n, d in entries:
            ti = tarfile.TarInfo("%s/%s" % (dist, n))
            ti.size = len(d)
            ti.mode = 0o644
            t.addfile(ti, io.BytesIO(d))
    return name
