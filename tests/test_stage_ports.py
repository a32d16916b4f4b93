"""Real stage boards on serial ports (`specmesh run --verifier PORT1,PORT2,...`, host/provision/stageports.py).

A stage node reports its layers [a, b) in STATS (firmware/stage.py), which is how the host learns each board's place
in the pipeline.
"""

from specmesh.shared import messages as m
from specmesh.tools.nodeproc import NodeProc, flash


def test_a_stage_node_reports_its_layers_in_stats(micropython, models, tmp_path):
    board = tmp_path / "board"
    board.mkdir()
    flash(board)
    node = NodeProc(micropython, board, {"role": "stage", "model": str(models / "target.spm"), "layers": [1, 2]},
                    flashed=True, env={"MICROPYPATH": ".frozen:" + str(board)})
    try:
        assert node.call(m.HELLO)[2] == m.ROLE_STAGE, node.text
        stats = dict(node.call(m.STATS)[0])
        assert (stats["layer_a"], stats["layer_b"]) == (1, 2)
    finally:
        node.close()
