/*
 * specmesh virtual Xtensa board: the console's byte source and sleep, and the clock.
 *
 * The console is QEMU's stdin and stdout through semihosting (fds 0 and 1; host/emulator/qemu.py bridges them
 * to the board's pty). Its receive buffer and Ctrl-C handling are rv32/port/vboard_console.c's, shared with the
 * RV32 board; here stdin is read into it. A board waiting for input sleeps (waiti until the next millisecond's
 * timer interrupt, vboard_idle) instead of spinning, so an idle board leaves the host's CPU alone.
 *
 * The clock is CCOUNT, which QEMU's de233_fpu runs at 40 MHz of its virtual clock: under `-icount shift=0` one
 * tick is 25 executed instructions exactly, so time.ticks_cpu() (CCOUNT x 25) counts instructions to 25,
 * and time.ticks_us() is 1000 instructions a microsecond, as on the RV32 board.
 */

#include "py/mphal.h"
#include "py/runtime.h"
#include "semihost.h"
#include "vboard_console.h"

#define TICKS_PER_US (40)
#define INSNS_PER_TICK (25) // -icount shift=0: 1 ns per instruction; CCOUNT: 40 MHz
#define CCOMPARE_TIMER_INT (6) // de233_fpu: CCOMPARE0 raises interrupt 6, level 1 (start.S clears it)

static inline uint32_t ccount(void) {
    uint32_t c;
    __asm__ volatile ("rsr %0, ccount" : "=r" (c));
    return c;
}

// CCOUNT extended to 64 bits (it wraps every 107 s); read often enough, since an idle board wakes every ms
static uint64_t ticks64(void) {
    static uint32_t last, high;
    uint32_t now = ccount();
    if (now < last) {
        ++high;
    }
    last = now;
    return ((uint64_t)high << 32) | now;
}

static uint32_t ticks_ms(void) {
    return (uint32_t)(ticks64() / (1000 * TICKS_PER_US));
}

static uint32_t rx_polled; // CCOUNT at the last look at QEMU's stdin
static bool rx_closed; // QEMU's stdin is at its end: the board stops once the bytes before it are read
#define RX_POLL_TICKS (100 * TICKS_PER_US) // the VM hook looks every 100 us at most: a host poll() is dear

// The console's byte source (vboard_console.c's buffer takes them): QEMU's stdin, read in chunks.
void vboard_rx_read(bool from_vm_hook) {
    if (from_vm_hook && ccount() - rx_polled < RX_POLL_TICKS) {
        return;
    }
    rx_polled = ccount();
    uint32_t room;
    while (!rx_closed && (room = vboard_rx_room()) > 0 && semihost_readable(0)) {
        uint8_t chunk[64];
        int n = semihost_read(0, chunk, room < sizeof(chunk) ? room : sizeof(chunk));
        if (n <= 0) {
            rx_closed = true; // the host has gone
            return;
        }
        for (int i = 0; i < n; ++i) {
            vboard_rx_take(chunk[i]);
        }
    }
}

int vboard_rx_ready(void) {
    return semihost_readable(0);
}

void vboard_idle(void) {
    // Sleep until the next millisecond: CCOMPARE0's interrupt wakes waiti (with interrupts masked until waiti
    // lowers the level, so it cannot fire before); start.S's handler clears it. QEMU's icount lets the
    // virtual clock run on in real time while the CPU waits.
    if (rx_closed || semihost_readable(0)) {
        return;
    }
    uint32_t ps, enable = 1u << CCOMPARE_TIMER_INT;
    __asm__ volatile ("rsil %0, 15" : "=r" (ps));
    __asm__ volatile ("wsr %0, ccompare0" : : "r" (ccount() + 1000 * TICKS_PER_US));
    __asm__ volatile ("wsr %0, intenable; rsync" : : "r" (enable));
    __asm__ volatile ("waiti 0" ::: "memory");
    __asm__ volatile ("wsr %0, intenable; rsync" : : "r" (0));
    __asm__ volatile ("wsr %0, ps; rsync" : : "r" (ps));
}

void vboard_rx_wait(void) {
    if (rx_closed) {
        semihost_exit(0);
    }
    vboard_idle();
}

mp_uint_t mp_hal_stdout_tx_strn(const char *str, size_t len) {
    semihost_write(1, str, len);
    return len;
}

mp_uint_t mp_hal_ticks_ms(void) {
    return ticks_ms();
}

mp_uint_t mp_hal_ticks_us(void) {
    return (mp_uint_t)(ticks64() / TICKS_PER_US);
}

mp_uint_t mp_hal_ticks_cpu(void) {
    return ccount() * INSNS_PER_TICK; // wraps at 2^32, a multiple of the ticks period (2^30)
}

// The filesystem's file times (littlefs mtime): time since power-on, as a board without a clock set.
uint64_t mp_hal_time_ns(void) {
    return ticks64() * (1000 / TICKS_PER_US);
}
