/*
 * specmesh virtual boards' flash and boot: the RV32 board (ESP32-C3 / ESP32-C6 classes, MicroPython's qemu port) and
 * the Xtensa board (ESP32 / ESP32-S3 classes, xtensa/port, which builds this file with its own vboard.h). Their
 * console input is vboard_console.c's, the same way shared.
 *
 * Owns the boot sequence both boards run (vboard_boot), their waits (mp_hal_delay_ms, mp_hal_delay_us), their
 * random bytes (mp_hal_get_random) and what a real board's flash gives MicroPython, kept in two host files beside
 * QEMU (its working directory), reached through semihosting so they survive a reset the way flash does:
 * - flash.img: the filesystem, littlefs2 in 4 KiB blocks (`vboard.Flash`, a block device), mounted at /;
 * - romfs.img: the ROMFS partition, loaded by QEMU into guest memory at VBOARD_ROMFS_ADDR and read in
 *   place (memory-mapped flash); `vfs.rom_ioctl` writes go to that memory and to the file.
 * Heap and partition sizes come from a config block QEMU writes before the CPU starts (vboard.h).
 *
 * MIT licence, as the MicroPython code it extends.
 */

#include <string.h>

#include "py/runtime.h"
#include "py/mperrno.h"
#include "py/objarray.h"
#include "py/compile.h"
#include "py/gc.h"
#include "py/mphal.h"
#include "extmod/vfs.h"
#include "extmod/vfs_rom.h"
#if defined(__xtensa__)
#include "semihost.h" // the same calls over Xtensa semihosting (xtensa/port)
#else
#include "shared/runtime/semihosting_rv32.h"
#endif
#include "shared/runtime/pyexec.h"
#include "vboard.h"
#include "vboard_console.h"

#define BLOCK (4096)

typedef struct {
    uint32_t magic;
    uint32_t heap_bytes;
    uint32_t romfs_bytes;
    uint32_t psram_bytes; // the Xtensa board's (xtensa/port/main.c reads it)
    uint32_t boot; // VBOARD_BOOT_RAW: into the raw REPL
} vboard_config_t;

static int flash_fd = -1;
static int romfs_fd = -1;
static uint32_t flash_blocks;
static uint32_t romfs_bytes;

static const vboard_config_t *config(void) {
    const vboard_config_t *c = (const vboard_config_t *)VBOARD_CONFIG_ADDR;
    return c->magic == VBOARD_CONFIG_MAGIC ? c : NULL;
}

size_t vboard_heap_bytes(size_t largest) {
    const vboard_config_t *c = config();
    if (c == NULL || c->heap_bytes == 0 || c->heap_bytes > largest) {
        return largest;
    }
    return c->heap_bytes & ~3u;
}

void vboard_init(void) {
    mp_semihosting_init();
    flash_fd = mp_semihosting_open("flash.img", "r+b");
    if (flash_fd >= 0) {
        flash_blocks = mp_semihosting_flen(flash_fd) / BLOCK;
    }
    const vboard_config_t *c = config();
    if (c != NULL && c->romfs_bytes) {
        romfs_fd = mp_semihosting_open("romfs.img", "r+b");
        if (romfs_fd >= 0) {
            romfs_bytes = c->romfs_bytes;
        }
    }
}

// -- the filesystem's block device ----------------------------------------------------------------

static void file_io(int fd, uint32_t offset, void *buf, size_t len, bool write) {
    if (fd < 0 || mp_semihosting_seek(fd, offset) != 0) {
        mp_raise_OSError(MP_EIO);
    }
    int left = write ? mp_semihosting_write(fd, buf, len) : mp_semihosting_read(fd, buf, len);
    if (left != 0) {
        mp_raise_OSError(MP_EIO);
    }
}

static mp_obj_t flash_make_new(const mp_obj_type_t *type, size_t n_args, size_t n_kw, const mp_obj_t *args) {
    mp_arg_check_num(n_args, n_kw, 0, 0, false);
    if (flash_fd < 0) {
        mp_raise_OSError(MP_ENODEV);
    }
    mp_obj_base_t *self = mp_obj_malloc(mp_obj_base_t, type);
    return MP_OBJ_FROM_PTR(self);
}

static mp_obj_t flash_blocks_io(size_t n_args, const mp_obj_t *args, bool write) {
    uint32_t block = mp_obj_get_int(args[1]);
    mp_buffer_info_t buf;
    mp_get_buffer_raise(args[2], &buf, write ? MP_BUFFER_READ : MP_BUFFER_WRITE);
    uint32_t offset = n_args > 3 ? mp_obj_get_int(args[3]) : 0;
    if ((uint64_t)block * BLOCK + offset + buf.len > (uint64_t)flash_blocks * BLOCK) {
        mp_raise_OSError(MP_EINVAL);
    }
    file_io(flash_fd, block * BLOCK + offset, buf.buf, buf.len, write);
    return mp_const_none;
}

