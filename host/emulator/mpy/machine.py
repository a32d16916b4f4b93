"""Virtual board stand-in for the parts of `machine` a node uses: reset, soft_reset, unique_id, freq."""

import os
import sys
import time

_HARD_RESET = 0x5EB007  # recognised by the virtual board's REPL shim (_vboard.py)
PWRON_RESET = 1
SOFT_RESET = 5


def reset():
    raise SystemExit(_HARD_RESET)


def soft_reset():
    raise SystemExit


def unique_id():
    mac = os.getenv("VBOARD_MAC") or "02:00:00:00:00:00"
    return bytes(int(x, 16) for x in mac.split(":"))


def freq(hz=None):
    return 240_000_000 if hz is None else None


def idle():
    time.sleep_ms(0)


def reset_cause():
    return PWRON_RESET


def lightsleep(ms=0):
    time.sleep_ms(ms)


def bootloader():
    sys.exit(_HARD_RESET)
