"""Virtual board stand-in for `network`: a WLAN interface just large enough to set up ESP-NOW."""

import os

STA_IF = 0
AP_IF = 1
_active = [False, False]


def _mac():
    text = os.getenv("VBOARD_MAC") or "02:00:00:00:00:00"
    return bytes(int(x, 16) for x in text.split(":"))


class WLAN:
    def __init__(self, interface=STA_IF):
        if interface not in (STA_IF, AP_IF):
            raise ValueError("invalid interface")
        self._if = interface

    def active(self, on=None):
        if on is None:
            return _active[self._if]
        _active[self._if] = bool(on)
        return None

    def config(self, *args, **kwargs):
        if args:
            if args[0] == "mac":
                return _mac()
            if args[0] == "channel":
                return 1
            raise ValueError("unknown config param")
        return None  # channel, txpower, pm, ...: accepted, no effect on the virtual radio

    def disconnect(self):
        pass

    def isconnected(self):
        return False

    def status(self, *args):
        return 1000  # STAT_IDLE

    def ifconfig(self, *args):
        return ("0.0.0.0", "0.0.0.0", "0.0.0.0", "0.0.0.0")


def sta_active():  # not MicroPython's API: the espnow stand-in asks whether a WLAN interface is up
    return _active[STA_IF] or _active[AP_IF]
