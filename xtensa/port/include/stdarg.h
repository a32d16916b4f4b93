#ifndef SPECMESH_XTENSA_STDARG_H
#define SPECMESH_XTENSA_STDARG_H
// Variable arguments for clang-22 / llc-22's Xtensa target, which disagree with each other and with the Xtensa
// ABI (xtensa/README.md; xtensa/tests/varargs.c shows both bugs, tests/test_xtensa.py runs it):
// - llc's va_start points __va_reg at the first *unnamed* argument register's save slot, while __va_ndx counts
//   the named arguments' bytes, as the ABI's va_arg indexes from a2's slot: va_start rebases __va_reg;
// - clang's va_arg moves __va_ndx past the register area on every argument read from the stack, not only
//   on the first one (so every stack-passed argument but none is read from the wrong place): va_arg is
//   this file's, the ABI's algorithm (GCC's xtensa_gimplify_va_arg_expr).
// va_list = { __va_stk (the incoming stack arguments - 32), __va_reg (a2's save slot), __va_ndx (bytes used) }.
typedef __builtin_va_list va_list;
typedef __builtin_va_list __gnuc_va_list;

static inline void *__specmesh_va_next(int *va, unsigned size, unsigned align) {
    int ndx = va[2];
    int bytes = (int)((size + 3) & ~3u);
    if (align > 4) {
        ndx = (ndx + 7) & ~7;
    }
    int next = ndx + bytes;
    char *base = (char *)va[1];
    if (next > 24) { // six argument registers a2..a7: 24 bytes
        if (ndx <= 24) {
            next = 32 + bytes; // the first stack argument (an argument is never split)
        }
        base = (char *)va[0];
    }
    va[2] = next;
    return base + next - bytes;
}

#define va_start(ap, last) (__builtin_va_start(ap, last), ((int *)&(ap))[1] -= ((int *)&(ap))[2])
#define va_end(ap) __builtin_va_end(ap)
#define va_arg(ap, type) (*(type *)__specmesh_va_next((int *)&(ap), sizeof(type), _Alignof(type)))
#define va_copy(d, s) __builtin_va_copy(d, s)
#define __va_copy(d, s) __builtin_va_copy(d, s)
#endif
