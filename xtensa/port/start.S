// specmesh virtual Xtensa board: reset vector, XEA2 window overflow/underflow vectors, the alloca (MOVSP) handler,
// the timer interrupt that wakes an idle board (mphalport.c vboard_idle), setjmp/longjmp and window spill for
// MicroPython on qemu-system-xtensa -M sim -cpu de233_fpu (windowed ABI, 32 AR registers = 8 window units).
#define NUNITS 8
#define SIMCALL .byte 0x00, 0x51, 0x00

    .section .resetvec, "ax"
    .global _resetvec
_resetvec:
    movi    a2, 0x240
    slli    a2, a2, 4
    jx      a2                      // 0x2400: j _start

    .section .vectors, "ax"
    .global _vectors
_vectors:
    .org 0x000
_WindowOverflow4:
    s32e    a0, a5, -16
    s32e    a1, a5, -12
    s32e    a2, a5, -8
    s32e    a3, a5, -4
    rfwo
    .org 0x040
_WindowUnderflow4:
    l32e    a0, a5, -16
    l32e    a1, a5, -12
    l32e    a2, a5, -8
    l32e    a3, a5, -4
    rfwu
    .org 0x080
_WindowOverflow8:
    s32e    a0, a9, -16
    l32e    a0, a1, -12
    s32e    a1, a9, -12
    s32e    a2, a9, -8
    s32e    a3, a9, -4
    s32e    a4, a0, -32
    s32e    a5, a0, -28
    s32e    a6, a0, -24
    s32e    a7, a0, -20
    rfwo
    .org 0x0c0
_WindowUnderflow8:
    l32e    a1, a9, -12
    l32e    a0, a9, -16
    l32e    a7, a1, -12
    l32e    a2, a9, -8
    l32e    a4, a7, -32
    l32e    a3, a9, -4
    l32e    a5, a7, -28
    l32e    a6, a7, -24
    l32e    a7, a7, -20
    rfwu
    .org 0x100
_WindowOverflow12:
    s32e    a0, a13, -16
    l32e    a0, a1, -12
    s32e    a1, a13, -12
    s32e    a2, a13, -8
    s32e    a3, a13, -4
    s32e    a4, a0, -48
    s32e    a5, a0, -44
    s32e    a6, a0, -40
    s32e    a7, a0, -36
    s32e    a8, a0, -32
    s32e    a9, a0, -28
    s32e    a10, a0, -24
    s32e    a11, a0, -20
    rfwo
    .org 0x140
_WindowUnderflow12:
    l32e    a1, a13, -12
    l32e    a0, a13, -16
    l32e    a11, a1, -12
    l32e    a2, a13, -8
    l32e    a4, a11, -48
    l32e    a8, a11, -32
    l32e    a3, a13, -4
    l32e    a5, a11, -44
    l32e    a6, a11, -40
    l32e    a7, a11, -36
    l32e    a9, a11, -28
    l32e    a10, a11, -24
    l32e    a11, a11, -20
    rfwu
    .org 0x180
    movi    a2, 0x72
    j       _die
    .org 0x1c0
    movi    a2, 0x73
    j       _die
    .org 0x200
    movi    a2, 0x74
    j       _die
    .org 0x240
    movi    a2, 0x75
    j       _die
    .org 0x280
    movi    a2, 0x76
    j       _die
    .org 0x2c0
    movi    a2, 0x77
    j       _die
    .org 0x300
_KernelExceptionVector:
    wsr     a0, excsave1
    j       _exc_common
    .org 0x340
_UserExceptionVector:
    wsr     a0, excsave1
    j       _exc_common
    .org 0x3c0
_DoubleExceptionVector:
    movi    a2, 0x7d
    j       _die
    .org 0x400
    j       _start

    .p2align 2
_exc_common:
    rsr     a0, exccause
    beqi    a0, 4, _level1          // 4 = Level1InterruptCause: CCOMPARE0, the only interrupt enabled
    bnei    a0, 5, _fatal           // 5 = AllocaCause (MOVSP with the caller's frame spilled)
    // reload the caller's frame into the register file (the standard Xtensa alloca handler)
    rsr     a0, windowbase
    rotw    -1
    rsr     a2, ps
    extui   a3, a2, 8, 4            // PS.OWB
    xor     a3, a3, a4
    rsr     a4, excsave1
    slli    a3, a3, 8
    xor     a2, a2, a3
    wsr     a2, ps                  // PS.OWB = WindowBase at the MOVSP
    rsync
    bbsi    a4, 31, 1f
    j       _WindowUnderflow4
1:  rotw    -1
    bbsi    a8, 30, 2f
    j       _WindowUnderflow8
