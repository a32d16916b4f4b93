/* specmesh's engine kernels in C, built as a MicroPython native module per architecture (`make native`).

Every kernel of docs/CONTRACTS.md section 4 with the call signature of firmware/kernels.py (viper) and
firmware/refkernels.py (plain Python), so firmware/engine.py runs whichever module its kernel picker
(firmware/kernelpick.py) chose; the integers are the same bit for bit. Written for 32-bit cores: int32
arithmetic only (every intermediate stays inside int32 for the shapes the engine accepts, as in the viper
kernels), no floats, nothing from libc, and nothing allocated: the arguments are buffers and `p`, an
array('i') of sizes, offsets and scalars, results come back in the buffers, `p` or as a small int.
matmul's inner loops are unrolled by hand (constant group size and x stride, immediate offsets) so that
gcc (rv32imc) and clang/llc (xtensawin) compile them to a few instructions per multiply-accumulate
(tools/native_loops.py counts them); on x64 (the virtual boards) one position takes SSE2, which every x64
core has; on Xtensa the models' rows run on the ESP32/S3's MAC16 unit (mac16_matmul, below). One more
function, `layer`, runs a whole transformer layer in one call, the steps of Engine._layer with these kernels,
so a token costs a few interpreted calls instead of a hundred.
*/
#include "py/dynruntime.h"

typedef int32_t i32;
typedef uint8_t u8;

#define INLINE static inline __attribute__((always_inline))
/* The function objects hold pointers: mpy_ld.py relocates those in .data.rel.ro (where gcc -fpic puts
   them; clang for Xtensa would put them in .rodata, which mpy_ld does not relocate for that arch). */
#define FUN_OBJ __attribute__((section(".data.rel.ro.kernels")))
/* Functions called, not inlined: llc calls them through a literal, which mpy_ld.py links only when it names
   a symbol (a static function's would be .text plus an addend), so on Xtensa they are global. */
#if defined(__XTENSA__)
#define INTERNAL
#else
#define INTERNAL static
#endif
/* A function kept out of line, so that its loop gets the registers to itself. */
#define NOINLINE INTERNAL __attribute__((noinline))

/* The low 6, 15 and 16 bits of a: one `extui` on Xtensa (LLVM loads the mask from a literal and ands). */
#if defined(__XTENSA__)
INLINE i32 lo15(i32 a) {
    i32 r;
    __asm__("extui %0, %1, 0, 15" : "=r"(r) : "r"(a));
    return r;
}
INLINE i32 lo16(i32 a) {
    i32 r;
    __asm__("extui %0, %1, 0, 16" : "=r"(r) : "r"(a));
    return r;
}
INLINE i32 bits6(i32 a) {
    i32 r;
    __asm__("extui %0, %1, 0, 6" : "=r"(r) : "r"(a));
    return r;
}
#else
#define lo15(a) ((a) & 0x7FFF)
#define lo16(a) ((a) & 0xFFFF)
#define bits6(a) ((a) & 63)
#endif

/* round(a * 2^-s), half up; a << -s when s <= 0 (0 from 32 on: the exact value modulo 2^32, where C
   and the cores' shifters differ). |a| < 2^30. For s >= 1, (a + 2^(s-1)) >> s is ((a >> (s-1)) + 1) >> 1
   (floor division twice), which takes no variable left shift for the 2^(s-1). */
INLINE i32 rshr(i32 a, int s) {
    if (s <= 0) {
        return s <= -32 ? 0 : (i32)((uint32_t)a << -s);
    }
    if (s > 30) {  /* |a| < 2^30 <= 2^(s-1): the rounded value is 0 */
        return 0;
    }
    return ((a >> (s - 1)) + 1) >> 1;
}

/* rshr(a * m, s) exactly, |a| < 2^31, |m| <= 2^14: a splits into a >> 15 and a & 0x7FFF, so no product
   leaves int32 (the viper kernels' form). mulsh_hi is the case 16 <= s <= 45 (one test on the way in),
   mulsh_lo 1 <= s <= 15; each rounds as rshr does, by two floor shifts (the sums stay under 2^31). */
INLINE i32 mulsh_hi(i32 a, i32 m, int s) {
    i32 x = (a >> 15) * m + ((lo15(a) * m) >> 15);
    return ((x >> (s - 16)) + 1) >> 1;
}

INLINE i32 mulsh_lo(i32 a, i32 m, int s) {
    return (i32)((uint32_t)((a >> 15) * m) << (15 - s)) + ((((lo15(a) * m) >> (s - 1)) + 1) >> 1);
}

#define SHIFT_HI(s) ((uint32_t)((s) - 16) < 30u)
#define SHIFT_LO(s) ((uint32_t)((s) - 1) < 15u)

INLINE i32 mulsh(i32 a, i32 m, int s) {
    if (SHIFT_HI(s)) {
        return mulsh_hi(a, m, s);
    }
    if (s >= 46) {  /* |a * m| < 2^45 <= 2^(s-1) */
        return 0;
    }
    if (s >= 1) {
        return mulsh_lo(a, m, s);
    }
    return s <= -32 ? 0 : (i32)((uint32_t)(a * m) << -s);
}

/* The least shift that fits max |x[0..n)| in `bits` bits: the bit length of the values' OR (that of
   their largest) above `bits`. On Xtensa a zero-overhead loop of two values an iteration (abs, or) and
   `nsau` for the bit length. */
#if defined(__XTENSA__)
INTERNAL int block_shift(const i32 *x, int n, int bits) {
    uint32_t m, t0, t1;
    const i32 *p = x;
    __asm__ volatile("j 2f\n\t.balign 4\n2:\n\tmovi.n %[m], 0\n\tloopnez %[n], 3f\n\t"
        "l32i %[t0], %[p], 0\n\tl32i %[t1], %[p], 4\n\tabs %[t0], %[t0]\n\tabs %[t1], %[t1]\n\t"
        "addi %[p], %[p], 8\n\tor %[m], %[m], %[t0]\n\tor %[m], %[m], %[t1]\n3:\n"
        : [m] "=&r"(m), [p] "+r"(p), [t0] "=&r"(t0), [t1] "=&r"(t1) : [n] "r"(n >> 1) : "memory");
    if (n & 1) {
        i32 v = x[n - 1];
        m |= v < 0 ? 0u - (uint32_t)v : (uint32_t)v;
    }
    int z;
    __asm__("nsau %0, %1" : "=r"(z) : "r"(m));
    int sh = 32 - z - bits;
    return sh > 0 ? sh : 0;
}
#else
INTERNAL int block_shift(const i32 *x, int n, int bits) {
    uint32_t m = 0;
    for (int i = 0; i < n; i++) {
        i32 v = x[i];
        m |= v < 0 ? 0u - (uint32_t)v : (uint32_t)v;
    }
    int sh = 0;
    while ((m >> sh) >> bits) {
        sh++;
    }
    return sh;
}
#endif

/* intmath.expq: round(2^15 exp(-d / 2^12)) for d >= 0 from the 144-entry Q15 table. */
INLINE i32 expq(i32 d, const i32 *tab) {
    if (d >= 65536) {
        return 0;
    }
    i32 e = (tab[d >> 12] * tab[16 + bits6(d >> 6)] + 16384) >> 15;
    return (e * tab[80 + bits6(d)] + 16384) >> 15;
}

INTERNAL void *buffer_of(mp_obj_t o, int flags) {
    mp_buffer_info_t info;
    mp_get_buffer_raise(o, &info, flags);
    return info.buf;
}

#define RD(o) buffer_of((o), MP_BUFFER_READ)
#define RW(o) buffer_of((o), MP_BUFFER_RW)

/* -- matmul ------------------------------------------------------------------------------------ */

/* One weight row against a group of G positions whose x values are S words apart (column c of position
   g at x[c * S + g]); out[g * ostride] = the sums. Inlined with constant G and S (and U = 4: four columns
   per iteration, at immediate offsets, then the remainder; U = 5: the same for cols a positive multiple of
   4, no remainder), each weight byte is loaded once for the G multiply-accumulates. */
