/*
 * specmesh virtual Xtensa board: main() (after MicroPython's qemu port, MIT, Damien P. George): the heap, then a
 * board's boot (rv32/port/vboard.c's vboard_boot, which both virtual boards run). A soft reset (Ctrl-D) ends QEMU
 * with a code that says which REPL to come back to, machine.reset() with 0; the host starts it again on the same
 * console (host/emulator/qemu.py).
 *
 * The GC heap is the board class's (vboard.h's config block): one internal area, the class's SRAM heap, and on
 * the S3 a second area in PSRAM, as MicroPython's esp32 port splits its heap (MICROPY_GC_SPLIT_HEAP).
 */

#include <string.h>

#include "py/runtime.h"
#include "py/gc.h"
#include "py/stackctrl.h"
#include "semihost.h"
#include "vboard.h"

extern char _sbss[], _ebss[], _stack_top[], _stack_bottom[];
void xsim_spill(void);
void *xsim_get_sp(void);

static uint32_t gc_heap[MICROPY_HEAP_SIZE / sizeof(uint32_t)];

// A word of the config block (rv32/port/vboard.c): the fourth is the PSRAM heap area's bytes
static uint32_t config_word(int i) {
    const uint32_t *c = (const uint32_t *)VBOARD_CONFIG_ADDR;
    return c[0] == VBOARD_CONFIG_MAGIC ? c[i] : 0;
}

int xsim_main(void) {
    memset(_sbss, 0, _ebss - _sbss);
    mp_cstack_init_with_top(_stack_top, _stack_top - _stack_bottom);
    vboard_init();
    gc_init(gc_heap, (char *)gc_heap + vboard_heap_bytes(MICROPY_HEAP_SIZE));
    size_t psram = config_word(3) & ~3u;
    if (psram && psram <= VBOARD_PSRAM_MAX) {
        gc_add((void *)VBOARD_PSRAM_ADDR, (char *)VBOARD_PSRAM_ADDR + psram);
    }

    // A soft reset ends QEMU: the host starts the board again in the same REPL (host/emulator/qemu.py), with the
    // heap sized for the flash as it is now, as the unix-port boards do
    semihost_exit(vboard_boot());
    return 0;
}

void gc_collect(void) {
    gc_collect_start();
    xsim_spill(); // every caller's registers are now in its stack save area
    void **sp = (void **)((uintptr_t)xsim_get_sp() & ~3);
    gc_collect_root(sp, ((uintptr_t)_stack_top - (uintptr_t)sp) / sizeof(void *));
    gc_collect_end();
}

void nlr_jump_fail(void *val) {
    mp_printf(&mp_plat_print, "uncaught NLR\n");
    semihost_exit(1);
}

// picolibc's headers declare these; the VM reaches them only on a fatal error
void exit(int code) {
    semihost_exit(code);
}

void abort(void) {
    semihost_exit(134);
}
