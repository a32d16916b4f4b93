# specmesh's virtual RV32 board (ESP32-C3 / ESP32-C6 classes): MicroPython's VIRT_RV32 board of the qemu
# port, with a littlefs filesystem and a ROMFS partition kept in host files (vboard.c) and the console both
# virtual boards share (vboard_console.c). Built by the top-level Makefile's `rv32-firmware` target, which
# copies ports/qemu and lays these files over it.
QEMU_ARCH = riscv32
QEMU_MACHINE = virt

CFLAGS += -DQEMU_SOC_VIRT
CFLAGS += -DMICROPY_HW_MCU_NAME='"specmesh-qemu-rv32"'

LDSCRIPT = mcu/rv32/virt.ld

SRC_BOARD_O += shared/runtime/gchelper_native.o shared/runtime/gchelper_rv32i.o
SRC_C += vboard.c vboard_console.c shared/runtime/semihosting_rv32.c
SRC_QSTR += vboard.c

MICROPY_VFS_LFS2 = 1
# the largest heap a board class asks for; the class's own size comes at boot (vboard.c)
MICROPY_HEAP_SIZE = 1048576

MPY_CROSS_FLAGS += -march=rv32imc

# The semihosting calls' aligned `ebreak` sequences do not survive linker relaxation at -O2: -Os there.
$(BUILD)/shared/runtime/semihosting_rv32.o: CFLAGS += -Os