#define MAC(u) { \
        i32 v = w[u]; \
        const i32 *xx = x + (u) * S; \
        a0 += v * xx[0]; \
        if (G > 1) a1 += v * xx[1]; \
        if (G > 2) a2 += v * xx[2]; \
        if (G > 3) a3 += v * xx[3]; \
        if (G > 4) a4 += v * xx[4]; \
}

INLINE void group(const int8_t *w, const i32 *x, int cols, const int G, const int S, const int U,
    i32 *out, int ostride) {
    i32 a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0;
    const int8_t *wend = w + cols;
    if (U == 5 || (U == 4 && cols >= 4)) {
        const int8_t *end4 = w + (cols & ~3);
        do {
            MAC(0) MAC(1) MAC(2) MAC(3)
            w += 4;
            x += 4 * S;
        } while (w != end4);
    }
    if (U != 5) {  /* U = 5: four columns an iteration, cols a positive multiple of 4: no remainder */
        for (; w != wend; w += 1, x += S) {
            MAC(0)
        }
    }
    out[0] = a0;
    if (G > 1) out[ostride] = a1;
    if (G > 2) out[2 * ostride] = a2;
    if (G > 3) out[3 * ostride] = a3;
    if (G > 4) out[4 * ostride] = a4;
}

#if defined(__SSE2__)
#include <emmintrin.h>
/* x64 (the virtual boards) has SSE2 on every core: one position, eight columns a step. x holds int16 values
   in int32 words (quant clips them to 15 bits), so packing them to int16 is exact, and pmaddwd's pair sums
   are the scalar loop's products; the sums wrap as the scalar ones would (and fit int32). */
INTERNAL i32 dot_sse2(const int8_t *w, const i32 *x, int cols) {
    __m128i acc = _mm_setzero_si128();
    int c = 0;
    for (; c + 8 <= cols; c += 8) {
        __m128i x16 = _mm_packs_epi32(_mm_loadu_si128((const __m128i *)(x + c)),
            _mm_loadu_si128((const __m128i *)(x + c + 4)));
        __m128i wb = _mm_loadl_epi64((const __m128i *)(w + c));
        __m128i w16 = _mm_srai_epi16(_mm_unpacklo_epi8(wb, wb), 8);
        acc = _mm_add_epi32(acc, _mm_madd_epi16(w16, x16));
    }
    acc = _mm_add_epi32(acc, _mm_shuffle_epi32(acc, 0x4E));
    acc = _mm_add_epi32(acc, _mm_shuffle_epi32(acc, 0xB1));
    i32 a = _mm_cvtsi128_si32(acc);
    for (; c < cols; c++) {
        a += w[c] * x[c];
    }
    return a;
}

/* A group of G = 2..5 positions, x values S words apart: column c's G values are one load of four words (two
   for G = 2; G = 3 reads one word past its values: at the end, the slack after x that matmul's callers
   leave), times the weight as
   (w, 0) int16 pairs: pmaddwd gives x * w + (x's sign half) * 0 per word. Eight columns a step; a fifth
   position's products take a one-word load of their own. */
#define SSE_COL(v, i) { \
        const i32 *xc = x + (c + (i)) * S; \
        __m128i xv = G == 2 ? _mm_loadl_epi64((const __m128i *)xc) : _mm_loadu_si128((const __m128i *)xc); \
        acc = _mm_add_epi32(acc, _mm_madd_epi16(xv, _mm_shuffle_epi32(v, ((i) & 3) * 0x55))); \
        if (G == 5) acc4 = _mm_add_epi32(acc4, _mm_madd_epi16(_mm_cvtsi32_si128(xc[4]), \
            _mm_shuffle_epi32(v, ((i) & 3) * 0x55))); \
}

INLINE void group_sse2(const int8_t *w, const i32 *x, int cols, const int G, const int S, i32 *out, int ostride) {
    __m128i acc = _mm_setzero_si128(), acc4 = _mm_setzero_si128(), zero = _mm_setzero_si128();
    i32 lanes[4];
    int c = 0;
    for (; c + 8 <= cols; c += 8) {
        __m128i wb = _mm_loadl_epi64((const __m128i *)(w + c));
        __m128i w16 = _mm_srai_epi16(_mm_unpacklo_epi8(wb, wb), 8);
        __m128i lo = _mm_unpacklo_epi16(w16, zero), hi = _mm_unpackhi_epi16(w16, zero);
        SSE_COL(lo, 0) SSE_COL(lo, 1) SSE_COL(lo, 2) SSE_COL(lo, 3)
        SSE_COL(hi, 4) SSE_COL(hi, 5) SSE_COL(hi, 6) SSE_COL(hi, 7)
    }
    _mm_storeu_si128((__m128i *)lanes, acc);
    i32 a4 = _mm_cvtsi128_si32(acc4);
    for (; c < cols; c++) {
        for (int j = 0; j < 4 && j < G; j++) {
            lanes[j] += w[c] * x[c * S + j];
        }
        if (G == 5) a4 += w[c] * x[c * S + 4];
    }
    for (int j = 0; j < 4 && j < G; j++) {
        out[j * ostride] = lanes[j];
    }
    if (G == 5) out[4 * ostride] = a4;
}
#endif

#if defined(__XTENSA__)
/* group() for a pass of G <= 5 positions over rows of a positive multiple of 4 columns, as Xtensa code: a
   zero-overhead loop (LLVM emits none; its bottom test took two branches, the body being out of a
   conditional branch's reach) of four columns an iteration, in column pairs: both weights loaded and
   sign-extended, then each position's two products, loads and multiplies paired so that no result is used
   by the next instruction (the LX6/LX7 load-use and multiply-use stalls). The same products and wrapping
   sums as group(). The loop body's first instruction must not cross an instruction fetch boundary: the
   block starts 4-aligned (a jump over the padding), and the accumulators' zeroing instructions (2 or 3
   bytes each) put the body at 0 or 1 mod 4. */
#define XT_OFF(u, g, G) "4*((" #u ")*" #G "+" #g ")"
#define XT_W(u) "l8ui %[v0], %[w], " #u "\n\tl8ui %[v1], %[w], " #u "+1\n\t" \
    "sext %[v0], %[v0], 7\n\tsext %[v1], %[v1], 7\n\t"
#define XT_P(u, g, G) "l32i %[t0], %[x], " XT_OFF(u, g, G) "\n\tl32i %[t1], %[x], " XT_OFF(u + 1, g, G) "\n\t" \
    "mull %[t0], %[t0], %[v0]\n\tmull %[t1], %[t1], %[v1]\n\t" \
    "add %[a" #g "], %[a" #g "], %[t0]\n\tadd %[a" #g "], %[a" #g "], %[t1]\n\t"
#define XT_C1(u) XT_W(u) XT_P(u, 0, 1)
#define XT_C2(u) XT_W(u) XT_P(u, 0, 2) XT_P(u, 1, 2)
#define XT_C3(u) XT_W(u) XT_P(u, 0, 3) XT_P(u, 1, 3) XT_P(u, 2, 3)
#define XT_C4(u) XT_W(u) XT_P(u, 0, 4) XT_P(u, 1, 4) XT_P(u, 2, 4) XT_P(u, 3, 4)
#define XT_C5(u) XT_W(u) XT_P(u, 0, 5) XT_P(u, 1, 5) XT_P(u, 2, 5) XT_P(u, 3, 5) XT_P(u, 4, 5)
#define XT_LOOP(G, zero) "j 2f\n\t.balign 4\n2:\n\t" zero "loopnez %[n], 3f\n\t" \
    XT_C##G(0) XT_C##G(2) "addi %[w], %[w], 4\n\taddi %[x], %[x], 16*" #G "\n3:\n"
#define XT_OUT [w] "+r"(w), [x] "+r"(x), [v0] "=&r"(v0), [v1] "=&r"(v1), [t0] "=&r"(t0), [t1] "=&r"(t1)

