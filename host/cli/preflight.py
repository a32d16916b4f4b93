"""What `specmesh run` checks before it starts anything: no board is booted, no port held, no process
left behind when one of these fails, and the failure is one line naming the file or port and what to do.

- the model files parse: header, size and CRC (host/backends/modelio.py `check_model_file`);
- the drafter's n-gram table, and the target's where the drafter has one, hold what a builder writes
  (host/backends `load_ngram_table`);
- the drafter speaks the target's tokens: the same vocabulary and, where both headers name one, the same
  tokenizer (a drafter board's HELLO is checked again once it answers, before any text);
- once a board answers, before any text: its HELLO's model crc is the build of the file the host takes its model
  for (`check_build`: the target for a verifier or stage, the drafter's file for a drafter);
- the tokenizer is the target's: its vocabulary size and, where the header names one, its tokenizer id;
- the prompt fits the target's context (the orchestrator would refuse it only after the boards were up);
- every `--drafter`/`--verifier` names a known back-end (a port also as mpremote's `a0`, `u0`, `c0`), and
  every role given a serial port (and each stage of a `--verifier PORT1,PORT2,...`) gets its own, one that exists
  and opens now; `auto` is resolved here to the port of the flashed board reporting that role, before a virtual
  board of the other role boots.
"""

from __future__ import annotations

import os
from pathlib import Path

from specmesh.host import backends
from specmesh.host.cli import registry
from specmesh.host.backends import is_port, load_ngram_table, port_list
from specmesh.host.backends.modelio import check_model_file
from specmesh.host.boardclasses import BOARD_CLASSES, drafter_class, drafter_model
from specmesh.host.layout import MODEL_FILES, TOKENIZER_FILE, host_drafter_model
from specmesh.shared.modelfile import Header, ModelFileError


def drafter_file(backend: str, models: Path, transport: str = "serial") -> str:
    """The model file in `models` of a `--drafter` back-end: a board's (`virtual[:CLASS]`, `auto`, a port) is
    its class's drafter (host/boardclasses.py; without a class, a default cluster's drafter board class on
    `transport`), a host back-end's drafter-host.spm (drafter.spm in a folder without it)."""
    if backend == "virtual" or is_port(backend):
        return drafter_model(models, drafter_class(transport)).name
    if backend.startswith("virtual:") and backend[len("virtual:"):] in BOARD_CLASSES:
        return drafter_model(models, backend[len("virtual:"):]).name
    return host_drafter_model(models).name


class PreflightError(Exception):
    """A check failed; the message is one line for the user."""


def unknown_backend(kind: str, name: str) -> str | None:
    """The one-line error for a `--drafter`/`--verifier` value that names no back-end, or None."""
    if registry.factory(kind, name) is not None:
        return None
    known = ", ".join(sorted({*(registry.VERIFIERS if kind == "verifier" else registry.DRAFTERS)}
                             - {backends.PORT, backends.STAGE_PORTS}))
    if not name.strip():  # an unset variable's --drafter "$PORT"
        return "--%s is empty: give a board's serial port or one of %s" % (kind, known)
    ports = port_list(name)
    if ports is not None:
        if kind != "verifier":
            return ("--%s %s: a list of ports is a pipeline's stage boards, which verify: give them as --verifier, and "
                    "one drafter board's port as --drafter" % (kind, name))
        bad = next(p for p in ports if not is_port(p) or p == "auto")
        return "--verifier %s: %s: give the stage boards' serial ports, comma-separated in layer order (e.g. " \
            "/dev/ttyUSB0,/dev/ttyUSB1)" % (name, "`auto` finds one board, not a pipeline's stages" if bad == "auto"
                                            else "%r is not a serial port" % bad)
    return "--%s %s: not a serial port nor one of %s" % (kind, name, known)


def check_models(files: dict[str, Path], roles: list[str]) -> dict[str, Header]:
    """The header of each role's model file (`files`: role -> path), every file checked whole."""
    heads = {}
    for role in roles:
        path = files[role]
        try:
            heads[role] = check_model_file(path)[0]
        except ModelFileError as e:
            raise PreflightError(str(e)) from None
        except OSError as e:
            raise PreflightError("cannot read model file %s: %s" % (path, e.strerror or e)) from None
    return heads


def check_tables(backend: str, drafter: Path, target: Path) -> None:
    """The n-gram table beside the drafter's model file `drafter` and, where it has one, the target's (`target`), whose
    chains the decode loop copies, each read whole and its slots checked. A broken one was found only once the
    boards had booted and the drafter board had been flashed with it. Not for a board on a port (`backend`): the
    host reads the table of the model its HELLO names, which may be another file than `drafter`."""
    from specmesh.host.bus.ports import expand

    if is_port(expand(backend)):
        return
    try:
        if load_ngram_table(drafter) is not None:
            load_ngram_table(target)
    except ModelFileError as e:
        raise PreflightError(str(e)) from None


