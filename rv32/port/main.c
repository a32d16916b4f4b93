/*
 * specmesh virtual RV32 board: the qemu port's main() (MIT, Damien P. George), booting as a board does:
 * the filesystem mounted at / (vboard.c), then boot.py, then main.py in the friendly REPL. A soft reset (Ctrl-D)
 * ends QEMU with a code that says which REPL to come back to, machine.reset() with 0; the host starts it again on
 * the same console (host/emulator/qemu.py), with the heap sized for the flash as it is then (the class's heap
 * plus what the flashed code takes: the node's budget counts its code as frozen into the firmware), as the
 * Xtensa board does (xtensa/port/main.c).
 */

#include <stdlib.h>

#include "py/compile.h"
#include "py/runtime.h"
#include "py/gc.h"
#include "py/mperrno.h"
#include "shared/runtime/gchelper.h"
#include "shared/runtime/pyexec.h"
#include "vboard.h"

#if MICROPY_HEAP_SIZE <= 0
#error MICROPY_HEAP_SIZE must be a positive integer.
#endif

static uint32_t gc_heap[MICROPY_HEAP_SIZE / sizeof(uint32_t)];

int main(int argc, char **argv) {
    mp_cstack_init_with_sp_here(10240);
    vboard_init();
    gc_init(gc_heap, (char *)gc_heap + vboard_heap_bytes(MICROPY_HEAP_SIZE));
    const uint32_t *config = (const uint32_t *)VBOARD_CONFIG_ADDR;
    if (config[0] == VBOARD_CONFIG_MAGIC && config[VBOARD_CONFIG_BOOT] == VBOARD_BOOT_RAW) {
        pyexec_mode_kind = PYEXEC_MODE_RAW_REPL; // a soft reset in the raw REPL: back into it
    }

    mp_init();
    vboard_mount();
    int ret = pyexec_file_if_exists("boot.py");
    if (!(ret & PYEXEC_FORCED_EXIT) && pyexec_mode_kind == PYEXEC_MODE_FRIENDLY_REPL) {
        ret = pyexec_file_if_exists("main.py");
    }
    if (!(ret & PYEXEC_FORCED_EXIT)) {
        for (;;) {
            if (pyexec_mode_kind == PYEXEC_MODE_RAW_REPL) {
                if (pyexec_raw_repl() != 0) {
                    break;
                }
            } else {
                if (pyexec_friendly_repl() != 0) {
                    break;
                }
            }
        }
    }

    mp_printf(&mp_plat_print, "MPY: soft reboot\n");
    gc_sweep_all(); // finalisers: open files are closed (flushed to the flash)
    mp_deinit();
    exit(pyexec_mode_kind == PYEXEC_MODE_RAW_REPL ? VBOARD_EXIT_SOFT_RAW : VBOARD_EXIT_SOFT);
}

void gc_collect(void) {
    gc_collect_start();
    gc_helper_collect_regs_and_stack();
    gc_collect_end();
}

void nlr_jump_fail(void *val) {
    mp_printf(&mp_plat_print, "uncaught NLR\n");
    exit(1);
}