INLINE void group_xt(const int8_t *w, const i32 *x, int cols, const int G, i32 *out, int ostride) {
    i32 a0, a1, a2, a3, a4, v0, v1, t0, t1;
    int n = cols >> 2;
    switch (G) {
        case 1:
            __asm__ volatile(XT_LOOP(1, "movi.n %[a0], 0\n\t")
                : [a0] "=&r"(a0), XT_OUT : [n] "r"(n) : "memory");
            out[0] = a0;
            break;
        case 2:
            __asm__ volatile(XT_LOOP(2, "movi %[a0], 0\n\tmovi.n %[a1], 0\n\t")
                : [a0] "=&r"(a0), [a1] "=&r"(a1), XT_OUT : [n] "r"(n) : "memory");
            out[0] = a0;
            out[ostride] = a1;
            break;
        case 3:
            __asm__ volatile(XT_LOOP(3, "movi.n %[a0], 0\n\tmovi.n %[a1], 0\n\tmovi.n %[a2], 0\n\t")
                : [a0] "=&r"(a0), [a1] "=&r"(a1), [a2] "=&r"(a2), XT_OUT : [n] "r"(n) : "memory");
            out[0] = a0;
            out[ostride] = a1;
            out[2 * ostride] = a2;
            break;
        case 4:
            __asm__ volatile(XT_LOOP(4, "movi %[a0], 0\n\tmovi.n %[a1], 0\n\tmovi.n %[a2], 0\n\tmovi.n %[a3], 0\n\t")
                : [a0] "=&r"(a0), [a1] "=&r"(a1), [a2] "=&r"(a2), [a3] "=&r"(a3), XT_OUT : [n] "r"(n) : "memory");
            out[0] = a0;
            out[ostride] = a1;
            out[2 * ostride] = a2;
            out[3 * ostride] = a3;
            break;
        default:
            __asm__ volatile(XT_LOOP(5, "movi.n %[a0], 0\n\tmovi.n %[a1], 0\n\tmovi.n %[a2], 0\n\tmovi.n %[a3], 0\n\t"
                                        "movi.n %[a4], 0\n\t")
                : [a0] "=&r"(a0), [a1] "=&r"(a1), [a2] "=&r"(a2), [a3] "=&r"(a3), [a4] "=&r"(a4), XT_OUT
                : [n] "r"(n) : "memory");
            out[0] = a0;
            out[ostride] = a1;
            out[2 * ostride] = a2;
            out[3 * ostride] = a3;
            out[4 * ostride] = a4;
    }
}
#endif

#if defined(__XTENSA__)
/* The matmul on the ESP32/S3's MAC16 unit (both cores have the option; QEMU's de233_fpu executes it): mula
   multiplies two 16-bit halves into the 40-bit accumulator ACC, and its .ldinc forms load the next operand word
   in the same instruction. A weight word's four int8 values are taken as offset values, u = w + 128 (xor
   0x80808080), two to a word in 16-bit halves: e = (u0, u2) = u & 0x00FF00FF and o = (u1, u3) = (u >> 8) &
   0x00FF00FF; x is packed to match, (x0, x2) and (x1, x3) (pack_x: int16 values, as quant leaves them), so a sum
   is ACC - 128 * sum(x): the scalar loop's products and int32 wrapping (ACC's low word is the sum modulo 2^32).
   One position (mac16_row1): the weight word expanded in registers, four mula a word (10 instructions per 4 MACs).
   More positions (mac16_expand, mac16_dot): the row expanded once into a buffer, then each position's pass is
   mula.dd.*.ldinc alone, the weight and x words alternating: one instruction a MAC. ACC and the MR registers belong to one asm
   statement at a time (nothing else here uses them; ESP-IDF's interrupt entry saves them with the other
   non-coprocessor state, xthal_save_extra_nw). Rows of up to MAC16_COLS columns, a multiple of 4, 4-aligned;
   other rows take group_xt. Each loop body starts 0 or 1 mod 4 (group_xt says why). */
#define MAC16_COLS 192
#define MAC16_G 5  /* positions per packing of x */
#define MAC16_WORDS (MAC16_COLS / 2 + 1)  /* a packed row: two words per 4 columns, and the word the last ldinc
   loads (never multiplied) */

/* The weight word at w as its offset halves (above), w stepped past it: e = (u0, u2), t = (u1, u3). */
#define MAC16_WORD "l32i %[t], %[w], 0\n\taddi %[w], %[w], 4\n\txor %[t], %[t], %[f]\n\t" \
    "and %[e], %[t], %[m]\n\tsrli %[t], %[t], 8\n\tand %[t], %[t], %[m]\n\t"

/* Position values S words apart, cols a multiple of 4, packed for mula (above) into xp; their sum. */
INTERNAL i32 pack_x(const i32 *x, int cols, int S, i32 *xp) {
    i32 sum = 0;
    for (int c = 0; c < cols; c += 4, x += 4 * S, xp += 2) {
        i32 x0 = x[0], x1 = x[S], x2 = x[2 * S], x3 = x[3 * S];
        sum += x0 + x1 + x2 + x3;
        xp[0] = (i32)((uint32_t)x2 << 16) | lo16(x0);
        xp[1] = (i32)((uint32_t)x3 << 16) | lo16(x1);
    }
    return sum;
}

/* One weight row (n4 words) against one packed position: the offset sum, ACC's low word. */
INTERNAL i32 mac16_row1(const int8_t *w, const i32 *xp, int n4) {
    i32 acc, t, e, zero = 0, m = 0x00FF00FF, f = (i32)0x80808080;
    const i32 *px = xp - 1;
    __asm__ volatile("wsr %[z], acclo\n\twsr %[z], acchi\n\tj 2f\n\t.balign 4\n2:\n\tldinc m0, %[px]\n\tnop.n\n\t"
        "loopnez %[n], 3f\n\t" MAC16_WORD
        "mula.da.ll.ldinc m1, %[px], m0, %[e]\n\tmula.da.hh m0, %[e]\n\t"
        "mula.da.ll.ldinc m0, %[px], m1, %[t]\n\tmula.da.hh m1, %[t]\n3:\n\trsr %[acc], acclo\n"
        : [acc] "=r"(acc), [t] "=&r"(t), [e] "=&r"(e), [w] "+r"(w), [px] "+r"(px)
        : [n] "r"(n4), [z] "r"(zero), [m] "r"(m), [f] "r"(f) : "memory");
    return acc;
}

/* A weight row (n4 words) expanded to its offset halves, e and o of each word in turn, into ws. */
INTERNAL void mac16_expand(const int8_t *w, i32 *ws, int n4) {
    i32 t, e, m = 0x00FF00FF, f = (i32)0x80808080;
    __asm__ volatile("j 2f\n\t.balign 4\n2:\n\tnop.n\n\tloopnez %[n], 3f\n\t" MAC16_WORD
        "s32i %[e], %[d], 0\n\ts32i %[t], %[d], 4\n\taddi %[d], %[d], 8\n3:\n"
        : [t] "=&r"(t), [e] "=&r"(e), [w] "+r"(w), [d] "+r"(ws)
        : [n] "r"(n4), [m] "r"(m), [f] "r"(f) : "memory");
}

/* An expanded row (mac16_expand) against one packed position: the offset sum. */
INTERNAL i32 mac16_dot(const i32 *ws, const i32 *xp, int n4) {
    i32 acc, zero = 0;
    const i32 *pw = ws - 1, *px = xp - 1;
    __asm__ volatile("wsr %[z], acclo\n\twsr %[z], acchi\n\tj 2f\n\t.balign 4\n2:\n\tldinc m0, %[pw]\n\t"
        "ldinc m2, %[px]\n\tloopnez %[n], 3f\n\t"
        "mula.dd.ll.ldinc m1, %[pw], m0, m2\n\tmula.dd.hh.ldinc m3, %[px], m0, m2\n\t"
        "mula.dd.ll.ldinc m0, %[pw], m1, m3\n\tmula.dd.hh.ldinc m2, %[px], m1, m3\n3:\n\trsr %[acc], acclo\n"
        : [acc] "=r"(acc), [pw] "+r"(pw), [px] "+r"(px) : [n] "r"(n4), [z] "r"(zero) : "memory");
    return acc;
}

