"""What a board is and keeps, for both runtimes: the role names, the board config's keys and bounds, and the
heap a node keeps free once its model is loaded.

Runs unchanged under MicroPython and CPython. firmware/config.py checks a board config against these keys
and bounds, firmware/node.py loads its model by these reserves; the host writes configs with the same keys
(host/provision/flash.py), checks flags against the same bounds (host/cli) and prices what a node holds from
the same reserves (host/boardclasses.py).
"""

# A node's role, by its id in HELLO and CONFIGURE (shared/messages.py ROLE_IDLE .. ROLE_STAGE): ROLES[id]
ROLES = ("idle", "drafter", "verifier", "stage")
LINKS = ("stdio", "uart", "espnow", "gateway")  # the board config's "link"

# The board config file (firmware/config.py documents each key): the defaults of a missing file, and the key a
# `specmesh flash` writes first and removes last (host/provision/flash.py), so a board interrupted meanwhile
# knows it is half-flashed
FLASHING = "flashing"
DEFAULTS = {"node_id": 1, "role": "idle", "model": "", "link": "stdio", "spec_ahead": 0}

# Bounds, inclusive
NODE_IDS = (1, 254)  # a board's bus address: 0 is the host (messages.HOST), 255 the broadcast (codec.BROADCAST)
SPEC_AHEAD = (0, 64)  # tokens a drafter may draft ahead while a verdict is pending
KMAX = (1, 256)  # most positions a verifier computes in one pass
CTR = (0, 0xFFFFFFFF)  # the signing counter (u32)

# Free heap a node keeps once its model is loaded, else it halves its context (HELLO reports it), and where even
# MIN_CTX leaves less it refuses the model at load ("does not fit", E_MEMORY) rather than meet a MemoryError
# mid-session: a drafter's, and a stage's and a verifier's (whose rule tables are preallocated at load and frames
# a few hundred bytes: they serve in less). tests/test_firmware_budget.py drafts through the whole context at
# -X heapsize= the class heap; the figures that chose them are in docs/bench/heap.md.
RESERVE = 22528
STAGE_RESERVE = 16384
VERIFIER_RESERVE = STAGE_RESERVE
MIN_CTX = 64  # the shortest context a node halves to
MAX_TRY_CTX = 256  # the context it tries after the model's whole one did not fit
