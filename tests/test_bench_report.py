"""The benchmark report (tools/bench/_report.py): the speed-up formula, and plots from a results dict."""

import pytest

from specmesh.tools.bench._report import speedup


def test_speedup_is_leviathans_formula():
    v = {k: 1.0 for k in range(1, 10)}  # a memory-bound verifier: k positions cost one
    assert speedup(0.8, 0, 0.1, v) == 1.0
    assert speedup(0.8, 4, 0.0, v) == pytest.approx((1 - 0.8 ** 5) / 0.2)  # free drafts: tokens per pass
    assert speedup(0.8, 4, 0.05, v) == pytest.approx((1 - 0.8 ** 5) / 0.2 / 1.2)
    board = {k: 0.6 * k + 0.4 for k in range(1, 10)}  # a compute-bound board
    assert max(speedup(0.7, g, 0.2, board) for g in range(1, 8)) < 1.0  # speculation cannot pay there
    assert speedup(1.0, 3, 0.0, v) == 4.0


def test_report_draws_what_the_sections_hold(tmp_path):
    pytest.importorskip("matplotlib", reason="the bench extra is not installed: pip install 'specmesh[bench]'")
    from specmesh.tools.bench._report import write

    acc = {"alpha": 0.7, "tokens_per_verification": 2.8, "alpha_per_position": [0.7, 0.72, 0.69, None]}
    results = {"started": "now", "machine": {"platform": "test", "processor": "x"},
               "vk": {"backends": {"cpu": {"v": {str(k): 1 + 0.1 * k for k in range(1, 9)}, "c": 0.3}},
                      "acceptance": {"T=0": acc, "T=1": acc}},
               "kernels": {"engines": {"integer": {"v": [1.0, 1.6, 2.1, 2.7, 3.0], "drafter_us": 100,
                                                   "verify_us": [400, 640, 840, 1080, 1200]}}}}
    from specmesh.tools.bench._report import _v_curves

    assert _v_curves(results)["native engine (unix port)"] == {1: 1.0, 2: 1.6, 3: 2.1, 4: 2.7, 5: 3.0}
    files = write(results, tmp_path)
    assert {f.name for f in files} == {"vk.png", "speedup_gamma.png", "alpha_position.png", "report.md"}
    assert all(f.stat().st_size > 1000 for f in files if f.suffix == ".png")
    text = (tmp_path / "report.md").read_text()
    assert "![Verify cost v(k)](vk.png)" in text and "projection section did not run" in text


def test_the_projection_derivation_is_a_table_of_terms_next_to_the_anchor():
    from specmesh.tools.bench._report import derivation_lines

    rows = {"matmul_1": {"ms_per_token": 60.0, "share": 0.75}, "bus": {"ms_per_token": 20.0, "share": 0.25}}
    results = {"projection": {"boards": {"esp32s3": {"plain": 12.5}}, "derivation": {"esp32s3": rows}}}
    lines = derivation_lines(results)
    assert lines[0].startswith("esp32s3, plain decoding of the shipped target: **12.50 tok/s projected** (80.0 ms")
    assert "against 19.13 tok/s measured by esp32-llm" in lines[0]
    assert "| matmul_1 | 60.00 | 75.0% |" in lines and "| total | 80.00 | 100% |" in lines
    assert derivation_lines({}) == []


