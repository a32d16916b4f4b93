// specmesh virtual RV32 board: the qemu port's configuration (mpconfigport_qemu.h, its own file renamed)
// with what a board of the ESP32-C3/C6 classes has: a littlefs filesystem, a writable ROMFS partition
// (vfs.rom_ioctl, vboard.c) and a console that sees Ctrl-C while code runs.
#include "mpconfigport_qemu.h"

#undef MICROPY_VFS_ROM_IOCTL
#define MICROPY_VFS_ROM_IOCTL (1)
#define MICROPY_KBD_EXCEPTION (1)
#define MICROPY_HELPER_REPL (1)

// The console both virtual boards share (vboard_console.c): the VM hook and the WFE wait that poll it
#include "vboard_console.h"

// An ESP32-C3 has no Zba: the board's own viper compiler emits plain rv32imc, as stock C3 firmware does.
#undef MICROPY_EMIT_RV32_ZBA
#define MICROPY_EMIT_RV32_ZBA (0)

// The VM as MicroPython's esp32 port builds it (ports/esp32/mpconfigport.h), so the executed instructions of
// interpreted code are those of a stock ESP32-C3 firmware (built with -O2: the Makefile's rv32-firmware).
#define MICROPY_OPT_COMPUTED_GOTO (1)
