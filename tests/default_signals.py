"""``python tests/default_signals.py -m MODULE ARGS...``: runs MODULE as ``python -m`` would, with SIGINT
and SIGTERM at their defaults first. A child of a background job (CI's) inherits SIGINT ignored, so a
test that stops a child with Ctrl-C starts it through this rather than with a ``preexec_fn``: that
runs Python in the forked child of a multi-threaded test process, before exec, and crashed there
with SIGSEGV (a `mwp worker run` started beside an in-process split mesh, about 1 start in 4)."""

from __future__ import annotations

import runpy
import signal
import sys

PATH = __file__


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.argv[1:2] != ["-m"] or len(sys.argv) < 3:
        sys.exit("usage: default_signals.py -m MODULE [ARGS...]")
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
