/*
 * specmesh virtual RV32 board: the qemu port's HAL (MIT, Damien P. George) with the console a board has: its
 * receive buffer and Ctrl-C handling are vboard_console.c's, shared with the Xtensa board; here is its byte
 * source, the UART, and its sleep. And a CPU counter: time.ticks_cpu() reads minstret, which under
 * `qemu -icount shift=0` is the number of instructions executed. A board waiting for input sleeps (wfi until the
 * next timer tick, vboard_idle) instead of spinning, so an idle virtual board leaves the host's CPU alone (QEMU's
 * icount sleeps with it).
 */

#include "py/mphal.h"
#include "py/runtime.h"
#include "uart.h"
#include "vboard_console.h"

uintptr_t ticks_ms(void);
uintptr_t ticks_us(void);

static uint32_t rx_last_ms; // when a byte last arrived: a transfer under way is not slept through
#define RX_BUSY_MS (20)

// The console's byte source (vboard_console.c's buffer takes them): the UART, read whenever asked.
void vboard_rx_read(bool from_vm_hook) {
    while (vboard_rx_room() && uart_rx_any()) {
        int c = uart_rx_chr();
        if (c >= 0 && vboard_rx_take(c)) {
            rx_last_ms = ticks_ms();
        }
    }
}

int vboard_rx_ready(void) {
    return uart_rx_any();
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

void vboard_rx_wait(void) {
    mp_handle_pending(true); // the qemu port's own wait, kept: a second scheduled callback runs before a sleep
    if (!uart_rx_any()) {
        vboard_idle();
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

// The filesystem's file times (littlefs mtime): time since power-on, as a board without a clock set.
uint64_t mp_hal_time_ns(void) {
    return (uint64_t)ticks_ms() * 1000000ull;
}
