"""Every ```python block of README.md and of the docs below, run as written
and in order, against a server started on the repository's config.lua and
endpoints/ (as README's command 1 does, on a private socket base through
SHARED_TENSOR_BASE_PATH).

A doc's blocks run in one interpreter (a child process per doc) and one
namespace, as a reader pasting them into one Python session would: a block
may use what an earlier block of the same doc defined. The test fails on
the first block that does not run, naming the doc, the line of the block's
first line and the exception (with a traceback in the doc's own line
numbers).

Two marks, both visible where the block is:
- a first line `# needs a GPU` runs the block only where torch sees a CUDA
  device (a GPU host runs it; elsewhere it is reported as skipped);
- a line `<!-- snippet: skip (why) -->` right before the fence skips the
  block everywhere (a placeholder that cannot run anywhere).
README's "## Try it" sh blocks are run by test_readme.py.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
import unittest

from st_fixture import env, start_repo_server

# The docs whose python blocks run, and the fewest blocks each must have
# (so a fence the extraction no longer finds fails the test).
DOCS = {"README.md": 2, "docs/python.md": 8}

# A block that runs longer fails (a wait that nothing ends, say).
BLOCK_TIMEOUT_S = 60
GPU_MARK = "# needs a GPU"
SKIP_MARK = re.compile(r"^\s*<!--\s*snippet:\s*skip\b.*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")


def blocks(path):
    """[(line, code, mark)] of the ```python blocks of `path`: `line` is the
    1-based line of the block's first code line, `code` the block with the
    fence's indentation removed, `mark` None, "gpu" or "skip"."""
    with open(path) as f:
        lines = f.read().split("\n")
    found = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        j = i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        if lang == "python":
            body = [l[len(indent):] if l.startswith(indent) else l.lstrip()
                    for l in lines[i + 1:j]]
            k = i - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            mark = None
            if k >= 0 and SKIP_MARK.match(lines[k]):
                mark = "skip"
            elif body and body[0].strip().startswith(GPU_MARK):
                mark = "gpu"
            found.append((i + 2, "\n".join(body) + "\n", mark))
        i = j + 1
    return found


def run_doc(rel):
    """Runs the blocks of the doc `rel` (relative to the source tree, the
    current directory) in this interpreter, in one namespace. Prints one
    JSON line per block to stdout before it runs ({"line": N}) and after
    ({"ran"|"skipped"|"failed": N, ...}); exits 1 on the first failure."""
    has_cuda = False
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError:
        pass
    def too_long(signum, frame):
        raise RuntimeError("the block ran past %d s" % BLOCK_TIMEOUT_S)
    signal.signal(signal.SIGALRM, too_long)
    ns = {"__name__": "__main__"}
    for line, code, mark in blocks(rel):
        if mark == "skip" or (mark == "gpu" and not has_cuda):
            print(json.dumps({"skipped": line, "why": mark}), flush=True)
            continue
        print(json.dumps({"line": line}), flush=True)
        signal.alarm(BLOCK_TIMEOUT_S)
        try:
            # Blank lines before the code: tracebacks give the doc's lines.
            exec(compile("\n" * (line - 1) + code, rel, "exec"), ns)
        except BaseException as e:
            print(json.dumps({"failed": line, "error": "%s: %s" % (type(e).__name__, e),
                              "traceback": traceback.format_exc()}), flush=True)
            sys.exit(1)
        signal.alarm(0)
        print(json.dumps({"ran": line}), flush=True)


class DocSnippets(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.src = env("ST_SOURCE_DIR")
        cls.dir = tempfile.mkdtemp(prefix="stdocs-")
        cls.server, cls.env, cls.log_path = start_repo_server(cls.dir)

    @classmethod
    def server_log(cls):
        with open(cls.log_path, errors="replace") as f:
            return f.read()

    @classmethod
    def tearDownClass(cls):
        cls.server.terminate()
        status = cls.server.wait(timeout=30)
        log = cls.server_log()
        if not os.environ.get("STT_KEEP"):
            shutil.rmtree(cls.dir, ignore_errors=True)
        if status != 0:
            raise AssertionError("stserver exited with %s; log:\n%s"
                                 % (status, log))

    def check_doc(self, rel):
        try:
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--run", rel],
                               cwd=self.src, env=self.env, capture_output=True, text=True,
                               timeout=240)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            r = subprocess.CompletedProcess(e.cmd, -9, out, "killed after 240 s")
        events = []
        for l in r.stdout.splitlines():
            if l.startswith("{"):
                try:
                    events.append(json.loads(l))
                except ValueError:
                    pass
        failed = [e for e in events if "failed" in e]
        if failed:
            e = failed[0]
            self.fail("%s: the block at line %d does not run: %s\n%s--- stderr\n%s"
                      % (rel, e["failed"], e["error"], e["traceback"], r.stderr))
        started = [e["line"] for e in events if "line" in e]
        if r.returncode != 0:
            self.fail("%s: the runner exited with %d %s\n--- stdout\n%s--- stderr\n%s"
                      % (rel, r.returncode,
                         "in the block at line %d" % started[-1] if started else "",
                         r.stdout, r.stderr))
        ran = [e["ran"] for e in events if "ran" in e]
        skipped = [e["skipped"] for e in events if "skipped" in e]
        self.assertGreaterEqual(len(ran) + len(skipped), DOCS[rel],
                                "%s: fewer python blocks than expected" % rel)
        if skipped:
            sys.stderr.write("%s: blocks at lines %s skipped (marked)\n" % (rel, skipped))
        return ran

    def test_marks(self):
        """The extraction: line numbers, indented fences, both marks, and
        fences of other languages left alone."""
        text = ("# t\n\n```python\na = 1\n```\n\n<!-- snippet: skip (a placeholder) -->\n"
                "```python\nopen('/nowhere')\n```\n```sh\nfalse\n```\n"
                "- item\n\n  ```python\n  # needs a GPU\n  b = a\n  ```\n")
        path = os.path.join(self.dir, "marks.md")
        with open(path, "w") as f:
            f.write(text)
        self.assertEqual(blocks(path), [(4, "a = 1\n", None),
                                        (9, "open('/nowhere')\n", "skip"),
                                        (17, "# needs a GPU\nb = a\n", "gpu")])

    def test_readme(self):
        self.check_doc("README.md")

    def test_python_md(self):
        self.check_doc("docs/python.md")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--run":
        run_doc(sys.argv[2])
    else:
        unittest.main()