/* k_matmul on MAC16 (above): positions MAC16_G at a time, x packed once per group for every row. */
INTERNAL void mac16_matmul(const int8_t *w, const i32 *x, int rows, int cols, int k, i32 *out) {
    i32 xp[MAC16_G * MAC16_WORDS], ws[MAC16_WORDS], bias[MAC16_G];
    int n4 = cols >> 2;
    for (int j = 0; j < k; j += MAC16_G) {
        int g = k - j < MAC16_G ? k - j : MAC16_G;
        for (int i = 0; i < g; i++) {
            bias[i] = (i32)((uint32_t)pack_x(x + j + i, cols, k, xp + i * MAC16_WORDS) << 7);
        }
        const int8_t *wr = w;
        i32 *o = out + j * rows;
        if (g == 1) {
            for (int r = 0; r < rows; r++, wr += cols) {
                o[r] = mac16_row1(wr, xp, n4) - bias[0];
            }
            continue;
        }
        for (int r = 0; r < rows; r++, wr += cols) {
            mac16_expand(wr, ws, n4);
            for (int i = 0; i < g; i++) {
                o[i * rows + r] = mac16_dot(ws, xp + i * MAC16_WORDS, n4) - bias[i];
            }
        }
    }
}
#endif

/* A group of g positions of a pass of k > 5 (x values k words apart). */
INTERNAL void group_strided(const int8_t *w, const i32 *x, int cols, int g, int k, i32 *out, int ostride) {
    switch (g) {
        case 1: group(w, x, cols, 1, k, 1, out, ostride); break;
        #if defined(__SSE2__)
        case 2: group_sse2(w, x, cols, 2, k, out, ostride); break;
        case 3: group_sse2(w, x, cols, 3, k, out, ostride); break;
        case 4: group_sse2(w, x, cols, 4, k, out, ostride); break;
        default: group_sse2(w, x, cols, 5, k, out, ostride); break;
        #else
        case 2: group(w, x, cols, 2, k, 1, out, ostride); break;
        case 3: group(w, x, cols, 3, k, 1, out, ostride); break;
        case 4: group(w, x, cols, 4, k, 1, out, ostride); break;
        default: group(w, x, cols, 5, k, 1, out, ostride); break;
        #endif
    }
}

/* out[j*rows + r] = sum_c int8 w[r*cols + c] * x[c*k + j], r < rows, j < k. Weights are loaded once per
   group of up to 5 positions; a pass of k <= 5 is one group with its stride known at compile time. Each
   group size has a row loop of its own (the switch outside it), so a row costs its group's setup and
   stores only: one loop over every case kept the other cases' values on the stack across rows. */
#if defined(__SSE2__)
#define ROWS(G) for (; rows > 0; rows--, w += cols, out++) { \
        if (G == 1) out[0] = dot_sse2(w, x, cols); else group_sse2(w, x, cols, G, G, out, nrows); }
#else
/* The models' rows are multiples of 4 columns: their loop has no remainder to set up or test per row. */
#if defined(__XTENSA__)
#define GROUP4(G) group_xt(w, x, cols, G, out, nrows)
#else
#define GROUP4(G) group(w, x, cols, G, G, 5, out, nrows)
#endif
#define ROWS(G) if ((cols & 3) || cols == 0) { \
        for (; rows > 0; rows--, w += cols, out++) group(w, x, cols, G, G, 4, out, nrows); \
    } else if (rows > 0) { \
        do { GROUP4(G); w += cols; out++; } while (--rows); \
    }
#endif
INTERNAL void k_matmul(const int8_t *w, const i32 *x, int rows, int cols, int k, i32 *out) {
    const int nrows = rows;
#if defined(__XTENSA__)
    if (cols > 0 && (cols & 3) == 0 && cols <= MAC16_COLS && ((uintptr_t)w & 3) == 0) {
        mac16_matmul(w, x, rows, cols, k, out);
        return;
    }
#endif
    switch (k) {
        case 1: ROWS(1) break;
        case 2: ROWS(2) break;
        case 3: ROWS(3) break;
        case 4: ROWS(4) break;
        case 5: ROWS(5) break;
        default:
            for (; rows > 0; rows--, w += cols, out++) {
                for (int j = 0; j < k; j += 5) {
                    group_strided(w, x + j, cols, k - j < 5 ? k - j : 5, k, out + j * nrows, nrows);
                }
            }
    }
}

/* -- the other kernels (firmware/kernels.py documents each and its p) ----------------------------- */

/* Each row's shift is fixed, so its rounding constant is too: rshr(v, sh) = (v + r) >> sh,
   the clamp a min and a max, the store through a pointer that steps
   by stride; one loop for byte and one for word rows (bits >= 2, the engine's 7 and 15: sh <= 30). */
#if defined(__XTENSA__)
/* A row as a zero-overhead loop: the shift set once (ssr), then load, round, clamp (min, max), store (a byte
   as v - 128: the low 8 bits of v + 128, addi's range ends at 127). The
   2-byte move and the ssr put the body 4-aligned (a move first: after the padding, an instruction whose
   first byte is 0, as ssr's, is decoded by llvm-objdump with the padding byte). */
#define XT_QUANT(store, step) { \
        i32 v, nl = -lim, st = (step); \
        __asm__ volatile("j 2f\n\t.balign 4\n2:\n\tmov.n %[v], %[r]\n\tssr %[sh]\n\tloopnez %[n], 3f\n\t" \
            "l32i %[v], %[s], 0\n\taddi %[s], %[s], 4\n\tadd %[v], %[v], %[r]\n\tsra %[v], %[v]\n\t" \
            "min %[v], %[v], %[lim]\n\tmax %[v], %[v], %[nl]\n\t" store "add %[d], %[d], %[st]\n3:\n" \
            : [v] "=&r"(v), [s] "+r"(s), [d] "+r"(d) \
            : [sh] "r"(sh), [r] "r"(r), [n] "r"(n), [lim] "r"(lim), [nl] "r"(nl), [st] "r"(st) \
            : "memory", "sar"); \
    }
#endif

INTERNAL void k_quant(void *dst, const i32 *src, i32 *p) {
    int n = p[1], bits = p[3], stride = p[4], rows = p[5];
    i32 lim = (1 << bits) - 1;
    for (int j = 0; j < rows; j++) {
        const i32 *s = src + p[0] + j * n, *end = s + n;
        int o = p[2] + j * p[6];
        int sh = block_shift(s, n, bits);
        i32 r = sh ? 1 << (sh - 1) : 0;
        if (bits <= 7) {
            u8 *d = (u8 *)dst + o;
#if defined(__XTENSA__)
            XT_QUANT("addi %[v], %[v], -128\n\ts8i %[v], %[d], 0\n\t", stride);
            (void)end;
#else
            for (; s != end; s++, d += stride) {
                i32 v = (*s + r) >> sh;
                v = v > lim ? lim : v;
                v = v < -lim ? -lim : v;
                *d = (u8)(v + 128);
            }
#endif
            *d = (u8)sh;
        } else {
            i32 *d = (i32 *)dst + o;
#if defined(__XTENSA__)
            XT_QUANT("s32i %[v], %[d], 0\n\t", 4 * stride);
            (void)end;
#else
            for (; s != end; s++, d += stride) {
                i32 v = (*s + r) >> sh;
                v = v > lim ? lim : v;
                *d = v < -lim ? -lim : v;
            }
#endif
        }
        p[8 + j] = sh;
    }
}

/* The `add` test out of the loop; the row scale's m and shift are one word: m | s << 16. */
INTERNAL void k_requant(i32 *dst, const i32 *acc, const i32 *ms, const i32 *p) {
    int n = p[0], k = p[1], stride = p[3], add = p[5];
    ms += p[2];
    for (int j = 0; j < k; j++) {
        int sh = p[8 + j];
        i32 *d = dst + j * stride + p[4];
        const i32 *a = acc + j * n, *end = a + n;
        const i32 *m = ms, *end2 = a + (n & ~1);
        if (add) {
            for (; a != end2; a += 2, m += 2, d += 2) {  /* two rows a step: the pointers step once for both */
                i32 v0 = m[0], v1 = m[1];
                d[0] += mulsh(a[0], lo16(v0), (v0 >> 16) - sh);
                d[1] += mulsh(a[1], lo16(v1), (v1 >> 16) - sh);
            }
        } else {
            for (; a != end2; a += 2, m += 2, d += 2) {
                i32 v0 = m[0], v1 = m[1];
                d[0] = mulsh(a[0], lo16(v0), (v0 >> 16) - sh);
                d[1] = mulsh(a[1], lo16(v1), (v1 >> 16) - sh);
            }
        }
        if (a != end) {
            i32 y = mulsh(*a, lo16(*m), (*m >> 16) - sh);
            *d = add ? *d + y : y;
        }
    }
}

