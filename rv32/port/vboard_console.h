// specmesh virtual boards' console input, shared by both firmware ports (rv32/port, and xtensa/port, whose build
// copies this file and vboard_console.c beside its own): the receive buffer and its Ctrl-C handling are
// vboard_console.c's; each port's mphalport.c is only the byte source and the sleep (the hooks below).
// Included by both mpconfigport.h files, for the VM hook and the WFE wait that poll it.
#ifndef SPECMESH_VBOARD_CONSOLE_H
#define SPECMESH_VBOARD_CONSOLE_H

#include <stdbool.h>
#include <stdint.h>

// -- what vboard_console.c gives the port (besides mp_hal_stdin_rx_chr and mp_hal_stdio_poll) -------------------
// Room left in the receive buffer: a port reads no more bytes than this.
uint32_t vboard_rx_room(void);
// A received byte: the interrupt character schedules a KeyboardInterrupt (false), any other is buffered (true).
bool vboard_rx_take(uint8_t c);
// A byte is buffered, or the port's source has one (vboard_rx_ready): no sleep.
int vboard_rx_any(void);
// The VM hook's look at the console (every MICROPY_VM_HOOK_COUNT hook points, below).
void vboard_rx_poll(void);

// -- what the port's mphalport.c gives vboard_console.c ---------------------------------------------------------
// Take what the byte source holds now (at most vboard_rx_room() bytes) through vboard_rx_take. from_vm_hook: the
// VM hook asks, so a port whose look is dear may skip it (the Xtensa board's host poll()); otherwise it looks.
void vboard_rx_read(bool from_vm_hook);
// The byte source has a byte waiting (not yet taken).
int vboard_rx_ready(void);
// mp_hal_stdin_rx_chr found nothing buffered: wait a while for input (vboard_idle), or end the board.
void vboard_rx_wait(void);
// Sleep until input or the next millisecond (also mp_hal_delay_ms's, vboard.c, and machine.idle's).
void vboard_idle(void);

// -- how MicroPython polls it -----------------------------------------------------------------------------------
// select.poll and time.sleep wait here: asleep until input or the next millisecond
#define MICROPY_INTERNAL_WFE(TIMEOUT_MS) do { \
        if (!vboard_rx_any()) { \
            vboard_idle(); \
        } \
} while (0)
// A Ctrl-C is seen while code runs, as a board's UART interrupt sees it: the VM looks every 64 hook points
#define MICROPY_VM_HOOK_COUNT (64)
#define MICROPY_VM_HOOK_INIT static unsigned int vm_hook_divisor = MICROPY_VM_HOOK_COUNT;
#define MICROPY_VM_HOOK_POLL if (--vm_hook_divisor == 0) { \
        vm_hook_divisor = MICROPY_VM_HOOK_COUNT; \
        vboard_rx_poll(); \
}
#define MICROPY_VM_HOOK_LOOP MICROPY_VM_HOOK_POLL
#define MICROPY_VM_HOOK_RETURN MICROPY_VM_HOOK_POLL

#endif
