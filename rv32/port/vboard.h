// specmesh virtual RV32 board: what main.c and mphalport.c take from vboard.c.
#ifndef SPECMESH_VBOARD_H
#define SPECMESH_VBOARD_H

#include <stddef.h>
#include <stdint.h>

// Board configuration, written into guest memory by QEMU before the CPU starts (host/emulator/qemu.py:
// `-device loader,addr=...,data=...`): magic, GC heap bytes, ROMFS partition bytes.
#define VBOARD_CONFIG_ADDR (0x80f00000u)
#define VBOARD_CONFIG_MAGIC (0x46434256u) // "VBCF"
// The ROMFS partition: the host file romfs.img loaded here by QEMU (`-device loader,file=...`), read in
// place like memory-mapped flash.
#define VBOARD_ROMFS_ADDR (0x81000000u)

size_t vboard_heap_bytes(size_t largest);
void vboard_init(void);
void vboard_mount(void);

#endif