INTERNAL void k_embed(i32 *dst, const int8_t *w, const i32 *ms, const i32 *p) {
    int dim = p[0], t = p[1];
    i32 m = ms[t] & 0xFFFF;
    int s = (ms[t] >> 16) - 16;
    w += t * dim;
    dst += p[2];
    if (SHIFT_HI(s)) {  /* the shift is the call's: its case is chosen once */
        for (int i = 0; i < dim; i++) {
            dst[i] = mulsh_hi(w[i], m, s);
        }
    } else {
        for (int i = 0; i < dim; i++) {
            dst[i] = mulsh(w[i], m, s);
        }
    }
}

/* dst = mulsh(mulsh(src, wn, qw), g, s) over a row, the case of each shift (the call's qw, the row's s)
   chosen once for the row: the models' norm shifts are 1..15 and the row's s either case. */
#define NORM_ROW(f1, f2) for (int i = 0; i < dim; i++) dst[i] = f2(f1(src[i], wn[i], qw), g, s)

INTERNAL void k_rmsnorm(i32 *dst, const i32 *src, const i32 *wn, const i32 *p) {
    int dim = p[0], k = p[1], qw = p[2];
    for (int j = 0; j < k; j++, src += dim, dst += dim) {
        int sh = block_shift(src, dim, 10);
        i32 ss = 0;
        for (int i = 0; i < dim; i++) {
            i32 v = src[i] >> sh;
            ss += v * v;
        }
        i32 t = ss / dim + (2 * sh > 31 ? 0 : p[3] >> (2 * sh));
        if (t <= 0) {
            for (int i = 0; i < dim; i++) {
                dst[i] = 0;
            }
            continue;
        }
        int n = 0;
        while (t < (1 << 28)) {
            t <<= 2;
            n++;
        }
        i32 q = 32768;  /* isqrt(t), Newton from above: t < 2^30 */
        for (;;) {
            i32 y = (q + t / q) >> 1;
            if (y >= q) {
                break;
            }
            q = y;
        }
        i32 g = (1 << 28) / q;
        int s = 12 + sh - n;
        if (SHIFT_LO(qw) && SHIFT_HI(s)) {
            NORM_ROW(mulsh_lo, mulsh_hi);
        } else if (SHIFT_LO(qw) && SHIFT_LO(s)) {
            NORM_ROW(mulsh_lo, mulsh_lo);
        } else {
            NORM_ROW(mulsh, mulsh);
        }
    }
}

INTERNAL void k_rope(i32 *b, const int16_t *cs, const i32 *p) {
    int k = p[0], heads = p[1], half = p[2];
    for (int j = 0; j < k; j++) {
        const int16_t *lo = cs + 2 * ((p[3] + j) & 31) * half;
        const int16_t *hi = cs + 64 * half + 2 * ((p[3] + j) >> 5) * half;
        for (int i = 0; i < half; i++) {
            i32 c1 = lo[2 * i], s1 = lo[2 * i + 1], c2 = hi[2 * i], s2 = hi[2 * i + 1];
            i32 c = (c1 * c2 - s1 * s2 + 8192) >> 14;
            i32 s = (s1 * c2 + c1 * s2 + 8192) >> 14;
            for (int h = 0; h < heads; h++) {
                i32 *o = b + (j * heads + h) * 2 * half + 2 * i;
                i32 x = o[0], y = o[1];
                o[0] = mulsh(x, c, 14) - mulsh(y, s, 14);
                o[1] = mulsh(x, s, 14) + mulsh(y, c, 14);
            }
        }
    }
}

/* The models' head size of 8: sc[t] = q.k of the query's 15-bit values qq against cached row t (int8 + 128
   bytes, rows stride bytes apart from row), and out[i] = sum_t w[t] * v_t[i] over the value rows; the query
   values (or the outputs) stay in registers across the rows. The sums are the same modulo 2^32. */
#if defined(__XTENSA__)
/* A zero-overhead loop of one row an iteration, the eight values in pairs (two loads, two multiplies,
   then their adds: no result used by the next instruction). Fourteen registers: all a windowed function
   has beside a0 and a1 (the count arrives in one of the temporaries). Each zero-overhead loop here (and in
   block_shift, att_scale_hi, att_exp) starts 4-aligned, jumped to, with a 2-byte instruction before the
   3-byte loopnez, so that the body's first instruction does not cross a fetch boundary. */
#define XT_QK(i, j) "l8ui %[t0], %[r], " #i "\n\tl8ui %[t1], %[r], " #j "\n\t" \
    "mull %[t0], %[t0], %[q" #i "]\n\tmull %[t1], %[t1], %[q" #j "]\n\t" \
    "add %[a], %[a], %[t0]\n\tadd %[a], %[a], %[t1]\n\t"
INTERNAL void qk8(const i32 *qq, const u8 *row, int stride, int n, i32 *sc) {
    i32 q0 = qq[0], q1 = qq[1], q2 = qq[2], q3 = qq[3], q4 = qq[4], q5 = qq[5], q6 = qq[6], q7 = qq[7];
    i32 a, t0, t1 = n;
    __asm__ volatile("j 2f\n\t.balign 4\n2:\n\tmovi.n %[a], 0\n\tloopnez %[t1], 3f\n\t"
        "l8ui %[t0], %[r], 0\n\tl8ui %[t1], %[r], 1\n\tmull %[a], %[t0], %[q0]\n\tmull %[t1], %[t1], %[q1]\n\t"
        "add %[a], %[a], %[t1]\n\t"
        XT_QK(2, 3) XT_QK(4, 5) XT_QK(6, 7)
        "add %[r], %[r], %[st]\n\ts32i %[a], %[sc], 0\n\taddi %[sc], %[sc], 4\n3:\n"
        : [r] "+r"(row), [sc] "+r"(sc), [a] "=&r"(a), [t0] "=&r"(t0), [t1] "+r"(t1)
        : [q0] "r"(q0), [q1] "r"(q1), [q2] "r"(q2), [q3] "r"(q3), [q4] "r"(q4), [q5] "r"(q5), [q6] "r"(q6),
          [q7] "r"(q7), [st] "r"(stride)
        : "memory");
}

#define XT_PV(i, j) "l8ui %[t0], %[r], " #i "\n\tl8ui %[t1], %[r], " #j "\n\t" \
    "mull %[t0], %[t0], %[a]\n\tmull %[t1], %[t1], %[a]\n\t" \
    "add %[o" #i "], %[o" #i "], %[t0]\n\tadd %[o" #j "], %[o" #j "], %[t1]\n\t"
INTERNAL void pv8(const i32 *w, const u8 *row, int stride, int n, i32 *out) {
    i32 o0 = 0, o1 = 0, o2 = 0, o3 = 0, o4 = 0, o5 = 0, o6 = 0, o7 = 0, a, t0, t1 = n;
    __asm__ volatile("j 2f\n\t.balign 4\n2:\n\tmovi.n %[a], 0\n\tloopnez %[t1], 3f\n\t"
        "l32i %[a], %[w], 0\n\taddi %[w], %[w], 4\n\t"
        XT_PV(0, 1) XT_PV(2, 3) XT_PV(4, 5) XT_PV(6, 7)
        "add %[r], %[r], %[st]\n3:\n"
        : [r] "+r"(row), [w] "+r"(w), [a] "=&r"(a), [t0] "=&r"(t0), [t1] "+r"(t1), [o0] "+r"(o0), [o1] "+r"(o1),
          [o2] "+r"(o2), [o3] "+r"(o3), [o4] "+r"(o4), [o5] "+r"(o5), [o6] "+r"(o6), [o7] "+r"(o7)
        : [st] "r"(stride)
        : "memory");
    out[0] = o0, out[1] = o1, out[2] = o2, out[3] = o3, out[4] = o4, out[5] = o5, out[6] = o6, out[7] = o7;
}
#else
INTERNAL void qk8(const i32 *qq, const u8 *row, int stride, int n, i32 *sc) {
    i32 q0 = qq[0], q1 = qq[1], q2 = qq[2], q3 = qq[3], q4 = qq[4], q5 = qq[5], q6 = qq[6], q7 = qq[7];
    for (int t = 0; t < n; t++, row += stride) {
        sc[t] = q0 * row[0] + q1 * row[1] + q2 * row[2] + q3 * row[3] + q4 * row[4] + q5 * row[5] +
            q6 * row[6] + q7 * row[7];
    }
}

