// specmesh virtual Xtensa board: the semihosting calls (semihost.h) over start.S's xsim_simcall.
#include "semihost.h"

int xsim_simcall(int nr, int a, int b, int c);

#define SYS_exit (1)
#define SYS_read (3)
#define SYS_write (4)
#define SYS_open (5)
#define SYS_lseek (19)
#define SYS_select_one (29)
#define SELECT_ONE_READ (1)
#define O_RDWR (2)
#define SEEK_SET (0)
#define SEEK_END (2)

int semihost_read(int fd, void *buf, size_t len) {
    return xsim_simcall(SYS_read, fd, (int)buf, len);
}

int semihost_write(int fd, const void *buf, size_t len) {
    return xsim_simcall(SYS_write, fd, (int)buf, len);
}

int semihost_readable(int fd) {
    // a zero timeval: QEMU polls and returns at once (without one it blocks until input)
    static const int zero[2] = {0, 0};
    return xsim_simcall(SYS_select_one, fd, SELECT_ONE_READ, (int)zero) > 0;
}

void semihost_exit(int code) {
    for (;;) {
        xsim_simcall(SYS_exit, code, 0, 0);
    }
}

int mp_semihosting_open(const char *file_name, const char *file_mode) {
    (void)file_mode;
    return xsim_simcall(SYS_open, (int)file_name, O_RDWR, 0644);
}

int mp_semihosting_flen(int handle) {
    return xsim_simcall(SYS_lseek, handle, 0, SEEK_END);
}

int mp_semihosting_seek(int handle, uint32_t offset) {
    return xsim_simcall(SYS_lseek, handle, offset, SEEK_SET) == (int)offset ? 0 : -1;
}

int mp_semihosting_read(int handle, void *data, size_t length) {
    int n = semihost_read(handle, data, length);
    return n < 0 ? (int)length : (int)length - n;
}

int mp_semihosting_write(int handle, const void *data, size_t length) {
    int n = semihost_write(handle, data, length);
    return n < 0 ? (int)length : (int)length - n;
}