static mp_obj_t flash_readblocks(size_t n_args, const mp_obj_t *args) {
    return flash_blocks_io(n_args, args, false);
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(flash_readblocks_obj, 3, 4, flash_readblocks);

static mp_obj_t flash_writeblocks(size_t n_args, const mp_obj_t *args) {
    return flash_blocks_io(n_args, args, true);
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(flash_writeblocks_obj, 3, 4, flash_writeblocks);

static mp_obj_t flash_ioctl(mp_obj_t self, mp_obj_t op_in, mp_obj_t arg) {
    switch (mp_obj_get_int(op_in)) {
        case MP_BLOCKDEV_IOCTL_BLOCK_COUNT:
            return MP_OBJ_NEW_SMALL_INT(flash_blocks);
        case MP_BLOCKDEV_IOCTL_BLOCK_SIZE:
            return MP_OBJ_NEW_SMALL_INT(BLOCK);
        default: // init, deinit, sync, erase: nothing to do on a file
            return MP_OBJ_NEW_SMALL_INT(0);
    }
}
static MP_DEFINE_CONST_FUN_OBJ_3(flash_ioctl_obj, flash_ioctl);

static const mp_rom_map_elem_t flash_locals_dict_table[] = {
    { MP_ROM_QSTR(MP_QSTR_readblocks), MP_ROM_PTR(&flash_readblocks_obj) },
    { MP_ROM_QSTR(MP_QSTR_writeblocks), MP_ROM_PTR(&flash_writeblocks_obj) },
    { MP_ROM_QSTR(MP_QSTR_ioctl), MP_ROM_PTR(&flash_ioctl_obj) },
};
static MP_DEFINE_CONST_DICT(flash_locals_dict, flash_locals_dict_table);

static MP_DEFINE_CONST_OBJ_TYPE(
    vboard_flash_type, MP_QSTR_Flash, MP_TYPE_FLAG_NONE,
    make_new, flash_make_new,
    locals_dict, &flash_locals_dict
    );

static const mp_rom_map_elem_t vboard_module_globals_table[] = {
    { MP_ROM_QSTR(MP_QSTR___name__), MP_ROM_QSTR(MP_QSTR_vboard) },
    { MP_ROM_QSTR(MP_QSTR_Flash), MP_ROM_PTR(&vboard_flash_type) },
};
static MP_DEFINE_CONST_DICT(vboard_module_globals, vboard_module_globals_table);

const mp_obj_module_t vboard_module = {
    .base = { &mp_type_module },
    .globals = (mp_obj_dict_t *)&vboard_module_globals,
};
MP_REGISTER_MODULE(MP_QSTR_vboard, vboard_module);

// Mount the filesystem at / (formatting an erased one first), as a board's boot does.
static void mount(void) {
    static const char src[] =
        "import vfs, vboard\n"
        "try:\n"
        " d = vboard.Flash()\n"
        " try:\n"
        "  vfs.mount(vfs.VfsLfs2(d), '/')\n"
        " except OSError:\n"
        "  vfs.VfsLfs2.mkfs(d)\n"
        "  vfs.mount(vfs.VfsLfs2(d), '/')\n"
        " import sys\n"
        " sys.path.append('/lib')\n"
        "except OSError as e:\n"
        " print('vboard: no filesystem:', e)\n"
        "del vfs, vboard\n";
    nlr_buf_t nlr;
    if (nlr_push(&nlr) == 0) {
        mp_lexer_t *lex = mp_lexer_new_from_str_len(MP_QSTR__lt_boot_gt_, src, sizeof(src) - 1, 0);
        mp_parse_tree_t tree = mp_parse(lex, MP_PARSE_FILE_INPUT);
        mp_obj_t fun = mp_compile(&tree, lex->source_name, false);
        mp_call_function_0(fun);
        nlr_pop();
    } else {
        mp_obj_print_exception(&mp_plat_print, MP_OBJ_FROM_PTR(nlr.ret_val));
    }
}

// -- boot, waits and random bytes -------------------------------------------------------------------

int vboard_boot(void) {
    const vboard_config_t *c = config();
    if (c != NULL && c->boot == VBOARD_BOOT_RAW) {
        pyexec_mode_kind = PYEXEC_MODE_RAW_REPL; // a soft reset in the raw REPL: back into it
    }
    mp_init();
    mount();
    int ret = pyexec_file_if_exists("boot.py");
    if (!(ret & PYEXEC_FORCED_EXIT) && pyexec_mode_kind == PYEXEC_MODE_FRIENDLY_REPL) {
        ret = pyexec_file_if_exists("main.py");
    }
    if (!(ret & PYEXEC_FORCED_EXIT)) {
        for (;;) {
            if (pyexec_mode_kind == PYEXEC_MODE_RAW_REPL) {
                if (pyexec_raw_repl() != 0) {
                    break;
                }
            } else {
                if (pyexec_friendly_repl() != 0) {
                    break;
                }
            }
        }
    }

    mp_printf(&mp_plat_print, "MPY: soft reboot\n");
    gc_sweep_all(); // finalisers: open files are closed (flushed to the flash)
    mp_deinit();
    return pyexec_mode_kind == PYEXEC_MODE_RAW_REPL ? VBOARD_EXIT_SOFT_RAW : VBOARD_EXIT_SOFT;
}

void mp_hal_delay_ms(mp_uint_t ms) {
    mp_uint_t start = mp_hal_ticks_ms();
    while (mp_hal_ticks_ms() - start < ms) {
        mp_handle_pending(true);
        vboard_idle();
    }
}

void mp_hal_delay_us(mp_uint_t us) {
    mp_uint_t start = mp_hal_ticks_us();
    while (mp_hal_ticks_us() - start < us) {
    }
}

// A dummy mp_hal_get_random() (an LCG), as MicroPython's qemu port has.
static uint32_t random_state;
void mp_hal_get_random(size_t n, uint8_t *buf) {
    for (size_t i = 0; i < n; ++i) {
        random_state = random_state * 1664525 + 1013904223;
        buf[i] = random_state >> 24;
    }
}

// -- the ROMFS partition ----------------------------------------------------------------------------

static void romfs_remount(void) {
    nlr_buf_t nlr;
    if (nlr_push(&nlr) == 0) {
        mp_obj_t rom = MP_OBJ_NEW_QSTR(MP_QSTR__slash_rom);
        mp_call_function_1(MP_OBJ_FROM_PTR(&mp_vfs_umount_obj), rom);
        nlr_pop();
    }
    if (nlr_push(&nlr) == 0) {
        mp_obj_t part = mp_obj_new_memoryview('B', romfs_bytes, (void *)VBOARD_ROMFS_ADDR);
        mp_obj_t romfs = mp_call_function_1(MP_OBJ_FROM_PTR(&mp_type_vfs_rom), part);
        mp_call_function_2(MP_OBJ_FROM_PTR(&mp_vfs_mount_obj), romfs, MP_OBJ_NEW_QSTR(MP_QSTR__slash_rom));
        nlr_pop();
    }
}

mp_obj_t mp_vfs_rom_ioctl(size_t n_args, const mp_obj_t *args) {
    mp_int_t op = mp_obj_get_int(args[0]);
    if (op == MP_VFS_ROM_IOCTL_GET_NUMBER_OF_SEGMENTS) {
        return MP_OBJ_NEW_SMALL_INT(romfs_bytes ? 1 : 0);
    }
    if (n_args < 2 || mp_obj_get_int(args[1]) != 0 || !romfs_bytes) {
        return MP_OBJ_NEW_SMALL_INT(-MP_EINVAL);
    }
    uint8_t *part = (uint8_t *)VBOARD_ROMFS_ADDR;
    switch (op) {
        case MP_VFS_ROM_IOCTL_GET_SEGMENT:
            return mp_obj_new_memoryview('B', romfs_bytes, part);
        case MP_VFS_ROM_IOCTL_WRITE_PREPARE: {
            mp_uint_t len = n_args > 2 ? mp_obj_get_int(args[2]) : 0;
            if (len > romfs_bytes) {
                return MP_OBJ_NEW_SMALL_INT(-MP_EINVAL);
            }
            len = (len + BLOCK - 1) / BLOCK * BLOCK; // erase the blocks it spans
            if (len > romfs_bytes) {
                len = romfs_bytes;
            }
            memset(part, 0xff, len);
            file_io(romfs_fd, 0, part, len, true);
            return MP_OBJ_NEW_SMALL_INT(4); // the smallest write
        }
        case MP_VFS_ROM_IOCTL_WRITE: {
            if (n_args < 4) {
                return MP_OBJ_NEW_SMALL_INT(-MP_EINVAL);
            }
            mp_int_t offset = mp_obj_get_int(args[2]);
            mp_buffer_info_t buf;
            mp_get_buffer_raise(args[3], &buf, MP_BUFFER_READ);
            if (offset < 0 || offset + buf.len > romfs_bytes) {
                return MP_OBJ_NEW_SMALL_INT(-MP_EINVAL);
            }
            memcpy(part + offset, buf.buf, buf.len);
            file_io(romfs_fd, offset, part + offset, buf.len, true);
            return MP_OBJ_NEW_SMALL_INT(0);
        }
        case MP_VFS_ROM_IOCTL_WRITE_COMPLETE:
            romfs_remount();
            return MP_OBJ_NEW_SMALL_INT(0);
        default:
            return MP_OBJ_NEW_SMALL_INT(-MP_EINVAL);
    }
}