def check_pair(target: Header, vocab: int, tokenizer_id: int, what: str, fix: str | None = None, *,
               tok_id: int | None = None, target_path: Path | None = None) -> None:
    """A drafter (`what`: its file, or the board that runs it) must draft the target's tokens: the same vocabulary
    size, and the same tokenizer where both headers name one (tokenizer_id 0: not recorded). `fix`: what gives the
    run such a drafter (a board's: the flash command that puts one on it, which --draft-model does not). Where the
    tokenizer (`tok_id`: its id, `tokenizer_id`) agrees with the drafter, the target's file (`target_path`) is the odd
    one out: a flipped byte in its header (outside the CRC of a version 1 file) was said as a drafter of another
    tokenizer, to be replaced."""
    fix = fix or "give a drafter trained with the target's tokenizer (--draft-model)"
    if vocab != target.vocab:
        raise PreflightError("the drafter %s has a vocabulary of %d tokens, the target's has %d: %s, or --plain"
                             % (what, vocab, target.vocab, fix))
    if tokenizer_id and target.tokenizer_id and tokenizer_id != target.tokenizer_id and tokenizer_id == tok_id:
        raise PreflightError("the target model %s records tokenizer id %08x, but %s and the drafter %s have %08x: its "
                             "header is corrupt or it was made with another tokenizer: copy it again, or give the "
                             "tokenizer and the drafter made with it" % (target_path, target.tokenizer_id,
                                                                         TOKENIZER_FILE, what, tokenizer_id))
    if tokenizer_id and target.tokenizer_id and tokenizer_id != target.tokenizer_id:
        raise PreflightError("the drafter %s was made with another tokenizer than the target (tokenizer id %08x, the "
                             "target's %08x): %s, or --plain" % (what, tokenizer_id, target.tokenizer_id, fix))


# what this run does with the file it takes a board's model for, by the board's role: why another build matters
_TAKEN_FOR = {"verifier": "which this run fails over to and copies drafts from",
              "stage": "which this run fails over to and copies drafts from",
              "drafter": "whose n-gram table and costs this run takes for it"}


def check_build(crc: int, path: Path, head: Header, role: str, where: str, running: str, flash_role: str = "") -> None:
    """A board's HELLO gives the crc32 of the model file it runs (`crc`; 0: a firmware older than that field, or no
    model: not checked); it must be the build of `path` (header `head`), the file this run takes that model for.
    Another build under the same name would leave the host's fail-over and copies on another model than the
    board's. `role`: the board's; `where`: its port or virtual board; `running`: the file name its HELLO gives;
    `flash_role`: the role arguments of the flash command that fixes it (default `--role ROLE`; a stage's its layers
    too, which `specmesh flash --role stage` needs). A board flashed with a file of another name is given it by the
    run's model flag (its folder as --models would not: the run reads its role's own name there)."""
    if not crc or crc == head.crc:
        return
    same_name = running in ("", path.name)
    what = "another build of %s" % path.name if same_name else "%s, not %s" % (running, path.name)
    theirs = ("its folder as --models" if same_name else
              "%s FILE, FILE its %s" % ("--draft-model" if role == "drafter" else "--model", running))
    fix = ("flash it with this run's file (`specmesh flash --port %s %s --model %s`) or give this run the "
           "file it was flashed from (%s)" % (where, flash_role or "--role " + role, path, theirs)
           if is_port(where)
           else "run again (a virtual board is flashed afresh)")
    raise PreflightError("the %s on %s runs %s (crc32 %08x, not the %08x of %s, %s): %s"
                         % (role, where, what, crc, head.crc, path, _TAKEN_FOR[role], fix))


def check_tokenizer(tok, target: Header, path: Path, name: str) -> None:
    """The tokenizer (`tok`, read from `path`) must be the one the target model `name` was made with: its vocabulary
    size, and its tokenizer id where the header records one (the CRC of its vocab table: host/decode/tokenizer.py).
    Another one encodes prompts into ids the model has not got, or is asked to decode ids it has no piece for (a
    run failed mid-text with 'list index out of range' or 'token id out of range', its boards up)."""
    fix = "put the model's own tokenizer.bin in the --models folder, or give the models made with this one"
    if tok.vocab_size != target.vocab:
        raise PreflightError("%s holds %d tokens but the target model (%s) has a vocabulary of %d: %s"
                             % (path, tok.vocab_size, name, target.vocab, fix))
    if not target.tokenizer_id:
        return
    tid = tokenizer_id(tok)
    if tid != target.tokenizer_id:
        raise PreflightError("%s is not the tokenizer the target model (%s) was made with (its tokenizer id %08x, "
                             "this one's %s): %s" % (path, name, target.tokenizer_id,
                                                     "unknown" if tid is None else "%08x" % tid, fix))


