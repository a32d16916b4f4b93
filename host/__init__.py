"""specmesh host: CLI, orchestrator, links, verifier back-ends, emulator and flashing (CPython)."""
