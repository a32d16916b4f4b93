"""Virtual board stand-in for `esp32.idf_heap_info`: the ESP-IDF heap that the esp32 port's GC heap grows into.

On the port the GC heap starts with one area (56 KiB on a classic ESP32, 64 KiB elsewhere: ports/esp32/
mpconfigport.h MICROPY_GC_INITIAL_HEAP_SIZE) and adds areas from the ESP-IDF heap on demand (py/gc.c
gc_try_add_heap), and `gc.mem_free()` counts the largest free ESP-IDF block (py/modgc.c gc_mem_free), the block
Wi-Fi/ESP-NOW also allocate from. Here the VM's heap is the class's GC heap plus VBOARD_IDF_BYTES of ESP-IDF heap
beyond it (the supervisor or test sizes it so), in one pool: the largest free ESP-IDF block is what is free of
that pool, up to VBOARD_IDF_BYTES (the GC heap grew into the rest). Unset: no ESP-IDF heap beyond the GC's.
"""

import gc
import os

HEAP_DATA = 4  # MALLOC_CAP_8BIT
HEAP_EXEC = 1  # MALLOC_CAP_EXEC
_IDF = int(os.getenv("VBOARD_IDF_BYTES") or "0")


def idf_heap_info(capabilities):
    """[(total, free, largest free block, minimum free)] of the ESP-IDF heap regions (one here)."""
    free = min(_IDF, gc.mem_free())
    return [(_IDF, free, free, free)]
