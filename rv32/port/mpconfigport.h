// specmesh virtual RV32 board: the qemu port's configuration (mpconfigport_qemu.h, its own file renamed)
// with what a board of the ESP32-C3/C6 classes has: a littlefs filesystem, a writable ROMFS partition
// (vfs.rom_ioctl, vboard.c) and a console that sees Ctrl-C while code runs.
#include "mpconfigport_qemu.h"

#undef MICROPY_VFS_ROM_IOCTL
#define MICROPY_VFS_ROM_IOCTL (1)
#define MICROPY_KBD_EXCEPTION (1)
#define MICROPY_HELPER_REPL (1)

void vboard_rx_poll(void);
void vboard_idle(void);
// select.poll and time.sleep wait here: asleep until input or the next millisecond (mphalport.c)
#define MICROPY_INTERNAL_WFE(TIMEOUT_MS) do { \
        if (!uart_rx_any_for_wfe()) { \
            vboard_idle(); \
        } \
} while (0)
int uart_rx_any_for_wfe(void);
#define MICROPY_VM_HOOK_COUNT (64)
#define MICROPY_VM_HOOK_INIT static unsigned int vm_hook_divisor = MICROPY_VM_HOOK_COUNT;
#define MICROPY_VM_HOOK_POLL if (--vm_hook_divisor == 0) { \
        vm_hook_divisor = MICROPY_VM_HOOK_COUNT; \
        vboard_rx_poll(); \
}
#define MICROPY_VM_HOOK_LOOP MICROPY_VM_HOOK_POLL
#define MICROPY_VM_HOOK_RETURN MICROPY_VM_HOOK_POLL

// An ESP32-C3 has no Zba: the board's own viper compiler emits plain rv32imc, as stock C3 firmware does.
#undef MICROPY_EMIT_RV32_ZBA
#define MICROPY_EMIT_RV32_ZBA (0)

// The VM as MicroPython's esp32 port builds it (ports/esp32/mpconfigport.h), so the executed instructions of
// interpreted code are those of a stock ESP32-C3 firmware (built with -O2: the Makefile's rv32-firmware).
#define MICROPY_OPT_COMPUTED_GOTO (1)