def tokenizer_id(tok) -> int | None:
    """The tokenizer id a model header records for the tokenizer `tok` (the CRC of its vocab table: host/decode/
    tokenizer.py), or None for one too large for a vocab table (not the one any header names)."""
    from specmesh.host.decode.tokenizer import TokenizerError, pack_vocab, vocab_id

    try:
        return vocab_id(pack_vocab(tok.pieces))
    except TokenizerError:
        return None


def check_context(prompt_tokens: int, target: Header, name: str = MODEL_FILES["verifier"],
                  source: str = "--prompt", at_least: bool = False) -> None:
    """The prompt must leave room in the target's context for at least one generated token (the
    drafter's context limits nothing: past it, rounds are plain; host/decode/orchestrator.py). `source`: where
    the prompt came from (--prompt, --prompt-file F, stdin), named in the message; `at_least`: the count is a
    lower bound (Tokenizer.least_tokens: a prompt too long to be worth encoding). A context of one token is the
    model's fault, not the prompt's: the start token (BOS), every prompt's first, fills it."""
    if target.max_seq < 2:
        raise PreflightError("the target model's context holds %d token (%s): it must hold the start token and one "
                             "generated token at least; give a target model with a longer context" % (target.max_seq,
                                                                                                       name))
    if prompt_tokens >= target.max_seq:
        raise PreflightError("the prompt is %s%d tokens but the target model's context holds %d (%s): shorten the "
                             "prompt from %s" % ("at least " if at_least else "", prompt_tokens, target.max_seq, name,
                                                 source))


def check_backends(names: dict[str, str], transport: str, key: bytes | None = None) -> dict[str, str]:
    """`names` (role -> back-end name), each checked to name a back-end, with every `auto` replaced by
    its board's port (asking with `key` when the boards sign frames) and every port checked to exist and
    open."""
    from specmesh.host.bus.ports import PortError, check_port, expand

    # mpremote's shortcuts: a0, u0, c0 (each of a verifier's list of stage ports too)
    names = {role: ",".join(expand(p) for p in name.split(",")) for role, name in names.items()}
    for role, name in names.items():
        problem = unknown_backend(role, name)
        if problem:
            raise PreflightError(problem)
    ports = [(_part(role, i, name), p) for role, name in names.items()
             for i, p in enumerate(port_list(name) or [name]) if is_port(p)]
    if ports and transport != "serial":
        raise PreflightError("--transport %s drives virtual boards only; a real board is reached on its own "
                             "serial port (--transport serial)" % transport)
    _one_role_a_port([(what, p) for what, p in ports if p != "auto"])
    out = dict(names)
    problems = []  # each said: one said alone was met again on the next try for the other (`--drafter u0 --verifier a0`)
    for what, p in ports:
        if p == "auto":
            continue
        try:
            check_port(p)
        except PortError as e:
            problems.append("%s: %s" % (what, e))
    if problems:
        raise PreflightError("; ".join(problems))
    for role, name in names.items():
        if name == "auto":
            out[role] = _find(role, key)
    return out


def _part(role: str, i: int, name: str) -> str:
    """The flag a port was given with, and for one of a list of stage ports which stage it is."""
    return "--%s" % role + (" (stage %d)" % (i + 1) if port_list(name) else "")


def _one_role_a_port(ports: list[tuple[str, str]]) -> None:
    """Two roles (or two stages) given one port (the same path, or two names of one device) is a mistake: one board
    plays one role. Unchecked, the port was opened for the verifier and the board's role named ('flashed as a drafter,
    not a verifier; flash it ...'), advice that would have overwritten a good drafter. `ports`: (flag, port)."""
    seen: dict[str, tuple[str, str]] = {}
    for what, port in sorted(ports):
        first, was = seen.setdefault(os.path.realpath(port), (what, port))
        if first != what:
            each = "stage" if "stage" in first and "stage" in what else "role"  # two stages, or two roles
            raise PreflightError("%s %s and %s %s are one port: one board plays one role; give each %s its own "
                                 "board's port" % (first, was, what, port, each))


def _find(role: str, key: bytes | None) -> str:
    from specmesh.host.backends import BackendError
    from specmesh.host.provision.cluster import find

    try:
        return find(role, key)
    except BackendError as e:
        raise PreflightError(str(e)) from None