INTERNAL void pv8(const i32 *w, const u8 *row, int stride, int n, i32 *out) {
    i32 o0 = 0, o1 = 0, o2 = 0, o3 = 0, o4 = 0, o5 = 0, o6 = 0, o7 = 0;
    for (int t = 0; t < n; t++, row += stride) {
        i32 a = w[t];
        o0 += a * row[0], o1 += a * row[1], o2 += a * row[2], o3 += a * row[3];
        o4 += a * row[4], o5 += a * row[5], o6 += a * row[6], o7 += a * row[7];
    }
    out[0] = o0, out[1] = o1, out[2] = o2, out[3] = o3, out[4] = o4, out[5] = o5, out[6] = o6, out[7] = o7;
}
#endif

/* attend's passes over a head's n scores, each a function of its own (so that its loop keeps its values
   in registers); rs: the first cached row's shift byte, the next stride bytes on. */

/* sc[t] = mulsh(sc[t] - base, isq, s0 - row t's shift); returns their max. */
NOINLINE i32 att_scale(i32 *sc, int n, const u8 *rs, int stride, i32 base, i32 isq, int s0) {
    i32 mx = -2147483647 - 1;
    for (i32 *end = sc + n; sc != end; sc++, rs += stride) {
        i32 a = mulsh(*sc - base, isq, s0 - *rs);
        *sc = a;
        mx = a > mx ? a : mx;
    }
    return mx;
}

/* att_scale when every row's shift is of mulsh's common case (16 <= s0 - shift <= 45, known from the
   rows' least and largest shifts): no test per score; on Xtensa a zero-overhead loop. */
#if defined(__XTENSA__)
NOINLINE i32 att_scale_hi(i32 *sc, int n, const u8 *rs, int stride, i32 base, i32 isq, int s0) {
    i32 mx = -2147483647 - 1, a, hi, lo, t = n, c = s0 - 16;
    __asm__ volatile("j 2f\n\t.balign 4\n2:\n\tmovi.n %[a], 0\n\tloopnez %[t], 3f\n\t"
        "l32i %[a], %[sc], 0\n\tl8ui %[t], %[rs], 0\n\tsub %[a], %[a], %[b]\n\tadd %[rs], %[rs], %[st]\n\t"
        "srai %[hi], %[a], 15\n\textui %[lo], %[a], 0, 15\n\tmull %[hi], %[hi], %[m]\n\t"
        "mull %[lo], %[lo], %[m]\n\tsub %[t], %[c], %[t]\n\tsrai %[lo], %[lo], 15\n\tssr %[t]\n\t"
        "add %[hi], %[hi], %[lo]\n\tsra %[hi], %[hi]\n\taddi %[hi], %[hi], 1\n\tsrai %[hi], %[hi], 1\n\t"
        "s32i %[hi], %[sc], 0\n\tmax %[mx], %[mx], %[hi]\n\taddi %[sc], %[sc], 4\n3:\n"
        : [mx] "+r"(mx), [a] "=&r"(a), [hi] "=&r"(hi), [lo] "=&r"(lo), [t] "+r"(t), [sc] "+r"(sc), [rs] "+r"(rs)
        : [st] "r"(stride), [b] "r"(base), [m] "r"(isq), [c] "r"(c)
        : "memory", "sar");
    return mx;
}
#else
NOINLINE i32 att_scale_hi(i32 *sc, int n, const u8 *rs, int stride, i32 base, i32 isq, int s0) {
    i32 mx = -2147483647 - 1;
    for (i32 *end = sc + n; sc != end; sc++, rs += stride) {
        i32 a = mulsh_hi(*sc - base, isq, s0 - *rs);
        *sc = a;
        mx = a > mx ? a : mx;
    }
    return mx;
}
#endif

/* sc[t] = expq(mx - sc[t]); returns their sum, and in *vm the value rows' largest shift. */
#if defined(__XTENSA__)
/* As Xtensa code: a zero-overhead loop whose rare case (d > 65535: 0) is out of line after the loop, and
   jumps back into it; expq's table indices by extui, its rounding constant in a register. */
NOINLINE i32 att_exp(i32 *sc, int n, const u8 *rs, int stride, i32 mx, const i32 *tab, int *vm) {
    i32 z, m = 0, d, e, t = n, lim = 65535, half = 16384;
    __asm__ volatile("j 2f\n\t.balign 4\n2:\n\tmovi.n %[z], 0\n\tloopnez %[t], 3f\n\t"
        "l32i %[d], %[sc], 0\n\tl8ui %[t], %[rs], 0\n\tsub %[d], %[mx], %[d]\n\tadd %[rs], %[rs], %[st]\n\t"
        "maxu %[m], %[m], %[t]\n\tblt %[lim], %[d], 5f\n\t"
        "srai %[e], %[d], 12\n\taddx4 %[e], %[e], %[tab]\n\tl32i %[e], %[e], 0\n\t"
        "extui %[t], %[d], 6, 6\n\taddx4 %[t], %[t], %[tab]\n\tl32i %[t], %[t], 64\n\t"
        "mull %[e], %[e], %[t]\n\textui %[t], %[d], 0, 6\n\tadd %[e], %[e], %[h]\n\t"
        "addx4 %[t], %[t], %[tab]\n\tsrai %[e], %[e], 15\n\tl32i %[t], %[t], 320\n\t"
        "mull %[e], %[e], %[t]\n\tadd %[e], %[e], %[h]\n\tsrai %[e], %[e], 15\n"
        "6:\n\ts32i %[e], %[sc], 0\n\tadd %[z], %[z], %[e]\n\taddi %[sc], %[sc], 4\n"
        "3:\n\tj 4f\n5:\n\tmovi %[e], 0\n\tj 6b\n4:\n"
        : [z] "=&r"(z), [m] "+r"(m), [d] "=&r"(d), [e] "=&r"(e), [t] "+r"(t), [sc] "+r"(sc), [rs] "+r"(rs)
        : [st] "r"(stride), [mx] "r"(mx), [tab] "r"(tab), [lim] "r"(lim), [h] "r"(half)
        : "memory");
    *vm = m;
    return z;
}
#else
NOINLINE i32 att_exp(i32 *sc, int n, const u8 *rs, int stride, i32 mx, const i32 *tab, int *vm) {
    i32 z = 0;
    int m = 0;
    for (i32 *end = sc + n; sc != end; sc++, rs += stride) {
        i32 e = expq(mx - *sc, tab);
        *sc = e;
        z += e;
        m = *rs > m ? *rs : m;
    }
    *vm = m;
    return z;
}
#endif

/* sc[t] = rshr(sc[t] * rz, 8 + vm - row t's shift), 0 from a shift of 31 on (8 .. 8 + vm: vm is the rows'
   largest, so no row needs the test when vm <= 22); returns their sum. */
NOINLINE i32 att_weights(i32 *sc, int n, const u8 *rs, int stride, int vm, i32 rz) {
    i32 qs = 0;
    int c = 7 + vm;
    i32 *end = sc + n;
    if (vm <= 22) {
        for (; sc != end; sc++, rs += stride) {
            i32 a = (((*sc * rz) >> (c - *rs)) + 1) >> 1;
            *sc = a;
            qs += a;
        }
    } else {
        for (; sc != end; sc++, rs += stride) {
            int s = c - *rs;
            i32 a = s <= 29 ? ((((*sc * rz) >> s) + 1) >> 1) : 0;
            *sc = a;
            qs += a;
        }
    }
    return qs;
}

