// specmesh virtual Xtensa board (ESP32 / ESP32-S3 classes): MicroPython on qemu-system-xtensa -M sim -cpu de233_fpu,
// the ESP32's windowed ABI and the xtensawin emitter, with what a board of those classes has: a littlefs
// filesystem, a writable ROMFS partition (vfs.rom_ioctl, rv32/port/vboard.c), a console that sees Ctrl-C while
// code runs, and a split heap for the S3's PSRAM (main.c).
#include <stdint.h>

#define MICROPY_CONFIG_ROM_LEVEL    (MICROPY_CONFIG_ROM_LEVEL_EXTRA_FEATURES)
#define MICROPY_NLR_SETJMP          (1)     // py/emitnxtensawin.c expects it (start.S: the windowed setjmp)
#define MICROPY_EMIT_XTENSAWIN      (1)
#define MICROPY_EMIT_INLINE_XTENSA  (1)
#define MICROPY_PERSISTENT_CODE_LOAD (1)
#define MICROPY_PERSISTENT_CODE_LOAD_NATIVE (1)
#define MICROPY_READER_VFS          (1)
#define MICROPY_ENABLE_GC           (1)
#define MICROPY_GC_SPLIT_HEAP       (1)
#define MICROPY_ENABLE_EMERGENCY_EXCEPTION_BUF (1)
#define MICROPY_LONGINT_IMPL        (MICROPY_LONGINT_IMPL_MPZ)
// single precision in the FPU, as the ESP32's and the S3's MicroPython (the node's arithmetic is integer,
// docs/CONTRACTS.md section 4; its model header and host-side figures are floats)
#define MICROPY_FLOAT_IMPL          (MICROPY_FLOAT_IMPL_FLOAT)
// no complex numbers: llc-22 aborts on objcomplex.c at any optimisation level (xtensa/tools/xcc: a select
// between two float constants it cannot select)
#define MICROPY_PY_BUILTINS_COMPLEX (0)
#define MICROPY_WARNINGS            (1)
#define MICROPY_HELPER_REPL         (1)
#define MICROPY_KBD_EXCEPTION       (1)
#define MICROPY_PY_SYS_PLATFORM     "qemu"
#define MICROPY_HW_BOARD_NAME       "specmesh-qemu-xtensa"
#define MICROPY_HW_MCU_NAME         "de233_fpu"
#define MICROPY_PY_ASYNCIO          (0)
#define MICROPY_PY_TIME             (1)
#define MICROPY_PY_TIME_INCLUDEFILE "ports/specmesh-xtensa/modtime.c"
#define MICROPY_PY_MACHINE          (1)
#define MICROPY_PY_MACHINE_INCLUDEFILE "ports/specmesh-xtensa/modmachine.c"
#define MICROPY_PY_MACHINE_RESET    (1)
#define MICROPY_VFS                 (1)
#define MICROPY_VFS_ROM             (1)
#define MICROPY_VFS_ROM_IOCTL       (1)
#define MICROPY_PY_OS               (1)
#define MICROPY_PY_OS_UNAME         (1)
#define MICROPY_PY_RANDOM_SEED_INIT_FUNC (12345)
#define MICROPY_STACK_CHECK_MARGIN  (1024)
// The VM as MicroPython's esp32 port builds it (ports/esp32/mpconfigport.h), so that the executed instructions of
// interpreted code are those of a stock ESP32 firmware's
#define MICROPY_OPT_COMPUTED_GOTO   (1)

// The console both virtual boards share (rv32/port/vboard_console.c): the VM hook and the WFE wait that poll it
#include "vboard_console.h"

#define MP_SSIZE_MAX (0x7fffffff)
#define MP_NEED_LOG2 (1) // lib/libm has no log2f: py/modmath.c defines it
typedef long mp_off_t;
#include <alloca.h>
#define MP_STATE_PORT MP_STATE_VM
