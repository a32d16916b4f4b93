"""Which kernels the engine runs, picked once per boot: the C kernels built for this board's architecture
(native/<arch>.mpy, from firmware/native/kernels.c) when that module loads and passes its self-test
(selftest.py), else the viper kernels (kernels.py), else plain Python (refkernels.py). All three compute
the same integers (docs/CONTRACTS.md section 4); a native module that fails to load or to pass is never
used, and the board says why on its console and in HELLO (`describe`). A module that crashes the board
(machine code gone wrong can reset a board rather than raise) is not tried again: the file MARK exists
while the module loads and runs its self-test, so the next boot finds it and runs viper (`specmesh flash`
removes it with a new module). On the esp32 port a module that fails its self-test keeps its IRAM until a soft reset,
so there the board writes why into MARK and soft-resets once: the next boot reads it and runs viper.

    module, name = pick(viper=True, native=True)   # name: "native", "viper" or "python"
    describe(name)                                 # HELLO's kernels string: the name, and why not native
"""

import os
import sys

# sys.implementation._mpy >> 10: py/persistentcode.h MP_NATIVE_ARCH_*; a native module is named after its arch
ARCHES = ("", "x86", "x64", "armv6", "armv6m", "armv7m", "armv7em", "armv7emsp", "armv7emdp", "xtensa",
          "xtensawin", "rv32imc", "rv64imc")

MARK = "native/.selftest"  # beside the module, relative to the board's root (its working directory)

_picked = {}
_why = [None]  # why the native kernels are not used (None: not tried yet, or they are)


def arch():
    """This VM's native architecture ("" when it emits no machine code)."""
    i = (getattr(sys.implementation, "_mpy", 0) >> 10) & 0x0F  # above: arch flags (RV32 extensions)
    return ARCHES[i] if i < len(ARCHES) else ""


def _native():
    """The native kernel module for this architecture, self-tested; None (and the reason in _why) if not."""
    a = arch()
    path = "native/%s.mpy" % a
    if not a:
        _why[0] = "no native code on this port"
        return None
    if _exists(MARK):
        with open(MARK) as f:
            said = f.read()  # a self-test that failed on a port keeping its code (_iram_kept) says so here
        _why[0] = said or "%s stopped the board in its self-test; flash the node again to retry" % path
        print("specmesh: " + _why[0] + ("; not used" if said else ""))
        return None
    marked = _mark()
    try:
        mod, found, loaded = _load(a, path)
    finally:
        if marked:
            os.remove(MARK)
    if mod is None and found:  # a module that is there and refused (a missing one is no news)
        print("specmesh: " + _why[0] + "; not used")
        if loaded and marked and _iram_kept():
            _reboot()
    return mod


def _iram_kept():
    """Whether a dropped native module keeps its code memory until a soft reset: the esp32 port commits native
    code to IRAM (ports/esp32/main.c esp_native_code_commit) and frees it only at soft reset
    (esp_native_code_free_all), so viper, also native code, may not fit next to a module that failed."""
    try:
        import esp32  # noqa: F401
    except ImportError:
        return False
    return True


def _reboot():
    """Keep the reason in MARK and soft-reset: the next boot skips the module and runs viper in freed IRAM."""
    with open(MARK, "w") as f:
        f.write(_why[0] + "; a soft reset freed its IRAM")
    import machine

    machine.soft_reset()


def _exists(name):
    try:
        os.stat(name)
        return True
    except OSError:
        return False


def _mark():
    """Create MARK (False where it cannot be: no native/ folder, a read-only filesystem)."""
    try:
        open(MARK, "w").close()
        return True
    except OSError:
        return False


def _load(a, path):
    """(the module for arch `a`, self-tested, or None with the reason in _why; whether a module was found; whether
    its code was loaded)."""
    try:
        mod = getattr(__import__("native." + a), a)
    except ImportError:
        _why[0] = "no " + path
        return None, False, False
    except Exception as e:  # noqa: BLE001 - a corrupt or foreign file: "incompatible .mpy file" and the like
        _why[0] = "%s does not load: %s" % (path, e)
        return None, True, False
    import selftest

    try:
        bad = selftest.run(mod)
    finally:
        del sys.modules["selftest"]  # its code and buffers go with the next collection
    if bad is not None:
        sys.modules.pop("native." + a, None)
        _why[0] = "%s fails its self-test (%s)" % (path, bad)
        return None, True, True
    _why[0] = None
    return mod, True, True


def pick(viper=True, native=True):
    """(kernel module, its name): native when `native` and it passes, else viper when `viper` and this
    port compiles it, else plain Python."""
    key = (bool(viper) and bool(native), bool(viper))
    if key not in _picked:
        mod = _native() if key[0] else None
        name = "native"
        if mod is None and key[1]:
            try:
                import kernels as mod

                name = "viper"
            except Exception:  # noqa: BLE001 - no native emitter on this port (or viper disabled in the build)
                mod = None
        if mod is None:
            import refkernels as mod  # only where it runs: its code would take heap on a board

            name = "python"
        _picked[key] = (mod, name)
    return _picked[key]


def describe(name):
    """HELLO's kernels string: `name`, then, when the native kernels were tried and are not used, why."""
    if name != "native" and _why[0] is not None:
        return "%s (%s)" % (name, _why[0])
    return name