def test_bench_json_is_written_the_unix_way_and_a_bad_path_is_one_line_before_the_sections(tmp_path, capsys):
    """--json FILE as a shell's `>` would: a FIFO (as /dev/full, a device) is written to, not replaced by a
    regular file; a path under a file is refused in one line before any section runs."""
    import os
    import stat
    import subprocess

    from specmesh.tools.bench.__main__ import main

    (tmp_path / "file").write_text("")
    assert main(["codec", "--json", str(tmp_path / "file" / "x.json"), "--report", str(tmp_path / "r")]) == 2
    out = capsys.readouterr()
    assert "== codec ==" not in out.out and out.err.count("\n") == 1 and "is a file, not a folder" in out.err
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    assert main(["codec", "--json", str(fifo), "--report", str(tmp_path / "r")]) == 0
    assert b'"codec"' in reader.communicate(timeout=30)[0]
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_the_codec_sections_workload_runs_its_signed_frames_in_a_session():
    """The codec section's signed VERDICT round trip needs node 2's session at both ends (signing v2): without one
    the whole section failed with BadAuth: no session."""
    from specmesh.tools.bench import _mp_codec

    res = _mp_codec.workload(200)
    assert res["frame_verdict_signed"] > 0 and res["frame_verdict"] > 0


def test_the_codec_and_signing_sections_run_from_any_folder(tmp_path):
    """The codec workload imported `shared` as the micropython binary does, found only from the repository root:
    `python -m specmesh.tools.bench codec` run elsewhere failed with "No module named 'shared'" (signing too)."""
    import subprocess
    import sys

    code = "from specmesh.tools.bench import _mp_codec; print(_mp_codec.workload(50)['frame_verdict'] > 0)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "True\n", "")


def test_bench_piped_to_a_reader_that_leaves_ends_quietly(tmp_path):
    """`python -m specmesh.tools.bench | head -1`: the shell's status for SIGPIPE and nothing on stderr (it was a
    BrokenPipeError traceback, after the section was counted as failed)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "specmesh.tools.bench", "codec", "--report", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"== codec ==\n"
    proc.stdout.close()
    err = proc.stderr.read()
    assert (proc.wait(timeout=120), err) == (141, b"")


@pytest.mark.parametrize("flags, said", [(["--json", ""], "--json '' cannot be written: an empty name"),
                                         (["--report", "{file}"], "--report {file} cannot be written: {file} is a "
                                                                  "file, not a folder"),
                                         (["--report", "{file}/r"], "is a file, not a folder")])
def test_a_bad_output_is_one_line_before_the_sections(tmp_path, capsys, flags, said):
    """`--json ''` wrote nothing, silently; a --report under or at a file failed only after the sections ran (with
    matplotlib installed): both are refused before any section, as a bad --json path is."""
    from specmesh.tools.bench.__main__ import main

    file = tmp_path / "file"
    file.write_text("")
    argv = ["codec", *(f.format(file=file) for f in flags)] + ([] if "--report" in flags else ["--report", str(tmp_path)])
    assert main(argv) == 2
    out = capsys.readouterr()
    assert "== codec ==" not in out.out and out.err.count("\n") == 1 and said.format(file=file) in out.err


def test_a_json_naming_a_shipped_model_is_refused_before_the_sections(tmp_path, capsys, monkeypatch):
    """`--json models/target.spm` (a slip of tab completion) replaced the model the sections read with the figures,
    status 0: refused in one line before any section, the file untouched (the models folder a copy here)."""
    from specmesh.tools.bench import __main__ as bench

    (tmp_path / "target.spm").write_bytes(b"model")
    monkeypatch.setattr(bench, "MODELS", tmp_path)
    assert bench.main(["codec", "--json", str(tmp_path / "target.spm"), "--report", str(tmp_path / "r")]) == 2
    out = capsys.readouterr()
    assert "== codec ==" not in out.out and out.err == (
        "bench: error: --json %s cannot be written: it would overwrite target.spm, which this tool reads: give another "
        "file\n" % (tmp_path / "target.spm"))
    assert (tmp_path / "target.spm").read_bytes() == b"model"


def test_an_unknown_section_is_one_line_naming_the_tool(capsys):
    """Its lines said "error: unknown benchmark section ..." without the tool's name, where every other tool's line
    starts with it (`make bench` runs it among other commands)."""
    from specmesh.tools.bench.__main__ import main, sections

    assert main(["nosuch"]) == 2
    assert capsys.readouterr().err == "bench: error: unknown benchmark section nosuch (available: %s)\n" % ", ".join(
        sections())
