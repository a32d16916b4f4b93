// specmesh virtual Xtensa board: QEMU's Xtensa semihosting calls (target/xtensa/xtensa-semi.c: SIMCALL with the
// call number in a2, arguments in a3..a5, result in a2). Files are the host's, relative to QEMU's working
// directory; fds 0 and 1 are QEMU's own stdin and stdout (the board's console, host/emulator/qemu.py).
// The mp_semihosting_* calls are the ones rv32/port/vboard.c (the flash, shared by both boards) makes, with
// the semantics of MicroPython's shared/runtime/semihosting_rv32.h.
#ifndef SPECMESH_SEMIHOST_H
#define SPECMESH_SEMIHOST_H

#include <stddef.h>
#include <stdint.h>

int semihost_read(int fd, void *buf, size_t len);  // bytes read, 0 at end of file, < 0 on error
int semihost_write(int fd, const void *buf, size_t len);
int semihost_readable(int fd);  // 1 when a read would not block (a poll that does not wait)
__attribute__((noreturn)) void semihost_exit(int code);

static inline void mp_semihosting_init(void) {
}
int mp_semihosting_open(const char *file_name, const char *file_mode);  // "r+b" only: read and write
int mp_semihosting_flen(int handle);
int mp_semihosting_seek(int handle, uint32_t offset);  // 0 when done
int mp_semihosting_read(int handle, void *data, size_t length);  // bytes not read
int mp_semihosting_write(int handle, const void *data, size_t length);  // bytes not written

#endif
