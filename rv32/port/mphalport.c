/*
 * specmesh virtual RV32 board: the qemu port's HAL (MIT, Damien P. George) with the console a board has:
 * received bytes go through a small buffer, so a Ctrl-C is seen while code runs (KeyboardInterrupt, as a
 * board's UART interrupt raises it; polled from the VM hook, mpconfigport.h), and a CPU counter:
 * time.ticks_cpu() reads minstret, which under `qemu -icount shift=0` is the number of instructions
 * executed. A board waiting for input sleeps (wfi until the next timer tick, vboard_idle) instead of spinning,
 * so an idle virtual board leaves the host's CPU alone (QEMU's icount sleeps with it).
 */

#include "py/mphal.h"
#include "py/runtime.h"
#include "py/stream.h"
#include "shared/runtime/interrupt_char.h"
#include "uart.h"

uintptr_t ticks_ms(void);
uintptr_t ticks_us(void);

#define RX_SIZE (256)
#define CTRL_C (3)
static uint8_t rx_buf[RX_SIZE];
static uint32_t rx_head, rx_tail; // bytes rx_tail..rx_head-1 are waiting
static uint32_t rx_ctrl_c; // rx_head after the last Ctrl-C buffered as a character (0: none waiting)
static uint32_t rx_last_ms; // when a byte last arrived: a transfer under way is not slept through
#define RX_BUSY_MS (20)

void vboard_rx_poll(void) {
    if (rx_ctrl_c && mp_interrupt_char == CTRL_C) {
        // A Ctrl-C that came while none was caught (a soft reboot) interrupts the code that now runs, and
        // takes what came before it, as a board's UART interrupt would have.
        if (rx_ctrl_c - rx_tail <= rx_head - rx_tail) {
            rx_tail = rx_ctrl_c;
            mp_sched_keyboard_interrupt();
        }
        rx_ctrl_c = 0;
    }
    while (rx_head - rx_tail < RX_SIZE && uart_rx_any()) {
        int c = uart_rx_chr();
        if (c == mp_interrupt_char) {
            mp_sched_keyboard_interrupt();
        } else if (c >= 0) {
            rx_last_ms = ticks_ms();
            rx_buf[rx_head++ % RX_SIZE] = c;
            if (c == CTRL_C) {
                rx_ctrl_c = rx_head;
            }
        }
    }
}

uintptr_t mp_hal_stdio_poll(uintptr_t poll_flags) {
    vboard_rx_poll();
    uintptr_t ret = 0;
    if ((poll_flags & MP_STREAM_POLL_RD) && rx_head != rx_tail) {
        ret |= MP_STREAM_POLL_RD;
    }
    if (poll_flags & MP_STREAM_POLL_WR) {
        ret |= MP_STREAM_POLL_WR;
    }
    return ret;
}

// The core local interruptor of QEMU's virt machine: the 10 MHz timer and hart 0's compare register.
#define CLINT_MTIMECMP_LO (*(volatile uint32_t *)0x02004000)
#define CLINT_MTIMECMP_HI (*(volatile uint32_t *)0x02004004)
#define CLINT_MTIME_LO (*(volatile uint32_t *)0x0200bff8)
#define CLINT_MTIME_HI (*(volatile uint32_t *)0x0200bffc)
#define MIP_MTIP (1u << 7)
#define IDLE_TICKS (10000u) // 1 ms of the 10 MHz timer

void vboard_idle(void) {
    // Sleep until the timer's next millisecond (or any other enabled interrupt): a timer interrupt enabled in
    // mie wakes wfi even with interrupts globally off, so no handler runs; the compare is then pushed away.
    // Not while bytes are arriving: the UART holds 16, so a transfer would go at 16 bytes a millisecond.
    if (ticks_ms() - rx_last_ms < RX_BUSY_MS) {
        return;
    }
    uint32_t lo = CLINT_MTIME_LO, hi = CLINT_MTIME_HI;
    uint32_t at = lo + IDLE_TICKS;
    CLINT_MTIMECMP_HI = 0xffffffffu;
    CLINT_MTIMECMP_LO = at;
    CLINT_MTIMECMP_HI = hi + (at < lo);
    uint32_t mstatus;
    __asm volatile ("csrrci %0, mstatus, 8" : "=r" (mstatus));
    __asm volatile ("csrs mie, %0" : : "r" (MIP_MTIP));
    __asm volatile ("wfi");
    __asm volatile ("csrc mie, %0" : : "r" (MIP_MTIP));
    CLINT_MTIMECMP_HI = 0xffffffffu;
    CLINT_MTIMECMP_LO = 0xffffffffu;
    __asm volatile ("csrw mstatus, %0" : : "r" (mstatus));
}

int mp_hal_stdin_rx_chr(void) {
    for (;;) {
        vboard_rx_poll();
        mp_handle_pending(true); // a Ctrl-C raises before the bytes after it are read: they are the REPL's
        if (rx_head != rx_tail) {
            if (rx_ctrl_c == rx_tail + 1) {
                rx_ctrl_c = 0; // the REPL reads the Ctrl-C as a character
            }
            return rx_buf[rx_tail++ % RX_SIZE];
        }
        mp_handle_pending(true);
        if (!uart_rx_any()) {
            vboard_idle();
        }
    }
}

mp_uint_t mp_hal_stdout_tx_strn(const char *str, size_t len) {
    uart_tx_strn(str, len);
    return len;
}

mp_uint_t mp_hal_ticks_ms(void) {
    return ticks_ms();
}

mp_uint_t mp_hal_ticks_us(void) {
    return ticks_us();
}

mp_uint_t mp_hal_ticks_cpu(void) {
    uint32_t n;
    __asm volatile ("csrr %0, minstret" : "=r" (n));
    return n;
}

// A dummy mp_hal_get_random() (an LCG), as the qemu port has.
static uint32_t random_state;
void mp_hal_get_random(size_t n, uint8_t *buf) {
    for (size_t i = 0; i < n; ++i) {
        random_state = random_state * 1664525 + 1013904223;
        buf[i] = random_state >> 24;
    }
}

// The filesystem's file times (littlefs mtime): time since power-on, as a board without a clock set.
uint64_t mp_hal_time_ns(void) {
    return (uint64_t)ticks_ms() * 1000000ull;
}

int uart_rx_any_for_wfe(void) {
    return rx_head != rx_tail || uart_rx_any();
}
