// specmesh virtual Xtensa board: machine.reset() ends QEMU, which the host starts again on the same pty (a power
// cycle, host/emulator/qemu.py); machine.idle() sleeps until input or the next millisecond.
// Included by extmod/modmachine.c (MICROPY_PY_MACHINE_INCLUDEFILE).
#include "semihost.h"

static void mp_machine_idle(void) {
    vboard_idle();
}

static void mp_machine_reset(void) {
    semihost_exit(0);
}

static mp_int_t mp_machine_reset_cause(void) {
    return 0;
}
