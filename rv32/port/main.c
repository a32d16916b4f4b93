/*
 * specmesh virtual RV32 board: the qemu port's main() (MIT, Damien P. George): the heap, then a board's boot
 * (vboard.c's vboard_boot). A soft reset (Ctrl-D) ends QEMU with a code that says which REPL to come back to,
 * machine.reset() with 0; the host starts it again on
 * the same console (host/emulator/qemu.py), with the heap sized for the flash as it is then (the class's heap
 * plus what the flashed code takes: the node's budget counts its code as frozen into the firmware), as the
 * Xtensa board does (xtensa/port/main.c).
 */

#include <stdlib.h>

#include "py/runtime.h"
#include "py/gc.h"
#include "py/mperrno.h"
#include "shared/runtime/gchelper.h"
#include "vboard.h"

#if MICROPY_HEAP_SIZE <= 0
#error MICROPY_HEAP_SIZE must be a positive integer.
#endif

static uint32_t gc_heap[MICROPY_HEAP_SIZE / sizeof(uint32_t)];

int main(int argc, char **argv) {
    mp_cstack_init_with_sp_here(10240);
    vboard_init();
    gc_init(gc_heap, (char *)gc_heap + vboard_heap_bytes(MICROPY_HEAP_SIZE));
    exit(vboard_boot());
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
