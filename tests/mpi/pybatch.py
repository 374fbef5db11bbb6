#!/usr/bin/env python3
"""pybatch.py — runs several Python check scripts with one import of torch, transformers and peft.

  pybatch.py LABEL SCRIPT [ARGS...] [::: LABEL SCRIPT [ARGS...]]...
  pybatch.py @FILE          the same words, one a line, from FILE (common.sh's venv_check)

Imports torch, transformers and peft once (what is missing is left to the scripts, which
skip or fail as they do alone), then runs each SCRIPT as __main__ with ARGS in a process of
its own forked from this one, one after another: each script sees a fresh copy of the
interpreter with those modules loaded, so no state passes from one case to the next, and
it costs one import (seconds of CPU) instead of one per case.

A LABEL that starts with "!" marks a case that must fail: it passes when SCRIPT exits
non-zero, and its output is discarded (common.sh's venv_check_fails: a check that must tell
two things apart).

Every case runs, whatever the others do. Exit status 0 when every case passed; otherwise
1, after one line on stderr per case that did not, with its LABEL and exit status.
"""
import os
import runpy
import sys


def cases(argv):
    case = []
    for a in argv:
        if a == ":::":
            yield case
            case = []
        else:
            case.append(a)
    yield case


def run(script, args, quiet):
    """in a forked child: SCRIPT as __main__ (its output discarded when quiet), then the
    child's exit status"""
    if quiet:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
    sys.argv = [script] + args
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` has it
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException as e:  # noqa: BLE001 - a script's crash is that case's failure
        import traceback
        traceback.print_exception(e)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main():
    argv = sys.argv[1:]
    if len(argv) == 1 and argv[0].startswith("@"):
        with open(argv[0][1:]) as f:
            argv = f.read().splitlines()
    todo = list(cases(argv))
    if not todo or any(len(c) < 2 for c in todo):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    for mod in ("torch", "transformers", "peft"):
        try:
            __import__(mod)
        except ImportError:
            pass
    failed = []
    for label, script, *args in todo:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        must_fail = label.startswith("!")
        if pid == 0:
            run(script, args, must_fail)
        _, status = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(status)
        if (rc == 0) if must_fail else (rc != 0):
            failed.append((label[1:] if must_fail else label, rc))
    for label, rc in failed:
        print(f"pybatch: FAILED ({rc}): {label}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
