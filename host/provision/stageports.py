"""Real stage boards on serial ports: `--verifier PORT1,PORT2,...` (in layer order) verifies on a pipeline
(host/backends/pipeline.py) of the boards flashed `specmesh flash --role stage --layers A:B` on those ports.

Each board is found on its port, its node checked to be this specmesh's (cluster.py `check_firmware`) and its role
(HELLO: a board that is not a stage is told what to flash it as, in its place: connect's node id, key file and model);
every board flashed from other files, and every one that fails otherwise (no answer, another role), is named in one
line, so that fixing one does not meet the next. Each tells the layers [a, b) it holds in STATS (`layer_a`,
`layer_b`: firmware/stage.py; a board flashed before stages said them is told to flash again). They must tile the target's layers: the first stage from
layer 0, each from where the one before ends, the last to the target's last; else one line naming the gap or the
overlap (or the order to give the ports in) and the flash commands that tile them: the target's layers split evenly
over the boards given, as `--stages N` splits them.

`--verifier PORT` (or `auto`) alone is a verifier board (host/provision/cluster.py `on_port`), or a stage board: a
pipeline of that one stage, which must then hold all the target's layers (else one line: the layers it lacks, and the
ports to give).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from specmesh.host.backends import BackendError, Boards, port_list
from specmesh.host.backends.board import WrongRole, role_args
from specmesh.host.backends.modelio import check_model_file
from specmesh.host.backends.pipeline import PipelineVerifier
from specmesh.host.provision.cluster import Failures, StaleFirmware, connect, find, split_layers
from specmesh.host.provision.flash import NODE_ID
from specmesh.shared import messages as m


def on_port(model_path: Path, *, name: str, boards: Boards, **options):
    """`--verifier PORT` (`auto`: the ESP32 USB port whose board verifies, else the one stage board there): the
    verifier board on that port; a stage board there is a pipeline of one stage."""
    port = find("verifier", boards.key) if name == "auto" else name
    try:
        return boards.enter_context(connect(port, "verifier", boards.key, model=model_path))
    except WrongRole as e:
        if e.role != m.ROLE_STAGE:
            raise
    return pipeline(model_path, name=port, boards=boards, **options)


def pipeline(model_path: Path, *, name: str, boards: Boards, **_options):
    """`--verifier PORT1,PORT2,...`: a pipeline verifier over the stage boards on those ports, in layer order."""
    ports = port_list(name) or [name]
    n_layers = check_model_file(model_path)[0].n_layers  # checked whole by preflight
    even = _even(n_layers, len(ports))
    stages, stale, other = [], [], []
    for i, port in enumerate(ports):  # every board connected first: each one flashed from other files, or that fails
        try:                          # otherwise (no answer, another role), is named at once
            stages.append(boards.enter_context(connect(port, "stage", boards.key, even[i] if even else None, model_path,
                                                       NODE_ID["stage"] + i)))
        except StaleFirmware as e:
            stale += e.boards
        except BackendError as e:
            other.append(str(e))
    if other:  # the stale ones first, as a lane names them beside a drafter's other failure (host/cli/session.py)
        raise Failures(stale, other)
    if stale:
        raise StaleFirmware(stale)
    layers = []
    for i, (port, stage) in enumerate(zip(ports, stages)):
        layers.append(_layers(stage.stats(), port, i, even[i] if even else None))
        stage.flash_layers = layers[-1]  # flashed again (another build of the target), it keeps them
    problem = tiling_problem(ports, layers, n_layers)
    if problem and len(ports) == 1 and layers[0][1] <= n_layers:  # given alone as --verifier PORT: the others left out
        problem = ("%s is a stage board holding layers %d:%d of the target's %d: give all the stage boards' ports, in "
                   "layer order, as --verifier PORT1,PORT2,..." % (ports[0], *layers[0], n_layers))
    if problem:
        raise BackendError(problem)
    return PipelineVerifier(stages, layers)


def _even(n_layers: int, n: int) -> list[tuple[int, int]] | None:
    """The target's layers split evenly over n boards (cluster.split_layers), or None for more boards than layers."""
    return split_layers(n_layers, n) if n <= n_layers else None


def _flash(port: str, i: int, layers: tuple[int, int] | None) -> str:
    """The command that flashes stage i (from 0) on `port` with `layers` (a placeholder where none is known)."""
    return "`specmesh flash --port %s --role %s --node-id %d`" % (
        port, role_args("stage", layers) if layers else "stage --layers A:B", NODE_ID["stage"] + i)


def _layers(stats: dict, port: str, i: int, even: tuple[int, int] | None) -> tuple[int, int]:
    """The layers [a, b) a stage board's STATS says it holds; a node from before stages said them: flash it again."""
    if "layer_a" not in stats or "layer_b" not in stats:
        raise BackendError("the stage board on %s does not say which layers it holds (its node is older than that): "
                           "flash it again with this specmesh: %s" % (port, _flash(port, i, even)))
    return stats["layer_a"], stats["layer_b"]


def tiling_problem(ports: Sequence[str], layers: Sequence[tuple[int, int]], n_layers: int) -> str | None:
    """Why the stages' layers (in the order of `ports`) do not tile the target's n_layers, with the fix, or None."""
    where = ["%s (layers %d:%d)" % (p, a, b) for p, (a, b) in zip(ports, layers)]
    if sorted(layers) != list(layers) and _tiles(sorted(layers), n_layers):
        order = sorted(range(len(ports)), key=lambda i: layers[i])
        return ("the stage boards are not given in layer order (%s): give --verifier %s"
                % (", ".join(where), ",".join(ports[i] for i in order)))
    held = 0  # layers [0, held) are on the stages before
    why = None
    for i, (a, b) in enumerate(layers):
        if a > held:
            why = "layers %d:%d are on no stage (%s starts at layer %d)" % (held, a, where[i], a)
        elif a < held:
            why = "layers %d:%d are on two stages (%s, and %s before it)" % (a, min(b, held), where[i], where[i - 1])
        if why:
            break
        held = b
    else:
        if held == n_layers:
            return None
        why = ("layers %d:%d of the target's %d are on no stage (the last, %s, ends at layer %d)" % (
            held, n_layers, n_layers, where[-1], held) if held < n_layers else
            "%s ends past the target's %d layers (a board flashed with another model?)" % (where[-1], n_layers))
    even = _even(n_layers, len(ports))
    if even is None:
        return ("%s: the target has %d layers, so at most %d stage boards: give the ports of %d of them"
                % (why, n_layers, n_layers, n_layers))
    fix = "; ".join(_flash(p, i, ab) for i, (p, ab, had) in enumerate(zip(ports, even, layers)) if ab != had)
    return "%s: flash the stages to split the target's %d layers, e.g. %s" % (why, n_layers, fix)


def _tiles(layers: Sequence[tuple[int, int]], n_layers: int) -> bool:
    """Whether `layers`, in this order, cover 0..n_layers once each."""
    return layers[0][0] == 0 and layers[-1][1] == n_layers and all(
        b == a2 for (_, b), (a2, _) in zip(layers, layers[1:]))
