"""Board entry point: builds the links the board config asks for and runs the node until RESET or Ctrl-C.

A board without a config file (or with a broken one) starts an idle node on the USB-serial console,
which still answers HELLO and CONFIGURE. When main() returns, the board drops to the REPL, so
mpremote can always take over (the frames on the console never contain a Ctrl-C byte). A board left
half-flashed starts no node (config.half_flashed). A board with a deployment key (config.KEY_PATH) fails
closed: a key file or a config it cannot read leaves it serving nothing (it says why on the console), and a
keyed node turns Ctrl-C off, so only a signed RESET ends it (`specmesh flash --key-file` sends one). This
file stays small: a board runs it as source, so its code takes heap that a last pipeline stage's layers need.
"""

import config
from links import EspNowLink, StdioLink, UartLink
from node import Node, _say


def make_links(cfg, key=None):
    """Links for cfg["link"]; the first one faces the host. Falls back to stdio with a console note."""
    kind = cfg["link"]
    try:
        if kind == "uart":
            u = cfg.get("uart", {})
            return [UartLink(u.get("id", 1), u.get("baudrate", 115200), u.get("tx"), u.get("rx"))]
        if kind in ("espnow", "gateway"):
            e = cfg.get("espnow", {})
            peers = {}
            for nid, mac in e.get("peers", {}).items():
                peers[int(nid)] = config.parse_mac(mac)
            plain = [int(nid) for nid in e.get("plain", ())]
            radio = EspNowLink(peers, e.get("mtu"), e.get("channel"), key and key.hex(), plain)
            return [radio] if kind == "espnow" else [StdioLink(), radio]
    except (ImportError, OSError, ValueError, TypeError, AttributeError, config.ConfigError) as ex:
        _say("link %r unavailable (%s): serving on the console instead" % (kind, ex))
    return [StdioLink()]


def fast_clock():
    """The fastest clock the chip takes: a stock ESP32_GENERIC boots at 160 MHz (it does not take
    boards/sdkconfig.240mhz), and ports/esp32/modmachine.c mp_machine_set_freq takes 240 MHz except on a C3/C6
    (ValueError there: they stay at their 160 MHz)."""
    try:
        import machine

        machine.freq(240_000_000)
    except (ImportError, AttributeError, ValueError):
        pass


def waker():
    """On a classic ESP32, a 1 ms periodic hardware timer (returned; the port keeps it until the next soft reset).

    Its UART0 console's receive interrupt wakes no task (ports/esp32/uart.c), so a node waiting for a frame, in
    poll or in a readline whose line is still arriving, saw it only at its next 10 ms FreeRTOS tick
    (ports/esp32/mpconfigport.h MICROPY_EVENT_POLL_HOOK); the timer's interrupt wakes the main task
    (ports/esp32/machine_timer.c mp_hal_wake_main_task_from_isr), so it sees the frame within a millisecond
    (host/projection/hardware.py CONSOLE_WAKE). Its default mode is periodic. The S2/S3/C3/C6 consoles are USB,
    whose drivers wake the task. New names cost heap here: the classic ESP32's node sits a dozen qstrs below its
    next qstr pool, 7 KB (docs/bench/waker.md)."""
    import os

    if getattr(os, "uname", None) and os.uname().machine.split(" with ")[-1] == "ESP32":
        import machine

        return machine.Timer(0, period=1, callback=lambda t: 0)


def main(path=config.PATH, key_path=config.KEY_PATH):
    try:
        fast_clock()
        cfg, err, key = config.load_board(path, key_path)
        if cfg is not None and not config.half_flashed(cfg):
            waker()
            Node(cfg, make_links(cfg, key and key[0]), path, err, key, key_path).run()
            config.console(True)  # ended by RESET (signed, with a key): the REPL takes Ctrl-C again
    except KeyboardInterrupt:  # Ctrl-C, even while a model loads: back to the REPL without a traceback
        pass


if __name__ == "__main__":
    main()
