// specmesh virtual Xtensa board: the time module has the ticks functions only (no wall clock, as a board
// that was never set)
