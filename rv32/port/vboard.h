// specmesh virtual RV32 board: what main.c takes from vboard.c.
#ifndef SPECMESH_VBOARD_H
#define SPECMESH_VBOARD_H

#include <stddef.h>
#include <stdint.h>

// Board configuration, written into guest memory by QEMU before the CPU starts (host/emulator/qemu.py:
// `-device loader,addr=...,data=...`): magic, GC heap bytes, ROMFS partition bytes, PSRAM heap bytes (none on
// RV32), the REPL to boot into (VBOARD_BOOT_RAW: the raw REPL, after a soft reset there).
#define VBOARD_CONFIG_ADDR (0x80f00000u)
#define VBOARD_CONFIG_MAGIC (0x46434256u) // "VBCF"
#define VBOARD_BOOT_RAW (1u)
// QEMU's exit codes for a soft reset in the friendly and in the raw REPL (those of host/emulator/board.py)
#define VBOARD_EXIT_SOFT (64)
#define VBOARD_EXIT_SOFT_RAW (65)
// The ROMFS partition: the host file romfs.img loaded here by QEMU (`-device loader,file=...`), read in
// place like memory-mapped flash.
#define VBOARD_ROMFS_ADDR (0x81000000u)

size_t vboard_heap_bytes(size_t largest);
void vboard_init(void);
// Boot as a board does, on a heap gc_init gave: the filesystem mounted at / (formatted if erased), boot.py, then
// main.py in the friendly REPL, then the REPL until a soft reset (Ctrl-D), whose finalisers close open files.
// Returns QEMU's exit code for that reset, which says which REPL to come back to (the host starts the board again
// on the same console: host/emulator/qemu.py); the config block's boot word starts it in the raw REPL.
int vboard_boot(void);

#endif
