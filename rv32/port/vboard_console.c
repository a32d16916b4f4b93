/*
 * specmesh virtual boards' console input, both firmware ports' (the RV32 board, rv32/port, whose bytes come from
 * the virt machine's UART; the Xtensa board, xtensa/port, whose bytes are QEMU's stdin over semihosting).
 *
 * Received bytes go through a buffer, so a Ctrl-C is seen while code runs (a KeyboardInterrupt, as a board's UART
 * interrupt raises it; polled from the VM hook, vboard_console.h), including one that arrived during a soft
 * reboot, while the REPL still reads a Ctrl-C as a character. Each port's mphalport.c feeds the buffer from its
 * byte source (vboard_rx_read) and waits its own way when it is empty (vboard_rx_wait, vboard_idle).
 *
 * MIT licence, as the MicroPython code it extends.
 */

#include "py/mphal.h"
#include "py/runtime.h"
#include "py/stream.h"
#include "shared/runtime/interrupt_char.h"
#include "vboard_console.h"

#define RX_SIZE (256)
#define CTRL_C (3)
static uint8_t rx_buf[RX_SIZE];
static uint32_t rx_head, rx_tail; // bytes rx_tail..rx_head-1 are waiting
static uint32_t rx_ctrl_c; // rx_head after the last Ctrl-C buffered as a character (0: none waiting)

uint32_t vboard_rx_room(void) {
    return RX_SIZE - (rx_head - rx_tail);
}

bool vboard_rx_take(uint8_t c) {
    if (c == mp_interrupt_char) {
        mp_sched_keyboard_interrupt();
        return false;
    }
    rx_buf[rx_head++ % RX_SIZE] = c;
    if (c == CTRL_C) {
        rx_ctrl_c = rx_head;
    }
    return true;
}

// Look at the console: a Ctrl-C buffered while none was caught, then what the port's source holds.
static void rx_poll(bool from_vm_hook) {
    if (rx_ctrl_c && mp_interrupt_char == CTRL_C) {
        // A Ctrl-C that came while none was caught (a soft reboot) interrupts the code that now runs, and
        // takes what came before it, as a board's UART interrupt would have.
        if (rx_ctrl_c - rx_tail <= rx_head - rx_tail) {
            rx_tail = rx_ctrl_c;
            mp_sched_keyboard_interrupt();
        }
        rx_ctrl_c = 0;
    }
    vboard_rx_read(from_vm_hook);
}

void vboard_rx_poll(void) {
    rx_poll(true);
}

uintptr_t mp_hal_stdio_poll(uintptr_t poll_flags) {
    rx_poll(false);
    uintptr_t ret = 0;
    if ((poll_flags & MP_STREAM_POLL_RD) && rx_head != rx_tail) {
        ret |= MP_STREAM_POLL_RD;
    }
    if (poll_flags & MP_STREAM_POLL_WR) {
        ret |= MP_STREAM_POLL_WR;
    }
    return ret;
}

int mp_hal_stdin_rx_chr(void) {
    for (;;) {
        rx_poll(false);
        mp_handle_pending(true); // a Ctrl-C raises before the bytes after it are read: they are the REPL's
        if (rx_head != rx_tail) {
            if (rx_ctrl_c == rx_tail + 1) {
                rx_ctrl_c = 0; // the REPL reads the Ctrl-C as a character
            }
            return rx_buf[rx_tail++ % RX_SIZE];
        }
        vboard_rx_wait();
    }
}

int vboard_rx_any(void) {
    return rx_head != rx_tail || vboard_rx_ready();
}
