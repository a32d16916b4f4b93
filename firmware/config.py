"""The board config file: which role, node id, model and link a board starts with.

A small JSON object in `specmesh.json` in the board's working directory (the flash root on a board,
the virtual board's directory in emulation). Keys, all optional:

    node_id   int 1..254          the node's bus address (default 1)
    role      "idle" | "drafter" | "verifier" | "stage"
    model     path of the model file: relative to the working directory, or absolute (`/rom/...`: a model
              flashed into the ROMFS partition, host/provision/romfs.py)
    link      "stdio" (USB-serial REPL console, default) | "uart" | "espnow" | "gateway"
              ("gateway": stdio to the host, and ESP-NOW to the peers for frames addressed to them)
    uart      {"id", "baudrate", "tx", "rx"} for the "uart" link; tx and rx are required (machine.UART(1) without
              pins takes GPIO 9/10, the SPI flash lines of a classic ESP32 WROOM module: ports/esp32/machine_uart.c),
              and neither may be a flash or PSRAM line of the chip (FLASH_PINS)
    espnow    {"peers": {"<node id>": "aa:bb:cc:dd:ee:ff"}, "mtu": 250, "channel": 1, "plain": ["<node id>"]};
              a node behind a gateway lists the gateway's MAC under "0" (the host), since its replies go
              there; with a key, peers are encrypted except those in "plain" (firmware/links.py)
    table     path of a drafter's n-gram table (shared/ngram.py), as `model`; "" or absent: none
    spec_ahead  int: tokens a drafter may draft ahead while a verdict is pending (0: off)
    kmax      int: most positions a verifier computes in one pass (drafts + 1; default messages.MAX_GAMMA + 1;
              a stage: 1)
    layers    [a, b]: the layers a..b-1 of the model a "stage" holds (required for that role)
    n_ctx     int: context (and KV cache) cap below the model's max_seq, to fit a small heap (0: none)
    board     board name reported by HELLO (default: the port's machine string)
    flashing  role: a `specmesh flash` for this role began and has not finished (it writes the final config
              last); the board does not start the node (half_flashed)

A missing or unreadable file gives the defaults (an idle node that still answers HELLO/CONFIGURE).
`save` writes the whole object atomically (temp file + rename), so a reset mid-write keeps the old file.

The deployment key lives apart, in `specmesh.key` ({"key": hex, "ctr": the signing counter the next boot
starts at}; `load_key`, `save_key`; docs/security.md): a torn config never loses it. A key file that cannot be
read, or a config that cannot be read beside a key file, leaves the board serving nothing (main.py).
"""

import json
import os

from shared.board import DEFAULTS, FLASHING, KMAX, LINKS, NODE_IDS, ROLES, SPEC_AHEAD

PATH = "specmesh.json"
KEY_PATH = "specmesh.key"
_ENOENT = 2  # errno of a file that does not exist (both runtimes)

# GPIOs wired to the module's SPI flash (and PSRAM), by MCU (os.uname().machine after " with "): ESP32 6-11, ESP32-S3
# 26-32 (33-37 with octal PSRAM), ESP32-C3 12-17, ESP32-C6 24-30 (each chip's datasheet, "Pin Overview")
FLASH_PINS = {"ESP32": (6, 11), "ESP32S3": (26, 37), "ESP32C3": (12, 17), "ESP32C6": (24, 30)}


class ConfigError(Exception):
    """A config value that cannot be used; the message names the key."""


def _bounded(key, value, bounds):
    if not isinstance(value, int) or not bounds[0] <= value <= bounds[1]:
        raise ConfigError("%s must be an int in %d..%d, not %r" % (key, bounds[0], bounds[1], value))


def check(cfg):
    """Raise ConfigError unless `cfg` holds usable values; returns cfg."""
    _bounded("node_id", cfg.get("node_id"), NODE_IDS)
    if cfg.get("role") not in ROLES:
        raise ConfigError("role must be one of %s, not %r" % ("/".join(ROLES), cfg.get("role")))
    if cfg.get("link") not in LINKS:
        raise ConfigError("link must be one of %s, not %r" % ("/".join(LINKS), cfg.get("link")))
    if not isinstance(cfg.get("model"), str):
        raise ConfigError("model must be a file name")
    _bounded("spec_ahead", cfg.get("spec_ahead"), SPEC_AHEAD)
    _bounded("kmax", cfg.get("kmax", 1), KMAX)
    lay = cfg.get("layers")
    if cfg["role"] == "stage" and not (isinstance(lay, list) and len(lay) == 2 and isinstance(lay[0], int)
                                       and isinstance(lay[1], int) and 0 <= lay[0] < lay[1]):
        raise ConfigError("a stage needs layers [a, b] with 0 <= a < b, not %r" % (lay,))
    n_ctx = cfg.get("n_ctx", 0)
    if not isinstance(n_ctx, int) or n_ctx < 0:
        raise ConfigError("n_ctx must be an int >= 0, not %r" % (n_ctx,))
    if cfg["link"] == "uart":
        _check_uart(cfg.get("uart"))
    return cfg


