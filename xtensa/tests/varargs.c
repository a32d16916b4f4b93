#include <stdarg.h>
int xsim_simcall(int nr, int a, int b, int c);
static int out[256]; static int no;
__attribute__((noinline)) void p1(int n, ...) {
    va_list ap; va_start(ap, n);
    for (int i = 0; i < n; i++) out[no++] = va_arg(ap, int);
    va_end(ap);
}
__attribute__((noinline)) void p3(int a, int b, int n, ...) {
    va_list ap; va_start(ap, n);
    out[no++] = a; out[no++] = b;
    for (int i = 0; i < n; i++) out[no++] = va_arg(ap, int);
    va_end(ap);
}
__attribute__((noinline)) void pll(int n, ...) {  // int, long long alternating
    va_list ap; va_start(ap, n);
    for (int i = 0; i < n; i++) { if (i & 1) { long long v = va_arg(ap, long long); out[no++] = (int)v; out[no++] = (int)(v >> 32); } else out[no++] = va_arg(ap, int); }
    va_end(ap);
}
__attribute__((noinline)) void vp(int n, va_list ap) { for (int i = 0; i < n; i++) out[no++] = va_arg(ap, int); }
__attribute__((noinline)) void pv(int n, ...) { va_list ap; va_start(ap, n); vp(n, ap); va_end(ap); }
int xsim_main(void) {
    p1(9, 11, 12, 13, 14, 15, 16, 17, 18, 19); out[no++] = -1;
    p3(1, 2, 9, 11, 12, 13, 14, 15, 16, 17, 18, 19); out[no++] = -1;
    pll(7, 1, 0x200000003LL, 4, 0x500000006LL, 7, 0x800000009LL, 10); out[no++] = -1;
    pv(9, 11, 12, 13, 14, 15, 16, 17, 18, 19); out[no++] = -1;
    xsim_simcall(4, 1, (int)out, no * 4);
    return 0;
}
