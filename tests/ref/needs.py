"""The Python the oracles of tests/ref need: numpy and PyTorch (CPU is enough), as Debian's
/usr/bin/python3 has them once `make deps` installed python3-numpy and python3-torch. The tests
run them with that interpreter (PY=/usr/bin/python3 in tests/cli/*.sh); another python3 first on
PATH (a virtual environment, /usr/local/bin) may lack them, and then each script says so and which
interpreter it ran under, instead of an ImportError's traceback.

    import needs; needs.modules("numpy", "torch")
"""
import importlib
import sys


def modules(*names):
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        sys.exit("%s needs the Python modules %s, which %s (Python %d.%d) lacks: run it with Debian's "
                 "/usr/bin/python3 after `make deps` (python3-numpy, python3-torch)"
                 % (sys.argv[0] or "this oracle", ", ".join(missing), sys.executable, *sys.version_info[:2]))
