"""CTest runner: `python3 run_tests.py MODULE [needs...]`.

Runs one unittest module; exits 77 (CTest's "skipped") when a required
import is missing (`torch`, `numpy`, `cuda`: torch with a CUDA device),
or when every test of the module was skipped.
"""
import importlib
import os
import sys
import unittest


def missing(needs):
    for n in needs:
        if n == "cuda":
            try:
                import torch
                if not torch.cuda.is_available():
                    return "no CUDA device visible to torch"
            except ImportError:
                return "torch is not installed"
            continue
        try:
            importlib.import_module(n)
        except ImportError as e:
            return "%s is not installed (%s)" % (n, e)
    return None


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    name, needs = sys.argv[1], sys.argv[2:]
    why = missing(needs)
    if why:
        print("SKIPPED: " + why)
        return 77
    suite = unittest.defaultTestLoader.loadTestsFromName(name)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    if not result.wasSuccessful():
        return 1
    if result.testsRun and len(result.skipped) == result.testsRun:
        return 77
    return 0


if __name__ == "__main__":
    sys.exit(main())
