"""Every snippet of the README's "Try it" section, run as written against
the server of the README's command 1 (build/bin/stserver --config
config.lua, on a private socket base through SHARED_TENSOR_BASE_PATH)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

from st_fixture import env, start_repo_server


def snippets():
    """(language, code) of the fenced blocks of README's "## Try it"."""
    with open(os.path.join(env("ST_SOURCE_DIR"), "README.md")) as f:
        text = f.read()
    section = text.split("## Try it", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(sh|python)\n(.*?)```", section, re.S)


class Readme(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.src = env("ST_SOURCE_DIR")
        cls.dir = tempfile.mkdtemp(prefix="streadme-")
        # TMPDIR: what a snippet makes with mktemp (the venv) goes with the
        # test's directory.
        cls.server, cls.env, _ = start_repo_server(cls.dir, {"TMPDIR": cls.dir})

    @classmethod
    def tearDownClass(cls):
        cls.server.terminate()
        cls.server.wait(timeout=20)
        if not os.environ.get("STT_KEEP"):   # STT_KEEP=1 keeps the log and the venv
            shutil.rmtree(cls.dir, ignore_errors=True)

    def run_snippet(self, lang, code):
        # build/ of the README is this build tree.
        code = code.replace("build/bin/", env("ST_BUILD_DIR") + "/bin/")
        code = code.replace("ST_CLIENT_LIB=build/lib/libstclient.so",
                            "ST_CLIENT_LIB=" + env("ST_CLIENT_LIB"))
        cmd = ["bash", "-euo", "pipefail", "-c", code] if lang == "sh" \
            else [sys.executable, "-c", code]
        r = subprocess.run(cmd, cwd=self.src, env=self.env, capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(r.returncode, 0, "%s snippet failed:\n%s\n--- output\n%s%s"
                         % (lang, code, r.stdout, r.stderr))
        return r.stdout

    def test_every_snippet_runs(self):
        found = snippets()
        self.assertGreaterEqual(len(found), 5)
        outputs = [self.run_snippet(lang, code) for lang, code in found]
        joined = "".join(outputs)
        self.assertIn("tensor([0.0000, 0.5000, 1.0000, 1.5000])", joined)
        self.assertIn("hello, lua", joined)


if __name__ == "__main__":
    unittest.main()