def _check_uart(u):
    """Raise ConfigError unless the "uart" link names its pins, none of them a flash line of this chip."""
    if not isinstance(u, dict) or not isinstance(u.get("tx"), int) or not isinstance(u.get("rx"), int):
        raise ConfigError("a uart link needs its pins, uart {\"tx\": N, \"rx\": N}: UART(1) without them "
                          "takes GPIO 9/10, the SPI flash lines of an ESP32 module")
    uname = getattr(os, "uname", None)
    span = FLASH_PINS.get(uname().machine.split(" with ")[-1]) if uname else None
    for pin in (u["tx"], u["rx"]):
        if span and span[0] <= pin <= span[1]:
            raise ConfigError("uart pin %d is wired to this module's flash (GPIO %d-%d): pick another" % (
                pin, span[0], span[1]))


def load(path=PATH):
    """(config dict, error message or None): the defaults overlaid with the file's values."""
    cfg = dict(DEFAULTS)
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError:
        return cfg, None
    except ValueError:
        return cfg, "config file %s is not valid JSON: using defaults" % path
    if not isinstance(data, dict):
        return cfg, "config file %s must hold a JSON object: using defaults" % path
    cfg.update(data)
    try:
        return check(cfg), None
    except ConfigError as e:
        return dict(DEFAULTS), "config file %s: %s: using defaults" % (path, e)


def save(cfg, path=PATH):
    """Write `cfg` (checked) atomically to `path`."""
    check(cfg)
    _write(cfg, path)


def _write(obj, path):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    try:
        os.rename(tmp, path)
    except OSError:  # a file system that cannot rename over an existing file: load_key finds tmp if torn here
        os.remove(path)
        os.rename(tmp, path)


def load_key(path=KEY_PATH):
    """(key bytes, counter floor) of the key file, None if the board has none; ConfigError if one exists (or the
    temp file of a save torn between its remove and rename) that cannot be used."""
    for name in (path, path + ".tmp"):
        try:
            with open(name) as f:
                data = json.load(f)
        except OSError as e:
            if e.args and e.args[0] != _ENOENT:
                raise ConfigError("cannot read key file %s (%s)" % (name, e))
            continue  # none (the temp file: a save torn after the remove; its content is whole if it parses)
        except ValueError:
            raise ConfigError("key file %s is not valid JSON" % name)
        try:
            key, ctr = bytes.fromhex(data["key"]), data.get("ctr", 0)
        except (TypeError, ValueError, KeyError, AttributeError):
            raise ConfigError("key file %s must hold {\"key\": hex, \"ctr\": int}" % name)
        if not key or not isinstance(ctr, int) or not 0 <= ctr <= 0xFFFFFFFF:
            raise ConfigError("key file %s holds no key or a counter outside 0..2**32-1" % name)
        return key, ctr
    return None


def load_board(path=PATH, key_path=KEY_PATH):
    """(config, its load error, key) for main.py; config None where the board must serve nothing: a key file it
    cannot read, or a config it cannot read beside a key (never the unkeyed defaults then), said on the console.
    With a key file Ctrl-C is off from here on (console): the USB line is no way past the key."""
    cfg, err = load(path)
    try:
        key = load_key(key_path)
    except ConfigError as e:
        key, err = True, "%s" % e
    if key is not None:
        console(False)
        if key is True or err:
            repeat("specmesh: %s; the board holds a key: serving nothing (esptool erase_flash, then specmesh flash "
                   "--key-file)" % err)
            return None, err, None
    return cfg, err, key


def console(on):
    """Ctrl-C on the console on (the REPL's) or off (a keyed node's)."""
    import micropython

    micropython.kbd_intr(3 if on else -1)


def save_key(key, ctr, path=KEY_PATH):
    """Write the key file atomically: the key (bytes) and the counter a later boot starts at."""
    _write({"key": key.hex(), "ctr": ctr}, path)


def half_flashed(cfg):
    """False, unless the config says "flashing": a `specmesh flash` began and did not finish (it writes that
    first and the real config last, host/provision/flash.py), so the files may be a mix of two versions.
    Then the node must not start: say so on the console, at once and for every line received (the host
    turns messages.HALF_FLASHED into the command that finishes the job, host/bus/links.py), until Ctrl-C."""
    role = cfg.get(FLASHING)
    if not role:
        return False
    from shared.messages import HALF_FLASHED

    repeat("%s as %s" % (HALF_FLASHED, role))
    return True


def repeat(note):
    """Say `note` on the console at once and for every line received, until Ctrl-C: a board that must not start
    its node (half-flashed, or a key it cannot use: main.py) answers every host with why."""
    import sys

    print(note)
    while sys.stdin.readline():
        print(note)


def parse_mac(text):
    """6 bytes from "aa:bb:cc:dd:ee:ff"; raises ConfigError."""
    parts = text.split(":") if isinstance(text, str) else ()
    if len(parts) != 6:
        raise ConfigError("bad MAC address %r (want aa:bb:cc:dd:ee:ff)" % (text,))
    try:
        return bytes(int(p, 16) for p in parts)
    except ValueError:
        raise ConfigError("bad MAC address %r (want aa:bb:cc:dd:ee:ff)" % (text,))