/* p = (n, hd, stride, kb, vb, heads, group, isq, k, qq, tab); cache bytes are int8 + 128, each row's
   shift in its last byte. Per query and head, over its n cached rows, one pass each (few live values, so
   few spills): the raw q.k, then their scaling (less the bytes' +128, mulsh by isq, the row's shift) and the max, then expq, z
   and the value rows' largest shift, then the weights (2^30 // z, the row's rounding), then p.v. */
INTERNAL void k_attend(i32 *q, const u8 *kv, i32 *sc, const i32 *p) {
    int hd = p[1], stride = p[2], heads = p[5], grp = p[6];
    i32 isq = p[7];
    i32 *qq = sc + p[9];
    const i32 *tab = sc + p[10];
    i32 *qo = q;
    int kmin = 255, kmax = 0;  /* the key rows' least and largest shifts, over the rows the last query sees */
    const u8 *ks = kv + p[3] + stride - 1;
    for (int t = 0; t < p[0] + p[8] - 1; t++, ks += stride) {
        kmin = *ks < kmin ? *ks : kmin;
        kmax = *ks > kmax ? *ks : kmax;
    }
    for (int j = 0; j < p[8]; j++) {
        int n = p[0] + j;  /* query j sees positions 0 .. p[0] + j - 1 */
        int kh = 0, gi = 0;  /* (h / grp) * hd, counted */
        for (int h = 0; h < heads; h++, qo += hd) {
            int sh = block_shift(qo, hd, 15);
            i32 r = sh ? 1 << (sh - 1) : 0;
            i32 qs = 0;
            for (int i = 0; i < hd; i++) {
                i32 v = (qo[i] + r) >> sh;
                v = v > 32767 ? 32767 : v;
                v = v < -32767 ? -32767 : v;
                qq[i] = v;
                qs += v;
            }
            i32 base = qs << 7;
            const u8 *row = kv + p[3] + kh;
            if (hd == 8) {
                qk8(qq, row, stride, n, sc);
            } else {
                for (int t = 0; t < n; t++, row += stride) {
                    i32 a = 0;
                    for (int i = 0; i < hd; i++) {
                        a += qq[i] * row[i];
                    }
                    sc[t] = a;
                }
            }
            int s0 = 34 - sh;
            i32 mx = s0 - kmax >= 16 && s0 - kmin <= 45 ? att_scale_hi(sc, n, kv + p[3] + stride - 1, stride, base, isq, s0)
                : att_scale(sc, n, kv + p[3] + stride - 1, stride, base, isq, s0);
            int vm;
            i32 z = att_exp(sc, n, kv + p[4] + stride - 1, stride, mx, tab, &vm);
            qs = att_weights(sc, n, kv + p[4] + stride - 1, stride, vm, (1 << 30) / z);
            row = kv + p[4] + kh;
            if (hd == 8) {
                pv8(sc, row, stride, n, qo);
            } else {
                for (int i = 0; i < hd; i++) {
                    qo[i] = 0;
                }
                for (int t = 0; t < n; t++, row += stride) {
                    i32 a = sc[t];
                    if (a) {
                        for (int i = 0; i < hd; i++) {
                            qo[i] += a * row[i];
                        }
                    }
                }
            }
            i32 base_v = qs << 7;
            if (vm <= 21) {  /* the head's shift 22 - vm is 1..22: rshr's case, chosen once */
                int s1 = 21 - vm;
                for (int i = 0; i < hd; i++) {
                    qo[i] = (((qo[i] - base_v) >> s1) + 1) >> 1;
                }
            } else {
                for (int i = 0; i < hd; i++) {
                    qo[i] = rshr(qo[i] - base_v, 22 - vm);
                }
            }
            if (++gi == grp) {
                gi = 0;
                kh += hd;
            }
        }
    }
}

/* One row: h1 = mulsh(mulsh(h1, sigmoid(h1), 14), b, 16 - sh), b = h3 rounded by the row's shift sh (its
   rounding constant r) and clamped; a function per case of the last mulsh (16 - sh: 16, 1..15, other),
   each loop with its own registers. */
#define SILU_ROW(name, f2) INTERNAL void name(i32 *h1, const i32 *h3, int n, const i32 *tab, i32 r, int sh) { \
    for (i32 *end = h1 + n; h1 != end; h1++, h3++) { \
        i32 a = *h1; \
        i32 g = (1 << 29) / (32768 + expq((a < 0 ? -a : a) >> 4, tab)); \
        if (a < 0) { \
            g = 16384 - g; \
        } \
        i32 b = (*h3 + r) >> sh; \
        b = b > 16383 ? 16383 : b; \
        b = b < -16383 ? -16383 : b; \
        *h1 = f2(mulsh_lo(a, g, 14), b, 16 - sh); \
    } \
}
SILU_ROW(silu_hi, mulsh_hi)
SILU_ROW(silu_lo, mulsh_lo)
SILU_ROW(silu_any, mulsh)

INTERNAL void k_silu(i32 *h1, const i32 *h3, const i32 *tab, const i32 *p) {
    int n = p[0], k = p[1];
    for (int j = 0; j < k; j++, h1 += n, h3 += n) {
        int sh = block_shift(h3, n, 14);  /* <= 18: 16 - sh >= -2 */
        i32 r = sh ? 1 << (sh - 1) : 0;
        if (sh == 0) {
            silu_hi(h1, h3, n, tab, r, sh);
        } else if (sh <= 15) {
            silu_lo(h1, h3, n, tab, r, sh);
        } else {
            silu_any(h1, h3, n, tab, r, sh);
        }
    }
}

/* -- the Python-facing kernels: firmware/kernels.py's signatures ---------------------------------- */

/* p[16 + j*rows + r] = the sums; p = (rows, cols, k, r0); `a` is unused (the viper kernel's register local). */
static mp_obj_t matmul(size_t n_args, const mp_obj_t *args) {
    i32 *p = RW(args[3]);
    const int8_t *w = RD(args[0]);
    k_matmul(w + p[3] * p[1], RD(args[1]), p[0], p[1], p[2], p + 16);
    return mp_const_none;
}
FUN_OBJ MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(matmul_obj, 4, 4, matmul);

static mp_obj_t quant(mp_obj_t dst, mp_obj_t src, mp_obj_t p) {
    k_quant(RW(dst), RD(src), RW(p));
    return mp_const_none;
}
FUN_OBJ MP_DEFINE_CONST_FUN_OBJ_3(quant_obj, quant);

static mp_obj_t requant(size_t n_args, const mp_obj_t *args) {
    k_requant(RW(args[0]), RD(args[1]), RD(args[2]), RD(args[3]));
    return mp_const_none;
}
FUN_OBJ MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(requant_obj, 4, 4, requant);

static mp_obj_t embed(size_t n_args, const mp_obj_t *args) {
    k_embed(RW(args[0]), RD(args[1]), RD(args[2]), RD(args[3]));
    return mp_const_none;
}
FUN_OBJ MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(embed_obj, 4, 4, embed);

static mp_obj_t rmsnorm(size_t n_args, const mp_obj_t *args) {
    k_rmsnorm(RW(args[0]), RD(args[1]), RD(args[2]), RD(args[3]));
    return mp_const_none;
}
FUN_OBJ MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(rmsnorm_obj, 4, 4, rmsnorm);

static mp_obj_t rope(mp_obj_t buf, mp_obj_t cs, mp_obj_t p) {
    k_rope(RW(buf), RD(cs), RD(p));
    return mp_const_none;
}
FUN_OBJ MP_DEFINE_CONST_FUN_OBJ_3(rope_obj, rope);

static mp_obj_t attend(size_t n_args, const mp_obj_t *args) {
    k_attend(RW(args[0]), RD(args[1]), RW(args[2]), RD(args[3]));
    return mp_const_none;
}
FUN_OBJ MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(attend_obj, 4, 4, attend);

