"""Board entry point: builds the links the board config asks for and runs the node until RESET or Ctrl-C.

A board without a config file (or with a broken one) starts an idle node on the USB-serial console,
which still answers HELLO and CONFIGURE. When main() returns, the board drops to the REPL, so
mpremote can always take over (the frames on the console never contain a Ctrl-C byte).

A board whose config says "flashing" was left half-flashed: `specmesh flash` writes that first and the
real config last (host/provision/flash.py), so its files may be a mix of two versions. The node is not
started then; the console answers every line with messages.HALF_FLASHED and the role being flashed, which
the host turns into the command that finishes the job (host/bus/links.py), until Ctrl-C.
"""

import config

try:  # first, as before any allocation of the run: the model then loads into a heap the imports did not split
    from links import EspNowLink, StdioLink, UartLink
    from node import Node, _say
except Exception as e:  # noqa: BLE001 - a half-flashed board may hold modules of two versions: main() says so
    _unloadable = e
else:
    _unloadable = None


def make_links(cfg):
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
            radio = EspNowLink(peers, e.get("mtu"), e.get("channel"), cfg.get("key"), plain)
            return [radio] if kind == "espnow" else [StdioLink(), radio]
    except (ImportError, OSError, ValueError, TypeError, AttributeError, config.ConfigError) as ex:
        _say("link %r unavailable (%s): serving on the console instead" % (kind, ex))
    return [StdioLink()]


def half_flashed(role):
    """Say on the console, at once and for every line received, that this board was left half-flashed."""
    import sys

    from shared.messages import HALF_FLASHED

    note = "%s as %s" % (HALF_FLASHED, role)
    print(note)
    while sys.stdin.readline():
        print(note)


def main(path=config.PATH):
    try:
        cfg, err = config.load(path)
        if cfg.get("flashing"):
            half_flashed(cfg["flashing"])
            return
        if _unloadable is not None:
            raise _unloadable
        Node(cfg, make_links(cfg), path, err).run()
    except KeyboardInterrupt:  # Ctrl-C, even while a model loads: back to the REPL without a traceback
        pass


if __name__ == "__main__":
    main()
