"""Virtual board stand-in for `os`: the unix port's module, plus `uname()` and a board-sized `statvfs()`.

Both live in uname.py, imported on the first call. Every VM imports this file at boot, and what it adds
there moves the heap a node sees: one more interned name here (e.g. a module name "_vboard_os")
left the drafter node 7 KB less free heap, enough to run out of memory in BEGIN. So this file names
nothing new but `uname`, and the module holding the code is called that too.
"""

import sys

_path = sys.path
sys.path = ()  # import the built-in os, not this file (the MicroPython way to extend a built-in module)
try:
    from os import *  # noqa: F403
finally:
    sys.path = _path
del _path


def uname():
    return __import__("uname").uname()


def statvfs(path):
    return __import__("uname").statvfs(path)