static mp_obj_t silu(size_t n_args, const mp_obj_t *args) {
    k_silu(RW(args[0]), RD(args[1]), RD(args[2]), RD(args[3]));
    return mp_const_none;
}
FUN_OBJ MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(silu_obj, 4, 4, silu);

static mp_obj_t argmax(mp_obj_t a_in, mp_obj_t p_in) {
    const i32 *p = RD(p_in);
    const i32 *a = (const i32 *)RD(a_in) + p[0];
    int best = 0;
    i32 top = a[0];  /* the best value in a register, not reloaded per value */
    for (int i = 1; i < p[1]; i++) {
        if (a[i] > top) {
            top = a[i];
            best = i;
        }
    }
    return mp_obj_new_int(best);
}
FUN_OBJ MP_DEFINE_CONST_FUN_OBJ_2(argmax_obj, argmax);

/* -- one whole layer per call: firmware/engine.py's Engine._layer, step for step ------------------ */

enum { L_X, L_XN, L_XQ, L_ACC, L_PR, L_QB, L_KB, L_VB, L_KV, L_SC, L_H1, L_H3, L_ROPE, L_EXP, L_ATTN_NORM, L_FFN_NORM,
       L_WQ, L_WK = L_WQ + 2, L_WV = L_WK + 2, L_WO = L_WV + 2, L_W1 = L_WO + 2, L_W2 = L_W1 + 2, L_W3 = L_W2 + 2,
       L_BUFS = L_W3 + 2 };

typedef struct {
    i32 *xq, *acc;
    int k;
} pass_t;

/* xq = the k rows of src rounded to int16 (positions interleaved), their shifts in pr[8:] (_quant_rows). */
INTERNAL void quant_rows(pass_t *ps, const i32 *src, int cols, i32 *pr) {
    pr[0] = 0;
    pr[1] = cols;
    pr[2] = 0;
    pr[3] = 15;
    pr[4] = ps->k;
    pr[5] = ps->k;
    pr[6] = 1;
    k_quant(ps->xq, src, pr);
}

/* dst rows (+)= requant(W @ xq) for a matrix of rows x cols (_project, one block). */
INTERNAL void project(pass_t *ps, void *const *b, int wi, int rows, int cols, i32 *dst, int add, i32 *pr) {
    k_matmul(b[wi], ps->xq, rows, cols, ps->k, ps->acc);
    pr[0] = rows;
    pr[1] = ps->k;
    pr[2] = 0;
    pr[3] = rows;
    pr[4] = 0;
    pr[5] = add;
    k_requant(dst, ps->acc, b[wi + 1], pr);
}

/* layer(bufs, p): one transformer layer over k positions, as Engine._layer computes it with the kernels
   above. bufs: a tuple of the buffers in L_* order (pr: quant's and requant's parameters, 8 + kmax ints;
   each matrix as its int8 weights, then its m | s << 16 row scales); p = (k, pos, li, dim, head_dim,
   n_heads, n_kv_heads, hidden, n_ctx, stride, cache, isq, eps, attn_norm shift, ffn_norm shift). */
static mp_obj_t layer(mp_obj_t bufs_in, mp_obj_t p_in) {
    mp_obj_tuple_t *t = MP_OBJ_TO_PTR(bufs_in);  /* the engine's tuple (no string constant: see INTERNAL) */
    mp_obj_t *items = t->items;
    if (t->len != L_BUFS) {
        mp_raise_ValueError(NULL);
    }
    void *b[L_BUFS];
    for (int i = 0; i < L_BUFS; i++) {
        b[i] = RD(items[i]);  /* read-only weights (a ROMFS) too; the engine's scratch is writable */
    }
    const i32 *p = RD(p_in);
    int k = p[0], pos = p[1], li = p[2], dim = p[3], hd = p[4], nh = p[5], nkv = p[6], hid = p[7], nctx = p[8];
    int stride = p[9], cache = p[10];
    int qd = nh * hd, kvd = nkv * hd;
    pass_t ps = {b[L_XQ], b[L_ACC], k};
    i32 *pr = b[L_PR], q[11];
    i32 *x = b[L_X], *xn = b[L_XN];
    q[0] = dim;
    q[1] = k;
    q[2] = p[13];
    q[3] = p[12];
    k_rmsnorm(xn, x, b[L_ATTN_NORM], q);
    quant_rows(&ps, xn, dim, pr);
    project(&ps, b, L_WQ, qd, dim, b[L_QB], 0, pr);
    project(&ps, b, L_WK, kvd, dim, b[L_KB], 0, pr);
    project(&ps, b, L_WV, kvd, dim, b[L_VB], 0, pr);
    q[0] = k;
    q[1] = nh;
    q[2] = hd / 2;
    q[3] = pos;
    k_rope(b[L_QB], b[L_ROPE], q);
    q[1] = nkv;
    k_rope(b[L_KB], b[L_ROPE], q);
    pr[0] = 0;  /* the k new rows of keys, then of values, into the cache (quant leaves k shifts after p[8]) */
    pr[1] = kvd;
    pr[2] = (li * nctx + pos) * stride;
    pr[3] = 7;
    pr[4] = 1;
    pr[5] = k;
    pr[6] = stride;
    k_quant(b[L_KV], b[L_KB], pr);
    pr[2] += cache;
    k_quant(b[L_KV], b[L_VB], pr);
    q[0] = pos + 1;  /* query j sees positions 0 .. pos + j */
    q[1] = hd;
    q[2] = stride;
    q[3] = li * nctx * stride;
    q[4] = cache + q[3];
    q[5] = nh;
    q[6] = nh / nkv;
    q[7] = p[11];
    q[8] = k;
    q[9] = nctx;
    q[10] = nctx + hd;
    k_attend(b[L_QB], b[L_KV], b[L_SC], q);
    quant_rows(&ps, b[L_QB], qd, pr);
    project(&ps, b, L_WO, dim, qd, x, 1, pr);
    q[0] = dim;
    q[1] = k;
    q[2] = p[14];
    q[3] = p[12];
    k_rmsnorm(xn, x, b[L_FFN_NORM], q);
    quant_rows(&ps, xn, dim, pr);
    project(&ps, b, L_W1, hid, dim, b[L_H1], 0, pr);
    project(&ps, b, L_W3, hid, dim, b[L_H3], 0, pr);
    q[0] = hid;
    q[1] = k;
    k_silu(b[L_H1], b[L_H3], b[L_EXP], q);
    quant_rows(&ps, b[L_H1], hid, pr);
    project(&ps, b, L_W2, dim, hid, x, 1, pr);
    return mp_const_none;
}
FUN_OBJ MP_DEFINE_CONST_FUN_OBJ_2(layer_obj, layer);

mp_obj_t mpy_init(mp_obj_fun_bc_t *self, size_t n_args, size_t n_kw, mp_obj_t *args) {
    MP_DYNRUNTIME_INIT_ENTRY
    mp_store_global(MP_QSTR_matmul, MP_OBJ_FROM_PTR(&matmul_obj));
    mp_store_global(MP_QSTR_quant, MP_OBJ_FROM_PTR(&quant_obj));
    mp_store_global(MP_QSTR_requant, MP_OBJ_FROM_PTR(&requant_obj));
    mp_store_global(MP_QSTR_embed, MP_OBJ_FROM_PTR(&embed_obj));
    mp_store_global(MP_QSTR_rmsnorm, MP_OBJ_FROM_PTR(&rmsnorm_obj));
    mp_store_global(MP_QSTR_rope, MP_OBJ_FROM_PTR(&rope_obj));
    mp_store_global(MP_QSTR_attend, MP_OBJ_FROM_PTR(&attend_obj));
    mp_store_global(MP_QSTR_silu, MP_OBJ_FROM_PTR(&silu_obj));
    mp_store_global(MP_QSTR_argmax, MP_OBJ_FROM_PTR(&argmax_obj));
    mp_store_global(MP_QSTR_layer, MP_OBJ_FROM_PTR(&layer_obj));
    MP_DYNRUNTIME_INIT_EXIT
}