2:  rotw    -1
    j       _WindowUnderflow12
_level1:
    wsr     a0, ccompare0           // writing CCOMPARE0 clears its interrupt (and sets the next far away)
    rsr     a0, excsave1
    rfe
_fatal:
    // exit(0x40 + EXCCAUSE); run QEMU with -d int to see EPC1/EXCVADDR
    movi    a2, 0x40
    add     a2, a2, a0
_die:
    mov     a3, a2
    movi    a2, 1                   // SYS_exit
    SIMCALL
3:  j       3b

    .text
    .p2align 2
.Lstack_top:
    .long   _stack_top
.Lmain:
    .long   xsim_main
.Lps:
    .long   (1 << 18) | (1 << 5)    // PS.WOE | PS.UM, EXCM=0, INTLEVEL=0
.Lvecbase:
    .long   _vectors
    .global _start
    .p2align 2
_start:
    movi    a0, 0
    movi    a2, 1
    wsr     a2, windowstart
    wsr     a0, windowbase
    rsync
    l32r    a2, .Lvecbase
    wsr     a2, vecbase
    movi    a2, 1
    wsr     a2, cpenable            // the FPU (coprocessor 0)
    l32r    a1, .Lstack_top
    l32r    a2, .Lps
    wsr     a2, ps
    rsync
    l32r    a4, .Lmain
    callx4  a4
    mov     a3, a6
    movi    a2, 1
    SIMCALL
4:  j       4b

// int xsim_simcall(int nr, int a, int b, int c)
    .global xsim_simcall
    .p2align 2
xsim_simcall:
    entry   a1, 32
    SIMCALL
    retw

// void *xsim_get_sp(void): the sp of this (callee) frame, below the caller's
    .global xsim_get_sp
    .p2align 2
xsim_get_sp:
    entry   a1, 32
    mov     a2, a1
    retw

// spill every live register window of the callers to their stack save areas
    .global xsim_spill
    .p2align 2
xsim_spill:
    entry   a1, 48
    movi    a14, 4
    call12  .Lspill12
    retw
    .p2align 2
.Lspill12:
    entry   a1, 64
    beqz    a2, 5f
    addi    a14, a2, -1
    call12  .Lspill12
5:  retw

// int setjmp(jmp_buf env): store the caller's (call8) a0..a7 and our return address.
// The caller's registers are reached with rotw -2; while rotated, our own WindowStart bit is cleared so that
// touching a10 (our a2) does not look like an access to a live older frame (that raises a window overflow).
    .global setjmp
    .p2align 2
setjmp:
    entry   a1, 32
    extui   a3, a0, 30, 2
    bnei    a3, 2, .Lbadcall
    rsr     a4, windowstart
    rsr     a5, windowbase
    movi    a6, 1
    ssl     a5
    sll     a6, a6
    xor     a6, a4, a6              // WindowStart without our bit
    wsr     a6, windowstart
    rsync
    rotw    -2
    s32i    a0, a10, 0
    s32i    a1, a10, 4
    s32i    a2, a10, 8
    s32i    a3, a10, 12
    s32i    a4, a10, 16
    s32i    a5, a10, 20
    s32i    a6, a10, 24
    s32i    a7, a10, 28
    rotw    2
    wsr     a4, windowstart
    rsync
    s32i    a0, a2, 32
    movi    a2, 0
    retw
.Lbadcall:
    movi    a2, 0x7a
    j       _die

// void longjmp(jmp_buf env, int val)
    .global longjmp
    .p2align 2
longjmp:
    entry   a1, 48
    movi    a14, 4
    call12  .Lspill12               // every older frame now lives in its stack save area
    movi    a5, 1
    movnez  a5, a3, a3              // a5 = val ? val : 1
    l32i    a4, a2, 32              // setjmp's return address into its caller
    rsr     a6, windowbase
    addi    a6, a6, -2
    bgez    a6, 6f
    addi    a6, a6, NUNITS
6:  movi    a7, 1
    ssl     a6
    sll     a7, a7
    wsr     a7, windowstart         // only the target frame (2 units below us) is live
    rsync
    rotw    -2                      // the target's view: our a0..a7 are its a8..a15
    l32i    a0, a10, 0
    l32i    a1, a10, 4
    l32i    a2, a10, 8
    l32i    a3, a10, 12
    l32i    a4, a10, 16
    l32i    a5, a10, 20
    l32i    a6, a10, 24
    l32i    a7, a10, 28
    mov     a10, a13                // setjmp's return value (the callee's a2)
    slli    a12, a12, 2
    srli    a12, a12, 2             // strip the call-size bits (code is below 1 GiB)
    jx      a12
